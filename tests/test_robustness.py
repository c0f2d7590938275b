"""Robustness (issue #6): odd text, long documents, batching, settings, saved pipelines,
interrupted training, determinism and fuzzing, on tiny random decoders (under a minute).

Everything runs on the tiny Llama-style decoders of `tiny_models`, with both tokenizer
styles: GPT-2 style byte-level BPE ("bytelevel", like SmolLM2) and SentencePiece style
with a BOS piece and byte fallback ("metaspace", like Llama and Gemma). Their tokenizers
get a normalizer in front (NFKC, and zero-width spaces and BEL characters removed, as
tokenizers that clean text do), so that some spaCy tokens map to no piece at all.

"""
import dataclasses
import itertools
import json
import math
import os
import pickle
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import spacy
import srsly
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from spacy.tokens import Doc, DocBin
from spacy.training import Example
from spacy.util import fix_random_seed
from thinc.api import Adam, Config

from spacy_unmask.windows import assign_windows, window_starts
from spacy_unmask import get_backbone
from tiny_models import save_tiny_model, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
STYLES = ("bytelevel", "metaspace")
WINDOW, STRIDE = 16, 8
# Examples per fuzz test; raise it for a deeper search (UNMASK_FUZZ_EXAMPLES=400 passes).
FUZZ_EXAMPLES = int(os.environ.get("UNMASK_FUZZ_EXAMPLES", "30"))
# Dropped by the tokenizers' normalizer: tokens made of them have no piece.
DROPPED = ("\u200b", "\x07")
TRAIN = [
    (
        "Peter Blackburn visited the European Commission in Brussels on Monday .",
        [("Peter Blackburn", "PER"), ("European Commission", "ORG"), ("Brussels", "LOC")],
    ),
    ("German officials said the ban would last until scientists found a cure .", []),
    ("EU rejects German call to boycott British lamb .", [("EU", "ORG")]),
    (
        "The capital of Germany is Berlin , and Paris is the capital of France .",
        [("Germany", "LOC"), ("Berlin", "LOC"), ("Paris", "LOC"), ("France", "LOC")],
    ),
]
ODD_TEXTS = {
    "empty": "",
    "space": " ",
    "spaces": "     ",
    "newline": "\n",
    "newlines": "\n\n\n",
    "whitespace_tokens": "Peter  Blackburn\n\nvisited \t Berlin\u3000today \r\n .\n",
    "emoji": "😀 👍🏽 👨\u200d👩\u200d👧 🇩🇪 Peter visited Berlin😀",
    "cjk": "東京は日本の首都です。北京市 서울특별시 Berlin",
    "rtl": "مرحبا بالعالم שלום עולם \u200fPeter\u202e Berlin\u202c ؟",
    "combining": "e\u0301 a\u0300\u0301\u0302 Z\u0351\u0352\u0357\u035b n\u0303 \u0301alone",
    "control": "Peter\x00Blackburn \x07 \x1b[31mred\x1b[0m \u0085 \u2028 \ufeff end\x7f",
    "zero_pieces": "\u200b \x07 Berlin \u200b\x07 \u200b",
    "url": "See https://example.com/" + "path/" * 100 + "?q=Berlin&x=1 now .",
    "long_token": "x" * 500,
    "long_token_mixed": "ab東😀é" * 100,
    "mixed_language": "Angela Merkel besuchte 東京 und sagte «Привет» — مرحبا, Peter! 😀 ½ ﬁ Ⅻ ｆｕｌｌ",
}


# --- helpers -------------------------------------------------------------------------


def save_model(path: Path, style: str) -> str:
    """A tiny Llama save_pretrained directory whose tokenizer drops DROPPED characters."""
    from tokenizers import normalizers

    save_tiny_model(path, "llama", style)
    tokenizer = tiny_tokenizer(style)
    tokenizer.backend_tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFKC()] + [normalizers.Replace(c, "") for c in DROPPED]
    )
    tokenizer.save_pretrained(str(path))
    return str(path)


def examples(nlp, data=TRAIN):
    out = []
    for text, ents in data:
        spans = [(text.index(s), text.index(s) + len(s), label) for s, label in ents]
        out.append(Example.from_dict(nlp.make_doc(text), {"entities": spans}))
    return out


