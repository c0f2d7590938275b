"""Saved pipelines (`saving.py`): reproducible saves, and a pipeline file treated as data.

The hostile-pipeline suite edits a saved pipeline the way an attacker would (file names
that climb out of the private directory, wrong types, a truncated or oversized weights
blob, configs that point at code, a config asking for remote code) and checks that each
is refused with a clear error and that nothing was written outside the private
temporary directory.
"""
import json
import pickle
import shutil
import struct
import tempfile
import uuid
from pathlib import Path

import numpy as np
import pytest
import spacy
import srsly
import torch
from spacy_unmask import get_backbone
from spacy_unmask.opt_ins import FETCH_BASE_ENV, TRUST_REMOTE_CODE_ENV, UnsafePipelineError
from forgery import forged_copy, read_backbone, with_digest
from tiny_models import TRAIN, check_doc, make_pipeline, mixed_texts, train_pipeline, vectors
from tiny_models import ents as ents_of

TEXTS = [
    ("Peter Blackburn visited the European Commission in Brussels .", [("Peter Blackburn", "PER"), ("Brussels", "LOC")]),
    ("EU rejects German call to boycott British lamb .", [("EU", "ORG")]),
]


def trained_pipeline(model_dir: str, **tok2vec):
    nlp = make_pipeline(model_dir, **{"lora_r": 4, **tok2vec})
    train_pipeline(nlp, 3, learn_rate=0.01, data=TEXTS)  # LoRA weights move off their initial zeros
    return nlp


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("saving-model"), "llama", "metaspace")


@pytest.fixture(scope="module")
def saved(model_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("saving") / "pipeline"
    trained_pipeline(model_dir).to_disk(path)
    return path


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """Temporary directories go here during the test; it must be empty afterwards."""
    place = tmp_path / "private-tmp"
    place.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(place))
    yield place
    assert list(place.iterdir()) == [], "a temporary directory was left behind"


def all_files(root: Path) -> set:
    return {p for p in root.rglob("*")}


# --- reproducible saves --------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_load_predict_save_is_byte_identical(model_dir, tmp_path, dtype):
    first = tmp_path / "first"
    trained_pipeline(model_dir, dtype=dtype).to_disk(first)
    loaded = spacy.load(first)
    loaded("Peter Blackburn visited Brussels .")  # prediction folds LoRA into copies
    second = tmp_path / "second"
    loaded.to_disk(second)
    again = tmp_path / "again"
    spacy.load(second).to_disk(again)
    for path in sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file()):
        assert (second / path).read_bytes() == (first / path).read_bytes(), path
        assert (again / path).read_bytes() == (first / path).read_bytes(), path


def test_saved_pipeline_holds_no_machine_path(model_dir, saved):
    for path in saved.rglob("*"):
        if path.is_file():
            assert model_dir.encode() not in path.read_bytes(), path
    config = spacy.util.load_config(saved / "config.cfg")
    assert config["components"]["ner"]["model"]["tok2vec"]["name"] == Path(model_dir).name
    assert spacy.load(saved)("Peter Blackburn visited Brussels .") is not None
    backbone = read_backbone(saved / "ner" / "model")
    config = json.loads(backbone["config"])
    assert "_name_or_path" not in config
    texts = [backbone["config"].encode()] + list(backbone["tokenizer"].values())
    for place in (model_dir, tempfile.gettempdir()):
        assert not any(place.encode() in text for text in texts), place


# --- hostile pipelines ---------------------------------------------------------------


def escaping_names(tmp_path: Path):
    tag = uuid.uuid4().hex[:12]
    outside = tmp_path / f"outside-{tag}.json"
    return [
        str(outside),  # absolute
        f"../../{tag}.json",
        f"../{tag}.json",
        f"sub/{tag}.json",
        f"sub\\{tag}.json",
        f"nul\0{tag}.json",
        "..",
        ".",
        "",
        f"tokenization_{tag}.py",  # code
        f".{tag}.json",  # hidden
    ], outside, tag


