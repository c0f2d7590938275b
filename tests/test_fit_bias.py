"""scripts/fit_bias.py: the entity bias of decoding, chosen on dev, test scored at 0 and at it."""
import json

import pytest
import spacy

from scripts import fit_bias
from test_calibrate import noisy_docbin
from test_unmask_ner import nlp, trained  # noqa: F401 (fixtures)


def test_fit_bias_chooses_on_dev_and_scores_test_as_spacy_evaluate_does(tmp_path, nlp):
    from spacy.cli.evaluate import evaluate

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
    with pytest.raises(SystemExit):
        fit_bias.main(["p", "dev.spacy", "test.spacy", "--output", str(tmp_path / "x.json"), "--biases", "1", "inf"])
    assert "--biases must be finite numbers" in capsys.readouterr().err
