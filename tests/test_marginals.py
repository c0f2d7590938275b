"""Span marginals (spacy_unmask/pipeline/marginals.py) against brute force over every tag sequence."""
import itertools

import numpy as np
import pytest
from spacy.training import iob_to_biluo
from spacy.training.iob_utils import tags_to_entities

from spacy_unmask.pipeline.marginals import SpanLattice, Spans, log_matmul
from spacy_unmask.pipeline.unmask_ner import log_softmax
from spacy_unmask.pipeline.viterbi import tag_names, viterbi

CASES = [("BILUO", 1, 8), ("BILUO", 2, 5), ("BILUO", 3, 4), ("BIO", 1, 8), ("BIO", 2, 6), ("BIO", 3, 5), ("BILUO", 2, 1)]


def lattice(scheme, n_labels):
    return SpanLattice(tag_names([f"L{i}" for i in range(n_labels)], scheme), scheme)


def random_log_probs(rng, length, n_tags, scale=2.0):
    return log_softmax(rng.normal(scale=scale, size=(length, n_tags)))


def brute_force(lat, log_probs):
    """{(start, end, label index): probability}, summing over every valid tag sequence."""
    length, n = log_probs.shape
    seqs = np.array(list(itertools.product(range(n), repeat=length)), dtype=np.int64).reshape(-1, length)
    valid = lat.start[seqs[:, 0]] & lat.end[seqs[:, -1]] & lat.allowed[seqs[:, :-1], seqs[:, 1:]].all(axis=1)
    seqs = seqs[valid]
    log_weights = log_probs[np.arange(length), seqs].sum(axis=1)
    log_z = np.logaddexp.reduce(log_weights)
    spans = {}
    for seq, log_weight in zip(seqs, log_weights):
        tags = [lat.tags[i] for i in seq]
        for label, start, last in tags_to_entities(tags if lat.scheme == "BILUO" else iob_to_biluo(tags)):
            spans.setdefault((start, last + 1, lat.labels.index(label)), []).append(log_weight - log_z)
    return {key: float(np.exp(np.logaddexp.reduce(w))) for key, w in spans.items()}


def every_span(length, n_labels):
    keys = [(s, e, x) for s in range(length) for e in range(s + 1, length + 1) for x in range(n_labels)]
    columns = np.array(keys, dtype=np.int64).reshape(-1, 3).T
    return keys, Spans(*columns)


@pytest.mark.parametrize("scheme,n_labels,length", CASES)
def test_span_marginals_equal_brute_force(scheme, n_labels, length):
    lat = lattice(scheme, n_labels)
    rng = np.random.default_rng(length * 10 + n_labels)
    for _ in range(3):
        log_probs = random_log_probs(rng, length, len(lat.tags))
        expected = brute_force(lat, log_probs)
        (marginals,) = lat.marginals([log_probs])
        keys, spans = every_span(length, n_labels)
        scores = marginals.span_scores(spans)
        np.testing.assert_allclose(scores, [expected.get(k, 0.0) for k in keys], rtol=1e-9, atol=1e-12)
        assert max(expected.values(), default=0) > 0.05  # the lattice is not degenerate


@pytest.mark.parametrize("scheme", ["BILUO", "BIO"])
def test_span_marginals_of_a_very_peaked_lattice_equal_brute_force(scheme):
    """Log-probabilities hundreds of nats apart (a sharp or low-temperature model)."""
    lat = lattice(scheme, 2)
    rng = np.random.default_rng(5)
    for _ in range(5):
        log_probs = random_log_probs(rng, 5, len(lat.tags), scale=400.0)
        expected = brute_force(lat, log_probs)
        (marginals,) = lat.marginals([log_probs])
        keys, spans = every_span(5, 2)
        np.testing.assert_allclose(marginals.span_scores(spans), [expected.get(k, 0.0) for k in keys],
                                   rtol=1e-9, atol=1e-12)


def test_log_matmul_is_exact_when_states_lie_thousands_of_nats_apart():
    rng = np.random.default_rng(0)
    allowed = rng.random((6, 6)) < 0.5
    log_v = rng.uniform(-3000, 0, size=(40, 6))
    log_v[0, :] = -np.inf
    log_v[1, :3] = -np.inf
    expected = [[np.logaddexp.reduce(np.where(allowed[:, j], row, -np.inf)) for j in range(6)] for row in log_v]
    with np.errstate(divide="ignore"):
        got = log_matmul(log_v, allowed.astype(float))
    np.testing.assert_allclose(got, expected, rtol=1e-12)


@pytest.mark.parametrize("scheme,n_labels,length", CASES)
@pytest.mark.parametrize("min_score", [0.02, 0.3])
def test_candidates_are_exactly_the_spans_above_the_threshold(scheme, n_labels, length, min_score):
    lat = lattice(scheme, n_labels)
    rng = np.random.default_rng(7 + length)
    log_probs = random_log_probs(rng, length, len(lat.tags))
    expected = {k: p for k, p in brute_force(lat, log_probs).items() if p >= min_score}
    (marginals,) = lat.marginals([log_probs])
    spans, scores = marginals.candidates(min_score)
    assert dict(zip(zip(*(a.tolist() for a in spans)), scores)) == pytest.approx(expected, rel=1e-9)
    short, _ = marginals.candidates(min_score, max_length=2)
    assert set(zip(*(a.tolist() for a in short))) == {k for k in expected if k[1] - k[0] <= 2}


