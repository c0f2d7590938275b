"""The SentencePiece-BPE tokenizer rebuilt from a GGUF file (spacy_unmask/gguf_tokenizer.py).

Tokenization is checked against SentencePiece BPE itself, written out below from
sentencepiece's bpe_model.cc over the vocabulary, scores and piece types in the GGUF:
user-defined pieces are taken whole (longest first) and never merged further, then
the adjacent pair whose concatenation is the best-scored piece is merged (leftmost on
ties) until none is left, and what is outside the vocabulary falls back to bytes.
transformers 4.53 got this wrong when reading the GGUF (a Unigram model over the BPE
scores: `▁G erm any`); `sentencepiece_bpe_tokenizer` builds the right one.

The first tests write small GGUF files here; the tests marked slow use Gemma 3 270M
from the package registry (see tests/test_gemma3.py for the time it takes).
"""
import json
import tempfile
from pathlib import Path

import gguf
import pytest
import transformers
from packaging.version import Version

from spacy_unmask.download import REGISTRY_MODELS, RegistryUnreachable, fetch_gguf
from spacy_unmask.gguf_tokenizer import (
    bpe_merges,
    needs_own_bpe_tokenizer,
    read_gguf_fields,
    sentencepiece_bpe_tokenizer,
)

MODEL = "gemma3-270m"
TRANSFORMERS_5 = Version(transformers.__version__) >= Version("5.0.0")

# CC-BY 4.0 (NCBI disease corpus, Dogan et al. 2014; IOB version of Crichton et al. 2017).
NCBI_TRAIN = Path(__file__).resolve().parents[1] / "assets" / "ncbi_disease" / "train.tsv"
# A fixed paragraph of plain English (written for these tests).
PARAGRAPH = (
    "The history of the city goes back more than two thousand years. It was founded as a small "
    "settlement on the banks of the river, where traders met to exchange goods. Over the centuries "
    "it grew into an important centre of commerce and learning, and today it is known for its "
    "museums, its universities and its lively markets. Every summer, thousands of visitors come "
    "to walk through the old streets, to see the cathedral and to enjoy the food of the region. "
    "Most of them arrive by train, because the station lies only a few minutes from the main square."
)
EDGE_CASES = [
    "The capital of Germany is Berlin.",
    " leading space, trailing space ",
    "Hello world\n\n  indented   text\t\ttabs\n",
    "naïve café déjà vu, Straße, Ωμέγα, Москва, 北京市, 東京 😀 ☃ ½ ﬁ",
    "Numbers 1234567 and 3.14159, dates 2024-05-17, codes BRCA1/2 and p53.",
    "<td>cell</td> <b>bold</b> a&b",
    # Runs of up to 31 spaces are single user-defined pieces. Longer runs are cut 16 + rest
    # by the BPE merges but 31 + rest by SentencePiece: a known difference, not tested.
    "a" + " " * 31 + "b",
]


class SentencePieceBPE:
    """SentencePiece BPE encoding (sentencepiece/src/bpe_model.cc), in plain Python."""

    NORMAL, USER_DEFINED, UNUSED = 1, 4, 5

    def __init__(self, tokens, scores, types):
        # Gemma's normalizer only escapes spaces; GGUF spells the space-run pieces with spaces.
        tokens = [token.replace(" ", "\u2581") for token in tokens]
        # The pieces BPE may produce (the others -- control, byte, unknown -- are reserved).
        self.scores = {
            token: score
            for token, score, kind in zip(tokens, scores, types)
            if kind in (self.NORMAL, self.USER_DEFINED, self.UNUSED)
        }
        self.user_defined = {token for token, kind in zip(tokens, types) if kind == self.USER_DEFINED}
        self.longest = max(map(len, self.user_defined))

    def encode(self, text: str):
        text = text.replace(" ", "\u2581")
        symbols, start = [], 0  # [piece, frozen]
        while start < len(text):
            for size in range(min(self.longest, len(text) - start), 0, -1):
                if text[start : start + size] in self.user_defined:
                    break
            frozen = text[start : start + size] in self.user_defined
            symbols.append([text[start : start + size], frozen])
            start += size
        while True:
            best = None
            for index in range(len(symbols) - 1):
                (left, left_frozen), (right, right_frozen) = symbols[index], symbols[index + 1]
                score = None if left_frozen or right_frozen else self.scores.get(left + right)
                if score is not None and (best is None or score > best[0]):
                    best = (score, index)
            if best is None:
                break
            index = best[1]
            symbols[index : index + 2] = [[symbols[index][0] + symbols[index + 1][0], False]]
        pieces = []
        for piece, _ in symbols:
            if piece in self.scores:
                pieces.append(piece)
            else:
                pieces.extend(f"<0x{byte:02X}>" for byte in piece.encode("utf-8"))
        return pieces


