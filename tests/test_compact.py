"""Compact pipelines (`compact.py`, `weights_file.py`): frozen weights stored as they are
used, the input embedding in 8 bits a row, the weights in a file of their own that is
read once; LoRA and the head exact, every check of a shared pipeline kept."""
import hashlib
import json
import pickle
import shutil
import struct
import uuid

import numpy as np
import pytest
import spacy
import srsly
import torch
import transformers
from safetensors.torch import load as load_tensors

from spacy_unmask import get_backbone
from spacy_unmask.compact import SCALE_SUFFIX, dequantize_rows, quantize_rows
from spacy_unmask.opt_ins import UnsafePipelineError
from forgery import forged_copy, read_backbone, write_backbone
from tiny_models import TRAIN, ents, make_pipeline, round_embedding_to_int8, train_pipeline, vectors

EMBEDDING = "embed_tokens.weight"


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory):
    """A tiny Llama whose weights are bfloat16 values (a bfloat16 checkpoint)."""
    from tiny_models import save_tiny_model

    path = save_tiny_model(tmp_path_factory.mktemp("compact-model") / "fp32", "llama", "metaspace")
    lm = transformers.AutoModelForCausalLM.from_pretrained(path).to(torch.bfloat16)
    target = str(tmp_path_factory.mktemp("compact-model") / "bf16")
    lm.save_pretrained(target)
    transformers.AutoTokenizer.from_pretrained(path).save_pretrained(target)
    return target


@pytest.fixture(scope="module")
def trained(bf16_model):
    nlp = make_pipeline(bf16_model, lora_r=4, save_embedding="int8")  # float32 compute, as on a CPU without bfloat16
    train_pipeline(nlp, 3, learn_rate=0.01)
    return nlp


@pytest.fixture(scope="module")
def saved(trained, tmp_path_factory):
    path = tmp_path_factory.mktemp("compact") / "pipeline"
    trained.to_disk(path)
    return path


def stored_weights(path):
    return load_tensors(read_backbone(path / "ner" / "model")["weights"])


def test_frozen_weights_stored_as_used_and_embedding_in_8_bits(trained, saved, tmp_path):
    stored = stored_weights(saved)
    live = get_backbone(trained).model.state_dict()
    assert stored[EMBEDDING].dtype == torch.int8 and stored[EMBEDDING + SCALE_SUFFIX].dtype == torch.float32
    assert stored["layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16  # bfloat16 values held in float32
    lora = [k for k in stored if "lora_" in k]
    assert lora and all(stored[k].dtype == torch.float32 and torch.equal(stored[k], live[k]) for k in lora)
    rows, width = stored[EMBEDDING].shape
    saved_bytes = rows * width - rows * 4  # a byte a value instead of two, a float32 scale a row
    assert exact_size(trained, tmp_path) - stored_weights_size(saved) >= 0.95 * saved_bytes


def stored_weights_size(path) -> int:
    return (path / "ner" / "backbone.safetensors").stat().st_size


def save_exact(nlp, path) -> None:
    """Save the pipeline with its embedding as it is used (save_embedding = "exact")."""
    settings = get_backbone(nlp).settings
    settings.save_embedding = "exact"
    try:
        nlp.to_disk(path)
    finally:
        settings.save_embedding = "int8"


def exact_size(nlp, tmp_path) -> int:
    save_exact(nlp, tmp_path / "exact")
    stored = stored_weights(tmp_path / "exact")
    assert stored[EMBEDDING].dtype == torch.bfloat16 and EMBEDDING + SCALE_SUFFIX not in stored
    return stored_weights_size(tmp_path / "exact")


def test_loaded_pipeline_differs_only_by_the_embedding_rounding(trained, saved):
    loaded = spacy.load(saved)
    before = get_backbone(trained).model.state_dict()
    after = get_backbone(loaded).model.state_dict()
    values, scale = quantize_rows(before[EMBEDDING])
    error = (after[EMBEDDING] - before[EMBEDDING]).abs()
    assert (error <= scale[:, None] / 2).all()  # at most half a step of its row
    assert error.max() > 0
    for key, value in before.items():
        if key != EMBEDDING:
            assert torch.equal(after[key], value), key  # the rest exact, LoRA included
    head = lambda nlp: nlp.get_pipe("ner").model.get_ref("output_layer").get_param("W")  # noqa: E731
    np.testing.assert_array_equal(head(loaded), head(trained))


def test_loaded_pipeline_predicts_as_the_rounded_one(trained, saved):
    original = pickle.loads(pickle.dumps(trained))
    round_embedding_to_int8(original)
    loaded = spacy.load(saved)
    docs = [loaded.make_doc(text) for text, _ in TRAIN]
    for a, b in zip(vectors(loaded, docs), vectors(original, docs)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)  # LoRA folded in on load
    assert [ents(d) for d in loaded.pipe(t for t, _ in TRAIN)] == [ents(d) for d in original.pipe(t for t, _ in TRAIN)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_quantise_back_to_the_same_bytes(dtype):
    torch.manual_seed(0)
    weight = (torch.randn(300, 64) * torch.logspace(-6, 2, 300)[:, None]).to(dtype)
    weight[7] = 0
    values, scale = quantize_rows(weight)
    again = quantize_rows(dequantize_rows(values, scale, dtype))
    assert torch.equal(again[0], values) and torch.equal(again[1], scale)
    peaks = values.abs().amax(dim=1)
    assert peaks[7] == 0 and torch.cat([peaks[:7], peaks[8:]]).min() >= 64  # a step at most twice the finest


def test_pipeline_saved_to_bytes_keeps_weights_inside(saved):
    loaded = spacy.load(saved)
    data = loaded.to_bytes()
    again = spacy.blank("en").from_config(loaded.config).from_bytes(data)
    assert [ents(d) for d in again.pipe(t for t, _ in TRAIN)] == [ents(d) for d in loaded.pipe(t for t, _ in TRAIN)]


def test_format_1_pipeline_still_loads(trained, tmp_path):
    """A pipeline of the first format: its weights inside the message, as they were used."""
    save_exact(trained, tmp_path / "exact")

    def as_format_1(msg):
        msg["format"] = 1

    path = forged_copy(tmp_path / "exact", tmp_path, as_format_1)
    (path / "ner" / "backbone.safetensors").unlink()
    loaded = spacy.load(path)
    for key, value in get_backbone(trained).model.state_dict().items():
        assert torch.equal(get_backbone(loaded).model.state_dict()[key], value), key


def file_copy(saved, tmp_path, forge=lambda data: data, *, name=None, fix_digest=True):
    """A copy whose weights file `forge` has rewritten (bytes -> bytes), the message's
    digest made to match unless `fix_digest` is false, so that only the file's own
    checks can refuse it; `name`: the file name the message gives instead."""
    path = tmp_path / f"copy-{uuid.uuid4().hex[:8]}"
    shutil.copytree(saved, path)
    model = path / "ner" / "model"
    data = forge((path / "ner" / "backbone.safetensors").read_bytes())
    (path / "ner" / "backbone.safetensors").write_bytes(data)
    msg = backbone_message(model)
    if fix_digest:
        msg["sha256"] = hashlib.sha256(data).hexdigest()
    if name is not None:
        msg["weights_file"] = name
    write_backbone(model, msg)
    return path


def backbone_message(model_file):
    """The backbone's message as saved (its weights file not read in)."""
    msg = srsly.msgpack_loads(model_file.read_bytes())
    (blob,) = [blob for node in msg["shims"] for blob in node]
    return srsly.msgpack_loads(srsly.msgpack_loads(blob)["state"])


def header_of(data: bytes) -> dict:
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length])


