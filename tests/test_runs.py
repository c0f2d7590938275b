"""scripts/runs.py: training campaigns (settings x seeds) and the sweep's plot and table."""
import json
from pathlib import Path

import pytest

from scripts import runs


def test_sweep_specs_plot(tmp_path, capsys):
    # the 16 patterns and the middle band, each trained once: groups:0000 is none, 1111 all
    assert runs.SWEEP[:3] == ["none", "all", "middle"] and len(set(runs.SWEEP)) == 17
    assert runs.SWEEP[3] == "groups:0001" and runs.SWEEP[-1] == "groups:1110"
    folder = tmp_path / "metrics" / "toy" / "sweep"
    folder.mkdir(parents=True)
    scores = {"none": [0.5, 0.6], "all": [0.55, 0.7], "groups:0110": [0.7, 0.8, 0.75], "groups:0001": [0.6],
              "groups:1110": [0.6, 0.6]}
    for spec, values in scores.items():
        for seed, f in enumerate(values, start=1):
            (folder / f"{runs.run_name(spec, seed)}.json").write_text(json.dumps({"ents_f": f}))
    (folder / "none-seed1.train.json").write_text(json.dumps({"wall_s": 1.0}))
    (folder / "none-seed1.doc.json").write_text(json.dumps({"ents_f": 0.1}))  # a sidecar, not a seed
    assert runs.main(["plot", "--corpus", "toy", "--metrics-dir", str(folder)]) == 0
    table = (folder.parent / "sweep.md").read_text()
    # each spec against `all` at the same seed: groups:0110's third seed has no `all` to pair with
    assert "| none = groups:0000 | 55.00 | 7.07 | 50.00 | 60.00 | 2 | -7.50 (-5.00, -10.00) | 0 of 2 |" in table
    assert "| groups:0110 | 75.00 | 5.00 | 70.00 | 80.00 | 3 | +12.50 (+15.00, +10.00) | 2 of 2 |" in table
    assert "| groups:0001 | 60.00 | – | 60.00 | 60.00 | 1 | +5.00 (+5.00) | 1 of 1 |" in table
    assert "| all = groups:1111 | 62.50 | 10.61 | 55.00 | 70.00 | 2 | – | – |" in table
    # each group's effect, from patterns that differ in it only (none = 0000, all = 1111):
    # the output-side group alone (none -> 0001) and joining (1110 -> all, two seeds); the
    # input-side group joining 0110 (-> 1110); the second group has no pair
    assert "| 4 of 4 | +10.00 (1) | +2.50 | -5.00 | +10.00 | 1 of 2 |" in table
    assert "| 1 of 4 | – | -15.00 | -20.00 | -10.00 | 0 of 2 |" in table
    assert "| 2 of 4 | – | – | – | – | – |" in table
    assert (folder.parent / "sweep.png").stat().st_size > 1000
    # runs of a backbone prefix (sweep-train --vars.run_prefix gemma3-) are shown by spec
    prefixed = tmp_path / "metrics" / "toy" / "gemma3-sweep"
    prefixed.mkdir()
    (prefixed / f"{runs.run_name('groups:0110', 1, 'gemma3-')}.json").write_text(json.dumps({"ents_f": 0.7}))
    assert runs.main(["plot", "--corpus", "toy", "--metrics-dir", str(prefixed), "--prefix=gemma3-",
                      "--table", str(tmp_path / "g.md"), "--output", str(tmp_path / "g.png")]) == 0
    # one seed has no spread: the table says so instead of printing a standard deviation of 0
    # and with no `all` run there is nothing to pair with
    assert "| groups:0110 | 70.00 | – | 70.00 | 70.00 | 1 | – | – |" in (tmp_path / "g.md").read_text()


@pytest.fixture
def toy_corpus(tmp_path):
    """corpus/toy with sentence files and, optionally, the documents files beside them."""
    folder = tmp_path / "corpus" / "toy"
    folder.mkdir(parents=True)
    for split in ("train", "dev", "test", "test.doc"):
        (folder / f"{split}.spacy").write_bytes(b"")
    return folder