def make_pipeline(model_dir: str, **tok2vec):
    config = {"name": model_dir, "unmask": "all", "dtype": "float32", "window": WINDOW, "stride": STRIDE}
    config.update(tok2vec)
    nlp = spacy.blank("en")
    nlp.add_pipe("unmask_ner", name="ner", config={"model": {"tok2vec": config}})
    return nlp


def train(nlp, steps: int, *, learn_rate: float = 0.02, drop: float = 0.0, data=TRAIN):
    egs = examples(nlp, data)
    nlp.initialize(lambda: egs)
    optimizer = Adam(learn_rate)
    losses = {}
    for _ in range(steps):
        losses = nlp.update(egs, sgd=optimizer, drop=drop)
    return losses


def tok2vec(nlp):
    return nlp.get_pipe("ner").model.get_ref("tok2vec")


def module(nlp):
    return get_backbone(nlp)


def vectors(nlp, docs):
    return tok2vec(nlp).predict(list(docs))


def ents(doc):
    return [(e.start, e.end, e.start_char, e.end_char, e.label_) for e in doc.ents]


def pieces_per_token(tokenizer, doc):
    """Independently of windows.py: does any non-empty piece overlap each token's characters?"""
    enc = tokenizer(doc.text, add_special_tokens=False, return_offsets_mapping=True)
    covered = np.zeros(len(doc.text) + 1, dtype=np.int64)  # +1 at a piece's start, -1 at its end
    for start, end in enc["offset_mapping"]:
        if end > start:
            covered[start] += 1
            covered[end] -= 1
    covered_chars = np.concatenate([[0], np.cumsum(np.cumsum(covered)[:-1] > 0)])
    return [bool(covered_chars[t.idx + len(t.text)] > covered_chars[t.idx]) for t in doc]


def check_doc(nlp, doc, vecs=None):
    """The invariants a user relies on: one finite vector per token, valid entity spans."""
    ner = nlp.get_pipe("ner")
    vecs = vectors(nlp, [doc])[0] if vecs is None else vecs
    width = module(nlp).hidden_size
    assert vecs.shape == (len(doc), width)
    assert np.isfinite(vecs).all()
    # A token gets a real vector exactly when the tokenizer gave it a piece, zeros otherwise.
    has = np.array(pieces_per_token(module(nlp).tokenizer, doc), dtype=bool)
    nonzero = vecs.any(axis=1) if len(doc) else np.zeros(0, dtype=bool)
    wrong = np.flatnonzero(nonzero != has)
    assert not len(wrong), f"tokens {[doc[int(i)].text for i in wrong[:5]]}: zero vector iff no piece"
    previous_end = 0
    text = doc.text  # spaCy joins the tokens anew on each access
    for ent in doc.ents:
        assert 0 <= ent.start < ent.end <= len(doc)
        assert ent.start >= previous_end  # sorted, not overlapping
        previous_end = ent.end
        assert 0 <= ent.start_char < ent.end_char <= len(text)
        assert text[ent.start_char : ent.end_char] == ent.text
        assert ent.label_ in ner.labels
    return vecs


