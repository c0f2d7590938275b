"""A decoder's vocabulary trimmed to a script and the pieces of a corpus, every text still encodable.

A labeller only looks rows of its input embedding up, and a language uses a part of a
large multilingual vocabulary (of Gemma 3's 262,144 pieces, 150,553 are ASCII).
`trim_backbone` keeps, of a BPE tokenizer:

- with `script` ("ascii" or "latin"), every text piece written in it (not the special
  pieces the tokenizer adds, such as Gemma's `<unused0>`...; its added runs of newlines or
  tabs are text): all text in that script is then read exactly as before, whatever it says;
- every piece the given texts are tokenized into, read the ways the pipeline reads them
  (whole, and sentence by sentence);
- the pieces those are merged from, for every merge that makes them, down to single
  characters, so that each kept piece can still be made;
- the fallback that keeps every text encodable: the single-character pieces (of the
  script, where one is given; Gemma 3 has 19,227 in all), the 256-character alphabet of
  a byte-level tokenizer, and the 256 byte pieces (`<0x00>`...) of one with byte
  fallback, so a word whose merges are gone is read as smaller pieces, its characters or
  their bytes;
- the special pieces (BOS, EOS, padding, unknown).

Merges survive when they make a kept piece from kept pieces, in their order, so the
texts given are tokenized into exactly the same pieces as before (checked). The
embedding keeps the rows of the kept pieces, renumbered in their old order; nothing
else of the decoder changes. Keeping the pieces of a corpus alone does not serve text
beyond it: CoNLL-2003's training text keeps 61,142 pieces, and its dev text reads
differently enough to lose 0.9 F1 (docs/compact-pipelines.md).
"""
import json
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Set

import torch
from torch import nn

SPECIAL_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")
SCRIPTS = ("ascii", "latin")
# Unicode blocks of the Latin script and of what Latin text uses beside it: Basic Latin
# to Latin Extended-B, combining diacritics, Latin Extended Additional, general
# punctuation to currency signs, Latin Extended-C and -D.
LATIN_BLOCKS = ((0x0000, 0x024F), (0x0300, 0x036F), (0x1E00, 0x1EFF), (0x2000, 0x20CF), (0x2C60, 0x2C7F), (0xA720, 0xA7FF))


@dataclass
class TrimReport:
    rows_before: int
    rows_after: int
    pieces_seen: int
    texts: int


def trim_backbone(backbone, docs: Iterable = (), *, script: Optional[str] = None) -> TrimReport:
    """Trim `backbone`'s tokenizer and input embedding (in place) to the pieces written in
    `script` (None, "ascii" or "latin") and the pieces of `docs` (spaCy Docs)."""
    from .saved_tokenizer import TOKENIZER_FILE, tokenizer_data, tokenizer_from_data

    if backbone.settings.save_mode != "full":
        raise ValueError(
            "vocabulary trimming needs save_mode = \"full\": with save_mode = \"adapter\" the base model, "
            "with its whole vocabulary, is loaded again from `name`"
        )
    if script not in (None, *SCRIPTS):
        raise ValueError(f"script must be one of {', '.join(SCRIPTS)} (or None: the pieces of the texts only), not {script!r}")
    backbone.set_merged(False)
    backbone.set_quantized(False)
    data = json.loads(backbone.tokenizer.backend_tokenizer.to_str())
    texts = pipeline_texts(docs)
    old_ids = [enc.ids for enc in backbone.tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)]
    seen = {i for ids in old_ids for i in ids}
    if not texts and script is None:
        raise ValueError("nothing to keep: give texts, a script, or both")
    keep = kept_pieces(data, seen, {str(t) for t in backbone.tokenizer.all_special_tokens}, script)
    new_data, order, remap = trimmed_tokenizer(data, keep)
    files = tokenizer_data(backbone.tokenizer)
    files[TOKENIZER_FILE] = json.dumps(new_data, ensure_ascii=False).encode("utf-8")
    tokenizer = tokenizer_from_data(files)
    new_ids = [enc.ids for enc in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)]
    if any([remap[i] for i in old] != new for old, new in zip(old_ids, new_ids)):
        raise RuntimeError("the trimmed tokenizer reads the given texts differently: report this tokenizer to spacy-unmask")
    rows_before = backbone.model.get_input_embeddings().num_embeddings
    trim_embedding(backbone.model, order, remap)
    backbone.tokenizer = tokenizer
    backbone.bos_id = None if backbone.bos_id is None else remap[backbone.bos_id]
    backbone.pad_id = remap.get(backbone.pad_id, tokenizer.pad_token_id or 0)
    return TrimReport(rows_before=rows_before, rows_after=len(order), pieces_seen=len(seen), texts=len(texts))