def test_escaping_tokenizer_file_names_are_refused(saved, tmp_path, private_tmp):
    names, outside, tag = escaping_names(tmp_path)
    for name in names:
        path = forged_copy(saved, tmp_path, lambda b: b["tokenizer"].__setitem__(name, b"{}"))
        before = all_files(tmp_path)
        with pytest.raises(UnsafePipelineError) as info:
            spacy.load(path)
        message = str(info.value)
        assert repr(name) in message and "damaged or hostile" in message, message
        assert all_files(tmp_path) == before, name
        assert not outside.exists()
        for root in (Path("/"), Path(tempfile.gettempdir()).parent, Path.cwd().parent, private_tmp.parent):
            assert not list(root.glob(f"*{tag}*")), root


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("tokenizer", [["tokenizer.json", b"{}"]], "'tokenizer' is list"),
        ("weights", "not bytes", "'weights' is str"),
        ("config", 7, "'config' is int"),
        ("sha256", None, "'sha256' is NoneType"),
        ("format", 99, "format 99"),
    ],
)
def test_wrong_types_are_refused(saved, tmp_path, private_tmp, field, value, words):
    path = forged_copy(saved, tmp_path, lambda b: b.__setitem__(field, value))
    with pytest.raises(UnsafePipelineError, match="damaged or hostile") as info:
        spacy.load(path)
    assert words in str(info.value)


def test_tokenizer_file_of_wrong_type_is_refused(saved, tmp_path, private_tmp):
    path = forged_copy(saved, tmp_path, lambda b: b["tokenizer"].__setitem__("tokenizer.json", "text, not bytes"))
    with pytest.raises(UnsafePipelineError, match="'tokenizer.json' holds str"):
        spacy.load(path)


def test_missing_digest_is_refused(saved, tmp_path, private_tmp):
    path = forged_copy(saved, tmp_path, lambda b: b.pop("sha256") and None)
    with pytest.raises(UnsafePipelineError, match="'sha256' is missing"):
        spacy.load(path)


def test_backbone_that_is_not_a_map_is_refused(saved, tmp_path, private_tmp):
    path = forged_copy(saved, tmp_path, lambda b: ["not", "a", "map"])
    with pytest.raises(UnsafePipelineError, match="expected a map"):
        spacy.load(path)


def test_truncated_weights_blob_is_refused(saved, tmp_path, private_tmp):
    def forge(b):
        b["weights"] = b["weights"][: len(b["weights"]) // 2]
        return with_digest(b)  # the digest matches: only the blob itself is short

    with pytest.raises(UnsafePipelineError, match="field 'weights'. are unreadable"):
        spacy.load(forged_copy(saved, tmp_path, forge))


def test_huge_declared_sizes_are_refused(saved, tmp_path, private_tmp):
    def huge_header(b):
        b["weights"] = struct.pack("<Q", 2**62) + b"{}"
        return with_digest(b)

    with pytest.raises(UnsafePipelineError, match="field 'weights'. are unreadable"):
        spacy.load(forged_copy(saved, tmp_path, huge_header))
    # a msgpack value that declares 4 GiB of bytes and holds 3
    huge_bin = b"\xc6\xff\xff\xff\xff" + b"abc"
    with pytest.raises(UnsafePipelineError, match="unreadable"):
        spacy.load(forged_copy(saved, tmp_path, lambda b: huge_bin))


def test_config_pointing_at_code_is_refused(saved, tmp_path, private_tmp):
    def forge(b):
        config = json.loads(b["config"])
        config["auto_map"] = {"AutoModel": "evil_model.EvilModel", "AutoConfig": "evil_model.EvilConfig"}
        b["config"] = json.dumps(config)
        b["tokenizer"]["evil_model.py"] = b"raise SystemExit('code ran')"

    with pytest.raises(UnsafePipelineError, match="evil_model.py|auto_map"):
        spacy.load(forged_copy(saved, tmp_path, forge))

    def only_auto_map(b):
        config = json.loads(b["config"])
        config["auto_map"] = {"AutoConfig": "evil_model.EvilConfig"}
        b["config"] = json.dumps(config)

    with pytest.raises(UnsafePipelineError, match="auto_map"):
        spacy.load(forged_copy(saved, tmp_path, only_auto_map))


def test_tokenizer_config_pointing_at_code_does_nothing(saved, tmp_path, private_tmp):
    """The tokenizer is built from its data by one class: keys naming code or classes are ignored."""
    def forge(b):
        name = "tokenizer_config.json"
        config = json.loads(b["tokenizer"][name])
        config["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", None]}
        config["tokenizer_class"] = "EvilTokenizer"
        b["tokenizer"][name] = json.dumps(config).encode()
        b["tokenizer"]["evil.py"] = b"raise SystemExit('code ran')"

    with pytest.raises(UnsafePipelineError, match="'evil.py'"):
        spacy.load(forged_copy(saved, tmp_path, forge))
    nlp = spacy.load(forged_copy(saved, tmp_path, lambda b: forge(b) or b["tokenizer"].pop("evil.py") and None))
    assert type(get_backbone(nlp).tokenizer).__name__ in ("PreTrainedTokenizerFast", "TokenizersBackend")


