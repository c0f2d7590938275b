"""Windows: which window each piece is read from, and a token's vector depends only on that
window, on every family."""
import dataclasses

import numpy as np
import pytest
import spacy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spacy_unmask import get_backbone
from spacy_unmask.layers.decoder_tok2vec import DecoderTok2Vec
from spacy_unmask.windows import assign_windows, token_spans, window_starts
from tiny_models import (
    FAMILIES,
    STRIDE,
    STYLES,
    TRAIN,
    WINDOW,
    first_piece,
    gold_examples,
    make_pipeline,
    shifting_prefix,
    vectors,
)

nlp = spacy.blank("en")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("unmask,lookahead", [("all", 0), ("all", 3), ("none", 0)])
def test_vectors_do_not_depend_on_where_the_doc_is_cut(tiny_dirs, family, unmask, lookahead):
    """The same text cut into windows at other places (a prefix of a multiple of the stride
    shifts every cut): tokens whose window holds the same pieces get the same vectors, so
    positions restart, BOS and the masks are exact. Each window runs alone (max_batch_pieces=1)."""
    model = DecoderTok2Vec(name=tiny_dirs(family, "metaspace"), unmask=unmask, lookahead=lookahead, window=WINDOW,
                           stride=STRIDE, max_batch_pieces=1, finetune="frozen", dtype="float32",
                           attn_implementation="eager" if family == "gemma2" else "sdpa")
    model.initialize()
    tokenizer = get_backbone(model).tokenizer
    tail = TRAIN[3][0] + " " + TRAIN[0][0]
    prefix, head_pieces = shifting_prefix(tokenizer, tail, prefix_words=30)
    tail_doc, doc = nlp.make_doc(tail), nlp.make_doc(prefix + tail)
    alone = model.predict([tail_doc])[0]
    shifted = model.predict([doc])[0][-len(tail_doc):]
    position = np.array([first_piece(tokenizer, tail, t) for t in tail_doc])
    far = position >= WINDOW - STRIDE  # read from windows that hold tail pieces only
    assert far.sum() > 5
    np.testing.assert_allclose(shifted[far], alone[far], rtol=0, atol=1e-5)


def sentences_doc(text, starts):
    doc = nlp.make_doc(text)
    for i, token in enumerate(doc):
        token.is_sent_start = i in starts
    return doc


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "mistral"])
def test_sentence_windows_read_each_sentence_alone_or_with_its_context(tiny_dirs, family):
    def model(**settings):
        m = DecoderTok2Vec(name=tiny_dirs(family, "metaspace"), unmask="all", sentence_windows=True,
                           finetune="frozen", dtype="float32", **settings)
        m.initialize()
        return m

    first, second, changed = "Peter Blackburn visited Brussels .", "EU rejects German lamb .", "Paris said no ."
    docs = [sentences_doc(f"{first} {second}", (0, 5)), sentences_doc(f"{changed} {second}", (0, 4))]
    alone = model(sentence_context=0)
    a, b = alone.predict(docs)
    np.testing.assert_allclose(a[:5], alone.predict([nlp.make_doc(first)])[0], atol=1e-5)  # as if alone
    np.testing.assert_allclose(a[5:], b[4:], atol=1e-5)  # the second sentence never sees the first
    # ...and is read exactly as it would be alone (tokenized alone: no leading-space piece)
    np.testing.assert_allclose(a[5:], alone.predict([nlp.make_doc(second)])[0], atol=1e-5)
    with_context = model(sentence_context=4)
    a, b = with_context.predict(docs)
    assert np.abs(a[5:] - b[4:]).max() > 1e-4  # with context it reads the end of the first
    # A doc without sentence boundaries is cut by window and stride, as before.
    plain = nlp.make_doc(f"{first} {second}")
    np.testing.assert_allclose(alone.predict([plain])[0], model(sentence_context=0).predict([plain])[0], atol=1e-6)
    fixed = DecoderTok2Vec(name=tiny_dirs(family, "metaspace"), unmask="all", finetune="frozen", dtype="float32")
    fixed.initialize()
    np.testing.assert_allclose(alone.predict([plain])[0], fixed.predict([plain])[0], atol=1e-5)


