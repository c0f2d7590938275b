"""spacy_unmask.load, spacy_unmask.save and the digest of a loaded pipeline (sharing.py)."""
import json
import os
import shutil
import uuid
from pathlib import Path

import pytest
import spacy

import spacy_unmask
from annotate_fixtures import pipeline_dir  # noqa: F401 (fixture)
from spacy_unmask.opt_ins import UnsafePipelineError
from spacy_unmask.sharing import loaded_digest

TEXT = "Peter Blackburn visited Brussels ."


def copy_of(pipeline, tmp_path):
    target = tmp_path / f"copy-{uuid.uuid4().hex[:8]}"
    shutil.copytree(pipeline, target)
    return target


def test_load_takes_spacy_keywords_and_backbone_settings(pipeline_dir, audit):
    with audit:
        nlp = spacy_unmask.load(pipeline_dir, disable=["ner"], quantize="int8")
    assert audit.outside(pipeline_dir) == []
    assert nlp.disabled == ["ner"]
    assert nlp.get_pipe_config("ner")["model"]["tok2vec"]["quantize"] == "int8"
    nlp = spacy_unmask.load(pipeline_dir, config={"components": {"ner": {"threshold": 0.9}}})
    assert nlp.get_pipe_config("ner")["threshold"] == 0.9
    assert [e.text for e in nlp(TEXT).ents] == [e.text for e in spacy.load(pipeline_dir, config={
        "components.ner.threshold": 0.9})(TEXT).ents]
    with pytest.raises(TypeError, match="unknown keywords"):
        spacy_unmask.load(pipeline_dir, quantise="int8")


@pytest.mark.parametrize("where", ["config.cfg", "meta.json", "vocab/strings.json", "tokenizer"])
@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_load_checks_the_files_spacy_reads_first(pipeline_dir, tmp_path, audit, where, kind):
    """config.cfg and meta.json are read by spacy.load before any plugin code runs: only
    spacy_unmask.load sees a link or FIFO there before it is read."""
    secret = tmp_path / "secret"
    secret.write_text('{"lang": "secret-value"}')
    path = copy_of(pipeline_dir, tmp_path)
    (path / where).unlink()
    if kind == "link":
        (path / where).symlink_to(secret)
    else:
        os.mkfifo(path / where)
    with audit, pytest.raises(UnsafePipelineError) as info:
        spacy_unmask.load(path)
    assert repr(where) in str(info.value) and ("symbolic link" if kind == "link" else "FIFO") in str(info.value)
    assert "secret-value" not in str(info.value)
    assert audit.outside(path) == []


@pytest.mark.parametrize("where", ["config.cfg", "meta.json", "vocab/strings.json", "ner/model"])
@pytest.mark.parametrize("dangling", [False, True])
def test_save_never_writes_through_a_link(pipeline_dir, tmp_path, where, dangling):
    """nlp.to_disk writes config.cfg, meta.json, the tokenizer and the vocab before any
    component runs; spacy_unmask.save checks the whole folder first."""
    nlp = spacy_unmask.load(pipeline_dir)
    path = copy_of(pipeline_dir, tmp_path)
    target = tmp_path / "elsewhere"
    if not dangling:
        target.write_text("keep")
    (path / where).unlink()
    (path / where).symlink_to(target)
    before = {p.relative_to(path): p.lstat().st_mtime_ns for p in path.rglob("*")}
    with pytest.raises(UnsafePipelineError, match="symbolic link") as info:
        spacy_unmask.save(nlp, path)
    assert "nothing was written" in str(info.value)
    assert (target.read_text() == "keep") if not dangling else not target.exists()
    assert {p.relative_to(path): p.lstat().st_mtime_ns for p in path.rglob("*")} == before


def test_save_writes_a_pipeline_that_loads_the_same(pipeline_dir, tmp_path):
    nlp = spacy_unmask.load(pipeline_dir)
    new, over = tmp_path / "new", copy_of(pipeline_dir, tmp_path)
    spacy_unmask.save(nlp, new)
    spacy_unmask.save(nlp, over)  # a folder of regular files: saved over
    for path in (new, over):
        assert (path / "ner" / "model").read_bytes() == (Path(pipeline_dir) / "ner" / "model").read_bytes()
        assert [e.text for e in spacy_unmask.load(path)(TEXT).ents] == [e.text for e in nlp(TEXT).ents]


def test_loaded_digest_is_what_was_loaded(pipeline_dir, tmp_path):
    from forgery import read_backbone, with_digest, write_backbone

    first = loaded_digest(spacy_unmask.load(pipeline_dir))
    path = copy_of(pipeline_dir, tmp_path)
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "description": "scores added"}))
    assert loaded_digest(spacy_unmask.load(path)) == first, "meta.json is not the model"
    assert loaded_digest(spacy_unmask.load(path, quantize="int8")) != first, "the settings are"

    backbone = read_backbone(path / "ner" / "model")
    backbone["tokenizer"]["tokenizer_config.json"] = json.dumps(
        {**json.loads(backbone["tokenizer"]["tokenizer_config.json"]), "padding_side": "left"}).encode()
    write_backbone(path / "ner" / "model", with_digest(backbone))
    assert loaded_digest(spacy_unmask.load(path)) != first, "the tokenizer as read is"