def test_unsupported_model_type_is_refused(saved, tmp_path, private_tmp):
    def forge(b):
        config = json.loads(b["config"])
        config["model_type"] = "evil_remote_model"
        b["config"] = json.dumps(config)

    with pytest.raises(UnsafePipelineError, match="model_type that is not supported") as info:
        spacy.load(forged_copy(saved, tmp_path, forge))
    assert "evil_remote_model" not in str(info.value)  # a config value is never echoed


def edit_config(pipeline: Path, **tok2vec) -> None:
    config = spacy.util.load_config(pipeline / "config.cfg")
    for key, value in tok2vec.items():
        config["components"]["ner"]["model"]["tok2vec"][key] = value
    config.to_disk(pipeline / "config.cfg")


@pytest.mark.parametrize("save_mode", ["adapter", "full"])
def test_config_asking_for_remote_code_needs_the_callers_opt_in(model_dir, tmp_path, monkeypatch, save_mode):
    path = tmp_path / "pipeline"
    trained_pipeline(model_dir, save_mode=save_mode).to_disk(path)
    edit_config(path, trust_remote_code=True)
    monkeypatch.delenv(TRUST_REMOTE_CODE_ENV, raising=False)
    with pytest.raises(UnsafePipelineError) as info:
        spacy.load(path)
    assert "trust_remote_code" in str(info.value) and f"{TRUST_REMOTE_CODE_ENV}=1" in str(info.value)
    monkeypatch.setenv(TRUST_REMOTE_CODE_ENV, "1")  # the caller's own, explicit choice
    monkeypatch.setenv(FETCH_BASE_ENV, "1")  # an adapter pipeline's base is a path here
    nlp = spacy.load(path)
    assert nlp("Peter Blackburn visited Brussels .") is not None


# --- saved pipelines that users break -----------

def broken_copy(saved, tmp_path, mutate):
    target = tmp_path / "broken"
    shutil.copytree(saved, target)
    mutate(target / "ner" / "model")
    return target


def test_pipeline_pickles(tiny_pipelines):
    nlp = tiny_pipelines["bytelevel"]
    copy = pickle.loads(pickle.dumps(nlp))
    assert ents_of(copy(TRAIN[0][0])) == ents_of(nlp(TRAIN[0][0]))


