"""project.yml: its commands parse and take the arguments they are given; the `all` workflow end to end."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import srsly

import spacy_unmask

from scripts import runs

ROOT = Path(__file__).resolve().parents[1]


# --- project.yml ---------------------------------------------------------------------


@pytest.fixture
def project_copy(tmp_path):
    """project.yml alone in a temporary folder (loading it creates its directories)."""
    shutil.copy(ROOT / "project.yml", tmp_path / "project.yml")
    return tmp_path


def test_project_yml_validates(project_copy):
    from weasel.schemas import ProjectConfigSchema, validate
    from weasel.util import load_project_config, validate_project_commands

    raw = srsly.read_yaml(project_copy / "project.yml")
    assert validate(ProjectConfigSchema, raw) == []
    validate_project_commands(raw)
    config = load_project_config(project_copy)
    assert set(config["workflows"]) >= {"all", "conll03", "sweep", "baselines"}
    for name in ("train", "report"):
        assert name in config["workflows"]["all"]
    raw_scripts = {cmd["name"]: cmd.get("script", []) for cmd in raw["commands"]}
    for cmd in config["commands"]:
        # Interpolation keeps one string per step (a step that began with ${...} would merge).
        assert len(cmd["script"]) == len(raw_scripts[cmd["name"]]), cmd["name"]
        for line in cmd["script"]:
            assert "${" not in line, line
            assert line.split()[0] in ("python", ".venv-t4/bin/python", "bash"), line
            for word in line.split():
                if word.startswith(("scripts/", "configs/")):
                    assert (ROOT / word).exists(), f"{cmd['name']}: {word} does not exist"
                if word.startswith("scripts."):  # python -m scripts.<name>
                    assert (ROOT / "scripts" / f"{word[len('scripts.'):]}.py").exists(), f"{cmd['name']}: {word}"
            # scripts run as modules of the `scripts` package, never by path
            assert not any(word.startswith("scripts/") and word.endswith(".py") for word in line.split()), line


def test_project_vars_override(project_copy):
    from weasel.util import load_project_config

    config = load_project_config(project_copy, overrides={"vars.corpus": "ncbi_disease", "vars.gpu_id": 0})
    commands = {cmd["name"]: cmd for cmd in config["commands"]}
    assert "preset ncbi_disease corpus/ncbi_disease" in commands["convert"]["script"][0]
    assert "--gpu-id 0" in commands["train"]["script"][0]
    assert "corpus/ncbi_disease/train.spacy" in commands["cnn"]["deps"]


def test_training_commands_pass_runs_py_arguments_it_takes(project_copy):
    """Every `python -m scripts.runs` line of project.yml parses, with the vars it is given."""
    import shlex

    from weasel.util import load_project_config

    overrides = {"vars.corpus": "bc5cdr", "vars.seeds": "0 1 2", "vars.run_prefix": "gemma3-", "vars.unmask": "0-3,10",
                 "vars.repeat": "1"}
    config = load_project_config(project_copy, overrides=overrides)
    parsed = {}
    for cmd in config["commands"]:
        for line in cmd["script"]:
            words = shlex.split(line)
            if words[:3] == ["python", "-m", "scripts.runs"]:
                parsed[cmd["name"]] = runs.build_parser().parse_args(words[3:])
    assert set(parsed) >= {"train", "conll03-train", "sweep-train", "sweep-plot", "cnn", "minilm"}
    train = parsed["train"]
    assert (train.corpus, train.specs, train.seeds, train.prefix) == ("bc5cdr", ["0-3,10"], ["0", "1", "2"], "gemma3-")
    assert (train.train, train.dev, train.eval) == ("auto", "auto", ["test", "test.doc"])
    assert train.force is True  # the demo retrains, although its metrics are committed
    command = " ".join(runs.train_command(train, {"out_dir": Path("m"), "name": "r", "model_dir": Path("t"), "train": "a",
                                                  "dev": "b", "seed": 0, "spec": "all", "curve": Path("m/r.log.jsonl")}))
    assert train.num_layers == -6 and "--components.ner.model.tok2vec.num_layers -6" in command
    # the accuracy recipe's repetition reaches spacy train from --vars.repeat
    assert "--components.ner.model.tok2vec.repeat 1" in command
    conll = parsed["conll03-train"]
    assert conll.corpus == "conll03" and conll.specs == ["none", "all", "middle"] and conll.seqeval
    sweep = parsed["sweep-train"]
    assert sweep.specs == ["sweep"] and sweep.delete_models
    assert train.repeat == conll.repeat == sweep.repeat == 1
    # the model scored is the one trained for the budget (model-last), so training's own
    # evaluation, at the last step, reads one dev document
    assert sweep.evaluate_model == "last" and conll.evaluate_model == "best"
    assert sweep.extra[-4:] == ["--training.eval_frequency", str(sweep.max_steps), "--corpora.dev.limit", "1"]
    assert parsed["sweep-plot"].prefix == sweep.prefix == "gemma3-"  # the plot finds the runs by spec
    assert parsed["cnn"].name == "cnn" and parsed["minilm"].python == ".venv-t4/bin/python"
    assert parsed["minilm"].extra[-2] == "--paths.minilm"
    assert parsed["cnn"].seeds == parsed["minilm"].seeds == train.seeds


def test_speed_command_runs_the_bench_with_arguments_it_takes(project_copy):
    """`speed` runs `python -m spacy_unmask bench`, and every argument it passes is one the bench accepts."""
    import argparse

    from weasel.util import load_project_config

    from spacy_unmask.bench import add_arguments

    config = load_project_config(project_copy, overrides={"vars.corpus": "ncbi_disease", "vars.run_prefix": "gemma3-"})
    speed = {cmd["name"]: cmd for cmd in config["commands"]}["speed"]
    (line,) = speed["script"]
    words = line.split()
    assert words[:4] == ["python", "-m", "spacy_unmask", "bench"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(words[4:])  # exits, failing the test, on an argument the bench lacks
    assert str(args.data) == "corpus/ncbi_disease/test.spacy" and args.data.as_posix() in speed["deps"]
    assert str(args.output) == "metrics/bench/gemma3-all-seed0-ncbi_disease.json" == speed["outputs"][0]
    assert str(args.pipeline) == "training/ncbi_disease/gemma3-all-seed0/model-best" and str(args.pipeline) in speed["deps"]


def test_conll_assets_are_checked_and_never_committed():
    raw = srsly.read_yaml(ROOT / "project.yml")
    conll = [a for a in raw["assets"] if a["dest"].startswith("assets/conll2003/")]
    assert {Path(a["dest"]).name for a in conll} == {"train.txt", "valid.txt", "test.txt"}
    for asset in conll:
        assert asset["url"].startswith("https://")
        assert len(asset["checksum"]) == 32
        assert asset["extra"] is True  # a plain `spacy project assets` leaves them alone
    ignored = (ROOT / ".gitignore").read_text().split()
    for line in ("assets/conll2003/", "assets/conll2000/", "corpus/", "training/"):
        assert line in ignored
    assert any(line.startswith(".venv") for line in ignored)


def test_shipped_corpora_have_attribution():
    for folder, files in {
        "wnut17": ["wnut17train.conll", "emerging.dev.conll", "emerging.test.annotated"],
        "ncbi_disease": ["train.tsv", "devel.tsv", "test.tsv"],
    }.items():
        attribution = (ROOT / "assets" / folder / "ATTRIBUTION.md").read_text()
        assert "CC-BY 4.0" in attribution or "Creative Commons Attribution 4.0" in attribution
        for name in files:
            assert (ROOT / "assets" / folder / name).is_file()


def test_scripts_run_as_modules_and_never_edit_the_import_path():
    for path in sorted((ROOT / "scripts").glob("*.py")) + sorted((ROOT / "research").glob("*.py")):
        assert "sys.path" not in path.read_text(encoding="utf8"), path
    for module in ("convert_corpus", "report", "seqeval_check", "runs", "timed", "copy_assets", "results"):
        module = f"scripts.{module}"
        done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0 and "usage" in done.stdout.lower(), module + done.stderr[-2000:]


# --- the `all` workflow, end to end on a tiny model ------------------------------------


def test_all_workflow_end_to_end_on_a_tiny_model(tmp_path, tiny_dirs):
    """`spacy project assets` then `spacy project run all`, as a newcomer would run it."""
    project = tmp_path / "project"
    project.mkdir()
    for part in ("project.yml", "configs", "scripts"):
        source = ROOT / part
        (shutil.copytree if source.is_dir() else shutil.copy)(source, project / part)
    shutil.copytree(ROOT / "assets" / "wnut17", project / "assets" / "wnut17")
    run = lambda *args: subprocess.run([sys.executable, "-m", "spacy", "project", *args], cwd=project,
                                       capture_output=True, text=True)
    # No ../shared beside this copy and no internet: `assets` must need neither.
    assets = run("assets", ".")
    assert assets.returncode == 0, assets.stdout + assets.stderr
    assert not (project / "assets" / "conll2003").exists()
    result = run("run", "all", ".", "--vars.model", tiny_dirs("llama", "bytelevel"), "--vars.num_layers", "0",
                 "--vars.max_steps", "4",
                 "--vars.eval_frequency", "2", "--vars.train_limit", "30", "--vars.dev_limit", "20")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    metrics = json.loads((project / "metrics" / "wnut17" / "all-seed0.json").read_text())
    assert {"ents_f", "ents_p", "ents_r", "ents_per_type", "speed"} <= set(metrics)
    assert "ents_f" in json.loads((project / "metrics" / "wnut17" / "all-seed0.doc.json").read_text())
    assert (project / "training" / "wnut17" / "all-seed0" / "model-best").is_dir()
    curve = [json.loads(line) for line in (project / "metrics" / "wnut17" / "all-seed0.log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in curve] == [0, 2, 4] and all("ents_f" in row["scores"] for row in curve)
    assert "F1" in result.stdout or "f1" in result.stdout.lower()
    trim = run("run", "trim", ".")  # a trimmed copy of the trained pipeline, beside it
    assert trim.returncode == 0, trim.stdout[-3000:] + trim.stderr[-3000:]
    trimmed = spacy_unmask.load(project / "training" / "wnut17" / "all-seed0" / "model-trimmed")
    assert spacy_unmask.get_backbone(trimmed).settings.save_embedding == "int8"
