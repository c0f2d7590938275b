"""Finding and loading a decoder (`loading.py`): what a model name means, the errors for
names that lead nowhere, GGUF files that cannot be used, and `num_layers` cuts."""
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from spacy_unmask import download, get_backbone
from spacy_unmask.layers.decoder_tok2vec import DecoderTok2Vec
from spacy_unmask.loading import (
    decoder_from_config,
    load_config,
    load_decoder,
    resolve_source,
    truncate_config,
    warn_about_loading,
)
from tiny_models import FAMILIES, build_and_initialize, check_fails_early_and_clearly, save_tiny_model, tiny_config


def tok2vec(name, **settings):
    model = DecoderTok2Vec(name=name, unmask="all", dtype="float32", **settings)
    model.initialize()
    return model


def tiny_gguf(path: Path, architecture: str, truncate: bool = False) -> str:
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(2)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((10, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if truncate:
        path.write_bytes(path.read_bytes()[:40])
    return str(path)


# --- what a name means ---------------------------------------------------------------


def test_a_name_is_a_registry_model_a_directory_a_gguf_file_or_a_hub_id(tmp_path, monkeypatch):
    converted = tmp_path / "cache" / "smollm2-135m"
    monkeypatch.setattr(download, "model_dir", lambda name: converted)  # the cached conversion
    assert resolve_source("smollm2-135m") == (str(converted), None)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert resolve_source(str(tmp_path / "model")) == (str(tmp_path / "model"), None)
    (tmp_path / "m.Q4.gguf").write_bytes(b"GGUF")
    assert resolve_source(str(tmp_path / "m.Q4.gguf")) == (str(tmp_path), "m.Q4.gguf")
    assert resolve_source("HuggingFaceTB/SmolLM2-135M") == ("HuggingFaceTB/SmolLM2-135M", None)


def test_a_directory_that_is_no_model_says_what_a_model_is(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no config.json") as err:
        resolve_source(str(tmp_path / "empty"))
    assert "save_pretrained directory" in str(err.value) and "smollm2-135m" in str(err.value)
    with pytest.raises(ValueError, match="no such file or directory"):
        resolve_source("./models/not-there")


def test_a_config_transformers_cannot_read_lists_what_can_be_loaded(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "not-a-model"}')
    with pytest.raises(ValueError) as err:
        load_config(str(tmp_path))
    message = str(err.value)
    assert f"model {str(tmp_path)!r} could not be loaded" in message
    assert "gemma3-270m" in message and "Supported architectures: llama, mistral" in message


# (settings, when the error comes, words the message must contain)
BAD_MODEL_NAMES = {
    "missing_dir": ({"name": "/no/such/model/dir"}, "initialize", ["'/no/such/model/dir'", "no such file", ".gguf"]),
    "missing_gguf": ({"name": "/no/such/model.gguf"}, "initialize", ["'/no/such/model.gguf'", "GGUF"]),
    "unknown_hub_id": (
        {"name": "no-such-org-zz/no-such-model-zz"},
        "initialize",
        ["'no-such-org-zz/no-such-model-zz'", "Hugging Face id", "save_pretrained directory"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_MODEL_NAMES))
def test_a_model_name_that_leads_nowhere_fails_at_initialize_naming_it(normalizer_dirs, monkeypatch, case):
    check_fails_early_and_clearly(normalizer_dirs["bytelevel"], monkeypatch, BAD_MODEL_NAMES, case)


def test_misspelt_registry_model_lists_registry_models(normalizer_dirs, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    stage, err = build_and_initialize(normalizer_dirs["bytelevel"], {"name": "smollm2-136m"})
    assert stage == "initialize" and isinstance(err, ValueError), repr(err)
    assert "smollm2-135m" in str(err), str(err)


# --- GGUF files ----------------------------------------------------------------------


def test_gguf_of_unsupported_architecture(tmp_path):
    """An architecture transformers reads from GGUF but spacy-unmask does not support."""
    path = tiny_gguf(tmp_path / "tiny-gpt2.gguf", "gpt2")
    stage, err = build_and_initialize(path, {})
    assert stage == "initialize" and isinstance(err, ValueError), repr(err)
    for word in ("'gpt2'", "Supported", "llama", "qwen2", "gemma3_text"):
        assert word in str(err), str(err)


def test_gguf_of_architecture_transformers_cannot_read(tmp_path):
    path = tiny_gguf(tmp_path / "tiny-bert.gguf", "bert")
    stage, err = build_and_initialize(path, {})
    assert stage == "initialize" and isinstance(err, ValueError), repr(err)
    for word in ("bert", "Supported", "llama"):
        assert word in str(err), str(err)


def test_truncated_gguf_fails_clearly(tmp_path):
    path = tiny_gguf(tmp_path / "cut.gguf", "llama", truncate=True)
    stage, err = build_and_initialize(path, {})
    assert stage == "initialize" and isinstance(err, (ValueError, OSError)), repr(err)
    assert "cut.gguf" in str(err)


# --- num_layers ----------------------------------------------------------------------


@pytest.mark.parametrize("family", ["gemma3_text", "qwen2"])
@pytest.mark.parametrize("num_layers,kept", [(3, 3), (1, 1), (-1, 3), (-3, 1)])
def test_a_cut_config_keeps_the_layer_types_of_the_kept_layers(family, num_layers, kept):
    """Gemma 3 alternates sliding and full layers, Qwen2 makes the layers from
    `max_window_layers` up sliding: the kept layers keep their own kinds."""
    config = tiny_config(family, num_layers=4)
    layer_types = list(config.layer_types)
    truncate_config(config, num_layers, "tiny")
    assert config.num_hidden_layers == kept
    assert list(config.layer_types) == layer_types[:kept]
    model = transformers.AutoModel.from_config(config)
    assert len(model.layers) == kept


@pytest.mark.parametrize("num_layers", [5, -4, -9])
def test_a_cut_beyond_the_model_names_the_accepted_range(num_layers):
    config = tiny_config("llama", num_layers=4)
    with pytest.raises(ValueError) as err:
        truncate_config(config, num_layers, "tiny")
    assert str(err.value) == (
        f"num_layers {num_layers}: model 'tiny' has only 4 decoder layers "
        "(accepted: 1 to 4 keeps the first N, -1 to -3 all but the last N, 0 all)"
    )
    assert config.num_hidden_layers == 4  # left as it was


def test_num_layers_keeps_the_first_layers_only(tiny_dirs, capfd):
    name = tiny_dirs("llama", "metaspace")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the cut-off layers' weights are unused on purpose: no warning
        short = get_backbone(tok2vec(name, num_layers=2))
    assert "layers.3" not in capfd.readouterr().err  # nor transformers' report of unused weights
    assert short.num_layers == 2 and len(short.model.layers) == 2
    full = get_backbone(tok2vec(name, finetune="frozen"))
    cut = get_backbone(tok2vec(name, finetune="frozen", num_layers=2))
    for key, value in cut.model.state_dict().items():  # the kept layers are the model's own
        torch.testing.assert_close(value, full.model.state_dict()[key], atol=0, rtol=0)
    from_the_top = get_backbone(tok2vec(name, finetune="frozen", num_layers=-2))  # all but the last 2
    assert from_the_top.num_layers == 2
    for key, value in from_the_top.model.state_dict().items():
        torch.testing.assert_close(value, cut.model.state_dict()[key], atol=0, rtol=0)
    for bad in (9, -4, -9):
        with pytest.raises(ValueError, match=f"num_layers {bad}: model .* has only 4 decoder layers"):
            tok2vec(name, num_layers=bad)


def test_loading_problems_other_than_the_cut_layers_are_still_reported():
    info = {"missing_keys": {"model.norm.weight"}, "mismatched_keys": [],
            "unexpected_keys": {"model.layers.2.mlp.up_proj.weight", "model.layers.1.extra", "lm_head.bias"}}
    with pytest.warns(UserWarning) as caught:
        warn_about_loading(info, "some/model", num_layers=2)
    message = str(caught[0].message)
    assert "missing from the checkpoint (left randomly initialised): model.norm.weight" in message
    assert "not used: lm_head.bias, model.layers.1.extra" in message and "layers.2" not in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # only cut-off layers unused: nothing to say
        warn_about_loading({"missing_keys": [], "unexpected_keys": ["model.layers.2.x"]}, "m", num_layers=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", FAMILIES)
def test_decoder_for_saved_weights_is_the_decoder_training_loads(family, dtype, tmp_path):
    """`decoder_from_config` (a saved pipeline's decoder) skips drawing random weights,
    since all are loaded next; it must still be the decoder that `from_pretrained` gives
    training: the buffers a family computes itself (rotary frequencies, embedding scale)
    there, with their values and dtypes (bfloat16 rotary frequencies would rotate every
    position a little wrongly), the weights in `dtype`, and the same outputs far into a
    sequence, bit for bit."""
    model_dir = save_tiny_model(tmp_path / "model", family)
    trained, _ = load_decoder(model_dir, dtype=dtype, attn_implementation="eager")
    loaded = decoder_from_config(load_config(model_dir), attn_implementation="eager", dtype=dtype)
    expected_buffers, got_buffers = dict(trained.named_buffers()), dict(loaded.named_buffers())
    assert list(got_buffers) == list(expected_buffers)
    for name, expected in expected_buffers.items():
        assert got_buffers[name].dtype == expected.dtype, name
        assert torch.equal(got_buffers[name], expected), name
    assert {p.dtype for p in loaded.parameters()} == {dtype}
    loaded.load_state_dict(trained.state_dict())
    ids = torch.arange(3, 203).remainder(300).unsqueeze(0)  # 200 positions
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).last_hidden_state, trained(ids).last_hidden_state, rtol=0, atol=0)
