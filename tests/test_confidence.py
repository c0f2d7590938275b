"""Entity scores of unmask_ner (doc.spans, threshold, candidates, temperature), the entity bias of its
decoding, scripts/calibrate.py and scripts/fit_bias.py."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import spacy
from spacy.tokens import DocBin
from spacy.training import biluo_tags_to_spans

from spacy_unmask.pipeline.marginals import SpanLattice
from spacy_unmask.pipeline.unmask_ner import log_softmax
from spacy_unmask.pipeline.viterbi import transition_rules, viterbi
from test_marginals import brute_force
from test_pipeline import CONFIGS, TEXTS, make_examples, tiny_nlp, train

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = [
    "", " ", "\n\n", "x", "Brussels", "😀 👨\u200d👩\u200d👧 🇩🇪 Peter visited Berlin😀",
    "東京は日本の首都です。 Brussels", "مرحبا \u200fPeter\u202e Brussels\u202c", "e\u0301 a\u0300\u0301 Z\u0351",
    "Peter\x00Blackburn \x07 \x1b[31mred\x1b[0m \ufeff end\x7f", "x" * 300, "Brussels . " * 150,
]
DEFAULTS = {"threshold": 0.0, "candidates_min_score": None, "temperature": 1.0, "entity_bias": 0.0, "spans_key": "ner"}


@pytest.fixture(scope="module")
def trained(tiny_dirs):
    nlp = tiny_nlp(CONFIGS[0], tiny_dirs("llama", "metaspace"))
    train(nlp, make_examples(nlp, n=20), steps=25)
    return nlp


@pytest.fixture
def nlp(trained):
    """The trained pipeline, its ner settings back at their defaults after each test."""
    yield trained
    for setting, value in DEFAULTS.items():
        setattr(trained.get_pipe("ner"), setting, value)


def group_of(doc, key="ner"):
    group = doc.spans[key]
    return [(s.start, s.end, s.label_) for s in group], np.asarray(group.attrs["scores"])


def ents_of(doc):
    return [(e.start, e.end, e.label_) for e in doc.ents]


def test_the_span_group_holds_the_entities_with_their_probabilities(nlp):
    docs = list(nlp.pipe(TEXTS))
    assert sum(len(doc.ents) for doc in docs) >= 4
    for doc in docs:
        spans, scores = group_of(doc)
        assert spans == ents_of(doc) and len(scores) == len(spans)
        assert ((scores > 0) & (scores <= 1)).all()


@pytest.mark.parametrize("text", ["EU rejects German call", "Peter Blackburn said"])
def test_scores_and_candidates_are_the_probabilities_over_every_valid_tag_sequence(nlp, text):
    ner = nlp.get_pipe("ner")
    ner.candidates_min_score = 0.01
    doc = nlp.make_doc(text)
    log_probs = log_softmax(ner.logits([doc])[0].astype(np.float64))
    lattice = SpanLattice(ner.tags, "BILUO")
    expected = {(s, e, lattice.labels[x]): p for (s, e, x), p in brute_force(lattice, log_probs).items()}
    doc = nlp(text)
    spans, scores = group_of(doc)
    assert len(spans) > len(doc.ents)  # candidates came with the entities
    for span, score in zip(spans, scores):
        assert score == pytest.approx(expected.get(span, 0.0), rel=1e-6, abs=1e-12)
    assert {s for s, p in zip(spans, scores) if p >= 0.01} == {s for s, p in expected.items() if p >= 0.01}


def test_a_bio_pipeline_scores_its_spans_over_the_bio_lattice(tiny_dirs):
    nlp = spacy.blank("en")
    config = {"model": {"tok2vec": {"name": tiny_dirs("llama", "metaspace"), "dtype": "float32"}},
              "scheme": "BIO", "candidates_min_score": 0.02}
    ner = nlp.add_pipe("unmask_ner", name="ner", config=config)
    examples = make_examples(nlp, n=8)
    nlp.initialize(lambda: examples)
    text = "EU rejects German call"
    log_probs = log_softmax(ner.logits([nlp.make_doc(text)])[0].astype(np.float64))
    lattice = SpanLattice(ner.tags, "BIO")
    expected = {(s, e, lattice.labels[x]): p for (s, e, x), p in brute_force(lattice, log_probs).items()}
    spans, scores = group_of(nlp(text))
    assert spans and {s for s, p in expected.items() if p >= 0.02} <= set(spans)
    for span, score in zip(spans, scores):
        assert score == pytest.approx(expected.get(span, 0.0), rel=1e-6, abs=1e-12)


def old_decoding(nlp, texts):
    """doc.ents as unmask_ner set them before entities had scores: Viterbi, then the tags' spans."""
    ner = nlp.get_pipe("ner")
    docs = [nlp.make_doc(t) for t in texts]
    rules = transition_rules(ner.tags, "BILUO")
    out = []
    for doc, logits in zip(docs, ner.logits(docs)):
        tags = [ner.tags[i] for i in viterbi(log_softmax(logits), *rules)]
        doc.ents = biluo_tags_to_spans(doc, tags)
        out.append([(t.ent_iob_, t.ent_type_) for t in doc])
    return out