def test_saved_pipeline_loads_without_base_model(normalizer_dirs, tmp_path):
    """spacy.load needs neither the model directory nor a hub: all is in the pipeline."""
    model_copy = tmp_path / "model"
    shutil.copytree(normalizer_dirs["bytelevel"], model_copy)
    nlp = make_pipeline(str(model_copy), lora_r=4)
    train_pipeline(nlp, 3)
    nlp.to_disk(tmp_path / "pipeline")
    shutil.rmtree(model_copy)
    loaded = spacy.load(tmp_path / "pipeline")
    texts = mixed_texts()
    assert [ents_of(d) for d in loaded.pipe(texts)] == [ents_of(d) for d in nlp.pipe(texts)]
    docs = [nlp.make_doc(t) for t in texts]
    for a, b in zip(vectors(loaded, docs), vectors(nlp, docs)):
        # Loaded pipelines fold LoRA into the base weights: same vectors up to rounding.
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_truncated_model_file_fails(saved, tmp_path):
    path = broken_copy(saved, tmp_path, lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]))
    with pytest.raises((ValueError, OSError)):
        spacy.load(path)


@pytest.mark.parametrize("damage", ["truncate", "header"])
def test_damaged_model_file_message_names_the_problem(saved, tmp_path, damage):
    def mutate(p):
        data = p.read_bytes()
        p.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\0" * 16 + data[16:])

    path = broken_copy(saved, tmp_path, mutate)
    with pytest.raises((ValueError, OSError)) as info:
        spacy.load(path)
    message = str(info.value)
    assert "ner" in message or "model" in message, message
    assert any(word in message for word in ("truncated", "corrupt", "damaged", "unreadable")), message


def test_deleted_model_file_fails(saved, tmp_path):
    path = broken_copy(saved, tmp_path, lambda p: p.unlink())
    with pytest.raises(UnsafePipelineError) as info:
        spacy.load(path)
    assert "[ner]" in str(info.value) and "'model' file" in str(info.value)


def test_corrupted_weights_are_detected(saved, tmp_path):
    weights = read_backbone(saved / "ner" / "model")["weights"]

    def mutate(p):
        data = bytearray(p.read_bytes())
        at = bytes(data).find(weights[:256]) + len(weights) // 2
        data[at : at + 64] = b"\xff" * 64
        p.write_bytes(bytes(data))

    path = broken_copy(saved, tmp_path, mutate)
    try:
        nlp = spacy.load(path)
    except (ValueError, OSError):
        return
    vecs = vectors(nlp, [nlp.make_doc(TRAIN[0][0])])[0]
    pytest.fail(f"corrupted weights loaded silently; vectors finite: {bool(np.isfinite(vecs).all())}")


def test_saved_backbone_has_no_pickle(saved, monkeypatch):
    data = (saved / "ner" / "model").read_bytes()
    for marker in (b"PK\x03\x04", b"data.pkl", b"torch._utils", b"_rebuild_tensor", b"collections\nOrderedDict"):
        assert marker not in data, marker
    # Every part of the backbone is msgpack, JSON text or safetensors.
    backbone = read_backbone(saved / "ner" / "model")
    assert set(backbone) == {"format", "config", "tokenizer", "weights", "sha256"}
    config = json.loads(backbone["config"])
    assert config["model_type"] == "llama"
    for name, content in backbone["tokenizer"].items():
        assert name.endswith(".json"), name
        tokenizer_file = json.loads(content)
        assert "auto_map" not in tokenizer_file  # no remote tokenizer code
    from safetensors.torch import load

    assert len(load(backbone["weights"])) > 10
    # Loading never unpickles anything.
    def no_pickle(*args, **kwargs):
        raise AssertionError("spacy.load unpickled something")

    monkeypatch.setattr(pickle, "loads", no_pickle)
    monkeypatch.setattr(pickle, "load", no_pickle)
    monkeypatch.setattr(torch, "load", no_pickle)
    nlp = spacy.load(saved)
    check_doc(nlp, nlp(TRAIN[0][0]))


def test_saved_config_has_no_remote_code(saved):
    config = spacy.util.load_config(saved / "config.cfg")
    assert config["components"]["ner"]["model"]["tok2vec"]["trust_remote_code"] is False
    model = srsly.msgpack_loads((saved / "ner" / "model").read_bytes())
    settings_ = [srsly.msgpack_loads(a["settings"]) for a in model["attrs"] if "settings" in a]
    assert settings_ and all(s["trust_remote_code"] is False for s in settings_)
