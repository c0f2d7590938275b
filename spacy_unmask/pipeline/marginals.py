"""Span marginals: forward-backward over the constrained lattice that Viterbi decodes.

The tag sequences of a doc are weighted by the product of the softmax's tag
probabilities and renormalised over the *valid* sequences only (the transitions,
start and end tags of `transition_rules`), which is the distribution whose best path
`viterbi` returns. The score of a span is the probability that exactly this span
with this label is an entity: the total weight of the valid sequences that hold
its tag run (BILUO: B I… L, or U; BIO: B I…, and the next tag is not I of the same
label), divided by the total weight of all valid sequences.

Everything is in log space (log-sum-exp), so a 20,000-token doc is as stable as a
short one; the time recursion runs once per batch of docs padded to one length.
"""
from typing import List, NamedTuple, Sequence, Tuple

import numpy as np

from .viterbi import transition_rules

# Log-probabilities are floored here: e^-10000 is 0 in float64 anyway, and the floor
# keeps sums of emissions finite for logits from a diverged or hostile model.
LOG_FLOOR = -1e4
# Candidate spans (alternatives to the decoded entities) are at most this many
# tokens long; decoded entities are scored whatever their length.
MAX_CANDIDATE_LENGTH = 64
# Padded tokens per forward-backward batch (bounds memory: a few float64 arrays of
# this many tokens x tags).
BATCH_TOKENS = 1 << 16


class Spans(NamedTuple):
    """Spans of one doc as parallel arrays: token start, end (exclusive), label index."""

    starts: np.ndarray
    ends: np.ndarray
    labels: np.ndarray

    @classmethod
    def empty(cls) -> "Spans":
        return cls(*(np.zeros(0, dtype=np.int64) for _ in range(3)))


