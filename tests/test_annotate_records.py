"""spacy_unmask/annotate/records.py: the readers, record ids and text checks."""
import io
import json

import pytest

from spacy_unmask.annotate import UsageError, count_input, iter_records, jsonl_records
from spacy_unmask.annotate.records import input_fingerprint, input_kind, txt_files

MAX_CHARS = 200


def test_jsonl_lines_byte_order_mark_crlf_and_line_separators():
    data = b'\xef\xbb\xbf{"id": "a", "text": "Berlin"}\r\n\r\n{"text": "x\xe2\x80\xa8y"}\r\n{"id": 7, "text": "Paris"}'
    records = list(jsonl_records(io.BytesIO(data), "text", "id", MAX_CHARS))
    assert [(r.id, r.line, r.text, r.reason) for r in records] == [
        ("a", 1, "Berlin", None),
        ("3", 3, "x\u2028y", None),  # U+2028 inside a string does not end the line
        ("7", 4, "Paris", None),
    ]


def test_readers_take_a_str_or_a_path(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": f"text {i}"}) + "\n" for i in range(3)))
    folder = tmp_path / "texts"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("Berlin")
    (folder / "sub" / "b.txt").write_text("Paris")
    for source in (path, folder):
        as_str, as_path = list(iter_records(str(source))), list(iter_records(source))
        assert as_str == as_path and as_path
        assert count_input(str(source)) == count_input(source) == len(as_path)
        assert input_fingerprint(str(source)) == input_fingerprint(source)
        assert input_kind(str(source)) == input_kind(source)
    assert txt_files(str(folder)) == txt_files(folder)
    assert [r.id for r in iter_records(str(folder))] == ["a.txt", "sub/b.txt"]  # ids: relative paths


def test_input_kind_names_what_is_wrong(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        input_kind(tmp_path / "missing.jsonl")
    (tmp_path / "corpus.csv").write_text("text\n")
    with pytest.raises(UsageError, match=r"expected a \.jsonl file"):
        input_kind(str(tmp_path / "corpus.csv"))