@dataclasses.dataclass
class Pipelines:
    model_dirs: dict
    nlps: dict


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Per tokenizer style: the model directory and a pipeline trained until it finds entities."""
    root = tmp_path_factory.mktemp("robustness")
    dirs, nlps = {}, {}
    for style in STYLES:
        fix_random_seed(0)
        dirs[style] = save_model(root / style, style)
        nlp = make_pipeline(dirs[style], lora_r=4, lora_alpha=4, max_batch_pieces=512)
        train(nlp, 60)
        found = sum(bool(nlp(text).ents) for text, _ in TRAIN)
        assert found >= 2, f"{style}: the fixture pipeline predicts too few entities to test with"
        nlps[style] = nlp
    return Pipelines(dirs, nlps)


def long_text(num_tokens: int, seed: int = 0) -> str:
    words = sorted({w for text, _ in TRAIN for w in text.split()})
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(words, size=num_tokens))


def shifting_prefix(tokenizer, tail: str, prefix_words: int, stride: int = STRIDE):
    """A prefix P of some `prefix_words` words such that the pieces of P + tail are some
    multiple of `stride` pieces followed by exactly the pieces of tail (with the same
    offsets, shifted by len(P)). Windows start every `stride` pieces, so every window
    over the tail alone has a twin over P + tail with the same pieces."""

    def encode(text):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return enc["input_ids"], enc["offset_mapping"]

    tail_ids, tail_offsets = encode(tail)
    base = long_text(prefix_words, seed=1)

    def head_pieces(prefix):
        return len(encode(prefix + tail)[0]) - len(tail_ids)

    for separator, filler in itertools.product((" ", "\n"), (" the", " x", " ,", " Berlin", " EU")):
        # Both tokenizers split at whitespace, so each filler adds the same number of pieces:
        # predict how many fillers make a multiple of the stride, then check the real thing.
        head = head_pieces(base + separator)
        step = head_pieces(base + filler + separator) - head
        extra = next((k for k in range(stride) if (head + k * step) % stride == 0), None)
        if extra is None:
            continue
        prefix = base + filler * extra + separator
        ids, offsets = encode(prefix + tail)
        head = len(ids) - len(tail_ids)
        if head % stride or ids[head:] != tail_ids:
            continue
        # The first piece may differ in offsets only: a SentencePiece-style tokenizer gives
        # the "▁" it prepends to a text the offsets of the first character.
        if [(s - len(prefix), e - len(prefix)) for s, e in offsets[head + 1 :]] != list(tail_offsets[1:]):
            continue
        return prefix, head
    raise AssertionError("no prefix with a multiple of the stride as piece count")


# --- 1. odd text ---------------------------------------------------------------------


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("kind", list(ODD_TEXTS))
def test_odd_text_gives_vectors_and_valid_entities(tiny, style, kind):
    nlp = tiny.nlps[style]
    text = ODD_TEXTS[kind]
    doc = nlp(text)
    assert doc.text == text
    check_doc(nlp, doc)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("pooling", ["first", "last", "mean"])
def test_odd_text_every_pooling(tiny, style, pooling):
    nlp = tiny.nlps[style]
    mod = module(nlp)
    saved = mod.settings
    mod.settings = dataclasses.replace(saved, pooling=pooling)
    try:
        docs = [nlp.make_doc(text) for text in ODD_TEXTS.values()]
        for doc, vecs in zip(docs, vectors(nlp, docs)):
            check_doc(nlp, doc, vecs)
    finally:
        mod.settings = saved


@pytest.mark.parametrize("style", STYLES)
def test_tokens_without_pieces_get_zero_vectors(tiny, style):
    nlp = tiny.nlps[style]
    doc = Doc(nlp.vocab, words=["Berlin", "\u200b", "\x07\u200b", "Paris"], spaces=[True, True, True, False])
    assert pieces_per_token(module(nlp).tokenizer, doc) == [True, False, False, True]
    vecs = check_doc(nlp, nlp(doc))
    assert not vecs[1:3].any() and vecs[0].any() and vecs[3].any()
    # A batch in which no doc has a single piece (the decoder never runs).
    only = [Doc(nlp.vocab, words=["\u200b"]), Doc(nlp.vocab, words=[]), Doc(nlp.vocab, words=["\x07", "\u200b"])]
    for doc, vecs in zip(only, vectors(nlp, only)):
        assert vecs.shape == (len(doc), module(nlp).hidden_size) and not vecs.any()
    assert [d.ents for d in nlp.pipe(only)] == [(), (), ()]


@pytest.mark.parametrize("style", STYLES)
def test_training_on_odd_text(tiny, style):
    """update() on odd docs (no pieces, huge tokens, all empty) runs and gives a finite loss."""
    nlp = make_pipeline(tiny.model_dirs[style], lora_r=4)
    data = [(text, []) for text in ODD_TEXTS.values()] + [
        ("😀 Peter visited 東京 \u200b", [("Peter", "PER")]),
        ("\u200b \x07", []),
    ]
    nlp.initialize(lambda: examples(nlp, TRAIN))
    optimizer = Adam(0.01)
    for batch in (examples(nlp, data), examples(nlp, [("", []), ("\u200b", [])]), examples(nlp, [("", [])])):
        losses = nlp.update(batch, sgd=optimizer)
        assert math.isfinite(losses["ner"])
    for doc in nlp.pipe(ODD_TEXTS.values()):
        check_doc(nlp, doc)


# --- 2. long documents ---------------------------------------------------------------


@pytest.mark.parametrize("style", STYLES)
def test_20000_token_doc_fully_processed(tiny, style):
    nlp = tiny.nlps[style]
    mod = module(nlp)
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


def first_piece(tokenizer, text, token):
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    for i, (s, e) in enumerate(enc["offset_mapping"]):
        if e > s and s < token.idx + len(token.text) and e > token.idx:
            return i
    return -1


@pytest.mark.parametrize("style", STYLES)
def test_token_vector_depends_only_on_its_window(tiny, style):
    """Prepending a multiple of the stride in pieces shifts every window of the tail by
    whole windows: a tail piece at position >= WINDOW - STRIDE lies only in windows that
    hold tail pieces alone, so its vector must not change at all. Each window runs alone
    (max_batch_pieces=1), so the check is exact."""
    nlp = make_pipeline(tiny.model_dirs[style], finetune="frozen", max_batch_pieces=1)
    nlp.initialize(lambda: examples(nlp))
    tokenizer = module(nlp).tokenizer
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
def test_doc_shorter_than_window_matches_unwindowed(tiny, style):
    """A doc that fits in one window gets exactly what the decoder gives the whole text."""
    nlp = tiny.nlps[style]
    mod = module(nlp)
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


@pytest.mark.parametrize("style", STYLES)
def test_training_on_long_doc(tiny, style):
    nlp = make_pipeline(tiny.model_dirs[style], lora_r=4)
    text = " ".join(t for t, _ in TRAIN[:1] + TRAIN[2:]) + " "
    repeats = 3000 // len(nlp.make_doc(text)) + 1
    long = text * repeats
    doc = nlp.make_doc(long)
    assert len(doc) >= 3000
    labels = {s: label for _, ents_ in TRAIN for s, label in ents_}
    spans, start = [], 0
    for sentence, sentence_ents in (TRAIN[0], TRAIN[2], TRAIN[3]) * repeats:
        for s, label in sentence_ents:
            at = long.index(s, start)
            spans.append((at, at + len(s), labels[s]))
        start = long.index(sentence, start) + len(sentence)
    eg = Example.from_dict(doc, {"entities": spans})
    nlp.initialize(lambda: [eg])
    lora_before = {k: v.detach().clone() for k, v in module(nlp).named_parameters() if "lora_B" in k}
    optimizer = Adam(0.01)
    for _ in range(2):
        losses = nlp.update([eg], sgd=optimizer)
        assert math.isfinite(losses["ner"]) and losses["ner"] > 0
    after = dict(module(nlp).named_parameters())
    assert all(torch.isfinite(after[k]).all() for k in lora_before)
    assert any(not torch.equal(after[k], v) for k, v in lora_before.items())
    check_doc(nlp, nlp(long))


# --- windows: the assignment, against the obvious definition --------------------------


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


# --- 3. batches ----------------------------------------------------------------------


def mixed_texts():
    return [
        "",
        TRAIN[0][0],
        long_text(1500, seed=3),
        "",
        " ",
        "\n\n",
        TRAIN[3][0],
        ODD_TEXTS["emoji"],
        "\u200b",
        long_text(700, seed=4) + " " + TRAIN[2][0],
        TRAIN[2][0],
        "",
    ]


@pytest.mark.parametrize("style", STYLES)
def test_pipe_batching_matches_one_by_one(tiny, style):
    nlp = tiny.nlps[style]
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
def test_pipe_two_processes_matches_one_by_one(tiny, style):
    nlp = tiny.nlps[style]
    texts = mixed_texts()
    expected = [ents(nlp(text)) for text in texts]
    assert sum(len(e) for e in expected) >= 3
    assert [ents(doc) for doc in nlp.pipe(texts, batch_size=2, n_process=2)] == expected


def test_pipe_workers_do_not_hang_after_the_parent_used_two_threads(tiny, tmp_path):
    """GNU OpenMP hangs a forked child whose parent has run a parallel op: the
    n_process workers must still finish (make test runs with one thread, so this
    runs in its own process with two)."""
    import signal
    import subprocess
    import sys

    nlp = tiny.nlps["metaspace"]
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


def test_pipeline_pickles(tiny):
    nlp = tiny.nlps["bytelevel"]
    copy = pickle.loads(pickle.dumps(nlp))
    assert ents(copy(TRAIN[0][0])) == ents(nlp(TRAIN[0][0]))


# --- 4. settings ---------------------------------------------------------------------


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


# (settings, when the error comes, words the message must contain)
BAD_SETTINGS = {
    "unmask_grammar": ({"unmask": "every"}, "config", ["unmask", "'every'", "Accepted", "'groups:0011'"]),
    "unmask_groups": ({"unmask": "groups:012"}, "config", ["unmask", "'groups:012'", "0s and 1s"]),
    "unmask_range": ({"unmask": "0-50"}, "initialize", ["unmask", "'0-50'", "layers 0-3", "Accepted"]),
    "pooling": ({"pooling": "max"}, "config", ["pooling", "'max'", "first, last, mean"]),
    "lora_targets": ({"lora_targets": ["c_attn", "q_proj"]}, "initialize", ["lora_targets", "c_attn", "q_proj", "v_proj"]),
    "window_below_stride": ({"window": 8, "stride": 16}, "config", ["stride 16", "window (8)"]),
    "window_too_small": ({"window": 1, "stride": 1}, "config", ["window 1", "at least 2"]),
    "dtype": ({"dtype": "float64"}, "config", ["dtype", "'float64'", "float32", "bfloat16"]),
    "finetune": ({"finetune": "qlora"}, "config", ["finetune", "'qlora'", "lora, frozen, full"]),
    "save_mode": ({"save_mode": "lora"}, "config", ["save_mode", "'lora'", "full, adapter"]),
    "attn_implementation": ({"attn_implementation": "flash_attention_2"}, "config", ["attn_implementation", "sdpa"]),
    "missing_dir": ({"name": "/no/such/model/dir"}, "initialize", ["'/no/such/model/dir'", "no such file", ".gguf"]),
    "missing_gguf": ({"name": "/no/such/model.gguf"}, "initialize", ["'/no/such/model.gguf'", "GGUF"]),
    "unknown_hub_id": (
        {"name": "no-such-org-zz/no-such-model-zz"},
        "initialize",
        ["'no-such-org-zz/no-such-model-zz'", "Hugging Face id", "save_pretrained directory"],
    ),
}


def build_and_initialize(model_dir, overrides):
    """Raise what building ("config") or initializing raises; return the stage."""
    try:
        nlp = make_pipeline(model_dir, **overrides)
    except Exception as err:
        return "config", err
    try:
        nlp.initialize(lambda: examples(nlp))
    except Exception as err:
        return "initialize", err
    return "none", None


@pytest.mark.parametrize("case", list(BAD_SETTINGS))
def test_bad_setting_fails_early_and_clearly(tiny, monkeypatch, case):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # never wait for a hub
    overrides, stage, words = BAD_SETTINGS[case]
    got_stage, err = build_and_initialize(tiny.model_dirs["bytelevel"], overrides)
    assert got_stage == stage, f"{case}: expected an error at {stage}, got {got_stage}: {err!r}"
    assert isinstance(err, ValueError), repr(err)
    for word in words:
        assert word in str(err), f"{case}: {word!r} not in {str(err)!r}"


def test_unmask_grammar_error_does_not_invent_a_layer_count(tiny):
    _, err = build_and_initialize(tiny.model_dirs["bytelevel"], {"unmask": "every"})
    assert "10000" not in str(err), str(err)


def test_misspelt_registry_model_lists_registry_models(tiny, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    stage, err = build_and_initialize(tiny.model_dirs["bytelevel"], {"name": "smollm2-136m"})
    assert stage == "initialize" and isinstance(err, ValueError), repr(err)
    assert "smollm2-135m" in str(err), str(err)


def test_gguf_of_unsupported_architecture(tiny, tmp_path):
    """An architecture transformers reads from GGUF but spacy-unmask does not support."""
    path = tiny_gguf(tmp_path / "tiny-gpt2.gguf", "gpt2")
    stage, err = build_and_initialize(path, {})
    assert stage == "initialize" and isinstance(err, ValueError), repr(err)
    for word in ("'gpt2'", "Supported", "llama", "qwen2", "gemma3_text"):
        assert word in str(err), str(err)


def test_gguf_of_architecture_transformers_cannot_read(tiny, tmp_path):
    path = tiny_gguf(tmp_path / "tiny-bert.gguf", "bert")
    stage, err = build_and_initialize(path, {})
    assert stage == "initialize" and isinstance(err, ValueError), repr(err)
    for word in ("bert", "Supported", "llama"):
        assert word in str(err), str(err)


def test_truncated_gguf_fails_clearly(tiny, tmp_path):
    path = tiny_gguf(tmp_path / "cut.gguf", "llama", truncate=True)
    stage, err = build_and_initialize(path, {})
    assert stage == "initialize" and isinstance(err, (ValueError, OSError)), repr(err)
    assert "cut.gguf" in str(err)


# --- 5. saved pipelines --------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("saved") / "pipeline"
    tiny.nlps["bytelevel"].to_disk(path)
    return path


def broken_copy(saved, tmp_path, mutate):
    target = tmp_path / "broken"
    shutil.copytree(saved, target)
    mutate(target / "ner" / "model")
    return target


def test_saved_pipeline_loads_without_base_model(tiny, saved, tmp_path):
    """spacy.load needs neither the model directory nor a hub: all is in the pipeline."""
    model_copy = tmp_path / "model"
    shutil.copytree(tiny.model_dirs["bytelevel"], model_copy)
    nlp = make_pipeline(str(model_copy), lora_r=4)
    train(nlp, 3)
    nlp.to_disk(tmp_path / "pipeline")
    shutil.rmtree(model_copy)
    loaded = spacy.load(tmp_path / "pipeline")
    texts = mixed_texts()
    assert [ents(d) for d in loaded.pipe(texts)] == [ents(d) for d in nlp.pipe(texts)]
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
    with pytest.raises(OSError) as info:
        spacy.load(path)
    assert str(Path("ner") / "model") in str(info.value)


def backbone_message(model_file: Path):
    """The decoder's own serialisation inside the thinc model file (msgpack all the way)."""
    msg = srsly.msgpack_loads(model_file.read_bytes())
    shims = [blob for node in msg["shims"] for blob in node]
    assert len(shims) == 1
    shim = srsly.msgpack_loads(shims[0])
    return srsly.msgpack_loads(shim["state"])


