"""A linear-chain CRF loss over the constrained lattice that Viterbi decodes.

The score of a tag sequence is the sum of its tokens' logits; only the sequences
that `transition_rules` allows (BILUO or BIO) count, and there are no learned
transition weights, so the decoded path is exactly the one Viterbi finds today.
The loss of a doc is its gold sequence's negative log-likelihood,

    log Z(all valid sequences) - log Z(valid sequences that agree with the gold tags),

where tokens without a gold tag (missing or misaligned) may take any tag, so partial
annotation is marginalised over. Its gradient with respect to the logits is the tag
marginals over all valid sequences minus those over the gold-consistent ones (a
one-hot row where the gold tag is known). Both come from the forward-backward pass
of `marginals.py`. Per-token log-softmax emissions give the same loss (each token's
normaliser cancels between the two sums), so the softmax layer's outputs can be used.
"""
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .marginals import LOG_FLOOR, SpanLattice


def crf_loss(
    lattice: SpanLattice, log_probs: Sequence[np.ndarray], gold: Sequence[Sequence[Optional[int]]]
) -> Tuple[float, List[np.ndarray]]:
    """(summed negative log-likelihood, per-doc gradient with respect to the logits).

    `log_probs[d]` is doc d's (tokens, tags) log-softmax; `gold[d]` its tag ids, None
    where unknown. A doc whose known gold tags no valid sequence agrees with (which a
    corpus converted by spaCy does not produce) contributes its token-wise
    cross-entropy instead, so training never stops on it.
    """
    log_probs = [np.asarray(lp, dtype=np.float64) for lp in log_probs]
    clamped = []
    for lp, tags in zip(log_probs, gold):
        known = np.array([t is not None for t in tags], dtype=bool)
        ids = np.array([t if t is not None else 0 for t in tags], dtype=np.int64)
        agree = np.full_like(lp, LOG_FLOOR)
        agree[known, ids[known]] = lp[known, ids[known]]
        agree[~known] = lp[~known]
        clamped.append(agree)
    free = lattice.marginals(log_probs)
    fixed = lattice.marginals(clamped)
    total = 0.0
    grads = []
    for lp, tags, m_free, m_fixed in zip(log_probs, gold, free, fixed):
        if not len(lp):
            grads.append(np.zeros_like(lp, dtype=np.float32))
            continue
        if agrees_with_some_valid_sequence(lattice, tags):
            total += m_free.log_z - m_fixed.log_z
            grads.append((m_free.tag_marginals() - m_fixed.tag_marginals()).astype(np.float32))
        else:
            total += token_cross_entropy(lp, tags)
            grads.append(token_cross_entropy_grad(lp, tags))
    return total, grads


def agrees_with_some_valid_sequence(lattice: SpanLattice, tags: Sequence[Optional[int]]) -> bool:
    """Whether some sequence allowed by the lattice has the known gold tags."""
    reach = lattice.start.copy()
    for t, tag in enumerate(tags):
        if t:
            reach = (reach.astype(np.int64) @ lattice.allowed.astype(np.int64)) > 0
        if tag is not None:
            reach = reach & (np.arange(len(reach)) == tag)
        if not reach.any():
            return False
    return bool((reach & lattice.end).any())


def token_cross_entropy(log_probs: np.ndarray, tags: Sequence[Optional[int]]) -> float:
    return -float(sum(log_probs[t, tag] for t, tag in enumerate(tags) if tag is not None))


def token_cross_entropy_grad(log_probs: np.ndarray, tags: Sequence[Optional[int]]) -> np.ndarray:
    grad = np.exp(log_probs)
    for t, tag in enumerate(tags):
        if tag is None:
            grad[t] = 0.0
        else:
            grad[t, tag] -= 1.0
    return grad.astype(np.float32)
