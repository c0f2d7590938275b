"""The spacy project (project.yml) and its data/report scripts, on tiny inputs (seconds)."""
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import srsly

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"project_script_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


convert_corpus = load_script("convert_corpus")
report = load_script("report")
timed = load_script("timed")
copy_assets = load_script("copy_assets")
runs = load_script("runs")
length_probe = load_script("length_probe")


def read_docs(path):
    import spacy
    from spacy.tokens import DocBin

    return list(DocBin().from_disk(path).get_docs(spacy.blank("en").vocab))


def iob2(doc):
    return [t.ent_iob_ + ("-" + t.ent_type_ if t.ent_type_ else "") for t in doc]


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


def test_project_vars_override(project_copy):
    from weasel.util import load_project_config

    config = load_project_config(project_copy, overrides={"vars.corpus": "ncbi_disease", "vars.gpu_id": 0})
    commands = {cmd["name"]: cmd for cmd in config["commands"]}
    assert "preset ncbi_disease corpus/ncbi_disease" in commands["convert"]["script"][0]
    assert "--gpu-id 0" in commands["train"]["script"][0]
    assert "corpus/ncbi_disease/train.spacy" in commands["cnn"]["deps"]


def test_training_commands_pass_runs_py_arguments_it_takes(project_copy):
    """Every `scripts/runs.py` line of project.yml parses, with the vars it is given."""
    import shlex

    from weasel.util import load_project_config

    overrides = {"vars.corpus": "bc5cdr", "vars.seeds": "0 1 2", "vars.run_prefix": "gemma3-", "vars.unmask": "0-3,10",
                 "vars.repeat": "1"}
    config = load_project_config(project_copy, overrides=overrides)
    parsed = {}
    for cmd in config["commands"]:
        for line in cmd["script"]:
            words = shlex.split(line)
            if words[:2] == ["python", "scripts/runs.py"]:
                parsed[cmd["name"]] = runs.build_parser().parse_args(words[2:])
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


# --- convert_corpus.py ---------------------------------------------------------------

WNUT_LIKE = (
    "@user\tO\nloves\tO\nNew\tB-location\nYork\tI-location\n\t\n"  # a lone tab separates, as in WNUT-17 train
    "Star\tB-creative-work\nWars\tI-creative-work\nrocks\tO\n\n"
    "nothing\tO\n\n\n"
    "Bob\tB-person\n"
)
CONLL_LIKE = (
    "-DOCSTART- -X- -X- O\n\n"
    "EU NNP B-NP B-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP B-MISC\n\n"
    "Peter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n\n"
    "-DOCSTART- -X- -X- O\n\n"
    "BRUSSELS NNP B-NP B-LOC\n"
)


def test_convert_tab_file(tmp_path, capsys):
    src = tmp_path / "train.conll"
    src.write_text(WNUT_LIKE, encoding="utf8")
    stats = convert_corpus.convert_file(src, tmp_path / "out.spacy", token_col=0, tag_col=1, sep="tab")
    assert stats["docs"] == 4 and stats["tokens"] == 9 and stats["entities"] == 3
    assert stats["per_type"] == {"creative-work": 1, "location": 1, "person": 1}
    assert "4 docs" in capsys.readouterr().out
    docs = read_docs(tmp_path / "out.spacy")
    assert [t.text for t in docs[0]] == ["@user", "loves", "New", "York"]
    assert iob2(docs[0]) == ["O", "O", "B-location", "I-location"]
    assert [(e.text, e.label_) for e in docs[1].ents] == [("Star Wars", "creative-work")]
    assert docs[2].ents == () and iob2(docs[2]) == ["O"]


def test_convert_limit_and_docstart(tmp_path):
    src = tmp_path / "train.txt"
    src.write_text(CONLL_LIKE, encoding="utf8")
    stats = convert_corpus.convert_file(
        src, tmp_path / "all.spacy", token_col=0, tag_col=3, sep="whitespace", docstart=True, quiet=True
    )
    assert stats["docs"] == 3 and stats["per_type"] == {"LOC": 1, "MISC": 1, "ORG": 1, "PER": 1}
    stats = convert_corpus.convert_file(
        src, tmp_path / "two.spacy", token_col=0, tag_col=3, sep="whitespace", docstart=True, limit=2, quiet=True
    )
    assert stats["docs"] == 2
    docs = read_docs(tmp_path / "two.spacy")
    assert [e.text for e in docs[1].ents] == ["Peter Blackburn"]
    assert "-DOCSTART-" not in [t.text for d in docs for t in d]