@pytest.mark.parametrize("style", STYLES)
def test_token_vector_depends_only_on_its_window(normalizer_dirs, style):
    """Prepending a multiple of the stride in pieces shifts every window of the tail by
    whole windows: a tail piece at position >= WINDOW - STRIDE lies only in windows that
    hold tail pieces alone, so its vector must not change at all. Each window runs alone
    (max_batch_pieces=1), so the check is exact."""
    nlp = make_pipeline(normalizer_dirs[style], finetune="frozen", max_batch_pieces=1)
    nlp.initialize(lambda: gold_examples(nlp))
    tokenizer = get_backbone(nlp).tokenizer
    tail = TRAIN[3][0] + " " + TRAIN[0][0]
    prefix, head_pieces = shifting_prefix(tokenizer, tail, prefix_words=30)
    assert head_pieces % STRIDE == 0 and head_pieces >= 3 * WINDOW
    tail_doc = nlp.make_doc(tail)
    doc = nlp.make_doc(prefix + tail)
    assert [t.text for t in doc[-len(tail_doc) :]] == [t.text for t in tail_doc]
    alone = vectors(nlp, [tail_doc])[0]
    shifted = vectors(nlp, [doc])[0][-len(tail_doc) :]
    position = np.array([first_piece(tokenizer, tail, t) for t in tail_doc])
    far = position >= WINDOW - STRIDE
    near = (position >= 0) & ~far
    assert far.sum() > 5 and near.sum() > 0
    np.testing.assert_array_equal(shifted[far], alone[far])
    # Near the start of the tail the prefix is inside the (bidirectional) window.
    assert not np.array_equal(shifted[near], alone[near])


@pytest.mark.parametrize("style", STYLES)
def test_doc_shorter_than_window_matches_unwindowed(tiny_pipelines, style):
    """A doc that fits in one window gets exactly what the decoder gives the whole text."""
    nlp = tiny_pipelines[style]
    mod = get_backbone(nlp)
    text = TRAIN[0][0]
    doc = nlp.make_doc(text)
    enc = mod.tokenizer(text, add_special_tokens=False)
    num_pieces = len(enc["input_ids"])
    ids = ([mod.bos_id] if mod.bos_id is not None else []) + enc["input_ids"]
    mod.eval()  # no LoRA dropout
    with torch.no_grad():
        hidden = mod.hidden_states(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0]
    hidden = hidden[len(ids) - num_pieces :].float().numpy()
    expected = np.stack([hidden[first_piece(mod.tokenizer, text, t)] for t in doc])
    saved = mod.settings
    try:
        for window in (num_pieces, 4 * num_pieces):
            mod.settings = dataclasses.replace(saved, window=window, stride=window // 2)
            assert len(mod.plan([doc]).sub_batches) == 1
            np.testing.assert_allclose(vectors(nlp, [doc])[0], expected, rtol=0, atol=1e-6)
        # ...and cut into windows, tokens in the middle of the text change.
        mod.settings = dataclasses.replace(saved, window=8, stride=4)
        assert not np.allclose(vectors(nlp, [doc])[0], expected, atol=1e-3)
    finally:
        mod.settings = saved


# --- the assignment, against the obvious definition --------------------------------


@given(st.integers(2, 40), st.data())
@settings(max_examples=60, deadline=None)
def test_assign_windows_matches_brute_force(window, data):
    stride = data.draw(st.integers(1, window))
    num_pieces = data.draw(st.integers(0, 300))
    starts = window_starts(num_pieces, window, stride) if num_pieces else np.zeros(0, dtype=np.int64)
    got = assign_windows(num_pieces, starts, window)
    pieces = np.arange(num_pieces)[:, None]
    left, right = pieces - starts[None, :], starts[None, :] + window - 1 - pieces
    margin = np.where((left < 0) | (right < 0), -1, np.minimum(left, right))
    expected = margin.argmax(axis=1) if num_pieces else np.zeros(0, dtype=np.int64)
    np.testing.assert_array_equal(got, expected)
    if num_pieces:
        covered = starts[got]
        assert ((covered <= pieces[:, 0]) & (pieces[:, 0] < covered + window)).all()


@pytest.mark.parametrize("text", ["Héllo  wörld 😀 a\tb  \n x", "Peter Blackburn visited Brussels .", ""])
def test_token_spans_are_each_tokens_characters(text):
    doc = spacy.blank("en")(text)
    starts, ends = token_spans(doc)
    assert starts.dtype == ends.dtype == np.int64
    assert [text[a:b] for a, b in zip(starts, ends)] == [t.text for t in doc]
    assert list(starts) == [t.idx for t in doc]
