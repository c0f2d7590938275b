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


# --- hostile input ------------------------------------------------------------------------


def test_links_in_a_txt_folder_are_not_followed(tmp_path, audit):
    from spacy_unmask.annotate.records import iter_records

    secret = tmp_path / "secret.txt"
    secret.write_text("secret-value")
    folder = tmp_path / "input"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("Peter visited Berlin .")
    (folder / "link.txt").symlink_to(secret)
    (folder / "environ.txt").symlink_to("/proc/self/environ")
    (folder / "linked-dir").symlink_to(tmp_path, target_is_directory=True)
    with audit:
        records = {r.id: r for r in iter_records(folder)}
    assert records["a.txt"].text == "Peter visited Berlin ."
    for name in ("link.txt", "environ.txt"):
        assert records[name].text is None and "symbolic link" in records[name].reason
    assert not any("secret-value" in (r.text or "") + (r.raw or "") for r in records.values())
    assert audit.outside(folder) == []


def test_a_txt_file_too_long_is_not_read(tmp_path, audit):
    from spacy_unmask.annotate.records import iter_records

    folder = tmp_path / "input"
    folder.mkdir()
    with (folder / "huge.txt").open("wb") as f:
        f.truncate(1 << 30)  # sparse
    with audit:
        (record,) = iter_records(folder, max_chars=1000)
    assert record.text is None and "more than --max-chars 1000" in record.reason
    assert [p for p, _ in audit.opened() if p.endswith("huge.txt")] == []


def test_one_hostile_jsonl_line_never_stops_the_run(tmp_path):
    import time

    from spacy_unmask.annotate.records import EXCERPT_BYTES, iter_records

    path = tmp_path / "in.jsonl"
    long_line = b'{"text": "' + b"x" * (8 << 20)  # no closing quote, no newline
    path.write_bytes(b'{"text": "a"}\n' + b"[" * 200_000 + b"\n" + b'{"text": "b"}\n' + long_line)
    start = time.monotonic()
    records = list(iter_records(path))
    assert time.monotonic() - start < 10
    assert [r.text for r in records] == ["a", None, "b", None]
    assert "nested too deeply" in records[1].reason
    assert all(len(r.raw) < EXCERPT_BYTES + 100 for r in records if r.raw is not None)


def test_an_over_long_line_is_one_error_row_never_held_whole(tmp_path):
    import time
    import tracemalloc

    from spacy_unmask.annotate.records import EXCERPT_BYTES, line_limit

    max_chars = 1000
    path = tmp_path / "in.jsonl"
    with path.open("wb") as f:
        f.write(b'{"text": "a"}\n{"id": "huge", "text": "')
        f.truncate(f.tell() + (64 << 20))  # 64 MiB of zero bytes on one line (sparse)
        f.seek(0, 2)
        f.write(b'"}\n{"text": "b"}\n' + b" " * 5000 + b"\n" + b'{"text": "' + b"y" * (30 << 20))  # the last: no newline
    tracemalloc.start()
    start = time.monotonic()
    try:
        records = list(iter_records(path, max_chars=max_chars))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - start < 10
    assert peak < 4 * line_limit(max_chars) + (8 << 20), f"{peak} bytes held to read it"
    assert [(r.line, r.text) for r in records] == [(1, "a"), (2, None), (3, "b"), (5, None)]  # line 4 is blank
    for record in (records[1], records[3]):
        assert f"more than the {line_limit(max_chars)}" in record.reason and "--max-chars 1000" in record.reason
        assert len(record.raw) < EXCERPT_BYTES + 100 and "bytes)" in record.raw
    assert records[1].raw.startswith('{"id": "huge", "text": "')
    assert count_input(path, max_chars) == len(records)
