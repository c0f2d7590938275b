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


# --- sequence repetition (`repeat`) ----------------------------------------------------


@pytest.mark.parametrize("style", ["bytelevel", "metaspace"])
def test_repetition_lets_a_causal_model_see_the_right_context(tiny_dirs, style):
    """Under `none`, the first word's vector (read from the last copy) changes with the
    last word exactly when the sequence is repeated."""
    for repeat, sees_right in ((0, False), (1, True), (2, True)):
        model = tok2vec(tiny_dirs("llama", style), "none", repeat=repeat)
        before, after = vectors(model, SENTENCE, CHANGED)
        moved = np.abs(before[0] - after[0]).max()
        assert (moved > 1e-4) == sees_right, (repeat, moved)


def test_repetition_reads_the_last_copy_with_positions_counting_on(tiny_dirs):
    model = tok2vec(tiny_dirs("llama", "metaspace"), "none", repeat=1)
    backbone = get_backbone(model)
    batch = backbone.plan([nlp("EU rejects German lamb")])
    (ids, segments), = batch.sub_batches
    row = ids[0][segments[0] > 0]
    half = len(row) // 2
    assert row[0] == backbone.bos_id and list(row[:half]) == list(row[half:])  # BOS included, twice
    assert batch.token_first[0].min() >= half  # vectors come from the second copy
    # The vectors are the (causal; tested equal to the stock model's) states of the whole
    # repeated row read as one sequence, positions 0 .. 2n-1, at the second copy's pieces.
    with torch.no_grad():
        ids = torch.from_numpy(row[None])
        stock = backbone.hidden_states(ids, torch.ones_like(ids))[0]
    (ours,) = vectors(model, "EU rejects German lamb")
    np.testing.assert_allclose(ours, stock[batch.token_first[0]].numpy(), atol=1e-5)


@pytest.mark.parametrize("unmask", ["none", "middle", "all"])
def test_repeated_docs_packed_or_alone_agree_and_padding_never_leaks(tiny_dirs, unmask):
    model = tok2vec(tiny_dirs("gemma3_text", "metaspace"), unmask, repeat=1, lookahead=3)
    short = "EU rejects German call"
    (alone,) = vectors(model, short)
    packed, _ = vectors(model, short, SENTENCE + " and " + SENTENCE)
    np.testing.assert_allclose(alone, packed, atol=1e-5)


def test_repetition_shares_the_window_budget(tiny_dirs):
    """With repeat = 1 a window of 16 pieces holds 8 pieces of text, read twice; long
    docs still get one vector per token."""
    model = tok2vec(tiny_dirs("llama", "bytelevel"), "all", repeat=1, window=16, stride=8)
    backbone = get_backbone(model)
    doc = nlp(" ".join([SENTENCE] * 6))
    batch = backbone.plan([doc])
    widths = {int((seg == s).sum()) for ids, segments in batch.sub_batches for seg in segments for s in set(seg.tolist()) - {0}}
    assert max(widths) <= 16
    (vecs,) = model.predict([doc])
    assert vecs.shape == (len(doc), backbone.hidden_size) and np.abs(vecs).sum(axis=1).min() > 0


def test_a_layer_without_its_mask_fails_loudly_with_repetition(tiny_dirs):
    model = tok2vec(tiny_dirs("llama", "metaspace"), "none", repeat=1)
    backbone = get_backbone(model)
    backbone.model.layers[1]._forward_pre_hooks.clear()
    ids = torch.tensor([[5, 17, 23, 5, 17, 23]])
    with pytest.raises(RuntimeError, match=r"decoder layers \[1\] did not take their per-layer attention mask"):
        backbone.hidden_states(ids, torch.ones_like(ids))
