"""spacy_unmask/annotate/output.py: the rules of OUTPUT, its run record, reading it back."""
import json

import pytest
import spacy
from spacy.tokens import Span, SpanGroup

from spacy_unmask.annotate import (
    LocalOptions,
    UsageError,
    count_rows,
    entities,
    read_errors,
    read_output,
)
from spacy_unmask.annotate.output import RUN_FILE, atomic_write, plain_name, prepare_output, run_record


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


def test_read_output_takes_a_str_as_the_readme_shows(tmp_path, monkeypatch):
    output = tmp_path / "ents.jsonl"
    (output / "_errors").mkdir(parents=True)
    rows = [{"id": "a", "entities": []}, {"id": "b", "entities": [{"start_char": 0, "end_char": 6, "label": "LOC",
                                                                  "score": None}]}]
    (output / "part-00000.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (output / "_errors" / "part-00000.jsonl").write_text(json.dumps({"id": "c", "line": 3, "reason": "x"}) + "\n")
    monkeypatch.chdir(tmp_path)
    assert list(read_output("ents.jsonl")) == list(read_output(output)) == rows
    assert [e["id"] for e in read_errors("ents.jsonl")] == ["c"]
    assert count_rows("ents.jsonl") == 2


def test_resume_refused_when_the_pipeline_changed_allowed_when_not(tmp_path):
    folder = tmp_path / "model-best"
    folder.mkdir()
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "Berlin"}\n')
    output = tmp_path / "ents.jsonl"
    options = LocalOptions()
    loaded = spacy.blank("en")
    loaded.add_pipe("sentencizer")
    prepare_output(output, run_record(str(folder), loaded, str(corpus), "local", options, "jsonl"), resume=True)
    saved = json.loads((output / RUN_FILE).read_text())
    assert len(saved["pipeline_sha256"]) == 64 and saved["part_size"] == options.part_size
    (output / "part-00000.jsonl").write_text("")
    prepare_output(output, run_record(folder, loaded, corpus, "local", options, "jsonl"), resume=True)  # the same
    other = spacy.blank("en")  # what the same folder holds now
    other.add_pipe("sentencizer", config={"punct_chars": ["!"]})
    with pytest.raises(UsageError, match=r"PIPELINE '.*model-best' changed since OUTPUT") as e:
        prepare_output(output, run_record(folder, other, corpus, "local", options, "jsonl"), resume=True)
    assert "two models" in str(e.value)


def test_plain_name_keeps_written_files_inside_their_folder():
    assert plain_name("part-00000.jsonl") == "part-00000.jsonl"
    for name in ("", ".", "..", "../x", "a/b", "/etc/passwd", "a\\b", "a\0b"):
        with pytest.raises(ValueError, match="not a plain file name"):
            plain_name(name)


def test_atomic_write_does_not_follow_a_link_left_at_its_temporary_name(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("keep")
    folder = tmp_path / "ents.jsonl"
    folder.mkdir()
    (folder / ".part-00000.jsonl.tmp").symlink_to(outside)
    atomic_write(folder / "part-00000.jsonl", b"rows\n")
    assert (folder / "part-00000.jsonl").read_bytes() == b"rows\n"
    assert outside.read_text() == "keep"
    assert not (folder / ".part-00000.jsonl.tmp").exists()