def pipeline_texts(docs: Iterable) -> List[str]:
    """Each doc's text, and each of its sentences where it has sentence boundaries, once
    each: the pipeline reads a doc one way or the other (`windows.plan_batch`), and a
    one-sentence doc is the same text both ways."""
    from .windows import sentence_texts

    texts = {}
    for doc in docs:
        texts[doc.text] = None
        if doc.has_annotation("SENT_START"):
            texts.update((text, None) for _, text in sentence_texts(doc))
    return list(texts)


def kept_pieces(data: dict, seen: Set[int], special: Set[str], script: Optional[str] = None) -> Set[str]:
    """The pieces to keep: those of the script, those seen and the special ones, the
    fallback, and every piece a kept piece is merged from."""
    model = data["model"]
    if model.get("type") != "BPE":
        raise ValueError(
            f"vocabulary trimming works on BPE tokenizers (Llama, Mistral, Qwen, Gemma, SmolLM); this "
            f"tokenizer's model is {model.get('type')!r}"
        )
    vocab: Dict[str, int] = model["vocab"]
    piece_of = {i: p for p, i in vocab.items()}
    piece_of.update({added["id"]: added["content"] for added in data.get("added_tokens") or []})
    written = piece_text(data)
    in_script = (lambda piece: True) if script is None else (lambda piece: is_written_in(written(piece), script))
    keep = {piece_of[i] for i in seen} | (special & set(vocab)) | fallback_pieces(data, in_script)
    if script is not None:  # text pieces only: special pieces (Gemma's 6,242 `<unused…>`) are not text
        control = {a["content"] for a in data.get("added_tokens") or [] if a.get("special")}
        keep |= {piece for piece in vocab if piece not in control and in_script(piece)}
    if model.get("unk_token"):
        keep.add(model["unk_token"])
    made_from: Dict[str, List[tuple]] = {}
    for a, b in map(split_merge, model["merges"]):
        made_from.setdefault(a + b, []).append((a, b))
    todo = list(keep)
    while todo:
        for parts in made_from.get(todo.pop(), ()):
            for part in parts:
                if part not in keep:
                    keep.add(part)
                    todo.append(part)
    return keep


def split_merge(merge) -> tuple:
    """A merge as (left, right): tokenizers writes `["a", "b"]`, older files `"a b"`."""
    return tuple(merge) if isinstance(merge, list) else tuple(merge.split(" ", 1))


def piece_text(data: dict):
    """A function from a piece to the text it stands for: a byte-level piece's bytes
    (a character cut between pieces left out), a SentencePiece piece with its spaces."""
    if _has_byte_level(data.get("pre_tokenizer")):
        from tokenizers.pre_tokenizers import ByteLevel

        byte_of = {char: index for index, char in enumerate(_byte_level_order(ByteLevel.alphabet()))}
        return lambda piece: bytes(byte_of[c] for c in piece if c in byte_of).decode("utf-8", errors="ignore")
    return lambda piece: piece.replace("\u2581", " ")


def _byte_level_order(alphabet) -> List[str]:
    """The byte-level alphabet in byte order (GPT-2's table: printable bytes stand for
    themselves, the others for 256 + their rank)."""
    printable = [b for b in range(256) if chr(b) in alphabet]
    others = [b for b in range(256) if b not in printable]
    char_of = {b: chr(b) for b in printable}
    char_of.update({b: chr(256 + n) for n, b in enumerate(others)})
    return [char_of[b] for b in range(256)]