def dry_run(toy_corpus, capsys, *args):
    capsys.readouterr()
    code = runs.main(["run", "--corpus", "toy", "--corpus-dir", str(toy_corpus), "--dry-run",
                      "--metrics-dir", str(toy_corpus.parent.parent / "metrics"), *args])
    return code, capsys.readouterr().out


def test_runs_dry_run_names_runs_and_passes_settings(toy_corpus, capsys):
    code, out = dry_run(toy_corpus, capsys, "--specs", "middle", "0-3,10", "--seeds", "7", "8",
                        "--prefix", "g-", "--max-steps", "5", "--model", "tiny", "--seqeval",
                        "--base-quantization", "nf4")
    assert code == 0
    assert "--components.ner.model.tok2vec.base_quantization nf4" in out
    for name in ("g-middle-seed7", "g-0-3_10-seed7", "g-middle-seed8", "g-0-3_10-seed8"):
        assert f"] {name}: " in out
    assert "--components.ner.model.tok2vec.unmask 0-3,10" in out and "--system.seed 8" in out
    assert "--components.ner.model.tok2vec.name tiny" in out and "--training.max_steps 5" in out
    assert "g-middle-seed7.log.jsonl" in out and "g-middle-seed7.doc.json" in out
    assert "scripts.seqeval_check" in out
    # By default the pipeline chosen on dev is evaluated; a sweep scores the last step.
    assert "model-best" in out and "model-last" not in out
    code, out = dry_run(toy_corpus, capsys, "--specs", "all", "--seqeval", "--evaluate-model", "last")
    assert code == 0 and "model-best" not in out
    assert "spacy evaluate" in out and out.count("model-last") == 3  # test, test.doc, seqeval check
    # A config without an unmask setting (a baseline) gets no unmask override.
    code, out = dry_run(toy_corpus, capsys, "--name", "cnn", "--seeds", "0,1", "--config", "configs/baseline_cnn.cfg")
    assert code == 0 and "] cnn-seed0: " in out and "] cnn-seed1: " in out and "unmask" not in out


def test_runs_auto_prefers_documents_where_the_corpus_has_them(toy_corpus, capsys):
    _, out = dry_run(toy_corpus, capsys, "--specs", "all")
    assert f"--paths.train {toy_corpus / 'train.spacy'}" in out and f"--paths.dev {toy_corpus / 'dev.spacy'}" in out
    (toy_corpus / "train.mix.spacy").write_bytes(b"")
    (toy_corpus / "dev.doc.spacy").write_bytes(b"")
    _, out = dry_run(toy_corpus, capsys, "--specs", "all")
    assert f"--paths.train {toy_corpus / 'train.mix.spacy'}" in out and f"--paths.dev {toy_corpus / 'dev.doc.spacy'}" in out
    _, out = dry_run(toy_corpus, capsys, "--specs", "all", "--train", "train", "--dev", "dev")
    assert f"--paths.train {toy_corpus / 'train.spacy'}" in out


def test_runs_force_retrains_and_drops_the_stale_curve(toy_corpus, capsys, monkeypatch):
    """A rerun's curve must be its own: spaCy's logger would not overwrite the old file."""
    metrics = toy_corpus.parent.parent / "metrics"
    metrics.mkdir()
    (metrics / "all-seed0.json").write_text(json.dumps({"ents_f": 0.5}))
    (metrics / "all-seed0.log.jsonl").write_text('{"step": 0, "scores": {"ents_f": 99.0}}\n')
    seen = []

    def fake_call(command):
        if "train" in command:  # the training step: the old curve is gone by now
            seen.append((metrics / "all-seed0.log.jsonl").exists())
        elif "evaluate" in command:
            (metrics / "all-seed0.json").write_text(json.dumps({"ents_f": 0.75}))
        return 0

    monkeypatch.setattr(runs.subprocess, "call", fake_call)
    base = ["run", "--corpus", "toy", "--corpus-dir", str(toy_corpus), "--metrics-dir", str(metrics),
            "--training-dir", str(toy_corpus.parent.parent / "training"), "--specs", "all", "--eval", "test"]
    assert runs.main(base) == 0 and seen == []  # resumed: nothing trained
    assert runs.main(base + ["--force=false"]) == 0 and seen == []
    assert runs.main(base + ["--force"]) == 0 and seen == [False]
    assert json.loads((metrics / "all-seed0.json").read_text())["ents_f"] == 0.75
    assert runs.main(base + ["--force=True"]) == 0 and seen == [False, False]
    with pytest.raises(SystemExit):
        runs.build_parser().parse_args(base + ["--force=maybe"])