def test_threshold_0_changes_nothing_even_with_candidates_and_a_temperature(nlp):
    texts = TEXTS + HOSTILE
    expected = old_decoding(nlp, texts)
    assert any(tag != ("O", "") for doc in expected for tag in doc)
    assert [[(t.ent_iob_, t.ent_type_) for t in doc] for doc in nlp.pipe(texts)] == expected
    ner = nlp.get_pipe("ner")
    ner.candidates_min_score, ner.temperature = 0.01, 2.5
    assert [[(t.ent_iob_, t.ent_type_) for t in doc] for doc in nlp.pipe(texts)] == expected


def test_the_threshold_leaves_low_scores_out_of_doc_ents_but_in_the_group(nlp):
    ner = nlp.get_pipe("ner")
    before = [group_of(doc) for doc in nlp.pipe(TEXTS)]
    ner.threshold = 1.0
    docs = list(nlp.pipe(TEXTS))
    assert all(doc.ents == () for doc in docs)
    for doc, (spans, scores) in zip(docs, before):
        assert group_of(doc)[0] == spans and np.array_equal(group_of(doc)[1], scores)
    all_scores = np.concatenate([scores for _, scores in before])
    ner.threshold = float(np.median(all_scores))
    for doc, (spans, scores) in zip(nlp.pipe(TEXTS), before):
        assert ents_of(doc) == [s for s, p in zip(spans, scores) if p >= ner.threshold]
    assert 0 < sum(len(doc.ents) for doc in nlp.pipe(TEXTS)) < len(all_scores)


def test_a_temperature_moves_the_scores_and_never_the_entities(nlp):
    ner = nlp.get_pipe("ner")
    before = [(ents_of(doc), group_of(doc)[1]) for doc in nlp.pipe(TEXTS)]
    ner.temperature = 3.0
    after = [(ents_of(doc), group_of(doc)[1]) for doc in nlp.pipe(TEXTS)]
    assert [e for e, _ in after] == [e for e, _ in before]
    assert not np.allclose(np.concatenate([s for _, s in after]), np.concatenate([s for _, s in before]))


def test_an_entity_bias_moves_the_entities_and_never_the_scores(nlp):
    ner = nlp.get_pipe("ner")
    texts = TEXTS + HOSTILE
    plain = [dict(zip(*group_of(doc))) for doc in nlp.pipe(texts)]
    ner.entity_bias = 50.0  # every token's entity tags far above O: every token in an entity
    docs = list(nlp.pipe(texts))
    assert all(token.ent_iob_ in ("B", "I") for doc in docs for token in doc)
    moved = 0
    for before, doc in zip(plain, docs):
        spans, scores = group_of(doc)
        assert set(ents_of(doc)) == set(spans)
        for span, score in zip(spans, scores):
            if span in before:  # the same span scores the same: the bias is not in the scores
                assert score == pytest.approx(before[span], abs=1e-12)
            else:
                moved += 1
    assert moved > 0
    ner.entity_bias = -50.0
    assert all(doc.ents == () for doc in nlp.pipe(texts))
    ner.entity_bias = 0.0
    assert [dict(zip(*group_of(doc))) for doc in nlp.pipe(texts)] == plain


