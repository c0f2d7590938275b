"""Mask mechanics on every supported family, seen through the tok2vec layer."""
import numpy as np
import pytest
import spacy
import torch

from spacy_unmask import get_backbone
from spacy_unmask.layers.decoder_tok2vec import DecoderTok2Vec
from tiny_models import FAMILIES

nlp = spacy.blank("en")
SENTENCE = "Peter Blackburn visited the European Commission in Brussels"
CHANGED = "Peter Blackburn visited the European Commission in Paris"


def tok2vec(name, unmask, **settings):
    settings.setdefault("dtype", "float32")
    model = DecoderTok2Vec(name=name, unmask=unmask, **settings)
    model.initialize()
    return model


def vectors(model, *texts):
    return model.predict([nlp(t) for t in texts])


def _family_params():
    for family in FAMILIES:
        yield pytest.param(family, "sdpa" if family != "gemma2" else "eager", id=f"{family}")
    yield pytest.param("llama", "eager", id="llama-eager")
    yield pytest.param("gemma3_text", "eager", id="gemma3-eager")


FAMILY_PARAMS = list(_family_params())


@pytest.mark.parametrize("family,attn", FAMILY_PARAMS)
def test_causal_model_never_looks_right(tiny_dirs, family, attn):
    model = tok2vec(tiny_dirs(family, "metaspace"), "none", attn_implementation=attn)
    before, after = vectors(model, SENTENCE, CHANGED)
    np.testing.assert_allclose(before[:-1], after[:-1], atol=1e-5)
    assert not np.allclose(before[-1], after[-1], atol=1e-5)


@pytest.mark.parametrize("family,attn", FAMILY_PARAMS)
def test_unmasked_model_looks_right_at_batch_size_one(tiny_dirs, family, attn):
    model = tok2vec(tiny_dirs(family, "bytelevel"), "all", attn_implementation=attn)
    # Short, so that on sliding-window families (window 4, 4 layers) the change can reach
    # the first word through the stacked layers.
    (before,) = vectors(model, "EU rejects Peter")
    (after,) = vectors(model, "EU rejects Paris")
    assert np.abs(before[0] - after[0]).max() > 1e-4


@pytest.mark.parametrize("family,attn", FAMILY_PARAMS)
@pytest.mark.parametrize("unmask", ["none", "all", "2-3"])
def test_padding_does_not_change_vectors(tiny_dirs, family, attn, unmask):
    model = tok2vec(tiny_dirs(family, "bytelevel"), unmask, attn_implementation=attn)
    short = "EU rejects German call"
    (alone,) = vectors(model, short)
    batched, _ = vectors(model, short, SENTENCE + " and " + SENTENCE)
    np.testing.assert_allclose(alone, batched, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "mistral"])
def test_layers_below_the_first_unmasked_layer_stay_causal(tiny_dirs, family):
    model = tok2vec(tiny_dirs(family, "metaspace"), "2-3")
    backbone = get_backbone(model)
    outputs = {}
    hooks = [
        layer.register_forward_hook(lambda mod, args, out, i=i: outputs.__setitem__(i, (out[0] if isinstance(out, tuple) else out).clone()))
        for i, layer in enumerate(backbone.model.layers)
    ]
    runs = []
    for last_id in (40, 41):
        ids = torch.tensor([[5, 17, 23, 31, 9, last_id]])
        with torch.no_grad():
            backbone.hidden_states(ids, torch.ones_like(ids))
        runs.append(dict(outputs))
    for hook in hooks:
        hook.remove()
    for layer in (0, 1):  # causal: earlier positions ignore the changed last piece
        torch.testing.assert_close(runs[0][layer][0, :-1], runs[1][layer][0, :-1], atol=1e-5, rtol=0)
    for layer in (2, 3):  # unmasked: earlier positions (within the sliding window, if any) see it
        assert (runs[0][layer][0, :-1] - runs[1][layer][0, :-1]).abs().max() > 1e-5


@pytest.mark.parametrize("pooling", ["first", "last", "mean"])
def test_windows_give_one_vector_per_token_and_match_where_they_cover(tiny_dirs, pooling):
    name = tiny_dirs("llama", "metaspace")
    wide = tok2vec(name, "all", pooling=pooling)
    narrow = tok2vec(name, "all", pooling=pooling, window=64, stride=32)
    short_doc = "EU rejects German lamb"  # under 64 pieces
    long_doc = " ".join([SENTENCE] * 12)
    wide_short, wide_long = vectors(wide, short_doc, long_doc)
    narrow_short, narrow_long = vectors(narrow, short_doc, long_doc)
    np.testing.assert_allclose(wide_short, narrow_short, atol=1e-5)
    assert narrow_long.shape == wide_long.shape == (len(nlp(long_doc)), 32)
    assert np.isfinite(narrow_long).all()