class SpanLattice:
    """The tags of one scheme, and per label the tags a span is made of.

    A span of label X is `single[X]` alone, or `begin[X]`, `inside[X]`… and `last[X]`:
    BILUO: U-X, or B-X I-X… L-X. BIO: B-X, or B-X I-X… I-X.
    """

    def __init__(self, tags: Sequence[str], scheme: str):
        self.tags = list(tags)
        self.scheme = scheme
        self.allowed, self.start, self.end = transition_rules(self.tags, scheme)
        self._forward_steps = self.allowed.astype(np.float64)
        self._backward_steps = np.ascontiguousarray(self._forward_steps.T)
        index = {tag: i for i, tag in enumerate(self.tags)}
        self.labels = list(dict.fromkeys(t[2:] for t in self.tags if t != "O"))
        single, begin, inside, last = ("U", "B", "I", "L") if scheme == "BILUO" else ("B", "B", "I", "I")
        self.single = np.array([index[f"{single}-{x}"] for x in self.labels], dtype=np.int64)
        self.begin = np.array([index[f"{begin}-{x}"] for x in self.labels], dtype=np.int64)
        self.inside = np.array([index[f"{inside}-{x}"] for x in self.labels], dtype=np.int64)
        self.last = np.array([index[f"{last}-{x}"] for x in self.labels], dtype=np.int64)
        # A span closes at tag k when the next tag does not continue it (I-/L- of its label).
        kinds = np.array([t[0] for t in self.tags])
        tag_labels = np.array([t[2:] for t in self.tags])
        continues = (np.isin(kinds, ["I", "L"])[None, :] & (tag_labels[:, None] == tag_labels[None, :])
                     & (kinds != "O")[:, None])
        exits = self.allowed & ~continues
        # Tags that a span can close on, grouped by their set of allowed next tags.
        closers = np.union1d(self.single, self.last)
        rows = {tuple(exits[k]) for k in closers}
        self._exit_groups = [
            (np.array(row), np.array([k for k in closers if tuple(exits[k]) == row], dtype=np.int64))
            for row in sorted(rows)
        ]
        self._kinds = kinds
        self._label_of_tag = np.array([self.labels.index(x) if x else -1 for x in tag_labels], dtype=np.int64)

    def decoded_spans(self, path: np.ndarray) -> Spans:
        """The entities of a valid tag path (as Viterbi returns it)."""
        path = np.asarray(path, dtype=np.int64)
        kinds = self._kinds[path]
        if self.scheme == "BILUO":
            starts = np.flatnonzero(np.isin(kinds, ["B", "U"]))
            ends = np.flatnonzero(np.isin(kinds, ["L", "U"])) + 1
        else:
            starts = np.flatnonzero(kinds == "B")
            following = np.append(kinds[1:], "O")
            ends = np.flatnonzero(np.isin(kinds, ["B", "I"]) & (following != "I")) + 1
        return Spans(starts, ends, self._label_of_tag[path[starts]])

    def marginals(self, log_probs: Sequence[np.ndarray]) -> List["SpanMarginals"]:
        """Forward-backward for each doc's (tokens, tags) log-probabilities, batched."""
        floored = [np.maximum(np.asarray(lp, dtype=np.float64), LOG_FLOOR) for lp in log_probs]
        out: List = [None] * len(floored)
        # Longest first: a batch is padded to the length of its first doc.
        order = sorted(range(len(floored)), key=lambda i: -len(floored[i]))
        first = 0
        while first < len(order):
            stop = first + max(1, BATCH_TOKENS // max(1, len(floored[order[first]])))
            batch = order[first:stop]
            for i, result in zip(batch, self._forward_backward([floored[i] for i in batch])):
                out[i] = result
            first = stop
        return out

    def _forward_backward(self, docs: List[np.ndarray]) -> List["SpanMarginals"]:
        lengths = np.array([len(d) for d in docs])
        steps, n = int(lengths.max(initial=0)), len(self.tags)
        if steps == 0:
            return [SpanMarginals.empty(self) for _ in docs]
        emissions = np.zeros((len(docs), steps, n))
        for b, doc in enumerate(docs):
            emissions[b, : len(doc)] = doc
        alpha = np.empty_like(emissions)
        beta = np.empty_like(emissions)
        alpha[:, 0] = np.where(self.start, emissions[:, 0], -np.inf)
        at_end = np.where(self.end, 0.0, -np.inf)
        last = lengths - 1
        # A shorter doc's backward pass starts at its own last token.
        ending = {int(t): np.flatnonzero(last == t) for t in np.unique(last) if t < steps - 1}
        beta[:, steps - 1] = at_end
        with np.errstate(divide="ignore"):  # log(0) = -inf for tags no path reaches
            for t in range(1, steps):
                alpha[:, t] = emissions[:, t] + log_matmul(alpha[:, t - 1], self._forward_steps)
            for t in range(steps - 2, -1, -1):
                beta[:, t] = log_matmul(emissions[:, t + 1] + beta[:, t + 1], self._backward_steps)
                if t in ending:
                    beta[ending[t], t] = at_end
        # closing[b, t, k]: log-weight of everything after token t, given tag k at t and
        # a next tag that does not continue k's span (or the end of the doc).
        closing = np.full_like(emissions, -np.inf)
        following = emissions[:, 1:] + beta[:, 1:]
        for exits, tags in self._exit_groups:
            closing[:, :-1, tags] = logsumexp(np.where(exits, following, -np.inf), axis=-1)[..., None]
        closing[np.arange(len(docs)), last] = at_end
        # inside_sums[b, t, X]: sum of the log-probabilities of I-X over tokens before t.
        inside_sums = np.zeros((len(docs), steps + 1, len(self.labels)))
        np.cumsum(emissions[:, :, self.inside], axis=1, out=inside_sums[:, 1:])
        log_z = logsumexp(alpha[np.arange(len(docs)), last] + at_end, axis=-1)
        return [
            SpanMarginals(self, emissions[b, :length], alpha[b, :length], beta[b, :length], float(log_z[b]),
                          closing[b, :length], inside_sums[b, : length + 1])
            if length else SpanMarginals.empty(self)
            for b, length in enumerate(lengths)
        ]


class SpanMarginals(NamedTuple):
    """Forward and backward log-weights of one doc, and the span probabilities they give."""

    lattice: SpanLattice
    log_probs: np.ndarray
    log_alpha: np.ndarray
    log_beta: np.ndarray
    log_z: float
    closing: np.ndarray
    inside_sums: np.ndarray

    @classmethod
    def empty(cls, lattice: SpanLattice) -> "SpanMarginals":
        nothing = np.zeros((0, len(lattice.tags)))
        return cls(lattice, nothing, nothing, nothing, 0.0, nothing, np.zeros((1, len(lattice.labels))))

    def tag_marginals(self) -> np.ndarray:
        """(tokens, tags): the probability of each tag at each token, over the valid sequences."""
        return np.exp(self.log_alpha + self.log_beta - self.log_z)

    def span_log_probs(self, spans: Spans) -> np.ndarray:
        """log P(exactly this span with this label is an entity), for each span."""
        lat = self.lattice
        starts, ends, labels = (np.asarray(a, dtype=np.int64) for a in spans)
        if not len(starts):
            return np.zeros(0)
        single = self.log_alpha[starts, lat.single[labels]] + self.closing[starts, lat.single[labels]]
        last = np.maximum(ends - 1, starts)
        multi = (
            self.log_alpha[starts, lat.begin[labels]]
            + self.inside_sums[np.maximum(last, starts + 1), labels]
            - self.inside_sums[starts + 1, labels]
            + self.log_probs[last, lat.last[labels]]
            + self.closing[last, lat.last[labels]]
        )
        return np.where(ends - starts == 1, single, multi) - self.log_z

    def span_scores(self, spans: Spans) -> np.ndarray:
        return probability(self.span_log_probs(spans))

    def candidates(self, min_score: float, max_length: int = MAX_CANDIDATE_LENGTH) -> Tuple[Spans, np.ndarray]:
        """Every span of at most `max_length` tokens whose probability is >= min_score.

        Exact, without enumerating all spans: P(span i..j) is at most the probability
        of its prefix (B at i, I up to j-1), which only falls as the prefix grows, so a
        start position and label are extended only while that prefix passes.
        """
        if not 0.0 < min_score <= 1.0:
            raise ValueError(f"min_score must be in (0, 1], got {min_score!r}")
        lat = self.lattice
        steps = len(self.log_probs)
        if steps == 0:
            return Spans.empty(), np.zeros(0)
        bound = np.log(min_score) - 1e-9  # rounding must not drop a span at the threshold
        found = []
        single = self.log_alpha[:, lat.single] + self.closing[:, lat.single] - self.log_z
        start, label = np.nonzero(single >= bound)
        found.append((start, start + 1, label, single[start, label]))
        # Prefixes B-X at i (i < last token): running log-weight without the suffix.
        opened = self.log_alpha[:, lat.begin] + self.log_beta[:, lat.begin] - self.log_z
        start, label = np.nonzero(opened[:-1] >= bound)
        path = self.log_alpha[start, lat.begin[label]]
        for length in range(2, max_length + 1):
            if not len(start):
                break
            end = start + length - 1  # the span's last token
            scores = (path + self.log_probs[end, lat.last[label]] + self.closing[end, lat.last[label]]
                      - self.log_z)
            keep = scores >= bound
            found.append((start[keep], end[keep] + 1, label[keep], scores[keep]))
            path = path + self.log_probs[end, lat.inside[label]]
            going = (path + self.log_beta[end, lat.inside[label]] - self.log_z >= bound) & (end < steps - 1)
            start, label, path = start[going], label[going], path[going]
        starts, ends, labels, scores = (np.concatenate(parts) for parts in zip(*found))
        order = np.lexsort((labels, ends, starts))
        spans = Spans(starts[order].astype(np.int64), ends[order].astype(np.int64), labels[order].astype(np.int64))
        return spans, probability(scores[order])


def log_matmul(log_v: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """out[b, j] = log sum of exp(log_v[b, i]) over the i with allowed[i, j] (a 0/1 float matrix)."""
    top = np.maximum(log_v.max(axis=1, keepdims=True), -1e300)  # a row of -inf stays -inf
    sums = np.exp(log_v - top) @ allowed
    out = np.log(sums) + top
    # Shifting by the row's best state underflows for a column whose allowed states all
    # lie ~650 nats or more below it: those rows are redone with a shift per column.
    if sums.min() < 1e-280:
        low = (sums < 1e-280).any(axis=1)
        terms = np.where(allowed[None] > 0, log_v[low][:, :, None], -np.inf)
        out[low] = logsumexp(terms, axis=1)
    return out


def logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    top = np.max(x, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)  # all -inf: the result is -inf, not NaN
    with np.errstate(divide="ignore"):
        return np.squeeze(top, axis=axis) + np.log(np.exp(x - top).sum(axis=axis))


def probability(log_p: np.ndarray) -> np.ndarray:
    """exp, clipped to [0, 1] (rounding can put a near-certain span a hair above 1)."""
    return np.clip(np.exp(log_p), 0.0, 1.0)
