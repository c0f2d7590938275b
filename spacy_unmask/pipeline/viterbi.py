"""Constrained Viterbi decoding over BILUO or BIO tags: every output is a valid sequence."""
from typing import List, Sequence, Tuple

import numpy as np

from ..settings import one_of

SCHEMES = ("BILUO", "BIO")


def tag_names(labels: Sequence[str], scheme: str) -> List[str]:
    one_of("scheme", scheme, SCHEMES)
    prefixes = "BILU" if scheme == "BILUO" else "BI"
    return ["O"] + [f"{p}-{label}" for label in labels for p in prefixes]


def transition_rules(tags: Sequence[str], scheme: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(allowed[prev, next], allowed at start, allowed at end) as boolean arrays."""
    kinds = [t[0] for t in tags]
    labels = [t[2:] for t in tags]
    n = len(tags)
    allowed = np.zeros((n, n), dtype=bool)
    for i in range(n):
        for j in range(n):
            inside_next = kinds[j] in "IL"
            if scheme == "BILUO":
                open_prev = kinds[i] in "BI"
                allowed[i, j] = (labels[i] == labels[j]) if open_prev and inside_next else (
                    not open_prev and not inside_next
                )
            else:
                allowed[i, j] = kinds[j] != "I" or (kinds[i] in "BI" and labels[i] == labels[j])
    start = np.array([k not in "IL" for k in kinds])
    end = np.array([k not in "BI" for k in kinds]) if scheme == "BILUO" else np.ones(n, dtype=bool)
    return allowed, start, end


def viterbi(log_probs: np.ndarray, allowed: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The best tag sequence (length T) under the transition constraints."""
    steps, n = log_probs.shape
    if steps == 0:
        return np.zeros(0, dtype=np.int64)
    forbidden = np.where(allowed, 0.0, -np.inf)
    score = np.where(start, log_probs[0], -np.inf)
    back = np.zeros((steps, n), dtype=np.int64)
    for t in range(1, steps):
        candidates = score[:, None] + forbidden
        back[t] = candidates.argmax(axis=0)
        score = candidates[back[t], np.arange(n)] + log_probs[t]
    score = np.where(end, score, -np.inf)
    path = np.zeros(steps, dtype=np.int64)
    path[-1] = int(score.argmax())
    for t in range(steps - 1, 0, -1):
        path[t - 1] = back[t, path[t]]
    return path
