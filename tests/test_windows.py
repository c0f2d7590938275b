"""Windows: a token's vector depends only on the window it is read from, on every family."""
import numpy as np
import pytest
import spacy

from spacy_unmask import get_backbone
from spacy_unmask.layers.decoder_tok2vec import DecoderTok2Vec
from test_robustness import STRIDE, TRAIN, WINDOW, first_piece, shifting_prefix
from tiny_models import FAMILIES

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