def real_text(min_words: int = 1000):
    """Sentences of the NCBI disease corpus (tokens joined by spaces), else the paragraph."""
    if not NCBI_TRAIN.is_file():
        return [PARAGRAPH]
    sentences, tokens, words = [], [], 0
    for line in NCBI_TRAIN.read_text(encoding="utf-8").splitlines():
        if line.strip():
            tokens.append(line.split("\t")[0])
        elif tokens:
            sentences.append(" ".join(tokens))
            words += len(tokens)
            tokens = []
            if words >= min_words:
                break
    return sentences


def pieces(tokenizer, text: str):
    return tokenizer.convert_ids_to_tokens(tokenizer(text, add_special_tokens=False)["input_ids"])


def mismatches(tokenizer, reference, texts):
    return [
        (text, got, want)
        for text in texts
        for got, want in [(pieces(tokenizer, text), reference.encode(text))]
        if got != want
    ]

# --- small GGUF files written here ---------------------------------------------------

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = (
    gguf.TokenType.NORMAL, gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED, gguf.TokenType.BYTE,
)  # fmt: skip
# A Gemma-like vocabulary: control and byte pieces, user-defined pieces (a newline run, a
# space run spelled with spaces as in GGUF, HTML tags), then merged pieces, best first
# (score falls with the position, as in Gemma's), then single characters.
TOY_PIECES = (
    [("<pad>", CONTROL), ("<eos>", CONTROL), ("<bos>", CONTROL), ("<unk>", UNKNOWN)]
    + [(f"<0x{byte:02X}>", BYTE) for byte in range(256)]
    + [("\n\n", USER_DEFINED), ("  ", USER_DEFINED), ("<b>", USER_DEFINED), ("</b>", USER_DEFINED)]
    + [(piece, NORMAL) for piece in ["er", "in", "li", "lin", "\u2581b", "\u2581be", "\u2581ber", "\u2581berlin", "\u2581l"]]
    + [(piece, NORMAL) for piece in ["\u2581", "b", "e", "r", "l", "i", "n", "<", ">", "/", "\n"]]
)


