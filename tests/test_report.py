"""scripts/report.py: metrics/<corpus>/SUMMARY.md and summary.json."""
import json

from scripts import report


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
        "split": "test",  # what the runs were scored on
        "gemma3-none": {"mean_f": 70.0, "std_f": None, "seeds": [0], "f": [70.0],  # one seed: no spread
                        "doc_mean_f": None, "doc_std_f": None, "train_minutes": None, "dev_best_f": None},
        "gemma3-all": {"mean_f": 85.0, "std_f": 5.0, "seeds": [1, 2, 3], "f": [80.0, 90.0, 85.0],
                       "doc_mean_f": 75.0, "doc_std_f": 5.0, "train_minutes": 20.0, "dev_best_f": 80.0},
    }
    assert "| gemma3-all | 3 | 85.00 ± 5.00 | 75.00 ± 5.00 | 80.00 | 20 min |" in summary
    assert "| gemma3-none | 1 | 70.00 | – | – | – |" in summary  # one seed: no spread shown
    assert (corpus / "curves.png").stat().st_size > 1000 and "(curves.png)" in summary
    assert "Span-level scores on test " in summary and "Over seeds (test F1" in summary
    assert report.main([str(tmp_path / "metrics"), "--check"]) == 0
    write_metrics(corpus / "gemma3-none-seed1.json", 0.72, 0.72, 0.72, {})  # a new run, no report written
    assert report.main([str(tmp_path / "metrics"), "--check"]) == 1
    assert "stale: " in capsys.readouterr().err
    assert json.loads((corpus / "summary.json").read_text()) == seeds  # --check wrote nothing
    (corpus / "gemma3-none-seed1.json").unlink()
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


def test_the_headline_score_is_ner_then_a_span_group_then_tagging():
    chunks = {"spans_chunks_f": 0.9, "spans_chunks_p": 0.8, "spans_chunks_r": 1.0,
              "spans_chunks_per_type": {"NP": {"f": 0.95}}, "tag_acc": 0.97}
    assert report.main_score(chunks) == 0.9 and report.main_score(chunks, "p") == 0.8
    assert report.per_type(chunks) == {"NP": {"f": 0.95}}
    assert report.main_score({"ents_f": 0.5, **chunks}) == 0.5
    assert report.main_score({"tag_acc": 0.97}) == 0.97 and report.main_score({"tag_acc": 0.97}, "p") is None
    assert report.main_score({"speed": 100}) is None


def test_the_summary_names_the_task_its_runs_label(tmp_path):
    def summary(name, metrics):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "all-seed0.json").write_text(json.dumps(metrics))
        return report.summarize(folder)

    chunks = summary("chunk", {"spans_chunks_f": 0.9, "spans_chunks_per_type": {"NP": {"f": 0.95}}})
    assert chunks.startswith('# chunk: results of doc.spans["chunks"]') and "F1 per label:" in chunks
    assert "| all-seed0 | 90.00 |" in chunks
    tags = summary("pos", {"tag_acc": 0.97})
    assert tags.startswith("# pos: part-of-speech results") and "Token accuracy" in tags
    assert "| all-seed0 | 97.00 |" in tags
    ner = summary("ner", {"ents_f": 0.5, "spans_chunks_f": 0.9, "ents_per_type": {"PER": {"f": 0.5}}})
    assert ner.startswith("# ner: NER results") and "F1 per entity type:" in ner
    # the seqeval note only where a run was checked with seqeval
    assert "seqeval F1:" not in tags and "seqeval F1:" not in ner
    (tmp_path / "ner" / "all-seed0.seqeval.json").write_text(json.dumps({"seqeval_f1": 0.5}))
    assert "seqeval F1: strict IOB2" in report.summarize(tmp_path / "ner")


def test_a_curve_read_on_a_cut_dev_set_gives_no_best_dev_score(tmp_path):
    for name, command in (("whole-seed1", ["spacy", "train"]),
                          ("cut-seed1", ["spacy", "train", "--corpora.dev.limit", "1"])):
        write_metrics(tmp_path / f"{name}.json", 0.8, 0.8, 0.8, {})
        (tmp_path / f"{name}.train.json").write_text(json.dumps({"wall_s": 60.0, "command": command}))
        (tmp_path / f"{name}.log.jsonl").write_text(json.dumps({"step": 10, "scores": {"ents_f": 90.0}}))
    seeds = report.seed_summary(report.load_runs(tmp_path))
    assert seeds["whole"]["dev_best_f"] == 90.0 and seeds["cut"]["dev_best_f"] is None