def with_header(data: bytes, header: dict) -> bytes:
    (length,) = struct.unpack("<Q", data[:8])
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data[8 + length :]


def shifted_offsets(data: bytes) -> bytes:
    header = header_of(data)
    entry = next(v for k, v in header.items() if k != "__metadata__")
    entry["data_offsets"][1] += 4
    return with_header(data, header)


def not_power_of_two(data: bytes) -> bytes:
    state = load_tensors(data)
    state[EMBEDDING + SCALE_SUFFIX] = state[EMBEDDING + SCALE_SUFFIX] * 1.5
    from safetensors.torch import save

    return save(state)


@pytest.mark.parametrize("forge, words", [
    (lambda d: d[: len(d) // 2], "unreadable"),
    (lambda d: d + b"\0" * 8, "unreadable"),
    (lambda d: struct.pack("<Q", 2**62) + d[8:], "unreadable"),
    (shifted_offsets, "unreadable"),
    (not_power_of_two, "power of two"),
])
def test_damaged_weights_file_is_refused(saved, tmp_path, forge, words):
    with pytest.raises(UnsafePipelineError, match=words):
        spacy.load(file_copy(saved, tmp_path, forge))


def test_weights_file_must_match_its_digest(saved, tmp_path):
    def flip(data):
        return data[:-3] + bytes([data[-3] ^ 0xFF]) + data[-2:]

    with pytest.raises(UnsafePipelineError, match="does not match its SHA-256"):
        spacy.load(file_copy(saved, tmp_path, flip, fix_digest=False))


@pytest.mark.parametrize("name", ["../backbone.safetensors", "/etc/passwd", "model", "backbone-1.safetensors", 7])
def test_weights_file_names_outside_the_pattern_are_refused(saved, tmp_path, name):
    with pytest.raises(UnsafePipelineError, match="weights_file"):
        spacy.load(file_copy(saved, tmp_path, name=name))


def test_missing_weights_file_is_refused(saved, tmp_path):
    path = file_copy(saved, tmp_path)
    (path / "ner" / "backbone.safetensors").unlink()
    with pytest.raises(UnsafePipelineError, match="missing"):
        spacy.load(path)


def test_weights_file_read_from_bytes_is_refused_clearly(saved):
    loaded = spacy.load(saved)
    data = (saved / "ner" / "model").read_bytes()
    with pytest.raises(UnsafePipelineError, match="spacy.load"):
        loaded.get_pipe("ner").model.from_bytes(data)
