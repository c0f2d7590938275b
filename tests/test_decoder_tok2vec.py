"""DecoderTok2Vec in a pipeline, on what users feed it: odd text, long
documents, batches and processes, and random tokens and text (fuzzing).

Everything runs on the tiny Llama-style decoders of `tiny_models`, with both tokenizer
styles: GPT-2 style byte-level BPE ("bytelevel", like SmolLM2) and SentencePiece style
with a BOS piece and byte fallback ("metaspace", like Llama and Gemma). Their tokenizers
get a normalizer in front (NFKC, and zero-width spaces and BEL characters removed, as
tokenizers that clean text do), so that some spaCy tokens map to no piece at all.
"""
import dataclasses
import json
import os
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spacy.tokens import Doc

from spacy_unmask import get_backbone
from spacy_unmask.windows import window_starts
from tiny_models import (
    ODD_TEXTS,
    STRIDE,
    STYLES,
    TRAIN,
    WINDOW,
    check_doc,
    ents,
    first_piece,
    mixed_texts,
    pieces_per_token,
    shifting_prefix,
    vectors,
)

# Examples per fuzz test; raise it for a deeper search (UNMASK_FUZZ_EXAMPLES=400 passes).
FUZZ_EXAMPLES = int(os.environ.get("UNMASK_FUZZ_EXAMPLES", "30"))


# --- odd text ----------------------------------------------------------------------


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("kind", list(ODD_TEXTS))
def test_odd_text_gives_vectors_and_valid_entities(tiny_pipelines, style, kind):
    nlp = tiny_pipelines[style]
    text = ODD_TEXTS[kind]
    doc = nlp(text)
    assert doc.text == text
    check_doc(nlp, doc)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("pooling", ["first", "last", "mean"])
def test_odd_text_every_pooling(tiny_pipelines, style, pooling):
    nlp = tiny_pipelines[style]
    mod = get_backbone(nlp)
    saved = mod.settings
    mod.settings = dataclasses.replace(saved, pooling=pooling)
    try:
        docs = [nlp.make_doc(text) for text in ODD_TEXTS.values()]
        for doc, vecs in zip(docs, vectors(nlp, docs)):
            check_doc(nlp, doc, vecs)
    finally:
        mod.settings = saved


@pytest.mark.parametrize("style", STYLES)
def test_tokens_without_pieces_get_zero_vectors(tiny_pipelines, style):
    nlp = tiny_pipelines[style]
    doc = Doc(nlp.vocab, words=["Berlin", "\u200b", "\x07\u200b", "Paris"], spaces=[True, True, True, False])
    assert pieces_per_token(get_backbone(nlp).tokenizer, doc) == [True, False, False, True]
    vecs = check_doc(nlp, nlp(doc))
    assert not vecs[1:3].any() and vecs[0].any() and vecs[3].any()
    # A batch in which no doc has a single piece (the decoder never runs).
    only = [Doc(nlp.vocab, words=["\u200b"]), Doc(nlp.vocab, words=[]), Doc(nlp.vocab, words=["\x07", "\u200b"])]
    for doc, vecs in zip(only, vectors(nlp, only)):
        assert vecs.shape == (len(doc), get_backbone(nlp).hidden_size) and not vecs.any()
    assert [d.ents for d in nlp.pipe(only)] == [(), (), ()]


# --- long documents ----------------------------------------------------------------


@pytest.mark.parametrize("style", STYLES)
def test_20000_token_doc_fully_processed(tiny_pipelines, style):
    nlp = tiny_pipelines[style]
    mod = get_backbone(nlp)
    tokenizer = mod.tokenizer
    tail = TRAIN[0][0] + " " + TRAIN[3][0]
    prefix, head_pieces = shifting_prefix(tokenizer, tail, prefix_words=20000)
    doc = nlp.make_doc(prefix + tail)
    assert len(doc) >= 20000
    tail_doc = nlp.make_doc(tail)
    assert [t.text for t in doc[-len(tail_doc) :]] == [t.text for t in tail_doc], "tail split differently"
    saved_settings = mod.settings
    mod.settings = dataclasses.replace(saved_settings, max_batch_pieces=8192)  # fewer, larger passes
    try:
        tracemalloc.start()
        batch = mod.plan([doc])
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        num_pieces = head_pieces + len(tokenizer(tail, add_special_tokens=False)["input_ids"])
        windows = sum(int(segments.max(axis=1).sum()) for _, segments in batch.sub_batches)
        assert windows == len(window_starts(num_pieces, WINDOW, STRIDE))
        # Planning is linear in the pieces (some 200 bytes each); a (pieces x windows) table
        # of int64 took 8 * 12,000 bytes per piece here, some 10 GiB.
        assert peak < 1000 * num_pieces, f"planning {num_pieces} pieces took {peak / 2**20:.0f} MiB"

        vecs = check_doc(nlp, doc)  # one finite vector per token, zeros only where no piece
        assert all(pieces_per_token(tokenizer, tail_doc))
        annotated = nlp(doc)
        assert annotated.ents, "the pipeline finds entities in the training sentences"
        check_doc(nlp, annotated, vecs)
        # The tail, past the first window that also holds prefix pieces, is exactly as alone
        # (up to float noise from batching the windows differently).
        alone = vectors(nlp, [tail_doc])[0]
    finally:
        mod.settings = saved_settings
    far = [i for i, t in enumerate(tail_doc) if first_piece(tokenizer, tail, t) >= WINDOW - STRIDE]
    assert len(far) > len(tail_doc) // 2
    np.testing.assert_allclose(vecs[-len(tail_doc) :][far], alone[far], rtol=0, atol=1e-5)


