"""`unmask_ner`: token-classification NER (or any labelled spans) on a decoder backbone.

Dropout and a softmax layer over BILUO (or BIO) tags on top of the per-token
vectors; cross-entropy on the gold tags of `Example.get_aligned_ner()` (tokens
whose gold tag is missing or misaligned are left out of the loss); constrained
Viterbi decoding, so every predicted entity is a well-formed span.

Each entity also gets a score: the probability, under the same constrained lattice,
that exactly this span with this label is an entity (`marginals.py`). The scores go
to `doc.spans[spans_key]` with `attrs["scores"]`, as spaCy's spancat does; entities
scoring below `threshold` are left out of `doc.ents`. `entity_bias` moves the decoding
itself towards more entities (recall) or fewer (precision); `scripts/fit_bias.py` fits it
on dev.

`target = "spans"` makes it a labeller of other non-overlapping spans, such as chunks:
it learns from the reference's `doc.spans[spans_key]` instead of `doc.ents`, writes only
that span group, and leaves `doc.ents` to an NER component beside it.
"""
import math
from itertools import islice
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional

import numpy as np
from spacy.language import Language
from spacy.pipeline import TrainablePipe
from spacy.tokens import Doc, Span, SpanGroup
from spacy.training import Example, biluo_to_iob, offsets_to_biluo_tags, validate_examples
from spacy.util import registry
from thinc.api import Config
from thinc.api import Model, SequenceCategoricalCrossentropy, chain, set_dropout_rate, with_array
from thinc.types import Floats2d

from ..pipeline_files import check_not_linked, read_component
from ..layers.decoder_tok2vec import hide_machine_paths
from ..settings import is_number, one_of, require
from ..weights_file import weights_folder
from . import scoring  # noqa: F401  (registers spacy_unmask.span_scorer.v1)
from .crf import crf_loss
from .marginals import SpanLattice, Spans
from .viterbi import tag_names, viterbi

LOSSES = ("cross_entropy", "crf")
TARGETS = ("ents", "spans")

DEFAULT_CONFIG = """
[model]
@architectures = "spacy_unmask.TokenClassifier.v1"
dropout = 0.1

[model.tok2vec]
@architectures = "spacy_unmask.DecoderTok2Vec.v1"
name = "gemma3-270m"
unmask = "all"
"""


@registry.architectures("spacy_unmask.TokenClassifier.v1")
def TokenClassifier(tok2vec: Model[List[Doc], List[Floats2d]], dropout: float = 0.1, nO: Optional[int] = None):
    """Dropout and a softmax layer over tags, on top of any tok2vec."""
    from thinc.api import Dropout, Softmax_v2

    require("dropout", dropout, is_number(dropout) and 0.0 <= dropout < 1.0, "in [0, 1)")
    head = with_array(chain(Dropout(dropout), Softmax_v2(nO=nO, normalize_outputs=False)))
    model = chain(tok2vec, head)
    model.set_ref("tok2vec", tok2vec)
    model.set_ref("output_layer", head.layers[0].layers[1])
    return model


# The component's settings and their defaults, written once: the factory's default config,
# make_unmask_ner (which spaCy always calls with every one) and UnmaskNER take them from here.
DEFAULTS = {
    "scheme": "BILUO",
    "spans_key": "ner",
    "threshold": 0.0,
    "candidates_min_score": None,
    "temperature": 1.0,
    "entity_bias": 0.0,
    "loss": "cross_entropy",
    "target": "ents",
}


