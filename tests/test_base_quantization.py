"""`base_quantization` (`base_quantization.py`): a 4- or 8-bit frozen base through
bitsandbytes, with LoRA beside it, on the CPU; masks on every layer, saved as used."""
import builtins

import numpy as np
import pytest
import spacy
import torch

from spacy_unmask import get_backbone
from spacy_unmask.layers.decoder_tok2vec import DecoderTok2Vec
from spacy_unmask.settings import BackboneSettings
from test_saving import read_backbone
from tiny_models import (
    FAMILIES, TRAIN, check_doc, ents, gold_examples, make_pipeline, train_pipeline, vectors,
)

bnb = pytest.importorskip("bitsandbytes")
MODES = ("nf4", "int8")
LAYER = {"nf4": "Linear4bit", "int8": "Linear8bitLt"}
TEXTS = [text for text, _ in TRAIN] + ["Peter visited Berlin and the EU .", ""]
blank = spacy.blank("en")


def trained(model_dir, mode, steps=4, **tok2vec):
    nlp = make_pipeline(model_dir, base_quantization=mode, lora_r=4, **tok2vec)
    train_pipeline(nlp, steps, learn_rate=0.01)
    return nlp


def quantized_layers(backbone, mode):
    kind = getattr(bnb.nn, LAYER[mode])
    return [m for m in backbone.model.modules() if type(m) is kind]


def test_the_setting_is_checked():
    with pytest.raises(ValueError, match=r"base_quantization 'nf8' is not supported; accepted: none, nf4, int8"):
        BackboneSettings(name="x", base_quantization="nf8")
    with pytest.raises(ValueError, match=r"base_quantization 'nf4'.*cannot be trained.*finetune 'full'"):
        BackboneSettings(name="x", base_quantization="nf4", finetune="full")
    with pytest.raises(ValueError, match=r"quantize 'int8'.*base_quantization 'int8' already"):
        BackboneSettings(name="x", base_quantization="int8", quantize="int8")