def write_gguf(path: Path, architecture="gemma3", merges=None) -> Path:
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([piece for piece, _ in TOY_PIECES])
    writer.add_token_scores([-float(index) for index in range(len(TOY_PIECES))])
    writer.add_token_types([int(kind) for _, kind in TOY_PIECES])
    if merges is not None:
        writer.add_token_merges(merges)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_string("general.name", "toy ünïcode")
    writer.add_uint32("toy.count", 7)
    writer.add_float32("toy.scale", 0.5)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_read_gguf_fields_reads_only_the_keys_asked_for(tmp_path):
    path = write_gguf(tmp_path / "toy.gguf")
    keys = ("general.architecture", "general.name", "toy.count", "toy.scale", "tokenizer.ggml.tokens",
            "tokenizer.ggml.token_type", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.merges")  # fmt: skip
    fields = read_gguf_fields(path, keys)
    assert set(fields) == set(keys) - {"tokenizer.ggml.merges"}
    assert (fields["general.architecture"], fields["general.name"]) == ("gemma3", "toy ünïcode")
    assert (fields["toy.count"], fields["toy.scale"], fields["tokenizer.ggml.add_bos_token"]) == (7, 0.5, True)
    assert fields["tokenizer.ggml.tokens"] == [piece for piece, _ in TOY_PIECES]
    assert fields["tokenizer.ggml.token_type"] == [int(kind) for _, kind in TOY_PIECES]


def test_read_gguf_fields_refuses_other_and_truncated_files(tmp_path):
    other = tmp_path / "model.safetensors"
    other.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf_fields(other, ["general.architecture"])
    data = write_gguf(tmp_path / "toy.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated GGUF header"):
        read_gguf_fields(cut, ["general.architecture"])


def test_own_tokenizer_only_for_sentencepiece_bpe_without_merges_under_transformers_4(tmp_path):
    gemma = write_gguf(tmp_path / "gemma.gguf")
    with_merges = write_gguf(tmp_path / "merges.gguf", merges=["e r", "i n"])
    llama = write_gguf(tmp_path / "llama.gguf", architecture="llama")
    assert needs_own_bpe_tokenizer(gemma) is not TRANSFORMERS_5
    assert not needs_own_bpe_tokenizer(with_merges)
    assert not needs_own_bpe_tokenizer(llama)


def test_bpe_merges_are_the_splits_into_pieces_best_piece_first():
    tokens = ["er", "b", "e", "r", "ber", "be"]
    assert bpe_merges(tokens, set(tokens)) == [("e", "r"), ("be", "r"), ("b", "er"), ("b", "e")]
    assert bpe_merges(tokens, set(tokens) - {"er"}) == [("be", "r"), ("b", "e")]


def test_toy_vocabulary_is_cut_as_sentencepiece_bpe(tmp_path):
    tokenizer = sentencepiece_bpe_tokenizer(write_gguf(tmp_path / "toy.gguf"))
    reference = SentencePieceBPE(
        [piece for piece, _ in TOY_PIECES], [-float(i) for i in range(len(TOY_PIECES))], [int(k) for _, k in TOY_PIECES]
    )
    assert pieces(tokenizer, " berlin lin") == ["\u2581berlin", "\u2581", "lin"]  # li, then lin, outrank ▁l
    assert pieces(tokenizer, "Berlin") == ["<0x42>", "er", "lin"]  # B is not in the vocabulary: its byte
    texts = [" berlin", "berliner  berlin\n\n<b>ber</b>", "  b e r", "nil\nlib ", "Straße über"]
    assert mismatches(tokenizer, reference, texts) == []
    ids = tokenizer(" berlin")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id == 2 and tokenizer.decode(ids, skip_special_tokens=True) == " berlin"
    assert (tokenizer.pad_token, tokenizer.eos_token, tokenizer.unk_token) == ("<pad>", "<eos>", "<unk>")


# --- Gemma 3 270M from the package registry (slow) -----------------------------------


@pytest.fixture(scope="module")
def model_path(registry_model) -> Path:
    return registry_model(MODEL)


@pytest.fixture(scope="module")
def gguf_tokenizer(model_path):
    """(the GGUF's vocabulary fields, `sentencepiece_bpe_tokenizer` built from it)."""
    keys = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = fetch_gguf(REGISTRY_MODELS[MODEL], Path(tmp))
        except RegistryUnreachable as err:
            pytest.skip(f"package registry unreachable: could not fetch {MODEL} ({err})")
        fields = read_gguf_fields(path, keys)
        built = sentencepiece_bpe_tokenizer(path)
    return fields, built


@pytest.fixture(scope="module")
def reference(gguf_tokenizer):
    fields, _ = gguf_tokenizer
    return SentencePieceBPE(
        fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.scores"], fields["tokenizer.ggml.token_type"]
    )


@pytest.fixture(scope="module")
def tokenizer(model_path):
    return transformers.AutoTokenizer.from_pretrained(str(model_path))


@pytest.mark.slow
def test_common_words_are_single_pieces(tokenizer):
    assert pieces(tokenizer, "The capital of Germany is Berlin.") == [
        "The", "\u2581capital", "\u2581of", "\u2581Germany", "\u2581is", "\u2581Berlin", ".",
    ]  # fmt: skip
    assert pieces(tokenizer, " German capital") == ["\u2581German", "\u2581capital"]
    ids = tokenizer("The capital of Germany is Berlin.")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id == 2
    assert tokenizer.decode(ids, skip_special_tokens=True) == "The capital of Germany is Berlin."
    assert (tokenizer.pad_token, tokenizer.eos_token, tokenizer.unk_token) == ("<pad>", "<eos>", "<unk>")


@pytest.mark.slow
def test_reference_is_sentencepiece(reference, gguf_tokenizer):
    """The plain-Python reference agrees with the sentencepiece library on the same vocabulary."""
    pytest.importorskip("google.protobuf", reason="sentencepiece's model proto needs protobuf")
    spm = pytest.importorskip("sentencepiece")
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    fields, _ = gguf_tokenizer
    proto = model_pb2.ModelProto()
    proto.trainer_spec.model_type = model_pb2.TrainerSpec.BPE
    proto.trainer_spec.byte_fallback = True
    proto.trainer_spec.vocab_size = len(fields["tokenizer.ggml.tokens"])
    proto.trainer_spec.pad_id, proto.trainer_spec.eos_id, proto.trainer_spec.bos_id = 0, 1, 2
    proto.trainer_spec.unk_id = 3
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = False
    proto.normalizer_spec.remove_extra_whitespaces = False
    proto.normalizer_spec.escape_whitespaces = True
    pieces_ = zip(fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.scores"], fields["tokenizer.ggml.token_type"])
    for index, (token, score, kind) in enumerate(pieces_):
        piece = proto.pieces.add()
        piece.piece, piece.score = token.replace(" ", "\u2581"), score
        piece.type = model_pb2.ModelProto.SentencePiece.UNKNOWN if index == 3 else kind
    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(proto.SerializeToString())
    texts = real_text() + EDGE_CASES + ["a" + " " * 40 + "b"]
    assert [processor.encode_as_pieces(text) for text in texts] == [reference.encode(text) for text in texts]


@pytest.mark.slow
def test_pieces_follow_sentencepiece_bpe(tokenizer, reference):
    """The converted tokenizer cuts ~1000 words of real text exactly as SentencePiece BPE."""
    texts = real_text()
    assert sum(len(text.split()) for text in texts) >= 100
    assert mismatches(tokenizer, reference, texts + EDGE_CASES) == []


@pytest.mark.slow
def test_tokenizer_built_without_transformers_5(tokenizer, reference, gguf_tokenizer):
    """The tokenizer conversion under transformers 4.x builds: right, and the same as 5.x's."""
    _, built = gguf_tokenizer
    assert mismatches(built, reference, real_text() + EDGE_CASES) == []
    assert pieces(built, "The capital of Germany is Berlin.") == pieces(tokenizer, "The capital of Germany is Berlin.")
    saved = json.loads(tokenizer.backend_tokenizer.to_str())
    ours = json.loads(built.backend_tokenizer.to_str())
    for part in ("model", "normalizer", "pre_tokenizer", "decoder", "added_tokens"):
        assert ours[part] == saved[part], part