def test_corrupted_weights_are_detected(saved, tmp_path):
    weights = backbone_message(saved / "ner" / "model")["weights"]

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
    backbone = backbone_message(saved / "ner" / "model")
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


# --- 6. training, and training that goes wrong ---------------------------------------


def write_train_config(root: Path, model_dir: str) -> Path:
    nlp = spacy.blank("en")
    docs = []
    for eg in examples(nlp):
        docs.append(eg.reference)
    DocBin(docs=docs).to_disk(root / "train.spacy")
    DocBin(docs=docs[:2]).to_disk(root / "dev.spacy")
    config = Config().from_disk(ROOT / "configs" / "ner.cfg", interpolate=False)
    config["components"]["ner"]["model"]["tok2vec"].update(
        name=model_dir, dtype="float32", window=WINDOW, stride=STRIDE, lora_r=4, max_batch_pieces=256, num_layers=0
    )
    config["paths"]["train"] = str(root / "train.spacy")
    config["paths"]["dev"] = str(root / "dev.spacy")
    config["training"]["max_steps"] = 6
    config["training"]["eval_frequency"] = 3
    config["training"]["optimizer"]["learn_rate"]["warmup_steps"] = 1
    config["training"]["logger"]["progress_bar"] = None
    config.to_disk(root / "tiny.cfg")
    return root / "tiny.cfg"