@Language.factory(
    "unmask_ner",
    assigns=["doc.ents", "token.ent_iob", "token.ent_type", "doc.spans"],
    default_config={
        "model": Config().from_str(DEFAULT_CONFIG)["model"],
        **DEFAULTS,
        "scorer": {"@scorers": "spacy_unmask.span_scorer.v1"},
    },
    default_score_weights={"ents_f": 1.0, "ents_p": 0.0, "ents_r": 0.0, "ents_per_type": None},
)
def make_unmask_ner(
    nlp: Language,
    name: str,
    model: Model,
    scheme: str,
    scorer: Optional[Callable],
    spans_key: str,
    threshold: float,
    candidates_min_score: Optional[float],
    temperature: float,
    entity_bias: float,
    loss: str,
    target: str,
):
    """Token-classification NER with constrained decoding and a score per entity.

    scheme (str): "BILUO" (default) or "BIO" tags for the softmax layer.
    spans_key (str): `doc.spans[spans_key]` gets the decoded entities, with their
        probabilities in `attrs["scores"]` (then any candidates).
    threshold (float): entities whose score is below it are left out of `doc.ents`
        (they stay in the span group). 0.0: `doc.ents` holds every decoded entity.
    candidates_min_score (float or None): if set, the span group also holds every other
        span (of up to MAX_CANDIDATE_LENGTH = 64 tokens; spans may overlap) whose
        probability is at least this.
    temperature (float): the logits are divided by it before the scores are computed
        (fitted by scripts/calibrate.py); it cannot change the decoded entities.
    entity_bias (float): added to every entity tag's log-probability, at every token, in
        Viterbi decoding only: above 0 the decoded entities grow in number and length
        (recall up, precision down), below 0 they shrink; 0.0 decodes the model's most
        probable valid path. The scores stay the model's probabilities (fitted by
        scripts/fit_bias.py on dev).
    loss (str): "cross_entropy" (token-wise, the papers' loss) or "crf": the negative
        log-likelihood of the gold tag sequence over the constrained lattice that
        decoding uses (a linear-chain CRF without learned transitions; `crf.py`).
    target (str): "ents" (learn from and write `doc.ents`, and the span group) or "spans"
        (learn from and write only `doc.spans[spans_key]`, e.g. chunks, with the decoded
        spans scoring at least `threshold` and their scores; no candidates).
    """
    return UnmaskNER(
        nlp.vocab, model, name, scheme=scheme, scorer=scorer, spans_key=spans_key, threshold=threshold,
        candidates_min_score=candidates_min_score, temperature=temperature, entity_bias=entity_bias, loss=loss,
        target=target,
    )


class Prediction(NamedTuple):
    """What `predict` finds in one doc: the Viterbi path, and the spans of the span group
    (the `n_decoded` decoded entities first, then candidates) with their probabilities."""

    tag_ids: np.ndarray
    spans: Spans
    scores: np.ndarray
    n_decoded: int