# --- batches and processes ---------------------------------------------------------


@pytest.mark.parametrize("style", STYLES)
def test_pipe_batching_matches_one_by_one(tiny_pipelines, style):
    nlp = tiny_pipelines[style]
    texts = mixed_texts()
    expected = [ents(nlp(text)) for text in texts]
    assert sum(len(e) for e in expected) >= 3, "no entities predicted: the check would be empty"
    for batch_size in (1, 2, 5, 1000):
        assert [ents(doc) for doc in nlp.pipe(texts, batch_size=batch_size)] == expected, batch_size
    docs = [nlp.make_doc(text) for text in texts]
    together = vectors(nlp, docs)
    for doc, vecs in zip(docs, together):
        np.testing.assert_allclose(vecs, vectors(nlp, [doc])[0], rtol=0, atol=1e-5)
        check_doc(nlp, doc, vecs)


@pytest.mark.parametrize("style", STYLES)
def test_pipe_two_processes_matches_one_by_one(tiny_pipelines, style):
    nlp = tiny_pipelines[style]
    texts = mixed_texts()
    expected = [ents(nlp(text)) for text in texts]
    assert sum(len(e) for e in expected) >= 3
    assert [ents(doc) for doc in nlp.pipe(texts, batch_size=2, n_process=2)] == expected


def test_pipe_workers_do_not_hang_after_the_parent_used_two_threads(tiny_pipelines, tmp_path):
    """GNU OpenMP hangs a forked child whose parent has run a parallel op: the
    n_process workers must still finish (make test runs with one thread, so this
    runs in its own process with two)."""
    import signal
    import subprocess
    import sys

    nlp = tiny_pipelines["metaspace"]
    nlp.to_disk(tmp_path / "pipeline")
    texts = [text for text, _ in TRAIN] * 2
    expected = [ents(doc) for doc in nlp.pipe(texts)]
    script = f"""
import json, spacy, torch
torch.set_num_threads(2)
nlp = spacy.load({str(tmp_path / "pipeline")!r})
x = torch.randn(512, 512)
for _ in range(10):
    x @ x  # starts the OpenMP pool in the parent
docs = nlp.pipe({texts!r}, batch_size=2, n_process=2)
print(json.dumps([[[e.start, e.end, e.start_char, e.end_char, e.label_] for e in d.ents] for d in docs]))
"""
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the workers too
        proc.communicate()
        pytest.fail("nlp.pipe(n_process=2) hung after torch had used two threads in the parent")
    assert proc.returncode == 0, err[-2000:]
    assert [[tuple(e) for e in doc] for doc in json.loads(out.strip().splitlines()[-1])] == expected


# --- fuzzing -----------------------------------------------------------------------


@pytest.mark.parametrize("style", STYLES)
@given(
    words_spaces=st.lists(st.tuples(st.text(min_size=1, max_size=12), st.booleans()), max_size=24),
    window=st.integers(2, 12),
    stride_fraction=st.floats(0.0, 1.0),
    pooling=st.sampled_from(["first", "last", "mean"]),
    max_batch_pieces=st.sampled_from([1, 7, 4096]),
)
@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
def test_fuzz_random_token_splits(tiny_pipelines, style, words_spaces, window, stride_fraction, pooling, max_batch_pieces):
    """Random tokens (any Unicode, any spacing) under random window, stride, pooling and
    batch size settings: one finite vector per token, valid entities."""
    nlp = tiny_pipelines[style]
    words = [w for w, _ in words_spaces]
    spaces = [s for _, s in words_spaces]
    mod = get_backbone(nlp)
    saved_settings = mod.settings
    stride = max(1, round(stride_fraction * window))
    mod.settings = dataclasses.replace(
        saved_settings, window=window, stride=stride, pooling=pooling, max_batch_pieces=max_batch_pieces
    )
    try:
        doc = nlp(Doc(nlp.vocab, words=words, spaces=spaces))
        assert [t.text for t in doc] == words
        check_doc(nlp, doc)
    finally:
        mod.settings = saved_settings


@pytest.mark.parametrize("style", STYLES)
@given(text=st.text(max_size=80))
@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
def test_fuzz_random_text(tiny_pipelines, style, text):
    nlp = tiny_pipelines[style]
    doc = nlp(text)
    assert doc.text == text
    check_doc(nlp, doc)
