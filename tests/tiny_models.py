"""Tiny randomly initialised decoders of every supported family, built from configs, and
what the pipeline-level tests share: their sentences, awkward texts, tiny pipelines on a
Llama whose tokenizer drops some characters, and the checks a user relies on.
"""
import itertools
from pathlib import Path

import numpy as np
import spacy
import transformers
from spacy.training import Example
from spacy.util import fix_random_seed
from thinc.api import Adam

from spacy_unmask import get_backbone

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3")
# Small enough that a window of 4 pieces matters in a 12-piece test sentence.
SLIDING_WINDOW = 4
VOCAB_SIZE = 320
TRAINING_TEXT = [
    "Peter Blackburn visited the European Commission in Brussels on Monday .",
    "German officials said the ban would last until scientists found a cure .",
    "EU rejects German call to boycott British lamb .",
    "The capital of Germany is Berlin , and Paris is the capital of France .",
    "Emoji 😀 , CJK 東京 , Arabic مرحبا and combining e\u0301 characters .",
]


def tiny_config(family: str, *, num_layers: int = 4, sliding: bool = True, vocab_size: int = VOCAB_SIZE):
    common = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    window = SLIDING_WINDOW if sliding else None
    if family == "llama":
        return transformers.LlamaConfig(**common)
    if family == "mistral":
        return transformers.MistralConfig(sliding_window=window, **common)
    if family == "qwen2":
        return transformers.Qwen2Config(
            use_sliding_window=sliding, sliding_window=SLIDING_WINDOW, max_window_layers=num_layers // 2, **common
        )
    if family == "qwen3":
        return transformers.Qwen3Config(head_dim=8, **common)
    if family == "gemma":
        return transformers.GemmaConfig(head_dim=8, **common)
    if family == "gemma2":
        return transformers.Gemma2Config(head_dim=8, sliding_window=SLIDING_WINDOW, **common)
    if family == "gemma3_text":
        return transformers.Gemma3TextConfig(
            head_dim=8, sliding_window=SLIDING_WINDOW, sliding_window_pattern=2, **common
        )
    if family == "phi3":
        common.pop("num_key_value_heads")
        return transformers.Phi3Config(sliding_window=window, num_key_value_heads=4, **common)
    raise ValueError(family)


def tiny_decoder(family: str, *, attn_implementation: str = "sdpa", seed: int = 0, **kwargs):
    import torch

    torch.manual_seed(seed)
    config = tiny_config(family, **kwargs)
    config._attn_implementation = attn_implementation
    lm = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    return lm.get_decoder().eval()