class UnmaskNER(TrainablePipe):
    def __init__(
        self,
        vocab,
        model: Model,
        name: str = "unmask_ner",
        *,
        scheme: str = DEFAULTS["scheme"],
        scorer=None,
        spans_key: str = DEFAULTS["spans_key"],
        threshold: float = DEFAULTS["threshold"],
        candidates_min_score: Optional[float] = DEFAULTS["candidates_min_score"],
        temperature: float = DEFAULTS["temperature"],
        entity_bias: float = DEFAULTS["entity_bias"],
        loss: str = DEFAULTS["loss"],
        target: str = DEFAULTS["target"],
    ):
        tag_names([], scheme)  # validates the scheme
        self.vocab = vocab
        self.model = model
        self.name = name
        self.scorer = scorer
        # Only what training learns goes into cfg (saved, and restored over the config by
        # from_disk); the settings below stay in the config, so a load-time override wins.
        self.cfg: Dict = {"labels": [], "scheme": scheme}
        where = f"[{name}] "
        self.spans_key = require("spans_key", spans_key, isinstance(spans_key, str) and spans_key,
                                 "a non-empty string", where)
        self.threshold = require("threshold", threshold, is_number(threshold) and 0.0 <= threshold <= 1.0,
                                 "a number from 0 to 1", where)
        self.candidates_min_score = require(
            "candidates_min_score", candidates_min_score,
            candidates_min_score is None or (is_number(candidates_min_score) and 0.0 < candidates_min_score <= 1.0),
            "null (off) or a number above 0, at most 1", where,
        )
        self.temperature = require("temperature", temperature, is_number(temperature) and 0.0 < temperature < math.inf,
                                   "a positive finite number", where)
        self.entity_bias = require("entity_bias", entity_bias, is_number(entity_bias) and math.isfinite(entity_bias),
                                   "a finite number", where)
        self.loss = one_of("loss", loss, LOSSES, where)
        self.target = one_of("target", target, TARGETS, where)
        if self.target == "spans" and self.candidates_min_score is not None:
            raise ValueError(f"{where}candidates_min_score needs target = 'ents' (with target = 'spans' the span "
                             f"group is the output, and candidates would overlap it); set it to null")
        self._span_lattice: Optional[SpanLattice] = None

    @property
    def labels(self) -> tuple:
        return tuple(self.cfg["labels"])

    @property
    def tags(self) -> List[str]:
        return tag_names(self.cfg["labels"], self.cfg["scheme"])

    def add_label(self, label: str) -> int:
        if label in self.cfg["labels"]:
            return 0
        if self.model.get_ref("output_layer").has_dim("nO"):
            raise ValueError(f"cannot add label {label!r} to an initialised unmask_ner; re-initialise it")
        self.cfg["labels"].append(label)
        self._span_lattice = None
        return 1

    def initialize(self, get_examples: Callable[[], Iterable[Example]], *, nlp=None, labels=None):
        self._require_labels_from(get_examples, labels)
        sample = [eg.reference for eg in islice(get_examples(), 10)]
        self.model.get_ref("output_layer").set_dim("nO", len(self.tags))
        self.model.initialize(X=sample)
        if nlp is not None:  # a saved full pipeline keeps no path of this machine in config.cfg
            hide_machine_paths(nlp, self.name)

    def _require_labels_from(self, get_examples, labels) -> None:
        found = set(labels or [])
        if labels is None:
            for eg in get_examples():
                found.update(span.label_ for span in self._gold_spans(eg.reference))
        for label in sorted(found):
            self.add_label(label)
        if not self.cfg["labels"]:
            where = "entities" if self.target == "ents" else f"spans in doc.spans[{self.spans_key!r}]"
            raise ValueError(
                f"[{self.name}] no labels: the training examples have no {where} "
                "and no labels were given in [initialize.components]"
            )

    def _gold_spans(self, doc: Doc):
        return doc.ents if self.target == "ents" else doc.spans.get(self.spans_key, [])

    def predict(self, docs: List[Doc]) -> List[Prediction]:
        return self.decode(self.logits(docs))

    def logits(self, docs: List[Doc]) -> List[np.ndarray]:
        """Each doc's (tokens, tags) logits: the softmax layer returns logits at prediction time."""
        if not any(len(doc) for doc in docs):
            return [np.zeros((0, len(self.tags)), dtype=np.float32) for _ in docs]
        return [self.model.ops.to_numpy(s) for s in self.model.predict(docs)]

    def decode(self, logits: List[np.ndarray]) -> List[Prediction]:
        """Viterbi paths, entities and their probabilities from each doc's (tokens, tags) logits."""
        lattice = self._lattice()
        paths = [viterbi(self._biased(log_softmax(s)), lattice.allowed, lattice.start, lattice.end) for s in logits]
        # The temperature cannot move the best valid path (it scales every path's summed
        # logits alike, and each token's log-softmax shifts all its tags alike), so only
        # the scores see it.
        log_probs = [log_softmax(np.asarray(s, dtype=np.float64) / self.temperature) for s in logits]
        predictions = []
        for path, marginals in zip(paths, lattice.marginals(log_probs)):
            decoded = lattice.decoded_spans(path)
            spans, scores = decoded, marginals.span_scores(decoded)
            if self.candidates_min_score is not None:
                found, found_scores = marginals.candidates(self.candidates_min_score)
                taken = set(zip(*(a.tolist() for a in decoded)))
                new = np.array([key not in taken for key in zip(*(a.tolist() for a in found))], dtype=bool)
                spans = Spans(*(np.concatenate([a, b[new]]) for a, b in zip(decoded, found)))
                scores = np.concatenate([scores, found_scores[new]])
            predictions.append(Prediction(path, spans, scores, len(decoded.starts)))
        return predictions

    def _biased(self, log_probs: np.ndarray) -> np.ndarray:
        # Tag 0 is O (tag_names); the bias goes to every other tag, in place (a fresh array).
        if self.entity_bias:
            log_probs[:, 1:] += self.entity_bias
        return log_probs

    def _lattice(self) -> SpanLattice:
        # Rebuilt when the labels or scheme change (add_label, or cfg restored by from_disk).
        lattice = self._span_lattice
        if lattice is None or lattice.tags != self.tags or lattice.scheme != self.cfg["scheme"]:
            lattice = self._span_lattice = SpanLattice(self.tags, self.cfg["scheme"])
        return lattice

    def set_annotations(self, docs: List[Doc], predictions: List[Prediction]) -> None:
        labels = self._lattice().labels
        for doc, found in zip(docs, predictions):
            spans = [Span(doc, int(s), int(e), label=labels[x]) for s, e, x in zip(*found.spans)]
            scores = found.scores
            kept = [i for i in range(found.n_decoded) if scores[i] >= self.threshold]
            if self.target == "spans":
                spans, scores = [spans[i] for i in kept], scores[kept]
            doc.spans[self.spans_key] = SpanGroup(doc, name=self.spans_key, spans=spans, attrs={"scores": scores})
            if self.target == "ents":
                doc.ents = [spans[i] for i in kept]

    def score(self, examples: Iterable[Example], **kwargs) -> Dict:
        # The scorer learns where this component's spans are (`span_scorer`).
        return super().score(examples, **{"target": self.target, "spans_key": self.spans_key, **kwargs})

    def update(self, examples: Iterable[Example], *, drop: float = 0.0, sgd=None, losses=None):
        losses = {} if losses is None else losses
        losses.setdefault(self.name, 0.0)
        examples = list(examples) if not isinstance(examples, Example) else examples
        validate_examples(examples, "UnmaskNER.update")
        docs = [eg.predicted for eg in examples]
        if not any(len(doc) for doc in docs):
            return losses
        # As spaCy's own components: `drop` ([training] dropout) sets the head's dropout
        # for this update. LoRA dropout inside the decoder is the `lora_dropout` setting.
        set_dropout_rate(self.model, drop)
        scores, backprop = self.model.begin_update(docs)
        loss, d_scores = self.get_loss(examples, scores)
        if not np.isfinite(loss):
            raise ValueError(f"[{self.name}] the loss is {loss}: training diverged; lower the learning rate")
        backprop(d_scores)
        if sgd is not None:
            self.finish_update(sgd)
        losses[self.name] += loss
        return losses

    def to_disk(self, path, *, exclude=tuple()):
        _check_finite(self)
        check_not_linked(path)
        with weights_folder(path):
            return super().to_disk(path, exclude=exclude)

    def to_bytes(self, *, exclude=tuple()):
        _check_finite(self)
        return super().to_bytes(exclude=exclude)

    def from_disk(self, path, *, exclude=tuple()):
        with weights_folder(path):
            return read_component(self, path, lambda: super(UnmaskNER, self).from_disk(path, exclude=exclude))

    def from_bytes(self, bytes_data, *, exclude=tuple()):
        return read_component(self, None, lambda: super(UnmaskNER, self).from_bytes(bytes_data, exclude=exclude))

    def get_loss(self, examples: Iterable[Example], scores: List[Floats2d]):
        validate_examples(examples, "UnmaskNER.get_loss")
        known = set(self.tags)
        truths = []
        for eg in examples:
            gold = eg.get_aligned_ner() if self.target == "ents" else self._aligned_span_tags(eg)
            if self.cfg["scheme"] == "BIO":
                gold = _biluo_to_bio_keep_missing(gold)
            # Missing ("-") or misaligned (None) gold tags carry no signal.
            truths.append([tag if tag in known else None for tag in gold])
        if self.loss == "crf":
            index = {tag: i for i, tag in enumerate(self.tags)}
            gold_ids = [[index[tag] if tag is not None else None for tag in truth] for truth in truths]
            # In training the softmax layer returns probabilities; its backprop takes d(logits).
            log_probs = [np.log(np.maximum(self.model.ops.to_numpy(s), 1e-30)) for s in scores]
            loss, grads = crf_loss(self._lattice(), log_probs, gold_ids)
            return loss, [self.model.ops.asarray2f(g) for g in grads]
        loss_func = SequenceCategoricalCrossentropy(names=self.tags, normalize=False, missing_value=None)
        d_scores, loss = loss_func(scores, truths)
        return float(loss), d_scores


    def _aligned_span_tags(self, eg: Example) -> List[Optional[str]]:
        """BILUO tags on the predicted tokens from the reference's span group (as
        `get_aligned_ner` does for entities); all missing where the reference lacks it."""
        if self.spans_key not in eg.reference.spans:
            return [None] * len(eg.predicted)
        spans = eg.get_aligned_spans_y2x(eg.reference.spans[self.spans_key], allow_overlap=False)
        return offsets_to_biluo_tags(eg.predicted, [(s.start_char, s.end_char, s.label_) for s in spans], missing="O")


def _check_finite(pipe: "UnmaskNER") -> None:
    for node in pipe.model.walk():
        for param in node.param_names:
            if node.has_param(param) and not np.isfinite(pipe.model.ops.to_numpy(node.get_param(param))).all():
                raise ValueError(
                    f"[{pipe.name}] refusing to save non-finite weights ({node.name}.{param}): training "
                    "diverged (the loss became NaN or infinite); lower the learning rate"
                )


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _biluo_to_bio_keep_missing(tags: List[Optional[str]]) -> List[Optional[str]]:
    out: List[Optional[str]] = [None] * len(tags)
    start = 0
    while start < len(tags):
        if tags[start] in (None, "-"):
            start += 1
            continue
        end = start
        while end < len(tags) and tags[end] not in (None, "-"):
            end += 1
        out[start:end] = biluo_to_iob(tags[start:end])
        start = end
    return out
