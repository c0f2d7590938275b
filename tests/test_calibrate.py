"""scripts/calibrate.py: calibration of the entity scores, a temperature fitted on dev, P/R against the threshold."""
import json
import subprocess
import sys

import numpy as np
import pytest
import spacy
from spacy.tokens import DocBin

from scripts import calibrate
from test_unmask_ner import TEXTS, ents_of, make_examples, nlp, trained  # noqa: F401 (fixtures)


def test_ece_and_the_threshold_curve_by_hand():
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
    done = subprocess.run([sys.executable, "-m", "scripts.calibrate", "--help"], capture_output=True,
                          text=True)
    assert done.returncode == 0 and "expected calibration error" in done.stdout.lower()