def _has_byte_level(block) -> bool:
    if not isinstance(block, dict):
        return False
    return block.get("type") == "ByteLevel" or any(_has_byte_level(b) for b in block.get("pretokenizers") or [])


def is_written_in(text: str, script: str) -> bool:
    if script == "ascii":
        return text.isascii()
    return all(any(low <= ord(c) <= high for low, high in LATIN_BLOCKS) for c in text)


def fallback_pieces(data: dict, in_script) -> Set[str]:
    """The pieces that keep every text encodable (see the module's docstring)."""
    vocab = data["model"]["vocab"]
    pieces = {p for p in vocab if len(p) == 1 and in_script(p)}
    if _has_byte_level(data.get("pre_tokenizer")):
        from tokenizers.pre_tokenizers import ByteLevel

        pieces |= set(ByteLevel.alphabet()) & set(vocab)
    if data["model"].get("byte_fallback"):
        pieces |= {f"<0x{b:02X}>" for b in range(256)} & set(vocab)
    return pieces


def trimmed_tokenizer(data: dict, keep: Set[str]):
    """(tokenizer.json data with only the pieces in `keep`, renumbered in their old order;
    the old id of each new id; the new id of each kept old id)."""
    model = data["model"]
    added = [a for a in data.get("added_tokens") or [] if a["content"] in keep]
    old_id = {**model["vocab"], **{a["content"]: a["id"] for a in added}}
    order = sorted(old_id[p] for p in keep if p in old_id)
    remap = {old: new for new, old in enumerate(order)}
    new_model = dict(model)
    new_model["vocab"] = {p: remap[i] for p, i in model["vocab"].items() if p in keep}
    new_model["merges"] = [m for m in model["merges"] if _kept_merge(split_merge(m), keep)]
    new_data = dict(data, model=new_model, added_tokens=[dict(a, id=remap[a["id"]]) for a in added])
    new_data["post_processor"] = _remapped_processor(data.get("post_processor"), remap)
    return new_data, order, remap


def _kept_merge(parts: tuple, keep: Set[str]) -> bool:
    return parts[0] in keep and parts[1] in keep and parts[0] + parts[1] in keep


def _remapped_processor(block, remap: Dict[int, int]):
    """A post-processor with the ids of its special pieces renumbered."""
    if not isinstance(block, dict):
        return block
    kind = block.get("type")
    if kind == "TemplateProcessing":
        special = {
            name: dict(token, ids=[remap[i] for i in token["ids"]]) for name, token in block.get("special_tokens", {}).items()
        }
        return dict(block, special_tokens=special)
    if kind == "Sequence":
        return dict(block, processors=[_remapped_processor(b, remap) for b in block.get("processors", [])])
    if kind in ("RobertaProcessing", "BertProcessing"):
        return dict(block, **{key: [block[key][0], remap[block[key][1]]] for key in ("sep", "cls")})
    return block


def trim_embedding(model: nn.Module, order: Sequence[int], remap: Dict[int, int]) -> None:
    """Keep the input embedding's rows `order` (in place, its class and settings kept) and
    renumber the special ids of the decoder's config."""
    embedding = model.get_input_embeddings()
    if not isinstance(embedding, nn.Embedding):
        raise ValueError(
            f"vocabulary trimming needs a plain input embedding; this decoder's is {type(embedding).__name__} "
            "(trained through LoRA?)"
        )
    index = torch.as_tensor(order, dtype=torch.long, device=embedding.weight.device)
    weight = embedding.weight
    embedding.weight = nn.Parameter(weight.detach().index_select(0, index).clone(), requires_grad=weight.requires_grad)
    embedding.num_embeddings = len(order)
    if embedding.padding_idx is not None:
        embedding.padding_idx = remap.get(embedding.padding_idx)
    config = model.config
    config.vocab_size = len(order)
    for key in SPECIAL_IDS:
        value = getattr(config, key, None)
        if isinstance(value, int):
            setattr(config, key, remap.get(value))
        elif isinstance(value, list):
            setattr(config, key, [remap[v] for v in value if v in remap] or None)
