"""The SentencePiece-BPE tokenizer of a GGUF file that stores no merges (Gemma 1/2/3).

transformers 4.x reads such a vocabulary as a Unigram model over the BPE scores, which
cuts common words apart (`▁G erm any`); transformers 5 rebuilds the BPE merges. Under
4.x, `sentencepiece_bpe_tokenizer` builds the tokenizer transformers 5 builds, reading
the GGUF header with `read_gguf_fields`.
"""
from pathlib import Path
from typing import List, Optional, Tuple

# GGUF architectures whose tokenizer is SentencePiece BPE stored without merges.
_SENTENCEPIECE_BPE_ARCHITECTURES = ("gemma", "gemma2", "gemma3")
# SentencePiece piece types, which GGUF's `tokenizer.ggml.token_type` copies.
_NORMAL, _CONTROL, _USER_DEFINED, _UNUSED = 1, 3, 4, 5


def needs_own_bpe_tokenizer(gguf: Path) -> bool:
    """Whether this transformers (4.x) would misread the GGUF's SentencePiece BPE as Unigram."""
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) >= Version("5.0.0"):
        return False
    fields = read_gguf_fields(gguf, ("general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.merges"))
    return (
        fields.get("general.architecture") in _SENTENCEPIECE_BPE_ARCHITECTURES
        and fields.get("tokenizer.ggml.model") == "llama"
        and "tokenizer.ggml.merges" not in fields
    )


def read_gguf_fields(gguf: Path, keys) -> dict:
    """The GGUF metadata values under `keys` (those present): strings, numbers or lists.

    Reads only the header (gguf.GGUFReader takes some 20 s over a 262k-piece vocabulary).
    """
    import struct

    import numpy

    scalars = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    wanted = set(keys)
    with gguf.open("rb") as file:
        data = file.read(1 << 20)
        position = 0

        def take(size: int) -> bytes:
            nonlocal data, position
            while position + size > len(data):
                more = file.read(max(1 << 20, size))
                if not more:
                    raise ValueError(f"{gguf}: truncated GGUF header")
                data = data[position:] + more
                position = 0
            position += size
            return data[position - size : position]

        def unpack(fmt: str):
            return struct.unpack(fmt, take(struct.calcsize(fmt)))[0]

        def string() -> str:
            return take(unpack("<Q")).decode("utf-8")

        def value(kind: int):
            if kind == 8:
                return string()
            if kind == 9:
                element, count = unpack("<I"), unpack("<Q")
                if element in (8, 9):
                    return [value(element) for _ in range(count)]
                fmt = scalars[element]
                return numpy.frombuffer(take(struct.calcsize(fmt) * count), dtype=fmt).tolist()
            return unpack(scalars[kind])

        if take(4) != b"GGUF" or unpack("<I") < 2:
            raise ValueError(f"{gguf}: not a GGUF file of version 2 or later")
        unpack("<Q")  # the tensor count
        count = unpack("<Q")
        values = {}
        for _ in range(count):
            key = string()
            found = value(unpack("<I"))
            if key in wanted:
                values[key] = found
    return values


def sentencepiece_bpe_tokenizer(gguf: Path):
    """The fast tokenizer of the SentencePiece BPE vocabulary in a GGUF file without merges.

    SentencePiece BPE first takes user-defined pieces (newline and space runs, HTML tags)
    whole, then keeps merging the adjacent pair whose concatenation is the best-scored piece;
    pieces that stay outside the vocabulary fall back to bytes. A `tokenizers` BPE model
    does the same given, for every piece, its splits into two pieces, ranked by the piece's
    position in the vocabulary: that order is the score order, and it puts the user-defined
    space runs (whose score is a flat -1000) first, as SentencePiece takes them first. This
    is the tokenizer transformers 5 builds from such a file; transformers 4 builds a Unigram
    model over the scores instead.
    """
    import transformers
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    fields = read_gguf_fields(
        gguf,
        (
            "tokenizer.ggml.tokens",
            "tokenizer.ggml.token_type",
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.unknown_token_id",
            "tokenizer.ggml.padding_token_id",
            "tokenizer.ggml.add_bos_token",
            "tokenizer.ggml.add_eos_token",
        ),
    )
    # GGUF spells the user-defined space runs with spaces; the tokenizer sees them as "▁".
    tokens = ["\u2581" * len(t) if t and not t.strip(" ") else t for t in fields["tokenizer.ggml.tokens"]]
    types = fields["tokenizer.ggml.token_type"]
    vocab = {token: index for index, token in enumerate(tokens)}
    mergeable = {token for token, kind in zip(tokens, types) if kind in (_NORMAL, _USER_DEFINED, _UNUSED)}
    tokenizer = Tokenizer(
        BPE(
            vocab=vocab,
            merges=bpe_merges(tokens, mergeable),
            unk_token=tokens[fields["tokenizer.ggml.unknown_token_id"]],
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    # Control pieces (<bos>, <start_of_turn>, <unused0>...) are special tokens; the other
    # user-defined pieces (newline runs, tab runs, HTML tags) are matched whole in the text,
    # except the space runs, which the merges build first (as transformers 5 does).
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, kind in zip(tokens, types) if kind == _CONTROL]
    )
    tokenizer.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, kind in zip(tokens, types)
            if kind == _USER_DEFINED and not t.startswith("\u2581")
        ]
    )

    def token(key: str) -> Optional[str]:
        index = fields.get(f"tokenizer.ggml.{key}_token_id")
        return None if index is None else tokens[index]

    return transformers.GemmaTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=token("bos"),
        eos_token=token("eos"),
        unk_token=token("unknown"),
        pad_token=token("padding"),
        add_bos_token=fields.get("tokenizer.ggml.add_bos_token", True),
        add_eos_token=fields.get("tokenizer.ggml.add_eos_token", False),
    )


def bpe_merges(tokens: List[str], mergeable) -> List[Tuple[str, str]]:
    """Every split of a mergeable piece into two mergeable pieces, best (earliest) piece first."""
    merges = []
    for token in tokens:
        if token not in mergeable:
            continue
        for cut in range(len(token) - 1, 0, -1):
            left, right = token[:cut], token[cut:]
            if left in mergeable and right in mergeable:
                merges.append((left, right))
    return merges