def tiny_tokenizer(style: str = "bytelevel", vocab_size: int = VOCAB_SIZE):
    """A fast BPE tokenizer trained on a few sentences: GPT-2 style ("bytelevel",
    like SmolLM2) or SentencePiece style with a BOS piece ("metaspace", like Llama/Gemma)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    special = ["<pad>", "<s>", "</s>"]
    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=style == "metaspace"))
    if style == "bytelevel":
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        alphabet = [f"<0x{i:02X}>" for i in range(256)]
        special = special + alphabet
        alphabet = []
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, initial_alphabet=alphabet)
    tokenizer.train_from_iterator(TRAINING_TEXT, trainer)
    if style == "metaspace":
        from tokenizers import processors

        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
        )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def save_tiny_model(path, family: str = "llama", style: str = "bytelevel", seed: int = 0, **kwargs) -> str:
    """A save_pretrained directory with a tiny random model and tokenizer."""
    import torch

    torch.manual_seed(seed)
    config = tiny_config(family, **kwargs)
    lm = transformers.AutoModelForCausalLM.from_config(config)
    lm.save_pretrained(str(path))
    tiny_tokenizer(style, kwargs.get("vocab_size", VOCAB_SIZE)).save_pretrained(str(path))
    return str(path)


def tiny_backbone(decoder, unmask: str = "all", **settings):
    """A `Backbone` around an in-memory decoder (no files), frozen, float32."""
    from spacy_unmask.backbone import Backbone
    from spacy_unmask.settings import BackboneSettings

    settings = BackboneSettings(name="tiny", unmask=unmask, finetune="frozen", dtype="float32", **settings)
    return Backbone(decoder, tiny_tokenizer(), settings, None)


# --- tiny pipelines: shared by the pipeline-level tests ----------------------------

STYLES = ("bytelevel", "metaspace")
WINDOW, STRIDE = 16, 8
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


def save_normalizing_model(path: Path, style: str) -> str:
    """A tiny Llama save_pretrained directory whose tokenizer drops DROPPED characters."""
    from tokenizers import normalizers

    save_tiny_model(path, "llama", style)
    tokenizer = tiny_tokenizer(style)
    tokenizer.backend_tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFKC()] + [normalizers.Replace(c, "") for c in DROPPED]
    )
    tokenizer.save_pretrained(str(path))
    return str(path)


def gold_examples(nlp, data=TRAIN):
    out = []
    for text, ents in data:
        spans = [(text.index(s), text.index(s) + len(s), label) for s, label in ents]
        out.append(Example.from_dict(nlp.make_doc(text), {"entities": spans}))
    return out


def make_pipeline(model_dir: str, component=None, **tok2vec):
    """A blank pipeline with an `unmask_ner` named "ner" (`component`: its own settings)."""
    config = {"name": model_dir, "unmask": "all", "dtype": "float32", "window": WINDOW, "stride": STRIDE}
    config.update(tok2vec)
    nlp = spacy.blank("en")
    nlp.add_pipe("unmask_ner", name="ner", config={**(component or {}), "model": {"tok2vec": config}})
    return nlp


def train_pipeline(nlp, steps: int, *, learn_rate: float = 0.02, drop: float = 0.0, data=TRAIN):
    egs = gold_examples(nlp, data)
    nlp.initialize(lambda: egs)
    optimizer = Adam(learn_rate)
    losses = {}
    for _ in range(steps):
        losses = nlp.update(egs, sgd=optimizer, drop=drop)
    return losses


def vectors(nlp, docs):
    return nlp.get_pipe("ner").model.get_ref("tok2vec").predict(list(docs))


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
    width = get_backbone(nlp).hidden_size
    assert vecs.shape == (len(doc), width)
    assert np.isfinite(vecs).all()
    # A token gets a real vector exactly when the tokenizer gave it a piece, zeros otherwise.
    has = np.array(pieces_per_token(get_backbone(nlp).tokenizer, doc), dtype=bool)
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


def trained_pipelines(root: Path) -> dict:
    """Per tokenizer style: a pipeline on a `save_normalizing_model` directory under `root`,
    trained until it finds entities."""
    nlps = {}
    for style in STYLES:
        fix_random_seed(0)
        model_dir = save_normalizing_model(root / style, style)
        nlp = make_pipeline(model_dir, lora_r=4, lora_alpha=4, max_batch_pieces=512)
        train_pipeline(nlp, 60)
        found = sum(bool(nlp(text).ents) for text, _ in TRAIN)
        assert found >= 2, f"{style}: the fixture pipeline predicts too few entities to test with"
        nlps[style] = nlp
    return nlps


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


def first_piece(tokenizer, text, token):
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    for i, (s, e) in enumerate(enc["offset_mapping"]):
        if e > s and s < token.idx + len(token.text) and e > token.idx:
            return i
    return -1


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


def build_and_initialize(model_dir, overrides):
    """Raise what building ("config") or initializing raises; return the stage."""
    try:
        nlp = make_pipeline(model_dir, **overrides)
    except Exception as err:
        return "config", err
    try:
        nlp.initialize(lambda: gold_examples(nlp))
    except Exception as err:
        return "initialize", err
    return "none", None


def check_fails_early_and_clearly(model_dir, monkeypatch, table: dict, case: str) -> None:
    """table[case] = (backbone overrides, the stage the error must come at, words it must hold)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # never wait for a hub
    overrides, stage, words = table[case]
    got_stage, err = build_and_initialize(model_dir, overrides)
    assert got_stage == stage, f"{case}: expected an error at {stage}, got {got_stage}: {err!r}"
    assert isinstance(err, ValueError), repr(err)
    for word in words:
        assert word in str(err), f"{case}: {word!r} not in {str(err)!r}"


def round_embedding_to_int8(nlp) -> None:
    """Give the in-memory pipeline the input embedding its saved copy loads with (the
    save_embedding = "int8"): each row rounded to 8 bits with its power-of-two scale."""
    import torch

    from spacy_unmask import get_backbone
    from spacy_unmask.compact import dequantize_rows, quantize_rows

    weight = get_backbone(nlp).model.get_input_embeddings().weight
    with torch.no_grad():
        weight.copy_(dequantize_rows(*quantize_rows(weight), weight.dtype))