def test_empty_one_token_and_hostile_texts_get_a_group(nlp):
    nlp.get_pipe("ner").candidates_min_score = 0.05
    docs = list(nlp.pipe(HOSTILE, batch_size=4))
    assert sum(len(doc.spans["ner"]) for doc in docs) > 0
    for doc in docs:
        spans, scores = group_of(doc)
        assert len(scores) == len(spans) and np.isfinite(scores).all()
        assert ((scores >= 0) & (scores <= 1)).all()
        assert set(ents_of(doc)) <= set(spans)
        assert all(p >= 0.05 for s, p in zip(spans, scores) if s not in ents_of(doc))
    copies = list(DocBin(docs=docs).from_bytes(DocBin(docs=docs).to_bytes()).get_docs(nlp.vocab))
    for doc, copy in zip(docs, copies):
        assert group_of(copy)[0] == group_of(doc)[0] and np.array_equal(group_of(copy)[1], group_of(doc)[1])


@pytest.mark.parametrize("setting,value,accepted", [
    ("threshold", 1.5, "a number from 0 to 1"),
    ("threshold", -0.1, "a number from 0 to 1"),
    ("candidates_min_score", 0.0, "null .off. or a number above 0, at most 1"),
    ("temperature", 0.0, "a positive finite number"),
    ("temperature", -2.0, "a positive finite number"),
    ("spans_key", "", "a non-empty string"),
    ("entity_bias", "inf", "a finite number"),
])
def test_bad_settings_are_refused_by_name(setting, value, accepted):
    with pytest.raises(ValueError, match=rf"\[unmask_ner\] {setting} .*: must be {accepted}"):
        spacy.blank("en").add_pipe("unmask_ner", config={setting: value})


def test_spacy_evaluate_scores_are_unchanged_by_the_new_settings(nlp):
    examples = make_examples(nlp, n=12, seed=3)
    plain = nlp.evaluate(examples)
    ner = nlp.get_pipe("ner")
    ner.candidates_min_score, ner.temperature, ner.spans_key = 0.01, 2.0, "sc"
    scored = nlp.evaluate(examples)
    plain.pop("speed"), scored.pop("speed")
    assert scored == plain and plain["ents_f"] > 0.5


SETTINGS = {"threshold": 0.3, "candidates_min_score": 0.05, "temperature": 1.5, "entity_bias": 0.5, "spans_key": "conf"}


def test_settings_are_saved_and_overridden_at_load_time(tmp_path, nlp):
    nlp.to_disk(tmp_path / "plain")
    configured = spacy.load(tmp_path / "plain", config={"components": {"ner": SETTINGS}})
    configured.to_disk(tmp_path / "configured")
    loaded = spacy.load(tmp_path / "configured")
    assert {k: getattr(loaded.get_pipe("ner"), k) for k in SETTINGS} == SETTINGS
    expected = [(ents_of(doc), *group_of(doc, "conf")) for doc in configured.pipe(TEXTS)]
    got = [(ents_of(doc), *group_of(doc, "conf")) for doc in loaded.pipe(TEXTS)]
    for (e1, s1, p1), (e2, s2, p2) in zip(expected, got):
        assert e1 == e2 and s1 == s2 and np.array_equal(p1, p2)
    strict = spacy.load(tmp_path / "configured", config={"components": {"ner": {"threshold": 1.0}}})
    docs = list(strict.pipe(TEXTS))
    assert all(doc.ents == () for doc in docs) and sum(len(doc.spans["conf"]) for doc in docs) > 0


def test_a_pipeline_saved_before_the_settings_existed_loads_with_the_defaults(tmp_path, nlp):
    nlp.to_disk(tmp_path / "old")
    config = spacy.util.load_config(tmp_path / "old" / "config.cfg")
    for setting in DEFAULTS:
        del config["components"]["ner"][setting]
    config.to_disk(tmp_path / "old" / "config.cfg")
    ner = spacy.load(tmp_path / "old").get_pipe("ner")
    assert {k: getattr(ner, k) for k in DEFAULTS} == DEFAULTS