def spacy_train(config_path: Path, output_path: Path, overrides=None):
    """What `python -m spacy train` does, in this process, returning the trained pipeline."""
    from spacy.training.initialize import init_nlp
    from spacy.training.loop import train as train_nlp

    config = spacy.util.load_config(config_path, overrides=overrides or {}, interpolate=False)
    nlp = init_nlp(config, use_gpu=-1)
    output_path.mkdir(parents=True, exist_ok=True)
    return train_nlp(nlp, output_path, use_gpu=-1)


def test_spacy_train_writes_loadable_models(tiny, tmp_path):
    config_path = write_train_config(tmp_path, tiny.model_dirs["bytelevel"])
    trained, last = spacy_train(config_path, tmp_path / "out")
    assert last == tmp_path / "out" / "model-last"
    for name in ("model-best", "model-last"):
        nlp = spacy.load(tmp_path / "out" / name)
        assert nlp.pipe_names == ["ner"]
        for text in [t for t, _ in TRAIN] + ["", ODD_TEXTS["emoji"]]:
            check_doc(nlp, nlp(text))
        assert "ents_f" in nlp.meta["performance"]
    loaded = spacy.load(last)
    docs = [loaded.make_doc(t) for t, _ in TRAIN]
    for a, b in zip(vectors(loaded, docs), vectors(trained, docs)):
        # Loaded pipelines fold LoRA into the base weights: same vectors up to rounding.
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_nan_loss_stops_update(tiny):
    nlp = make_pipeline(tiny.model_dirs["metaspace"], lora_r=4)
    train(nlp, 1)
    output = nlp.get_pipe("ner").model.get_ref("output_layer")
    W = output.get_param("W").copy()
    W[0, 0] = np.nan
    output.set_param("W", W)
    lora = {k: v.detach().clone() for k, v in module(nlp).named_parameters() if "lora_" in k}
    with pytest.raises(ValueError, match=r"\[ner\] the loss is nan"):
        nlp.update(examples(nlp), sgd=Adam(0.01))
    # It stops before the step: the backbone is untouched.
    after = dict(module(nlp).named_parameters())
    assert all(torch.equal(after[k], v) for k, v in lora.items())