def test_convert_rejects_bad_input_and_counts_iob2_errors(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("word\tB-PER\nnext\tX-PER\n", encoding="utf8")
    with pytest.raises(ValueError, match="not an IOB tag"):
        convert_corpus.convert_file(bad, tmp_path / "bad.spacy", sep="tab", quiet=True)
    short = tmp_path / "short.tsv"
    short.write_text("word\n", encoding="utf8")
    with pytest.raises(ValueError, match="column"):
        convert_corpus.convert_file(short, tmp_path / "short.spacy", tag_col=1, sep="tab", quiet=True)
    loose = tmp_path / "loose.tsv"
    loose.write_text("a\tO\nb\tI-PER\nc\tI-LOC\n", encoding="utf8")
    stats = convert_corpus.convert_file(loose, tmp_path / "loose.spacy", sep="tab", quiet=True)
    assert stats["invalid_iob2"] == 2 and stats["entities"] == 2  # read as starts, like spaCy's converters


def write_preset_files(root, corpus, text):
    """The three split files of a preset corpus under root/assets, each holding `text`."""
    preset = convert_corpus.PRESETS[corpus]
    folder = root / preset.directory
    folder.mkdir(parents=True)
    for name in preset.splits.values():
        (folder / name).write_text(text, encoding="utf8")
    return root / "corpus"


def test_convert_preset_and_cli(tmp_path):
    out = write_preset_files(tmp_path, "wnut17", WNUT_LIKE)
    code = convert_corpus.main(["preset", "wnut17", str(out), "--limit", "1", "--dev-limit", "2", "--root", str(tmp_path)])
    assert code == 0
    assert [len(read_docs(out / f"{s}.spacy")) for s in ("train", "dev", "test")] == [1, 2, 4]
    with pytest.raises(SystemExit, match="copy-conll"):
        convert_corpus.convert_preset("conll03", out, root=tmp_path, quiet=True)
    assert not (out / "train.mix.spacy").exists()  # tweets: the documents are the sentences


def test_convert_preset_writes_sentences_documents_and_their_mix(tmp_path):
    out = write_preset_files(tmp_path, "conll03", CONLL_LIKE)
    convert_corpus.convert_preset("conll03", out, root=tmp_path, quiet=True)
    sentences, articles = read_docs(out / "train.spacy"), read_docs(out / "train.doc.spacy")
    assert (len(sentences), len(articles)) == (3, 2)
    mix = read_docs(out / "train.mix.spacy")
    assert [d.text for d in mix] == [d.text for d in sentences + articles]
    assert [[(e.text, e.label_) for e in d.ents] for d in mix] == [
        [(e.text, e.label_) for e in d.ents] for d in sentences + articles
    ]
    assert [t.is_sent_start for t in mix[3]] == [True, False, False, True, False]


# --- timed.py, report.py -------------------------------------------------------------


def test_timed_writes_sidecar(tmp_path):
    sidecar = tmp_path / "run.train.json"
    assert timed.main(["--output", str(sidecar), "--", "python", "-c", "x = bytearray(10_000_000)"]) == 0
    info = json.loads(sidecar.read_text())
    assert info["returncode"] == 0 and info["wall_s"] > 0 and info["peak_rss_mib"] > 5
    assert info["command"][0] == sys.executable
    # The sidecar says whether dtype "auto" trained in bfloat16 on this machine.
    import torch

    from spacy_unmask.backbone import bf16_supported

    if not torch.cuda.is_available():
        assert info["machine"]["cpu_bf16"] == bf16_supported() and info["machine"]["cores"] >= 1
    failed = tmp_path / "failed.train.json"
    assert timed.main(["--output", str(failed), "--", "python", "-c", "raise SystemExit(3)"]) == 3
    assert not failed.exists()


def write_metrics(path, f, p, r, per_type, speed=1234.5):
    path.write_text(json.dumps({"token_acc": 1.0, "ents_p": p, "ents_r": r, "ents_f": f, "speed": speed,
                                "ents_per_type": per_type}))


def test_report(tmp_path, capsys):
    corpus = tmp_path / "metrics" / "wnut17"
    corpus.mkdir(parents=True)
    write_metrics(corpus / "cnn.json", 0.25, 0.5, 1 / 6, {"person": {"p": 0.5, "r": 0.2, "f": 0.3}})
    write_metrics(corpus / "all.json", 0.5, 0.6, 0.4, {"person": {"p": 0.6, "r": 0.5, "f": 0.55},
                                                       "product": {"p": 0.1, "r": 0.1, "f": 0.1}})
    (corpus / "all.train.json").write_text(json.dumps({"wall_s": 3725.0, "peak_rss_mib": 3072.0}))
    (corpus / "all.seqeval.json").write_text(json.dumps({"seqeval_f1": 0.5}))
    write_metrics(corpus / "all.doc.json", 0.45, 0.5, 0.4, {})
    (corpus / "notes.json").write_text("[1, 2]")  # not a metrics file: ignored
    for seed, (f, doc_f) in enumerate([(0.8, 0.7), (0.9, 0.75), (0.85, 0.8)], start=1):
        write_metrics(corpus / f"gemma3-all-seed{seed}.json", f, f, f, {})
        write_metrics(corpus / f"gemma3-all-seed{seed}.doc.json", doc_f, doc_f, doc_f, {})
        (corpus / f"gemma3-all-seed{seed}.train.json").write_text(json.dumps({"wall_s": 600.0 * seed}))
        curve = [{"step": step, "scores": {"ents_f": 60.0 + 10 * seed * step / 100}} for step in (0, 50, 100)]
        (corpus / f"gemma3-all-seed{seed}.log.jsonl").write_text("\n".join(map(json.dumps, curve)) + "\nnot json\n")
    write_metrics(corpus / "gemma3-none-seed0.json", 0.7, 0.7, 0.7, {})  # one seed, no document run
    bench = tmp_path / "metrics" / "bench"
    bench.mkdir()
    (bench / "smollm2.json").write_text(json.dumps({"pipeline_words_per_s": 500.0}))  # no runs: no table
    assert report.main([str(tmp_path / "metrics")]) == 0
    assert not (bench / "SUMMARY.md").exists()
    summary = (corpus / "SUMMARY.md").read_text()
    assert summary == capsys.readouterr().out.rstrip("\n") + "\n"
    rows = [line for line in summary.splitlines() if line.startswith("| all ") or line.startswith("| cnn ")]
    assert rows[0] == "| all | 50.00 | 60.00 | 40.00 | 45.00 | 50.00 | 1,234 | 1h 02m | 3.00 GiB |"
    assert rows[1] == "| cnn | 25.00 | 50.00 | 16.67 | – | – | 1,234 | – | – |"
    assert "| all | 55.00 | 10.00 |" in summary and "| cnn | 30.00 | – |" in summary
    assert "notes" not in summary
    seeds = json.loads((corpus / "summary.json").read_text())
    assert seeds == {
        "gemma3-none": {"mean_f": 70.0, "std_f": None, "seeds": [0], "f": [70.0],  # one seed: no spread
                        "doc_mean_f": None, "doc_std_f": None, "train_minutes": None, "dev_best_f": None},
        "gemma3-all": {"mean_f": 85.0, "std_f": 5.0, "seeds": [1, 2, 3], "f": [80.0, 90.0, 85.0],
                       "doc_mean_f": 75.0, "doc_std_f": 5.0, "train_minutes": 20.0, "dev_best_f": 80.0},
    }
    assert "| gemma3-all | 3 | 85.00 ± 5.00 | 75.00 ± 5.00 | 80.00 | 20 min |" in summary
    assert "| gemma3-none | 1 | 70.00 | – | – | – |" in summary  # one seed: no spread shown
    assert (corpus / "curves.png").stat().st_size > 1000 and "(curves.png)" in summary
    assert "Span-level scores on test " in summary and "Over seeds (test F1" in summary
    assert report.main([str(corpus), "--split", "dev", "--no-write"]) == 0  # runs scored on dev say so
    dev_summary = capsys.readouterr().out
    assert "Span-level scores on dev " in dev_summary and "Over seeds (dev F1" in dev_summary
    assert "test" not in dev_summary.split("| run |")[0]
    assert "| gemma3-all − gemma3-none > 3 sd, sentences | 85.00 vs 70.00 | +15.00 | 15.00 | not judged (3 / 1 seeds) |" in summary
    assert "| gemma3-all > cnn, sentences | 85.00 vs 25.00 | +60.00 | 0.00 | met |" in summary
    assert "gemma3-all > cnn, documents" not in summary  # the baseline was not read as documents
    assert report.order(["cnn", "gemma3-all", "all", "groups-0011", "gemma3-none", "none"]) == [
        "none", "all", "gemma3-none", "gemma3-all", "groups-0011", "cnn"]
    assert report.order(["cnn-seed0", "gemma3-all-seed10", "gemma3-all-seed2", "minilm-seed0", "gemma3-none-seed0"]) == [
        "gemma3-none-seed0", "gemma3-all-seed2", "gemma3-all-seed10", "cnn-seed0", "minilm-seed0"]


def test_report_goals_judge_gaps_against_the_spread_over_seeds():
    def row(mean, std, n, doc=None):
        return {"mean_f": mean, "std_f": std, "seeds": list(range(n)), "doc_mean_f": doc,
                "doc_std_f": None if doc is None else std}

    runs = {"minilm": {"metrics": {"ents_f": 0.9}, "doc": None}}
    seeds = {"x-none": row(80.0, 1.0, 3, doc=88.0), "x-all": row(90.0, 2.0, 3, doc=93.0), "cnn": row(91.0, 0.5, 2)}
    rows = report.comparisons(runs, seeds)
    # sentences: +10 > 3 x max(2, 1); documents: +5 < 6; below the CNN, above MiniLM (90 vs 90 is not above)
    assert rows == [
        "| x-all − x-none > 3 sd, sentences | 90.00 vs 80.00 | +10.00 | 6.00 | met |",
        "| x-all > cnn, sentences | 90.00 vs 91.00 | -1.00 | 0.00 | missed |",
        "| x-all > minilm, sentences | 90.00 vs 90.00 | +0.00 | 0.00 | missed |",
        "| x-all − x-none > 3 sd, documents | 93.00 vs 88.00 | +5.00 | 6.00 | missed |",
    ]
    assert report.comparisons(runs, {"all": row(90.0, 0.0, 1)})[0] == "| all − none > 3 sd, sentences | 90.00 vs – | | | no causal run |"
    assert report.comparisons(runs, {"x-none": row(80.0, 1.0, 3)}) == []  # no unmasked run: no goal
    one_each = report.comparisons({}, {"x-none": row(80.0, 0.0, 1), "x-all": row(90.0, 0.0, 1)})
    assert one_each[0] == "| x-all − x-none > 3 sd, sentences | 90.00 vs 80.00 | +10.00 | – | not judged (1 / 1 seeds) |"


# --- seqeval_check.py ----------------------------------------------------------------


def ruler_pipeline(path, patterns):
    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns(patterns)
    nlp.to_disk(path)


def gold_docbin(path, sentences, with_spaces):
    import spacy
    from spacy.tokens import Doc, DocBin
    from spacy.training import biluo_tags_to_spans, iob_to_biluo

    vocab = spacy.blank("en").vocab
    docbin = DocBin()
    for words, tags in sentences:
        spaces = [True] * (len(words) - 1) + [False] if with_spaces else None
        doc = Doc(vocab, words=words, spaces=spaces)
        doc.ents = biluo_tags_to_spans(doc, iob_to_biluo(tags))
        docbin.add(doc)
    docbin.to_disk(path)


SENTENCES = [
    (["Alice", "met", "Bob", "in", "Paris", "."], ["B-PER", "O", "B-PER", "O", "B-LOC", "O"]),
    (["Acme", "Corp", "don't", "care"], ["B-ORG", "I-ORG", "B-PER", "O"]),
    (["Paris", "Hilton", "sings"], ["B-PER", "I-PER", "O"]),
    (["nothing", "here"], ["O", "O"]),
]


@pytest.mark.parametrize("with_spaces", [False, True])
def test_seqeval_check_agrees_with_spacy_evaluate(tmp_path, with_spaces):
    from spacy.cli.evaluate import evaluate

    seqeval_check = load_script("seqeval_check")
    # "n't" is only part of the gold token "don't" once spaCy's tokenizer re-splits the text
    # (with_spaces): spaCy's scorer maps it onto the whole gold token, and so must the check.
    ruler_pipeline(tmp_path / "model", [
        {"label": "PER", "pattern": "Alice"}, {"label": "LOC", "pattern": "Bob"},
        {"label": "LOC", "pattern": "Paris"}, {"label": "ORG", "pattern": [{"LOWER": "acme"}, {"LOWER": "corp"}]},
        {"label": "PER", "pattern": [{"ORTH": "n't"}]},
    ])
    gold_docbin(tmp_path / "test.spacy", SENTENCES, with_spaces)
    metrics = tmp_path / "run.json"
    scores = evaluate(str(tmp_path / "model"), tmp_path / "test.spacy", output=metrics)
    assert 0 < scores["ents_f"] < 1
    code = seqeval_check.main([str(tmp_path / "model"), str(tmp_path / "test.spacy"), "--metrics", str(metrics)])
    assert code == 0
    result = json.loads((tmp_path / "run.seqeval.json").read_text())
    assert result["agree"] and result["docs"] == 4
    assert abs(result["seqeval_f1"] - scores["ents_f"]) < 1e-9
    assert set(result["seqeval_per_type"]) == {"PER", "LOC", "ORG"}


def test_seqeval_check_reports_disagreement(tmp_path):
    seqeval_check = load_script("seqeval_check")
    # Two predictions inside one gold token cannot both be written as IOB2: spaCy counts
    # both, seqeval only one, and the check must say so rather than pass.
    ruler_pipeline(tmp_path / "model", [{"label": "LOC", "pattern": [{"ORTH": "do"}]},
                                        {"label": "PER", "pattern": [{"ORTH": "n't"}]}])
    gold_docbin(tmp_path / "test.spacy", SENTENCES, with_spaces=True)
    result = seqeval_check.check(str(tmp_path / "model"), tmp_path / "test.spacy")
    assert not result["agree"] and result["overlapping_predictions_dropped"] == 1


# --- runs.py, copy_assets.py --------------------------------------------------------


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
                        "--prefix", "g-", "--max-steps", "5", "--model", "tiny", "--seqeval")
    assert code == 0
    for name in ("g-middle-seed7", "g-0-3_10-seed7", "g-middle-seed8", "g-0-3_10-seed8"):
        assert f"] {name}: " in out
    assert "--components.ner.model.tok2vec.unmask 0-3,10" in out and "--system.seed 8" in out
    assert "--components.ner.model.tok2vec.name tiny" in out and "--training.max_steps 5" in out
    assert "g-middle-seed7.log.jsonl" in out and "g-middle-seed7.doc.json" in out
    assert "seqeval_check.py" in out
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