def test_runs_resume_and_refuse_bad_settings(toy_corpus, capsys):
    metrics = toy_corpus.parent.parent / "metrics"
    metrics.mkdir()
    (metrics / "all-seed0.json").write_text(json.dumps({"ents_f": 0.5}))
    code, out = dry_run(toy_corpus, capsys, "--specs", "all", "none")
    assert code == 0 and "all-seed0: done already" in out and "] none-seed0: " in out
    for args, message in [
        (["--specs", "all", "--train", "train.doc"], "--train train.doc: no "),
        (["--specs", "all", "--eval", "dev", "test"], "same metrics file"),
        (["--specs", "all", "--name", "cnn"], "--name and --specs"),
        (["--specs", "all", "--seeds", "one"], "--seeds: 'one' is not an integer"),
    ]:
        with pytest.raises(SystemExit, match=message):
            dry_run(toy_corpus, capsys, *args)


@pytest.mark.parametrize("config, block", [
    ("ner.cfg", "components.ner.model.tok2vec"),
    ("chunk.cfg", "components.chunker.model.tok2vec"),
    ("tagger.cfg", "components.tagger.model.tok2vec"),
    ("multitask.cfg", "components.tok2vec.model"),
])
def test_backbone_settings_reach_the_decoder_of_every_config(config, block):
    assert runs.backbone_block(Path("configs") / config) == block


def test_a_config_without_a_decoder_refuses_backbone_settings():
    with pytest.raises(SystemExit, match="0 decoder blocks"):
        runs.backbone_block(Path("configs") / "baseline_cnn.cfg")


@pytest.mark.parametrize("args, message", [
    (["--specs", "all", "--dev", "test"], "model selection on a test split is refused"),
    (["--specs", "all", "--dev", "test.doc"], "model selection on a test split is refused"),
    (["--specs", "sweep", "--eval", "test"], "a mask study .* on dev only"),
    (["--specs", "all", "groups:0011", "--eval", "dev"], None),
    (["--specs", "none", "groups:0101", "--eval", "test.doc"], "a mask study"),
    (["--specs", "all", "--select", "--eval", "test.doc"], "--select chooses between settings"),
])
def test_choices_are_made_on_dev_only(toy_corpus, capsys, args, message):
    if message is None:
        assert dry_run(toy_corpus, capsys, *args)[0] == 0
        return
    with pytest.raises(SystemExit, match=message):
        dry_run(toy_corpus, capsys, *args)


def test_the_final_comparison_reads_test(toy_corpus, capsys):
    code, out = dry_run(toy_corpus, capsys, "--specs", "none", "all", "middle")
    assert code == 0 and "test.spacy" in out and "dev.spacy" in out  # chosen on dev, scored on test


def test_span_groups_are_scored_and_checked(toy_corpus, capsys):
    code, out = dry_run(toy_corpus, capsys, "--config", "configs/chunk.cfg", "--specs", "all", "--seqeval")
    assert code == 0
    evaluations = [line for line in out.splitlines() if "spacy evaluate" in line]
    assert evaluations and all("--spans-key chunks" in line for line in evaluations)
    assert "scripts.seqeval_check" in out and out.count("--spans-key chunks") == len(evaluations) + 1
    code, out = dry_run(toy_corpus, capsys, "--config", "configs/multitask.cfg", "--specs", "all", "--seqeval")
    check = next(line for line in out.splitlines() if "seqeval_check" in line)
    assert "--spans-key" not in check  # the multitask pipeline's headline is its entities