def test_pooling_modes_differ_for_multi_piece_tokens(tiny_dirs):
    name = tiny_dirs("llama", "bytelevel")
    doc = "Blackburnshire"  # several pieces in the tiny vocabulary
    first, last, mean = (vectors(tok2vec(name, "all", pooling=p), doc)[0] for p in ("first", "last", "mean"))
    assert not np.allclose(first, last) and not np.allclose(first, mean)


def test_bfloat16_is_close_to_float32(tiny_dirs):
    name = tiny_dirs("llama", "bytelevel")
    (full,) = vectors(tok2vec(name, "all", dtype="float32"), SENTENCE)
    (half,) = vectors(tok2vec(name, "all", dtype="bfloat16"), SENTENCE)
    assert np.abs(full - half).max() < 0.1 * np.abs(full).max()


def test_lora_trains_only_adapter_weights(tiny_dirs):
    model = tok2vec(tiny_dirs("llama"), "all")
    base = get_backbone(model).model
    trainable = [n for n, p in base.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    frozen = get_backbone(tok2vec(tiny_dirs("llama"), "all", finetune="frozen")).model
    assert not any(p.requires_grad for p in frozen.parameters())
    full = get_backbone(tok2vec(tiny_dirs("llama"), "all", finetune="full")).model
    assert all(p.requires_grad for p in full.parameters())


def test_unsupported_architecture_is_named(tmp_path):
    import transformers

    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="gpt2.*Supported: llama, mistral"):
        tok2vec(str(tmp_path), "all")