def test_copy_assets(tmp_path):
    shared = tmp_path / "shared" / "toy"
    shared.mkdir(parents=True)
    (shared / "a.txt").write_text("hello\n")
    project = tmp_path / "project"
    project.mkdir()
    checksum = copy_assets.md5(shared / "a.txt")
    srsly.write_yaml(project / "project.yml", {"assets": [{"dest": "assets/toy/a.txt", "url": "https://example.invalid/a.txt",
                                                           "checksum": checksum}]})
    args = ["--shared", str(tmp_path / "shared"), "--only", "assets/toy", "--project-dir", str(project)]
    assert copy_assets.main(args) == 0
    assert (project / "assets" / "toy" / "a.txt").read_text() == "hello\n"
    assert copy_assets.fetch(copy_assets.load_assets(project)[0], project, None) == "present"
    (project / "assets" / "toy" / "a.txt").write_text("changed\n")
    (shared / "a.txt").write_text("changed too\n")
    assert copy_assets.main(args) == 1  # checksum mismatch is an error
    assert copy_assets.main(["--only", "assets/none", "--project-dir", str(project)]) == 0


def test_scripts_run_as_commands():
    for name in ("convert_corpus", "report", "seqeval_check", "runs", "timed", "copy_assets"):
        done = subprocess.run([sys.executable, str(SCRIPTS / f"{name}.py"), "--help"], capture_output=True, text=True)
        assert done.returncode == 0 and "usage" in done.stdout.lower(), name


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


