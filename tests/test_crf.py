"""The CRF loss (`pipeline/crf.py`) against brute force over every tag sequence of a small
lattice, its gradient against finite differences, and training with `loss = "crf"`."""
import itertools

import numpy as np
import pytest
import spacy
from thinc.api import Adam

from spacy_unmask.pipeline.crf import crf_loss
from spacy_unmask.pipeline.marginals import SpanLattice
from spacy_unmask.pipeline.unmask_ner import log_softmax
from spacy_unmask.pipeline.viterbi import tag_names
from tiny_models import gold_examples, make_pipeline


def brute_force_nll(lattice, logits, gold):
    """-log P(sequences agreeing with gold) over all valid sequences, logits summed."""
    steps, n = logits.shape
    total, agreeing = [], []
    for path in itertools.product(range(n), repeat=steps):
        if not lattice.start[path[0]] or not lattice.end[path[-1]]:
            continue
        if not all(lattice.allowed[a, b] for a, b in zip(path, path[1:])):
            continue
        score = sum(logits[t, k] for t, k in enumerate(path))
        total.append(score)
        if all(g is None or g == k for g, k in zip(gold, path)):
            agreeing.append(score)
    lse = lambda xs: np.logaddexp.reduce(np.array(xs))  # noqa: E731
    return lse(total) - lse(agreeing)


@pytest.mark.parametrize("scheme", ["BILUO", "BIO"])
@pytest.mark.parametrize("seed", range(4))
def test_loss_matches_brute_force_with_full_and_partial_gold(scheme, seed):
    rng = np.random.default_rng(seed)
    tags = tag_names(["A", "B"], scheme)
    lattice = SpanLattice(tags, scheme)
    steps = 4
    logits = rng.normal(scale=2.0, size=(steps, len(tags)))
    index = {t: i for i, t in enumerate(tags)}
    full = [index[t] for t in (["U-A", "O", "B-B", "L-B"] if scheme == "BILUO" else ["B-A", "O", "B-B", "I-B"])]
    partial = [full[0], None, None, full[3]]
    for gold in (full, partial):
        loss, _ = crf_loss(lattice, [log_softmax(logits)], [gold])
        assert loss == pytest.approx(brute_force_nll(lattice, logits, gold), rel=1e-9, abs=1e-9)


def test_gradient_matches_finite_differences():
    rng = np.random.default_rng(7)
    tags = tag_names(["A", "B"], "BILUO")
    lattice = SpanLattice(tags, "BILUO")
    logits = rng.normal(size=(5, len(tags)))
    index = {t: i for i, t in enumerate(tags)}
    gold = [index["B-A"], index["L-A"], None, index["O"], index["U-B"]]
    _, (grad,) = crf_loss(lattice, [log_softmax(logits)], [gold])
    eps = 1e-6
    for t, k in itertools.product(range(5), range(len(tags))):
        up, down = logits.copy(), logits.copy()
        up[t, k] += eps
        down[t, k] -= eps
        numeric = (crf_loss(lattice, [log_softmax(up)], [gold])[0] - crf_loss(lattice, [log_softmax(down)], [gold])[0]) / (2 * eps)
        assert grad[t, k] == pytest.approx(numeric, abs=1e-4)


def test_gold_no_valid_sequence_agrees_with_falls_back_to_cross_entropy():
    tags = tag_names(["A"], "BILUO")
    lattice = SpanLattice(tags, "BILUO")
    logits = np.zeros((2, len(tags)))
    index = {t: i for i, t in enumerate(tags)}
    gold = [index["I-A"], index["O"]]  # I- cannot start a sequence
    loss, (grad,) = crf_loss(lattice, [log_softmax(logits)], [gold])
    assert loss == pytest.approx(2 * np.log(len(tags)))
    assert np.isfinite(grad).all()


def test_empty_docs_cost_nothing():
    lattice = SpanLattice(tag_names(["A"], "BILUO"), "BILUO")
    loss, (grad,) = crf_loss(lattice, [np.zeros((0, 5))], [[]])
    assert loss == 0.0 and grad.shape == (0, 5)


TRAIN = [
    ("Peter Blackburn visited Brussels .", [("Peter Blackburn", "PER"), ("Brussels", "LOC")]),
    ("EU rejects German call to boycott British lamb .", [("EU", "ORG")]),
]


def test_training_with_the_crf_loss_learns_the_training_entities(tiny_dirs):
    nlp = make_pipeline(tiny_dirs("llama", "metaspace"), {"loss": "crf"}, lora_r=4, lora_dropout=0.0)
    egs = gold_examples(nlp, TRAIN)
    nlp.initialize(lambda: egs)
    optimizer = Adam(0.005)
    losses = [nlp.update(egs, sgd=optimizer, losses={})["ner"] for _ in range(60)]
    assert losses[-1] < 0.05 * losses[0], losses[::10]
    assert [(e.text, e.label_) for e in nlp(TRAIN[0][0]).ents] == [("Peter Blackburn", "PER"), ("Brussels", "LOC")]
    assert [(e.text, e.label_) for e in nlp(TRAIN[1][0]).ents] == [("EU", "ORG")]


def test_unknown_loss_names_the_accepted_ones(tiny_dirs):
    nlp = spacy.blank("en")
    with pytest.raises(ValueError, match="loss 'hinge' is not supported; accepted: cross_entropy, crf"):
        nlp.add_pipe("unmask_ner", config={"loss": "hinge", "model": {"tok2vec": {"name": tiny_dirs("llama")}}})