def test_without_bitsandbytes_the_error_says_how_to_install_it(tiny_dirs, monkeypatch):
    real_import = builtins.__import__

    def no_bitsandbytes(name, *args, **kwargs):
        if name.split(".")[0] == "bitsandbytes":
            raise ImportError("No module named 'bitsandbytes'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_bitsandbytes)
    model = DecoderTok2Vec(name=tiny_dirs("llama"), base_quantization="nf4", dtype="float32")
    with pytest.raises(ValueError, match=r"needs bitsandbytes.*spacy-unmask\[qlora\]"):
        model.initialize()


@pytest.mark.parametrize("mode", MODES)
def test_every_block_linear_is_quantised_and_lora_sits_beside_it(tiny_dirs, mode):
    nlp = make_pipeline(tiny_dirs("llama", "metaspace"), base_quantization=mode, lora_targets=["attention", "mlp"])
    nlp.initialize(lambda: gold_examples(nlp))
    backbone = get_backbone(nlp)
    assert len(quantized_layers(backbone, mode)) == 7 * backbone.num_layers
    plain = [n for n, m in backbone.model.layers.named_modules() if type(m) is torch.nn.Linear and "lora_" not in n]
    assert not plain
    lora = [m for m in backbone.model.modules() if type(m).__module__ == "peft.tuners.lora.bnb"]
    assert len(lora) == 7 * backbone.num_layers  # peft's QLoRA layers
    assert backbone.model.embed_tokens.weight.dtype == torch.float32  # not quantised
    trainable = [n for n, p in backbone.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert not backbone.predicts_in_int8 and not backbone.merge_for_inference


def frozen_base(backbone):
    return {k: v.clone() for k, v in backbone.model.state_dict().items() if "lora_" not in k}


@pytest.mark.parametrize("mode", MODES)
def test_lora_trains_on_the_quantised_base_through_predictions(tiny_dirs, mode):
    """Every LoRA weight gets a gradient (through the quantised layers above it), also
    after a prediction, and the quantised base never changes."""
    nlp = trained(tiny_dirs("llama", "metaspace"), mode, steps=2)
    backbone = get_backbone(nlp)
    before = frozen_base(backbone)
    list(nlp.pipe(TEXTS))  # prediction between training steps
    lora = {n: p.detach().clone() for n, p in backbone.model.named_parameters() if p.requires_grad}
    train_pipeline(nlp, 2, learn_rate=0.01)
    moved = [n for n, p in backbone.model.named_parameters() if p.requires_grad and not torch.equal(p, lora[n])]
    assert sorted(moved) == sorted(lora)
    after = frozen_base(backbone)
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_masks_reach_every_layer_of_a_quantised_base(tiny_dirs, family, mode):
    name = tiny_dirs(family, "bytelevel")  # no BOS: on sliding-window families the change reaches the first word
    attn = "eager" if family == "gemma2" else "sdpa"
    vecs = {}
    for unmask in ("none", "all"):
        model = DecoderTok2Vec(name=name, unmask=unmask, base_quantization=mode, dtype="float32", attn_implementation=attn)
        model.initialize()
        vecs[unmask] = [model.predict([blank(t)])[0] for t in ("EU rejects Peter", "EU rejects Paris")]
    causal, unmasked = vecs["none"], vecs["all"]
    np.testing.assert_allclose(causal[0][:-1], causal[1][:-1], atol=1e-5)  # never looks right
    assert np.abs(unmasked[0][0] - unmasked[1][0]).max() > 1e-4  # looks right
    backbone = get_backbone(model)
    backbone.model.layers[1]._forward_pre_hooks.clear()
    ids = torch.tensor([[5, 17, 23, 31]])
    with pytest.raises(RuntimeError, match=r"decoder layers \[1\] did not take"):
        backbone.hidden_states(ids, torch.ones_like(ids))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_saved_as_used_and_loaded_to_the_same_predictions(tiny_dirs, tmp_path, mode, dtype):
    nlp = trained(tiny_dirs("llama", "metaspace"), mode, dtype=dtype)
    docs = [blank.make_doc(t) for t in TEXTS]
    expected_vectors, expected_ents = vectors(nlp, docs), [ents(d) for d in nlp.pipe(TEXTS)]
    nlp.to_disk(tmp_path / "first")
    weights = read_backbone(tmp_path / "first" / "ner" / "model")["weights"]
    from safetensors.torch import load

    stored = load(weights)
    storage = torch.uint8 if mode == "nf4" else torch.int8
    assert stored["layers.0.mlp.up_proj.weight"].dtype == storage
    assert stored["layers.0.self_attn.q_proj.base_layer.weight"].dtype == storage
    loaded = spacy.load(tmp_path / "first")
    assert len(quantized_layers(get_backbone(loaded), mode)) == 7 * get_backbone(loaded).num_layers
    for a, b in zip(vectors(loaded, docs), expected_vectors):
        np.testing.assert_array_equal(a, b)
    assert [ents(d) for d in loaded.pipe(TEXTS)] == expected_ents
    for doc in loaded.pipe(TEXTS):
        check_doc(loaded, doc)
    loaded.to_disk(tmp_path / "again")
    for path in (tmp_path / "first").rglob("*"):
        if path.is_file():
            assert (tmp_path / "again" / path.relative_to(tmp_path / "first")).read_bytes() == path.read_bytes(), path


def test_quantised_weights_are_stored_in_4_and_8_bits(tiny_dirs, tmp_path):
    from safetensors.torch import load

    name = tiny_dirs("llama", "metaspace", num_layers=2)
    stored = {}
    for mode in ("none", "int8", "nf4"):
        nlp = make_pipeline(name, base_quantization=mode, lora_r=4)
        nlp.initialize(lambda: gold_examples(nlp))
        nlp.to_disk(tmp_path / mode)
        weights = load(read_backbone(tmp_path / mode / "ner" / "model")["weights"])
        stored[mode] = sum(v.nbytes for k, v in weights.items() if k.startswith("layers.") and k.endswith("proj.weight"))
    assert stored["int8"] * 4 == stored["none"] == stored["nf4"] * 8  # float32 -> 8 and 4 bits


@pytest.mark.parametrize("mode", MODES)
def test_composes_with_repeat_windows_sentences_and_num_layers(tiny_dirs, tmp_path, mode):
    name = tiny_dirs("gemma3_text", "metaspace")
    nlp = trained(name, mode, unmask="middle", repeat=1, num_layers=-1, sentence_windows=True, sentence_context=4)
    backbone = get_backbone(nlp)
    assert backbone.num_layers == 3 and len(quantized_layers(backbone, mode)) == 7 * 3
    long_text = " ".join(TEXTS) * 6  # several windows
    doc = nlp(long_text)
    check_doc(nlp, doc)
    nlp.to_disk(tmp_path / "p")
    loaded = spacy.load(tmp_path / "p")
    assert ents(loaded(long_text)) == ents(doc)


@pytest.mark.parametrize("mode", MODES)
def test_adapter_mode_requantises_the_base_alike(tiny_dirs, tmp_path, monkeypatch, mode):
    monkeypatch.setenv("SPACY_UNMASK_FETCH_BASE", "1")  # the base is read from a path
    nlp = trained(tiny_dirs("llama", "bytelevel"), mode, save_mode="adapter")
    expected = vectors(nlp, [blank.make_doc(t) for t in TEXTS])
    nlp.to_disk(tmp_path / "p")
    stored = read_backbone(tmp_path / "p" / "ner" / "model")
    from safetensors.torch import load

    assert all("lora_" in k for k in load(stored["weights"]))
    loaded = spacy.load(tmp_path / "p")
    for a, b in zip(vectors(loaded, [blank.make_doc(t) for t in TEXTS]), expected):
        np.testing.assert_array_equal(a, b)


def test_a_damaged_quant_state_is_refused(tiny_dirs, tmp_path):
    from test_saving import forged_copy, with_digest
    from safetensors.torch import load, save

    nlp = trained(tiny_dirs("llama", "metaspace"), "nf4", steps=1)
    nlp.to_disk(tmp_path / "p")

    def forge(state_key, value):
        def edit(b):
            state = load(b["weights"])
            state[state_key] = value
            b["weights"] = save(state)
            return with_digest(b)

        return edit

    key = "layers.0.mlp.up_proj.weight"
    cases = {
        "quant_state.bitsandbytes__nf4": (torch.tensor(list(b'{"quant_type": "fp4"}'), dtype=torch.uint8), "not an NF4 state"),
        "absmax": (torch.zeros(3, dtype=torch.uint8), "is not torch.uint8 with 32 values"),
    }
    for suffix, (value, words) in cases.items():
        # (the loader may wrap the message into one that quotes nothing from the file)
        with pytest.raises(ValueError, match=f"{words}|damaged or hostile"):
            spacy.load(forged_copy(tmp_path / "p", tmp_path, forge(f"{key}.{suffix}", value)))