@pytest.fixture(scope="module")
def diverged(tiny, tmp_path_factory):
    """`spacy train` with a learning rate so large that the weights overflow."""
    root = tmp_path_factory.mktemp("diverged")
    config_path = write_train_config(root, tiny.model_dirs["bytelevel"])
    overrides = {"training.optimizer.learn_rate.initial_rate": 1e12, "training.optimizer.grad_clip": 0.0}
    with np.errstate(all="ignore"):
        try:
            spacy_train(config_path, root / "out", overrides=overrides)
        except Exception as err:
            return root / "out", err
    return root / "out", None


def test_diverging_spacy_train_stops_naming_the_loss(diverged):
    _, err = diverged
    assert isinstance(err, ValueError), repr(err)
    assert "loss" in str(err) and "learning rate" in str(err)


def test_diverging_spacy_train_saves_no_broken_model(diverged):
    out, _ = diverged
    for name in ("model-best", "model-last"):
        if not (out / name).exists():
            continue
        nlp = spacy.load(out / name)
        W = nlp.get_pipe("ner").model.get_ref("output_layer").get_param("W")
        assert np.isfinite(W).all(), f"{name}: the saved head has non-finite weights"
        assert np.isfinite(vectors(nlp, [nlp.make_doc(TRAIN[0][0])])[0]).all(), name