def test_convert_groups_sentences_into_documents_keeping_sentence_starts(tmp_path):
    from spacy.tokens import DocBin
    from spacy.vocab import Vocab

    source = tmp_path / "c.txt"
    source.write_text(
        "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\nPeter NNP B-NP B-PER\n"
        "Blackburn NNP I-NP I-PER\n\n-DOCSTART- -X- -X- O\n\nBRUSSELS NNP B-NP B-LOC\n\n"
    )
    common = dict(token_col=0, tag_col=3, sep="whitespace", docstart=True, quiet=True)
    stats = convert_corpus.convert_file(source, tmp_path / "docs.spacy", group="docs", **common)
    assert (stats["docs"], stats["sentences"]) == (2, 3)
    first, second = DocBin().from_disk(tmp_path / "docs.spacy").get_docs(Vocab())
    assert [t.text for t in first] == ["EU", "rejects", "Peter", "Blackburn"]
    assert [s.text for s in first.sents] == ["EU rejects", "Peter Blackburn"]
    assert [(e.text, e.label_) for e in first.ents] == [("EU", "ORG"), ("Peter Blackburn", "PER")]
    assert [t.text for t in second] == ["BRUSSELS"]
    assert convert_corpus.convert_file(source, tmp_path / "two.spacy", group="2", **common)["docs"] == 2
    assert convert_corpus.convert_file(source, tmp_path / "one.spacy", **common)["docs"] == 3
    with pytest.raises(ValueError, match="group 'articles'"):
        convert_corpus.convert_file(source, tmp_path / "bad.spacy", group="articles", **common)


