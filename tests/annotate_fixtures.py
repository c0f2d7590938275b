"""Shared by the tests of `spacy_unmask/annotate/`: a tiny trained pipeline, a corpus with
every kind of bad record, and the helpers that compare outputs.

The pipeline is a tiny random Llama-style decoder trained for a few steps, so its
entities are arbitrary but deterministic. It is built once per test run, whichever test
module asks first (the fixtures are imported into several modules).
"""
import json
from pathlib import Path

import pytest
import spacy
from spacy.util import fix_random_seed

from spacy_unmask.annotate import read_errors
import tiny_models
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
_BUILT = {}


def train_pipeline(root: Path, steps: int = 30, seed: int = 0) -> str:
    fix_random_seed(seed)
    model = save_tiny_model(root / "model", "llama", "bytelevel", seed=seed)
    nlp = tiny_models.make_pipeline(model, lora_r=4, lora_alpha=4, window=256, stride=192)
    tiny_models.train_pipeline(nlp, steps, data=TRAIN)
    path = root / "pipeline"
    nlp.to_disk(path)
    return str(path)


@pytest.fixture(scope="package")  # built once for the tests folder
def pipeline_dir(tmp_path_factory) -> str:
    if "pipeline" not in _BUILT:
        _BUILT["pipeline"] = train_pipeline(tmp_path_factory.mktemp("annotate"))
    return _BUILT["pipeline"]


@pytest.fixture(scope="package")  # built once for the tests folder
def nlp(pipeline_dir):
    return spacy.load(pipeline_dir)


@pytest.fixture(scope="package")  # built once for the tests folder
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