@pytest.mark.parametrize("family,attn", FAMILY_PARAMS)
def test_causal_spec_reproduces_the_stock_model_with_padding(family, attn):
    """`none` must be the stock model exactly: causal mask, sliding windows and padding."""
    from tiny_models import tiny_backbone, tiny_decoder

    base = tiny_decoder(family, attn_implementation=attn)
    ids = torch.randint(3, 300, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 7:] = 0
    with torch.no_grad():
        stock = base(input_ids=ids, attention_mask=mask).last_hidden_state
        ours = tiny_backbone(base, "none").hidden_states(ids, mask)
    torch.testing.assert_close(ours[0], stock[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(ours[1, :7], stock[1, :7], atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_unmasked_sliding_layers_see_the_window_on_both_sides_only(family):
    from tiny_models import tiny_backbone, tiny_decoder

    base = tiny_decoder(family, attn_implementation="eager", num_layers=1)
    decoder = tiny_backbone(base, "all").hidden_states
    ids = torch.randint(3, 300, (1, 10))
    changed = ids.clone()
    changed[0, 6] += 1
    with torch.no_grad():
        before, after = decoder(ids, torch.ones_like(ids)), decoder(changed, torch.ones_like(ids))
    moved = (before - after).abs().amax(-1)[0] > 1e-6
    # window 4: position 6 reaches positions 3..9 (distance < 4), in both directions
    assert moved.tolist() == [False, False, False, True, True, True, True, True, True, True]


@pytest.mark.parametrize("family,attn", FAMILY_PARAMS)
@pytest.mark.parametrize("unmask", ["none", "all", "2-3"])
def test_docs_packed_in_one_row_match_each_doc_alone(family, attn, unmask):
    """Packing is invisible: positions restart and no piece sees another doc."""
    from tiny_models import tiny_backbone, tiny_decoder

    decoder = tiny_backbone(tiny_decoder(family, attn_implementation=attn), unmask).hidden_states
    first, second = torch.randint(3, 300, (1, 7)), torch.randint(3, 300, (1, 5))
    row = torch.cat([first, second, torch.zeros(1, 2, dtype=torch.long)], dim=1)
    segments = torch.tensor([[1] * 7 + [2] * 5 + [0] * 2])
    with torch.no_grad():
        packed = decoder(row, segments)[0]
        alone = [decoder(ids, torch.ones_like(ids))[0] for ids in (first, second)]
    torch.testing.assert_close(packed[:7], alone[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[7:12], alone[1], atol=1e-5, rtol=0)


def test_short_docs_share_rows_and_keep_their_own_vectors(tiny_dirs):
    model = tok2vec(tiny_dirs("llama", "metaspace"), "all")
    docs = [nlp(t) for t in (SENTENCE, "EU rejects German call", "Peter", CHANGED, "Brussels")]
    batch = get_backbone(model).plan(docs)
    assert sum(ids.shape[0] for ids, _ in batch.sub_batches) < len(docs)  # short docs share rows
    together = model.predict(docs)
    for doc, vecs in zip(docs, together):
        np.testing.assert_allclose(vecs, model.predict([doc])[0], atol=1e-5)


def test_a_layer_without_its_mask_fails_loudly(tiny_dirs):
    """If transformers stopped passing the mask keyword on, no layer may fall back to causal."""
    backbone = get_backbone(tok2vec(tiny_dirs("llama"), "all"))
    ids = torch.tensor([[5, 17, 23]])
    with pytest.raises(RuntimeError, match="decoder layer 0 .*no per-layer attention mask"):
        backbone.model(input_ids=ids, attention_mask=torch.ones_like(ids))


def test_num_layers_keeps_the_first_layers_only(tiny_dirs, capfd):
    import warnings

    name = tiny_dirs("llama", "metaspace")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the cut-off layers' weights are unused on purpose: no warning
        short = get_backbone(tok2vec(name, "all", num_layers=2))
    assert "layers.3" not in capfd.readouterr().err  # nor transformers' report of unused weights
    assert short.num_layers == 2 and len(short.model.layers) == 2
    full = get_backbone(tok2vec(name, "all", finetune="frozen"))
    cut = get_backbone(tok2vec(name, "all", finetune="frozen", num_layers=2))
    for key, value in cut.model.state_dict().items():  # the kept layers are the model's own
        torch.testing.assert_close(value, full.model.state_dict()[key], atol=0, rtol=0)
    from_the_top = get_backbone(tok2vec(name, "all", finetune="frozen", num_layers=-2))  # all but the last 2
    assert from_the_top.num_layers == 2
    for key, value in from_the_top.model.state_dict().items():
        torch.testing.assert_close(value, cut.model.state_dict()[key], atol=0, rtol=0)
    for bad in (9, -4, -9):
        with pytest.raises(ValueError, match=f"num_layers {bad}: model .* has only 4 decoder layers"):
            tok2vec(name, "all", num_layers=bad)


def test_loading_problems_other_than_the_cut_layers_are_still_reported():
    import warnings

    from spacy_unmask.loading import warn_about_loading

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


def test_get_backbone_on_pipelines_components_and_layers(tiny_dirs, tmp_path):
    from spacy.training import Example

    fresh = spacy.blank("en")
    fresh.add_pipe("unmask_ner", name="ner", config={"model": {"tok2vec": {"name": tiny_dirs("llama"), "dtype": "float32"}}})
    with pytest.raises(ValueError, match="not loaded yet"):
        get_backbone(fresh)
    ref = fresh.make_doc("Peter visited Brussels")
    ref.ents = [ref.char_span(0, 5, label="PER")]
    fresh.initialize(lambda: [Example(fresh.make_doc(ref.text), ref)])
    backbone = get_backbone(fresh)
    assert get_backbone(fresh.get_pipe("ner")) is backbone
    assert get_backbone(fresh.get_pipe("ner").model.get_ref("tok2vec")) is backbone
    assert backbone.settings is fresh.get_pipe("ner").model.get_ref("tok2vec").attrs["settings"]
    fresh.to_disk(tmp_path / "p")
    loaded = spacy.load(tmp_path / "p", config={"components": {"ner": {"model": {"tok2vec": {"window": 64, "stride": 32}}}}})
    settings = get_backbone(loaded).settings
    assert (settings.window, settings.stride) == (64, 32)  # a load-time override reaches the one settings object
    assert loaded.get_pipe("ner").model.get_ref("tok2vec").attrs["settings"] is settings
    with pytest.raises(ValueError, match="no spacy_unmask backbone"):
        get_backbone(spacy.blank("en"))


def test_prediction_after_a_training_pass_runs_without_dropout(tiny_dirs):
    model = tok2vec(tiny_dirs("llama"), "all", lora_dropout=0.5)
    torch.manual_seed(0)
    with torch.no_grad():  # as after some training: LoRA starts at zero, where dropout has no effect
        for name, param in get_backbone(model).named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    docs = [nlp(SENTENCE)]
    before = model.predict(docs)[0]
    model.begin_update(docs)  # training mode: LoRA dropout on
    first, second = model.predict(docs)[0], model.predict(docs)[0]
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(first, before)  # no optimizer step: the same model
