"""Constrained Viterbi decoding (`pipeline/viterbi.py`): every output is a valid BILUO or BIO
sequence, and the best valid one, as brute force over every sequence finds it."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spacy_unmask.pipeline.viterbi import tag_names, transition_rules, viterbi


def is_valid(tags, scheme):
    open_label = None
    for tag in tags:
        kind, label = tag[0], tag[2:]
        if scheme == "BILUO":
            if open_label is None and kind in "IL":
                return False
            if open_label is not None and (kind not in "IL" or label != open_label):
                return False
            open_label = label if kind in "BI" else None
        else:
            if kind == "I" and open_label != label:
                return False
            open_label = label if kind in "BI" else None
    return scheme == "BIO" or open_label is None


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["BILUO", "BIO"]), st.integers(1, 3), st.integers(0, 12), st.integers(0, 2**32 - 1))
def test_viterbi_never_emits_an_invalid_sequence(scheme, n_labels, length, seed):
    tags = tag_names([f"L{i}" for i in range(n_labels)], scheme)
    scores = np.random.default_rng(seed).normal(scale=5, size=(length, len(tags)))
    path = viterbi(scores, *transition_rules(tags, scheme))
    assert len(path) == length and is_valid([tags[i] for i in path], scheme)


def test_viterbi_repairs_what_argmax_gets_wrong():
    tags = tag_names(["PER"], "BILUO")  # O B I L U
    scores = np.log(np.array([[0.1, 0.1, 0.6, 0.1, 0.1], [0.1, 0.1, 0.1, 0.6, 0.1]]))
    assert [tags[i] for i in viterbi(scores, *transition_rules(tags, "BILUO"))] == ["B-PER", "L-PER"]

@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["BILUO", "BIO"]), st.integers(1, 2), st.integers(0, 4), st.integers(0, 2**32 - 1))
def test_viterbi_finds_the_best_valid_sequence(scheme, n_labels, length, seed):
    """Over every tag sequence of a small random lattice: Viterbi's path scores as high as
    the best sequence that `is_valid` (written independently of `transition_rules`) accepts."""
    tags = tag_names([f"L{i}" for i in range(n_labels)], scheme)
    rng = np.random.default_rng(seed)
    scores = rng.normal(scale=3, size=(length, len(tags)))
    scores[rng.random(scores.shape) < 0.2] = -np.inf  # tags a lattice rules out
    best = max(
        (sum(scores[t, i] for t, i in enumerate(path)) for path in itertools.product(range(len(tags)), repeat=length)
         if is_valid([tags[i] for i in path], scheme)),
        default=-np.inf,
    )
    path = viterbi(scores, *transition_rules(tags, scheme))
    assert len(path) == length and is_valid([tags[i] for i in path], scheme)
    got = sum(scores[t, i] for t, i in enumerate(path))
    assert got == pytest.approx(best) if np.isfinite(best) else got == best