# --- length_probe.py: where the errors sit -------------------------------------------


def one_piece_per_word(text, add_special_tokens=False, return_offsets_mapping=True):
    import re

    offsets = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    return {"input_ids": list(range(len(offsets))), "offset_mapping": offsets}


def test_length_probe_distance_buckets():
    assert [length_probe.bucket(d) for d in (-1, 0, 1, 2, 3, 4, 7, 8, 63, 64, 500)] == [
        "uncut", "0", "1", "2-3", "2-3", "4-7", "4-7", "8-15", "32-63", "64+", "64+"
    ]


def test_length_probe_distance_from_window_cuts_and_sentence_edges():
    from spacy.tokens import Doc
    from spacy.vocab import Vocab

    words = ["a", "b", "c", "d", "e", "f", "g", "h"]
    doc = Doc(Vocab(), words=words, sent_starts=[True, False, False, True, False, False, False, False])
    # windows of 4 pieces every 2: [0-3] [2-5] [4-7]; each piece reads from the window where it
    # sits furthest from an edge, and the doc's own start and end are no cuts
    cut = length_probe.window_cut_distance(doc, one_piece_per_word, window=4, stride=2)
    assert cut.tolist() == [3, 2, 1, 1, 1, 1, 2, 3]
    assert length_probe.window_cut_distance(doc, one_piece_per_word, window=8, stride=4).tolist() == [-1] * 8
    assert length_probe.sentence_edge_distance(doc).tolist() == [0, 1, 0, 0, 1, 2, 1, 0]