def test_scores_survive_a_fresh_process(tmp_path, nlp):
    nlp.to_disk(tmp_path / "plain")
    spacy.load(tmp_path / "plain", config={"components": {"ner": SETTINGS}}).to_disk(tmp_path / "pipeline")
    expected = [[[list(s) for s in spans], scores.tolist()]
                for spans, scores in (group_of(doc, "conf") for doc in spacy.load(tmp_path / "pipeline").pipe(TEXTS))]
    assert any(scores for _, scores in expected)
    script = (
        "import json, spacy\n"
        f"nlp = spacy.load({str(tmp_path / 'pipeline')!r})\n"
        "out = [[[[s.start, s.end, s.label_] for s in d.spans['conf']], list(map(float, d.spans['conf'].attrs['scores']))]"
        f" for d in nlp.pipe({TEXTS!r})]\n"
        "print(json.dumps(out))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert [spans for spans, _ in got] == [spans for spans, _ in expected]
    np.testing.assert_allclose(sum((s for _, s in got), []), sum((s for _, s in expected), []), rtol=1e-6)


# --- scripts/calibrate.py ------------------------------------------------------------


def load_calibrate():
    spec = importlib.util.spec_from_file_location("calibrate_script", ROOT / "scripts" / "calibrate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ece_and_the_threshold_curve_by_hand():
    calibrate = load_calibrate()
    scores = np.array([0.95, 0.95, 0.95, 0.95, 0.25, 0.25, 0.25, 0.25, 1.0])
    correct = np.array([1, 1, 0, 0, 0, 0, 0, 1, 1], dtype=bool)
    summary = calibrate.calibration(scores, correct, bins=10)
    # Bin [0.9, 1]: 5 entities, accuracy 3/5, mean score 0.96; bin [0.2, 0.3): accuracy 1/4 = its score.
    assert summary["ece"] == pytest.approx(5 / 9 * abs(3 / 5 - 0.96))
    assert [r["count"] for r in summary["bins"]] == [0, 0, 4, 0, 0, 0, 0, 0, 0, 5]
    assert calibrate.calibration(np.full(10, 0.9), np.arange(10) < 9, bins=15)["ece"] == pytest.approx(0.0)
    curve = calibrate.threshold_curve(scores, correct, gold_entities=8)
    at = {t: i for i, t in enumerate(curve["thresholds"])}
    assert curve["precision"][at[0.0]] == pytest.approx(4 / 9) and curve["recall"][at[0.0]] == pytest.approx(4 / 8)
    assert curve["precision"][at[0.5]] == pytest.approx(3 / 5) and curve["recall"][at[0.5]] == pytest.approx(3 / 8)
    assert curve["precision"][at[1.0]] == 1.0 and curve["recall"][at[1.0]] == pytest.approx(1 / 8)


def noisy_docbin(nlp, path, n, seed):
    """Gold where every third "Brussels" is an ORG: the model is sometimes wrong, and confident."""
    docs = []
    for i, eg in enumerate(make_examples(nlp, n=n, seed=seed)):
        doc = eg.reference
        if i % 3 == 0:
            doc.ents = [doc.char_span(e.start_char, e.end_char, label="ORG" if e.text == "Brussels" else e.label_)
                        for e in doc.ents]
        docs.append(doc)
    DocBin(docs=docs).to_disk(path)


def test_calibrate_end_to_end_on_a_tiny_pipeline(tmp_path, nlp):
    from spacy.cli.evaluate import evaluate

    calibrate = load_calibrate()
    nlp.to_disk(tmp_path / "pipeline")
    noisy_docbin(nlp, tmp_path / "dev.spacy", 30, seed=1)
    noisy_docbin(nlp, tmp_path / "test.spacy", 30, seed=2)
    output = tmp_path / "metrics" / "calibration"
    code = calibrate.main([str(tmp_path / "pipeline"), str(tmp_path / "dev.spacy"), str(tmp_path / "test.spacy"),
                           "--output", str(output), "--fit-temperature", "--save-pipeline", str(tmp_path / "calibrated")])
    assert code == 0
    result = json.loads((tmp_path / "metrics" / "calibration.json").read_text())
    for name in ("reliability", "threshold"):
        png = (tmp_path / "metrics" / f"calibration.{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 5000
    before, after = result["before"]["test"], result["after"]["test"]
    assert before["entities"] == after["entities"] > 10
    assert 0 < before["accuracy"] < 1 and 0 <= after["ece"] <= 1 and 0 <= before["ece"] <= 1
    # At threshold 0 the curve is spacy evaluate's precision and recall.
    spacy_scores = evaluate(str(tmp_path / "pipeline"), tmp_path / "test.spacy")
    assert result["threshold_curve"]["precision"][0] == pytest.approx(spacy_scores["ents_p"])
    assert result["threshold_curve"]["recall"][0] == pytest.approx(spacy_scores["ents_r"])
    # The fitted temperature is at least as good on dev as a few others.
    fitted = result["temperature_fitted"]
    loaded = spacy.load(tmp_path / "pipeline")
    dev = calibrate.read_split(loaded, "ner", tmp_path / "dev.spacy", batch_size=8)
    ner = loaded.get_pipe("ner")
    nll = {t: calibrate.correctness_nll(*dev.scores(ner, t)) for t in (fitted, 0.5, 1.0, 2.0, 4.0)}
    assert nll[fitted] == pytest.approx(result["after"]["dev"]["nll"]) and nll[1.0] == pytest.approx(
        result["before"]["dev"]["nll"])
    assert nll[fitted] <= min(nll.values()) + 1e-9
    calibrated = spacy.load(tmp_path / "calibrated")
    assert calibrated.get_pipe("ner").temperature == pytest.approx(fitted)
    assert [ents_of(d) for d in calibrated.pipe(TEXTS)] == [ents_of(d) for d in loaded.pipe(TEXTS)]


def test_calibrate_runs_as_a_command():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "calibrate.py"), "--help"], capture_output=True,
                          text=True)
    assert done.returncode == 0 and "expected calibration error" in done.stdout.lower()


