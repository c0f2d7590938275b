"""spacy_unmask/annotate/local.py: the local engine on a tiny trained pipeline,
resuming, and refusing to resume on a changed pipeline."""
import json
import shutil
import sys
from pathlib import Path

import pytest

import spacy_unmask.annotate.local as local
from annotate_fixtures import (  # noqa: F401 (fixtures)
    GOOD_TEXTS,
    MAX_CHARS,
    check_errors,
    corpus,
    errors_of,
    expected_spans,
    nlp,
    pipeline_dir,
    spans_of,
    write_parquet_corpus,
    write_txt_corpus,
)
from spacy_unmask.__main__ import main
from spacy_unmask.annotate import (
    EXIT_BAD_RECORDS,
    EXIT_OK,
    EXIT_USAGE,
    LocalOptions,
    UsageError,
    annotate_local,
    entities,
    read_errors,
    read_output,
)
from spacy_unmask.annotate.options import load_pipeline
from forgery import read_backbone, with_digest, write_backbone
from safetensors.torch import load as load_tensors, save as save_tensors


def test_local_jsonl_good_annotated_bad_set_aside(pipeline_dir, nlp, corpus, tmp_path, capsys):
    path, good, bad, read = corpus
    output = tmp_path / "ents.jsonl"
    argv = ["annotate", pipeline_dir, str(path), str(output), "--part-size", "7", "--max-chars", str(MAX_CHARS)]
    argv.append("--keep-text")
    assert main(argv) == EXIT_BAD_RECORDS
    assert f"read {read} = written {len(good)} + errors {len(bad)}" in capsys.readouterr().out
    rows = list(read_output(output))
    assert {row["id"]: row["text"] for row in rows} == good
    got = spans_of(rows)
    assert got == expected_spans(nlp, good)
    assert sum(map(len, got.values())) >= 5, "the fixture pipeline finds too few entities to compare"
    check_errors(output, bad)
    raw = {e["id"]: e["raw"] for e in read_errors(output)}
    assert json.loads(raw["number"]) == {"id": "number", "text": 42}  # the record itself is kept
    assert "caf\\xe9" in raw["latin-1"]
    # The parts follow the input: 7 records each, the errors of a part beside it.
    assert sorted(p.name for p in output.glob("part-*")) == [f"part-{i:05d}.jsonl" for i in range(-(-read // 7))]


def test_local_all_good_exits_zero_and_scores_come_from_the_span_group(pipeline_dir, nlp, tmp_path):
    path = tmp_path / "good.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(GOOD_TEXTS)))
    output = tmp_path / "ents.jsonl"
    assert main(["annotate", pipeline_dir, str(path), str(output)]) == EXIT_OK
    rows = {row["id"]: row for row in read_output(output)}
    assert list(rows) == [str(i) for i in range(len(GOOD_TEXTS))]  # numeric ids as text
    for i, doc in enumerate(nlp.pipe(GOOD_TEXTS)):
        want = entities(doc)
        assert [(e["start_char"], e["end_char"], e["label"]) for e in rows[str(i)]["entities"]] == [
            (e.start_char, e.end_char, e.label_) for e in doc.ents
        ]
        assert [e["score"] for e in rows[str(i)]["entities"]] == pytest.approx([e["score"] for e in want])


def test_local_n_process_gives_the_same_parts(pipeline_dir, corpus, tmp_path):
    path, good, bad, _ = corpus
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    options = LocalOptions(part_size=9, max_chars=MAX_CHARS, batch_size=4, progress=False)
    annotate_local(pipeline_dir, path, one, options)
    summary = annotate_local(pipeline_dir, str(path), str(two), options, n_process=2)  # str paths, keywords win
    assert (summary.written, summary.errors) == (len(good), len(bad))
    for part in sorted(one.glob("part-*")):
        assert (two / part.name).read_bytes() == part.read_bytes()
    assert errors_of(two) == errors_of(one)


def test_parquet_without_pyarrow_names_the_extra(corpus, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed
    with pytest.raises(UsageError, match=r"spacy-unmask\[ray\]"):
        annotate_local("unused", corpus[0], tmp_path / "ents.parquet", progress=False)


class Interrupted(Exception):
    pass


def load_failing_after(n, piped):
    """local.load_pipeline, its pipe raising Interrupted after `n` docs (never if n < 0)."""
    def load(*args, **kwargs):
        loaded = load_pipeline(*args, **kwargs)
        pipe = loaded.pipe

        def counting_pipe(stream, **kw):
            if not kw.get("as_tuples"):  # Language.pipe(as_tuples=True) calls itself without
                yield from pipe(stream, **kw)
                return
            for item in pipe(stream, **kw):
                if len(piped) == n:
                    raise Interrupted
                piped.append(item[0].text)
                yield item

        loaded.pipe = counting_pipe
        return loaded

    return load


def test_resume_after_interruption_writes_no_duplicates(pipeline_dir, nlp, corpus, tmp_path, monkeypatch):
    path, good, bad, read = corpus
    output = tmp_path / "ents.jsonl"
    settings = dict(part_size=5, batch_size=4, max_chars=MAX_CHARS, progress=False)
    piped = []
    monkeypatch.setattr(local, "load_pipeline", load_failing_after(11, piped))
    with pytest.raises(Interrupted):
        annotate_local(pipeline_dir, path, output, **settings)
    first = {p.name: p.stat().st_mtime_ns for p in output.glob("part-*")}
    assert 0 < len(first) < -(-read // 5), "the interruption should leave some parts complete, some not"
    assert not list(output.glob("*.tmp")) and list(output.glob(".*.tmp")) == []  # nothing half-written shows
    done_ids = {row["id"] for row in read_output(output)}

    piped.clear()
    monkeypatch.setattr(local, "load_pipeline", load_failing_after(-1, piped))
    summary = annotate_local(pipeline_dir, path, output, **settings)
    assert (summary.read, summary.written, summary.errors) == (read, len(good), len(bad))
    assert {p.name: p.stat().st_mtime_ns for p in output.glob("part-*") if p.name in first} == first  # not rewritten
    assert sorted(piped) == sorted(text for id, text in good.items() if id not in done_ids)  # only the rest
    assert spans_of(read_output(output)) == expected_spans(nlp, good)  # each id once, all there
    check_errors(output, bad)

    # A third run has nothing left to do; other settings are refused, not mixed in.
    piped.clear()
    annotate_local(pipeline_dir, path, output, **settings)
    assert piped == []
    with pytest.raises(UsageError, match="part_size"):
        annotate_local(pipeline_dir, path, output, **{**settings, "part_size": 6})


def test_resume_refused_after_the_pipeline_was_retrained_in_place(pipeline_dir, corpus, tmp_path, capsys):
    """Retrained into the same model-best, the pipeline's path is the same: its files are not."""
    path, good, bad, read = corpus
    model = tmp_path / "training" / "model-best"
    shutil.copytree(pipeline_dir, model)
    output = tmp_path / "ents.jsonl"
    argv = ["annotate", str(model), str(path), str(output), "--part-size", "5", "--max-chars", str(MAX_CHARS)]
    assert main(argv) == EXIT_BAD_RECORDS
    parts = {p.name: p.stat().st_mtime_ns for p in output.glob("part-*")}
    capsys.readouterr()
    assert main(argv) == EXIT_BAD_RECORDS, "unchanged: the rerun resumes (nothing left to do)"
    assert {p.name: p.stat().st_mtime_ns for p in output.glob("part-*")} == parts

    # "Retrain": the decoder's weights change (a valid pipeline); config.cfg and the path stay.
    started_with = (model / "ner" / "model").read_bytes()
    backbone = read_backbone(model / "ner" / "model")
    state = load_tensors(backbone["weights"])
    name = next(k for k, v in state.items() if v.is_floating_point())
    state[name] = state[name] + 0.01
    backbone["weights"] = save_tensors(state)
    write_backbone(model / "ner" / "model", with_digest(backbone))
    capsys.readouterr()
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"PIPELINE {str(model.resolve())!r} changed since OUTPUT" in err and "two models" in err
    assert {p.name: p.stat().st_mtime_ns for p in output.glob("part-*")} == parts  # nothing written

    (model / "ner" / "model").write_bytes(started_with)  # the pipeline it was started with: allowed again
    meta = json.loads((model / "meta.json").read_text())
    (model / "meta.json").write_text(json.dumps({**meta, "description": "scores added"}))  # not the model: allowed
    assert main(argv) == EXIT_BAD_RECORDS


def test_resume_refused_after_the_model_was_swapped_through_a_link(pipeline_dir, corpus, tmp_path, capsys):
    """A component folder swapped for a link to another pipeline's is not read at all."""
    path, _, _, _ = corpus
    model, other = tmp_path / "model-best", tmp_path / "other"
    shutil.copytree(pipeline_dir, model)
    shutil.copytree(pipeline_dir, other)
    output = tmp_path / "ents.jsonl"
    argv = ["annotate", str(model), str(path), str(output), "--part-size", "5", "--max-chars", str(MAX_CHARS)]
    assert main(argv) == EXIT_BAD_RECORDS
    parts = {p.name: p.read_bytes() for p in output.glob("part-*")}
    shutil.rmtree(model / "ner")
    (model / "ner").symlink_to(other / "ner", target_is_directory=True)
    capsys.readouterr()
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "was not loaded" in err and "'ner'" in err and "symbolic link" in err
    assert {p.name: p.read_bytes() for p in output.glob("part-*")} == parts


def test_resume_refused_after_an_adapter_pipelines_base_changed(corpus, tmp_path, monkeypatch, capsys):
    """The base an adapter pipeline loads is part of what is digested: with a pinned base
    the changed base is refused when loading; without one (saved by an earlier version,
    loaded with the opt-in) the resumed run is refused."""
    from spacy_unmask.opt_ins import FETCH_BASE_ENV
    from tiny_models import make_pipeline, save_tiny_model, train_pipeline

    path, _, _, _ = corpus
    monkeypatch.setenv(FETCH_BASE_ENV, "1")
    base = save_tiny_model(tmp_path / "base", "llama", "bytelevel")
    nlp = make_pipeline(base, lora_r=4, save_mode="adapter")
    train_pipeline(nlp, 1)
    pinned, unpinned = tmp_path / "pinned", tmp_path / "unpinned"
    nlp.to_disk(pinned)
    nlp.to_disk(unpinned)
    backbone = read_backbone(unpinned / "ner" / "model")
    del backbone["base"]
    write_backbone(unpinned / "ner" / "model", backbone)
    runs = {}
    for pipeline in (pinned, unpinned):
        runs[pipeline] = ["annotate", str(pipeline), str(path), str(tmp_path / f"{pipeline.name}.jsonl"),
                          "--max-chars", str(MAX_CHARS)]
        assert main(runs[pipeline]) == EXIT_BAD_RECORDS
        assert main(runs[pipeline]) == EXIT_BAD_RECORDS, "unchanged: the rerun resumes"

    other = save_tiny_model(tmp_path / "other-base", "llama", "bytelevel", seed=1)
    shutil.copy(Path(other) / "model.safetensors", Path(base) / "model.safetensors")
    capsys.readouterr()
    assert main(runs[pinned]) == EXIT_USAGE
    assert "SHA-256" in capsys.readouterr().err
    assert main(runs[unpinned]) == EXIT_USAGE
    assert "changed since OUTPUT" in capsys.readouterr().err


def test_parquet_and_txt_input_parquet_and_docbin_output(pipeline_dir, nlp, corpus, tmp_path):
    _, good, _, _ = corpus
    want = expected_spans(nlp, good)
    parquet = tmp_path / "corpus.parquet"
    write_parquet_corpus(parquet, good)
    output = tmp_path / "ents.parquet"
    summary = annotate_local(
        pipeline_dir, parquet, output, text_field="body", id_field="key", part_size=8, progress=False
    )
    assert (summary.read, summary.written, summary.errors) == (len(good) + 2, len(good), 2)
    assert spans_of(read_output(output)) == want
    n = len(good)
    assert [(e[0], e[1]) for e in errors_of(output)] == [("bad-bytes", n + 2), ("null-text", n + 1)]

    # Without an id column the row number is the id.
    write_parquet_corpus(parquet, good, with_ids=False)
    output = tmp_path / "by-row.parquet"
    annotate_local(pipeline_dir, parquet, output, text_field="body", progress=False)
    assert spans_of(read_output(output)) == {str(i): want[id] for i, id in enumerate(good, start=1)}

    folder = tmp_path / "texts"
    texts = write_txt_corpus(folder, good)
    output = tmp_path / "ents.spacy"
    summary = annotate_local(pipeline_dir, folder, output, progress=False)
    assert (summary.read, summary.written, summary.errors) == (len(texts) + 1, len(texts), 1)
    rows = list(read_output(output))
    assert {row["id"]: row["text"] for row in rows} == texts
    by_text = {good[id]: spans for id, spans in want.items()}
    assert spans_of(rows) == {name: by_text[text] for name, text in texts.items()}
    assert [e[0] for e in errors_of(output)] == ["bad.txt"]
    # Ids that look like paths stay inside rows: the files are the generated parts only.
    assert sorted(p.relative_to(output).as_posix() for p in output.rglob("*")) == [
        "_errors", "_errors/part-00000.jsonl", "_run.json", "part-00000.spacy"
    ]


def test_quantize_int8_writes_the_same_records_format(pipeline_dir, tmp_path):
    path = tmp_path / "good.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(GOOD_TEXTS)))
    full, int8 = tmp_path / "full.jsonl", tmp_path / "int8.jsonl"
    assert main(["annotate", pipeline_dir, str(path), str(full)]) == EXIT_OK
    assert main(["annotate", pipeline_dir, str(path), str(int8), "--quantize", "int8"]) == EXIT_OK
    rows_full, rows_int8 = list(read_output(full)), list(read_output(int8))
    assert [r["id"] for r in rows_int8] == [r["id"] for r in rows_full]
    for a, b in zip(rows_full, rows_int8):
        assert set(a) == set(b)
        assert all(set(e) == set(f) for e in a["entities"] for f in b["entities"])
    # the run record says int8, so a resume without it is refused rather than mixing parts
    assert json.loads((int8 / "_run.json").read_text())["quantize"] == "int8"
    assert main(["annotate", pipeline_dir, str(path), str(int8), "--quantize", "none"]) == EXIT_USAGE