def test_length_probe_error_rates_count_wrong_tags_per_bucket():
    from spacy.tokens import Doc, Span
    from spacy.training import Example
    from spacy.vocab import Vocab

    vocab = Vocab()
    words = ["Peter", "Blackburn", "visited", "Brussels"]
    reference = Doc(vocab, words=words, ents=["B-PER", "I-PER", "O", "B-LOC"])
    predicted = Doc(vocab, words=words)
    predicted.ents = [Span(predicted, 1, 2, label="PER"), Span(predicted, 3, 4, label="ORG")]
    rates = length_probe.error_rates([Example(predicted, reference)], [[0, 1, 1, -1]])
    assert rates == {
        "uncut": {"tokens": 1, "errors": 1, "rate": 1.0},  # LOC read as ORG
        "0": {"tokens": 1, "errors": 1, "rate": 1.0},  # Peter missed
        "1": {"tokens": 2, "errors": 1, "rate": 0.5},  # Blackburn begins the entity instead of continuing it
    }


def test_length_probe_scores_and_locates_errors_of_any_pipeline(tmp_path):
    """A rule-based pipeline that finds every entity but one: F1 and the error rates say so."""
    import spacy

    source = tmp_path / "c.txt"
    source.write_text(CONLL_LIKE, encoding="utf8")
    convert_corpus.convert_file(source, tmp_path / "docs.spacy", token_col=0, tag_col=3, sep="whitespace",
                                docstart=True, group="docs", quiet=True)
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("entity_ruler")
    ruler.add_patterns([{"label": "ORG", "pattern": "EU"}, {"label": "MISC", "pattern": "German"},
                        {"label": "PER", "pattern": [{"ORTH": "Peter"}, {"ORTH": "Blackburn"}]}])  # BRUSSELS missed
    nlp.to_disk(tmp_path / "ruler")
    output = tmp_path / "probe.json"
    assert length_probe.main([str(tmp_path / "ruler"), str(tmp_path / "docs.spacy"), "--groups", "1,doc",
                              "--output", str(output)]) == 0
    result = json.loads(output.read_text())
    assert result["settings"] is None  # not a spacy-unmask pipeline: no windows
    for group in ("1", "doc"):
        row = result["groups"][group]
        assert (row["ents_p"], row["ents_r"]) == (100.0, 75.0)
        assert "errors_by_window_cut" not in row
        errors = row["errors_by_sentence_edge"]
        assert sum(b["tokens"] for b in errors.values()) == 6
        assert errors["0"]["errors"] == 1 and sum(b["errors"] for b in errors.values()) == 1  # BRUSSELS, alone
