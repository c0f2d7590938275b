"""`python -m spacy_unmask annotate` (issue #15): both engines on a tiny trained pipeline.

The pipeline is a tiny random Llama-style decoder trained for a few steps, so its
entities are arbitrary but deterministic. The Ray tests share one local Ray (2 CPUs).
"""
import io
import json
from pathlib import Path

import pytest
import spacy
from spacy.tokens import Doc, Span, SpanGroup
from spacy.training import Example
from spacy.util import fix_random_seed
from thinc.api import Adam

from spacy_unmask.__main__ import main
from spacy_unmask.annotate import (
    EXIT_BAD_RECORDS,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    annotate_local,
    entities,
    jsonl_records,
    read_errors,
    read_output,
)
from tiny_models import save_tiny_model

TRAIN = [
    (
        "Peter Blackburn visited the European Commission in Brussels on Monday .",
        [("Peter Blackburn", "PER"), ("European Commission", "ORG"), ("Brussels", "LOC")],
    ),
    ("EU rejects German call to boycott British lamb .", [("EU", "ORG")]),
    (
        "The capital of Germany is Berlin , and Paris is the capital of France .",
        [("Germany", "LOC"), ("Berlin", "LOC"), ("Paris", "LOC"), ("France", "LOC")],
    ),
]
GOOD_TEXTS = [
    "Peter Blackburn visited Brussels on Monday .",
    "EU rejects German call to boycott British lamb .",
    "Paris is the capital of France , and Berlin of Germany .",
    "",
    "Emoji 😀 , CJK 東京 , line\u2028separator and Brussels .",
    "The European Commission said the ban would last .",
]
# (raw JSONL line, expected id, what the reason says)
BAD_LINES = [
    (b'{"id": "cut", "text": "Peter', "{line}", "not JSON"),
    (b'{"id": "no-text", "body": "Berlin"}', "no-text", "missing"),
    (b'{"id": "null-text", "text": null}', "null-text", "missing"),
    (b'{"id": "number", "text": 42}', "number", "not a string"),
    (b'{"id": "latin-1", "text": "caf\xe9 in Paris"}', "latin-1", "UTF-8"),
    (b'{"id": "surrogate", "text": "a \\ud800 b"}', "surrogate", "surrogate"),
    (b'["an", "array"]', "{line}", "not a JSON object"),
    (b'{"id": "too-long", "text": "' + b"x" * 300 + b'"}', "too-long", "--max-chars"),
]
MAX_CHARS = 200


@pytest.fixture(scope="module")
def pipeline_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("annotate")
    fix_random_seed(0)
    model = save_tiny_model(root / "model", "llama", "bytelevel")
    nlp = spacy.blank("en")
    tok2vec = {"name": model, "unmask": "all", "dtype": "float32", "lora_r": 4, "lora_alpha": 4}
    nlp.add_pipe("unmask_ner", name="ner", config={"model": {"tok2vec": tok2vec}})
    egs = []
    for text, ents in TRAIN:
        spans = [(text.index(s), text.index(s) + len(s), label) for s, label in ents]
        egs.append(Example.from_dict(nlp.make_doc(text), {"entities": spans}))
    nlp.initialize(lambda: egs)
    optimizer = Adam(0.02)
    for _ in range(30):
        nlp.update(egs, sgd=optimizer)
    path = root / "pipeline"
    nlp.to_disk(path)
    return str(path)