# --- 7. determinism ------------------------------------------------------------------


def seeded_run(model_dir, seed):
    fix_random_seed(seed)
    nlp = make_pipeline(model_dir, lora_r=4, lora_dropout=0.2)
    egs = examples(nlp)
    optimizer = nlp.initialize(lambda: egs)
    for _ in range(3):
        nlp.update(egs, sgd=optimizer, drop=0.2)
    lora = {k: v.detach().clone() for k, v in module(nlp).named_parameters() if "lora_" in k}
    output = nlp.get_pipe("ner").model.get_ref("output_layer")
    head = {name: output.get_param(name).copy() for name in ("W", "b")}
    return lora, head


def test_training_is_deterministic_with_a_fixed_seed(tiny):
    model_dir = tiny.model_dirs["bytelevel"]
    (lora_a, head_a), (lora_b, head_b) = seeded_run(model_dir, 0), seeded_run(model_dir, 0)
    assert lora_a and set(lora_a) == set(lora_b)
    for key in lora_a:
        assert torch.equal(lora_a[key], lora_b[key]), key
    for key in head_a:
        np.testing.assert_array_equal(head_a[key], head_b[key])
    assert any(lora_a[k].abs().sum() > 0 for k in lora_a if "lora_B" in k)  # training moved LoRA
    lora_c, _ = seeded_run(model_dir, 1)
    assert any(not torch.equal(lora_a[k], lora_c[k]) for k in lora_a)  # the seed matters


# --- 8. fuzzing ----------------------------------------------------------------------


@pytest.mark.parametrize("style", STYLES)
@given(
    words_spaces=st.lists(st.tuples(st.text(min_size=1, max_size=12), st.booleans()), max_size=24),
    window=st.integers(2, 12),
    stride_fraction=st.floats(0.0, 1.0),
    pooling=st.sampled_from(["first", "last", "mean"]),
    max_batch_pieces=st.sampled_from([1, 7, 4096]),
)
@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
def test_fuzz_random_token_splits(tiny, style, words_spaces, window, stride_fraction, pooling, max_batch_pieces):
    """Random tokens (any Unicode, any spacing) under random window, stride, pooling and
    batch size settings: one finite vector per token, valid entities."""
    nlp = tiny.nlps[style]
    words = [w for w, _ in words_spaces]
    spaces = [s for _, s in words_spaces]
    mod = module(nlp)
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
def test_fuzz_random_text(tiny, style, text):
    nlp = tiny.nlps[style]
    doc = nlp(text)
    assert doc.text == text
    check_doc(nlp, doc)