def test_candidates_reject_a_threshold_outside_0_1():
    (marginals,) = lattice("BILUO", 1).marginals([np.zeros((3, 5))])
    with pytest.raises(ValueError, match=r"min_score must be in \(0, 1\], got 0.0"):
        marginals.candidates(0.0)


@pytest.mark.parametrize("scheme", ["BILUO", "BIO"])
def test_decoded_spans_are_spacys_entities_of_the_path(scheme):
    lat = lattice(scheme, 3)
    rng = np.random.default_rng(0)
    for length in [0, 1, 2, 5, 30]:
        for _ in range(20):
            path = viterbi(rng.normal(scale=3, size=(length, len(lat.tags))), lat.allowed, lat.start, lat.end)
            tags = [lat.tags[i] for i in path]
            expected = [(s, e + 1, lat.labels.index(x))
                        for x, s, e in tags_to_entities(tags if scheme == "BILUO" else iob_to_biluo(tags))]
            assert list(zip(*(a.tolist() for a in lat.decoded_spans(path)))) == expected


@pytest.mark.parametrize("scheme", ["BILUO", "BIO"])
def test_a_near_certain_sequence_scores_1_and_its_rivals_0(scheme):
    lat = lattice(scheme, 2)
    tags = ["B-L0", "I-L0", "L-L0", "O", "U-L1", "O"] if scheme == "BILUO" else ["B-L0", "I-L0", "I-L0", "O", "B-L1", "O"]
    path = np.array([lat.tags.index(t) for t in tags])
    log_probs = np.full((len(path), len(lat.tags)), -40.0)
    log_probs[np.arange(len(path)), path] = 0.0
    (marginals,) = lat.marginals([log_probs])
    decoded = lat.decoded_spans(path)
    assert list(zip(*(a.tolist() for a in decoded))) == [(0, 3, 0), (4, 5, 1)]
    assert marginals.span_scores(decoded) == pytest.approx([1.0, 1.0], abs=1e-12)
    spans, scores = marginals.candidates(1e-9)
    assert set(zip(*(a.tolist() for a in spans))) == {(0, 3, 0), (4, 5, 1)} and scores.min() > 1 - 1e-12


def test_a_batch_of_docs_of_every_length_gives_each_doc_its_own_marginals():
    lat = lattice("BIO", 2)
    rng = np.random.default_rng(3)
    docs = [random_log_probs(rng, n, len(lat.tags)) for n in (5, 0, 1, 12, 3, 12)]
    batched = lat.marginals(docs)
    for doc, together in zip(docs, batched):
        (alone,) = lat.marginals([doc])
        assert together.log_z == pytest.approx(alone.log_z, abs=1e-12)
        keys, spans = every_span(len(doc), 2)
        np.testing.assert_allclose(together.span_log_probs(spans), alone.span_log_probs(spans), atol=1e-12)
    assert len(batched[1].span_log_probs(Spans.empty())) == 0
    assert len(batched[1].candidates(0.5)[0].starts) == 0


@pytest.mark.parametrize("scheme", ["BILUO", "BIO"])
def test_a_20000_token_doc_gives_finite_marginals(scheme):
    lat = lattice(scheme, 4)
    rng = np.random.default_rng(0)
    log_probs = random_log_probs(rng, 20_000, len(lat.tags), scale=4.0)
    log_probs[5000:5100] = -1e30  # and a stretch a diverged model could produce
    (marginals,) = lat.marginals([log_probs])
    assert np.isfinite(marginals.log_z)
    # Token marginals sum to one at every position: nothing drifts over 20,000 steps.
    token = np.exp(marginals.log_alpha + marginals.log_beta - marginals.log_z)
    np.testing.assert_allclose(token.sum(axis=1), 1.0, atol=1e-9)
    path = viterbi(log_probs, lat.allowed, lat.start, lat.end)
    scores = marginals.span_scores(lat.decoded_spans(path))
    assert len(scores) > 1000 and np.isfinite(scores).all() and (scores >= 0).all() and (scores <= 1).all()
    spans, candidate_scores = marginals.candidates(0.1)
    assert len(spans.starts) >= (scores >= 0.1).sum() and (candidate_scores >= 0.1 - 1e-12).all()


@pytest.mark.parametrize("scheme", ["BILUO", "BIO"])
def test_a_uniform_temperature_does_not_change_the_viterbi_path(scheme):
    """log_softmax(z / T) = z / T - c_t: every path's score is (sum z) / T minus the same
    constants, and the constraints are 0 / -inf, so the best valid path is the same."""
    lat = lattice(scheme, 3)
    rng = np.random.default_rng(1)
    for _ in range(50):
        logits = rng.normal(scale=3, size=(int(rng.integers(1, 25)), len(lat.tags)))
        paths = [viterbi(log_softmax(logits / t), lat.allowed, lat.start, lat.end) for t in (1.0, 0.3, 2.5)]
        assert all((p == paths[0]).all() for p in paths)