# --- scripts/fit_bias.py -------------------------------------------------------------


def test_fit_bias_chooses_on_dev_and_scores_test_as_spacy_evaluate_does(tmp_path, nlp):
    from spacy.cli.evaluate import evaluate

    spec = importlib.util.spec_from_file_location("fit_bias_script", ROOT / "scripts" / "fit_bias.py")
    fit_bias = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit_bias)
    nlp.to_disk(tmp_path / "pipeline")
    noisy_docbin(nlp, tmp_path / "dev.spacy", 30, seed=1)
    noisy_docbin(nlp, tmp_path / "test.spacy", 30, seed=2)
    biases = ["-2", "-0.5", "0.5", "1", "3"]
    code = fit_bias.main([str(tmp_path / "pipeline"), str(tmp_path / "dev.spacy"), str(tmp_path / "test.spacy"),
                          "--output", str(tmp_path / "bias.json"), "--biases", *biases,
                          "--save-pipeline", str(tmp_path / "biased")])
    assert code == 0
    result = json.loads((tmp_path / "bias.json").read_text())
    grid = {row["bias"]: row for row in result["dev_grid"]}
    assert sorted(grid) == [-2.0, -0.5, 0.0, 0.5, 1.0, 3.0]  # the stored bias (0) is always tried
    chosen = result["bias_chosen"]
    assert grid[chosen]["f1"] == max(row["f1"] for row in grid.values())
    assert len({row["r"] for row in grid.values()}) > 1  # the bias moved the entities
    # Each score is spacy evaluate's, of the pipeline with that bias.
    for bias, split, key in ((0.0, "test", "stored"), (chosen, "test", "chosen"), (chosen, "dev", "chosen")):
        configured = spacy.load(tmp_path / "pipeline", config={"components": {"ner": {"entity_bias": bias}}})
        configured.to_disk(tmp_path / "check")
        expected = evaluate(str(tmp_path / "check"), tmp_path / f"{split}.spacy")
        assert result[f"{split}_scores"][key]["f1"] == pytest.approx(100 * expected["ents_f"], abs=0.006)
    biased = spacy.load(tmp_path / "biased")
    assert biased.get_pipe("ner").entity_bias == chosen


def test_fit_bias_refuses_a_bias_that_is_not_finite(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("fit_bias_script", ROOT / "scripts" / "fit_bias.py")
    fit_bias = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit_bias)
    with pytest.raises(SystemExit):
        fit_bias.main(["p", "dev.spacy", "test.spacy", "--output", str(tmp_path / "x.json"), "--biases", "1", "inf"])
    assert "--biases must be finite numbers" in capsys.readouterr().err