@pytest.fixture(scope="module")
def nlp(pipeline_dir):
    return spacy.load(pipeline_dir)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A JSONL file of good records (one without an id) and every kind of bad one.

    Returns (path, good {id: text}, bad [(id, line, reason part)], records read)."""
    lines, good, bad = [], {}, []
    for i in range(24):
        if i % 3 == 0 and i // 3 < len(BAD_LINES):
            raw, bad_id, reason = BAD_LINES[i // 3]
            lines.append(raw)
            bad.append((bad_id.format(line=len(lines)), len(lines), reason))
        if i == 10:
            lines.append(b"   ")  # a blank line is not a record
        text = f"{GOOD_TEXTS[i % len(GOOD_TEXTS)]} {i}"
        if i == 7:
            lines.append(json.dumps({"text": text}).encode())  # no id: the line number
            good[str(len(lines))] = text
        else:
            lines.append(json.dumps({"id": f"doc-{i}", "text": text}, ensure_ascii=False).encode())
            good[f"doc-{i}"] = text
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_bytes(b"\n".join(lines))  # no newline after the last line
    assert len(bad) == len(BAD_LINES)
    return path, good, bad, len(good) + len(bad)


def spans_of(rows):
    """{id: [(start, end, label)]}, failing on an id written twice."""
    out = {}
    for row in rows:
        assert row["id"] not in out, f"id {row['id']!r} written twice"
        out[row["id"]] = [(e["start_char"], e["end_char"], e["label"]) for e in row["entities"]]
    return out


def expected_spans(nlp, good):
    ids = list(good)
    docs = nlp.pipe(good[id] for id in ids)
    return {id: [(e.start_char, e.end_char, e.label_) for e in doc.ents] for id, doc in zip(ids, docs)}


def errors_of(output: Path):
    return sorted((e["id"], e["line"], e["reason"]) for e in read_errors(output))


def check_errors(output: Path, bad):
    errors = errors_of(output)
    assert [(id, line) for id, line, _ in errors] == sorted((id, line) for id, line, _ in bad)
    reasons = {id: reason for id, _, reason in errors}
    for id, _, part in bad:
        assert part in reasons[id], (id, reasons[id])


# --- local engine ----------------------------------------------------------------------


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
    settings = dict(part_size=9, max_chars=MAX_CHARS, batch_size=4, progress=False)
    annotate_local(pipeline_dir, path, one, **settings)
    summary = annotate_local(pipeline_dir, path, two, n_process=2, **settings)
    assert (summary.written, summary.errors) == (len(good), len(bad))
    for part in sorted(one.glob("part-*")):
        assert (two / part.name).read_bytes() == part.read_bytes()
    assert errors_of(two) == errors_of(one)


def test_entity_scores_from_span_group_else_none():
    nlp = spacy.blank("en")
    doc = nlp("Peter visited Berlin and Paris")
    doc.ents = [Span(doc, 0, 1, "PER"), Span(doc, 2, 3, "LOC")]
    assert [e["score"] for e in entities(doc)] == [None, None]
    # The component's span group may hold other candidates and a different order.
    group = SpanGroup(doc, name="ner", spans=[Span(doc, 4, 5, "LOC"), Span(doc, 2, 3, "LOC"), Span(doc, 0, 1, "PER")])
    group.attrs["scores"] = [0.3, 0.8, 0.9]
    doc.spans["ner"] = group
    assert entities(doc) == [
        {"start_char": 0, "end_char": 5, "label": "PER", "score": 0.9},
        {"start_char": 14, "end_char": 20, "label": "LOC", "score": 0.8},
    ]
    assert [e["score"] for e in entities(doc, spans_key="other")] == [None, None]


def test_jsonl_lines_byte_order_mark_crlf_and_line_separators():
    data = b'\xef\xbb\xbf{"id": "a", "text": "Berlin"}\r\n\r\n{"text": "x\xe2\x80\xa8y"}\r\n{"id": 7, "text": "Paris"}'
    records = list(jsonl_records(io.BytesIO(data), "text", "id", MAX_CHARS))
    assert [(r.id, r.line, r.text, r.reason) for r in records] == [
        ("a", 1, "Berlin", None),
        ("3", 3, "x\u2028y", None),  # U+2028 inside a string does not end the line
        ("7", 4, "Paris", None),
    ]


def test_parquet_without_pyarrow_names_the_extra(corpus, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed
    with pytest.raises(UsageError, match=r"spacy-unmask\[ray\]"):
        annotate_local("unused", corpus[0], tmp_path / "ents.parquet", progress=False)


class Interrupted(Exception):
    pass


def test_resume_after_interruption_writes_no_duplicates(pipeline_dir, nlp, corpus, tmp_path, monkeypatch):
    import spacy_unmask.annotate as annotate

    path, good, bad, read = corpus
    output = tmp_path / "ents.jsonl"
    settings = dict(part_size=5, batch_size=4, max_chars=MAX_CHARS, progress=False)
    piped = []
    real_load = annotate.load_pipeline

    def load_failing_after(n):
        def load(*args, **kwargs):
            loaded = real_load(*args, **kwargs)
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

    monkeypatch.setattr(annotate, "load_pipeline", load_failing_after(11))
    with pytest.raises(Interrupted):
        annotate_local(pipeline_dir, path, output, **settings)
    first = {p.name: p.stat().st_mtime_ns for p in output.glob("part-*")}
    assert 0 < len(first) < -(-read // 5), "the interruption should leave some parts complete, some not"
    assert not list(output.glob("*.tmp")) and list(output.glob(".*.tmp")) == []  # nothing half-written shows
    done_ids = {row["id"] for row in read_output(output)}

    piped.clear()
    monkeypatch.setattr(annotate, "load_pipeline", load_failing_after(-1))
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
    with pytest.raises(annotate.UsageError, match="part_size"):
        annotate_local(pipeline_dir, path, output, **{**settings, "part_size": 6})


def write_parquet_corpus(path: Path, good: dict, with_ids: bool = True):
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = list(good) + ["null-text", "bad-bytes"]
    texts = [good[i].encode() for i in good] + [None, b"caf\xe9"]  # binary: may hold invalid UTF-8
    columns = {"body": pa.array(texts, pa.binary())}
    if with_ids:
        columns["key"] = pa.array(ids)
    pq.write_table(pa.table(columns), path)


def write_txt_corpus(folder: Path, good: dict) -> dict:
    """One file per text (some in a subfolder), one invalid UTF-8 file, one skipped '_' file."""
    ids = {}
    for n, (id, text) in enumerate(good.items()):
        name = f"sub/{n:02d}.txt" if n % 2 else f"{n:02d}.txt"
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")
        ids[name] = text
    (folder / "bad.txt").write_bytes(b"caf\xe9")
    (folder / "_notes.txt").write_text("not part of the corpus")
    (folder / "readme.md").write_text("not a .txt file")
    return ids


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


def test_usage_errors_name_the_setting(pipeline_dir, corpus, tmp_path, capsys):
    path = str(corpus[0])
    assert main(["annotate", pipeline_dir, path, str(tmp_path / "ents.csv")]) == EXIT_USAGE
    assert ".jsonl, .parquet, .spacy" in capsys.readouterr().err
    assert main(["annotate", pipeline_dir, path, str(tmp_path / "a.jsonl"), "--concurrency", "2"]) == EXIT_USAGE
    assert "--concurrency" in capsys.readouterr().err
    argv = ["annotate", pipeline_dir, path, str(tmp_path / "b.jsonl"), "--engine", "ray", "--n-process", "2"]
    assert main(argv) == EXIT_USAGE
    assert "--n-process" in capsys.readouterr().err
    parquet = tmp_path / "c.parquet"
    write_parquet_corpus(parquet, {"a": "Berlin"})
    assert main(["annotate", pipeline_dir, str(parquet), str(tmp_path / "c.jsonl")]) == EXIT_USAGE
    assert "no column 'text'" in capsys.readouterr().err


# --- Ray engine ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


def test_ray_equals_local_record_for_record(local_ray, pipeline_dir, nlp, corpus, tmp_path, capsys):
    path, good, bad, read = corpus
    output = tmp_path / "ents.jsonl"
    argv = ["annotate", pipeline_dir, str(path), str(output), "--engine", "ray", "--concurrency", "2",
            "--num-cpus", "0.5", "--batch-size", "4", "--max-chars", str(MAX_CHARS)]
    assert main(argv) == EXIT_BAD_RECORDS
    assert f"read {read} = written {len(good)} + errors {len(bad)}" in capsys.readouterr().out
    local = tmp_path / "local.jsonl"
    annotate_local(pipeline_dir, path, local, max_chars=MAX_CHARS, progress=False)
    ray_rows = {row["id"]: row["entities"] for row in read_output(output)}
    local_rows = {row["id"]: row["entities"] for row in read_output(local)}
    assert spans_of(read_output(output)) == spans_of(read_output(local)) == expected_spans(nlp, good)
    for id, ents in local_rows.items():
        # Actors batch (and so pack) docs differently: float32 sums round differently, ~1e-6.
        assert [e["score"] for e in ray_rows[id]] == pytest.approx([e["score"] for e in ents], abs=1e-4)
    check_errors(output, bad)
    assert sorted(read_errors(output), key=lambda e: e["line"]) == sorted(read_errors(local), key=lambda e: e["line"])


def test_ray_parquet_and_txt_input(local_ray, pipeline_dir, nlp, corpus, tmp_path):
    from spacy_unmask.annotate_ray import annotate_ray

    _, good, _, _ = corpus
    want = expected_spans(nlp, good)
    parquet = tmp_path / "corpus.parquet"
    write_parquet_corpus(parquet, good)
    output = tmp_path / "ents.parquet"
    summary = annotate_ray(pipeline_dir, parquet, output, text_field="body", id_field="key", batch_size=8)
    assert (summary.read, summary.written, summary.errors) == (len(good) + 2, len(good), 2)
    assert spans_of(read_output(output)) == want
    assert [e[0] for e in errors_of(output)] == ["bad-bytes", "null-text"]

    folder = tmp_path / "texts"
    texts = write_txt_corpus(folder, good)
    output = tmp_path / "txt.jsonl"
    summary = annotate_ray(pipeline_dir, folder, output, keep_text=True)
    assert (summary.read, summary.written, summary.errors) == (len(texts) + 1, len(texts), 1)
    rows = list(read_output(output))
    assert {row["id"]: row["text"] for row in rows} == texts
    by_text = {good[id]: spans for id, spans in want.items()}
    assert spans_of(rows) == {name: by_text[text] for name, text in texts.items()}


def test_ray_killed_actor_is_restarted_and_each_id_written_once(
    local_ray, pipeline_dir, nlp, corpus, tmp_path, monkeypatch
):
    from spacy_unmask.annotate_ray import KILL_ONCE_ENV, annotate_ray

    path, good, bad, _ = corpus
    marker = tmp_path / "killed"
    monkeypatch.setenv(KILL_ONCE_ENV, str(marker))
    output = tmp_path / "ents.jsonl"
    summary = annotate_ray(pipeline_dir, path, output, batch_size=3, max_chars=MAX_CHARS)
    assert marker.exists(), "no actor killed itself: the test tested nothing"
    assert (summary.written, summary.errors) == (len(good), len(bad))
    assert spans_of(read_output(output)) == expected_spans(nlp, good)
