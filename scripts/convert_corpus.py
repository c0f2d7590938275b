"""Convert CoNLL-style IOB2 files to spaCy's binary `.spacy` (DocBin) format.

Up to three annotation columns per file, each to its place on the Doc: the NER
column (`--tag-col`) to `doc.ents`, a chunk column (`--chunk-col`, IOB2 like NER)
to the span group `doc.spans["chunks"]`, and a part-of-speech column
(`--pos-col`) to `token.tag_`. CoNLL-2003 has all three (token POS chunk NER);
CoNLL-2000 has POS and chunks (`--tag-col none`).

One Doc per sentence by default. Sentences are separated by blank lines; a line
holding only whitespace (WNUT-17's train file separates sentences with a lone
tab) counts as blank. `-DOCSTART-` lines (CoNLL-2003) are dropped when asked for.

`--group docs` makes one Doc per document instead (the sentences between two
`-DOCSTART-` lines: a CoNLL-2003 article), and `--group N` one Doc per N
consecutive sentences; either way the sentence boundaries are kept on the Doc
(`token.is_sent_start`), so the evaluation can compare sentence-level and
document-level input on the same text.
The token and tag columns are chosen by index, the separator by name.

Entities are built the way `spacy convert` does it
(`spacy.training.converters.conll_ner_to_docs`): the IOB tags go through
`spacy.training.iob_to_biluo` and become spans on the Doc. Unlike that
converter, this one does not split lines on any whitespace when the columns
are tab-separated, so tokens stay exactly as they are in the file.

Two modes:

    # one file, explicit format
    python scripts/convert_corpus.py file assets/wnut17/wnut17train.conll \
        corpus/wnut17/train.spacy --token-col 0 --tag-col 1 --sep tab --limit 200

    # a named corpus: its train/dev/test files to OUTPUT_DIR/{train,dev,test}.spacy and
    # the document-level copies OUTPUT_DIR/{train,dev,test}.doc.spacy (CoNLL-2003:
    # -DOCSTART- articles; NCBI-disease and BC5CDR, whose files mark no documents: 10
    # consecutive sentences; WNUT-17's tweets stand alone, as they are), and, where
    # documents differ from sentences, OUTPUT_DIR/train.mix.spacy: the training sentences
    # and documents together, so that a model learns from inputs of both lengths
    python scripts/convert_corpus.py preset wnut17 corpus/wnut17 --limit 200

CoNLL-2000 has no dev file: the preset holds out its last 1,000 training sentences
(WSJ section 18's end) as dev.spacy and trains on the 7,936 before them; select on
that split only, and test on test.txt (WSJ section 20).

`--limit N` keeps the first N sentences (0 = all); in preset mode it applies to
train (and, with `--dev-limit`, to dev), never to test.
"""
import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional

SEPARATORS = {"tab": "\t", "space": " ", "whitespace": None}
_TAG = re.compile(r"^(O|[BI]-.+)$")
# what the written DocBins keep: the words, the entities and the sentence starts
DOCBIN_ATTRS = ["ORTH", "TAG", "ENT_IOB", "ENT_TYPE", "SENT_START"]
# the span group that holds a chunk column
CHUNKS_KEY = "chunks"


@dataclass(frozen=True)
class Preset:
    """A corpus: where its splits live and how its columns are laid out."""

    directory: str
    splits: Dict[str, str]  # split name -> file name inside `directory`
    token_col: int
    tag_col: Optional[int]  # the NER column (None: the corpus has none)
    sep: str
    docstart: bool
    note: str = ""
    chunk_col: Optional[int] = None
    pos_col: Optional[int] = None
    # a corpus without a dev file: its last N training sentences are the dev split
    # (written to dev.spacy and left out of train.spacy), the only split to select on
    dev_from_train: int = 0
    # how the document-level copy groups sentences: "docs" (-DOCSTART- articles), N
    # (N consecutive sentences, where the files mark no documents) or "sentences" (the
    # corpus's units stand alone: WNUT-17's tweets)
    doc_group: str = "sentences"


PRESETS: Dict[str, Preset] = {
    "wnut17": Preset(
        "assets/wnut17",
        {"train": "wnut17train.conll", "dev": "emerging.dev.conll", "test": "emerging.test.annotated"},
        token_col=0, tag_col=1, sep="tab", docstart=False,
        note="shipped in the repository (CC-BY 4.0)",
    ),
    "ncbi_disease": Preset(
        "assets/ncbi_disease",
        {"train": "train.tsv", "dev": "devel.tsv", "test": "test.tsv"},
        token_col=0, tag_col=1, sep="tab", docstart=False,
        note="shipped in the repository (CC-BY 4.0)", doc_group="10",
    ),
    "bc5cdr": Preset(
        "assets/bc5cdr",
        {"train": "train.tsv", "dev": "devel.tsv", "test": "test.tsv"},
        token_col=0, tag_col=1, sep="tab", docstart=False,
        note="shipped in the repository (CC-BY 4.0)", doc_group="10",
    ),
    "conll03": Preset(
        "assets/conll2003",
        {"train": "train.txt", "dev": "valid.txt", "test": "test.txt"},
        token_col=0, tag_col=3, chunk_col=2, pos_col=1, sep="whitespace", docstart=True,
        note="not shipped: run `python -m spacy project run copy-conll` first", doc_group="docs",
    ),
    "conll2000": Preset(
        "assets/conll2000",
        {"train": "train.txt", "test": "test.txt"},
        token_col=0, tag_col=None, chunk_col=2, pos_col=1, sep="whitespace", docstart=False,
        note="not shipped: run `python -m spacy project run copy-conll` first", dev_from_train=1000,
    ),
}


@dataclass
class Sentence:
    words: List[str]
    tags: List[str]  # NER (IOB2); empty where the file has no NER column
    line: int  # 1-based line number of the first token
    document: int = 0  # index of the -DOCSTART- document it belongs to
    chunks: List[str] = field(default_factory=list)  # IOB2; empty where no chunk column
    pos: List[str] = field(default_factory=list)  # empty where no POS column


def read_sentences(
    path: Path, *, token_col: int = 0, tag_col: Optional[int] = -1, sep: str = "tab", docstart: bool = False,
    chunk_col: Optional[int] = None, pos_col: Optional[int] = None,
) -> Iterator[Sentence]:
    """Yield the sentences of a column file, one per blank-line-separated block.

    `tag_col` (NER) and `chunk_col` must hold IOB tags; `pos_col` any non-empty tag;
    a column given as None is not read.
    """
    if sep not in SEPARATORS:
        raise ValueError(f"unknown separator {sep!r}; choose one of {sorted(SEPARATORS)}")
    splitter = SEPARATORS[sep]
    columns = {name: col for name, col in (("tags", tag_col), ("chunks", chunk_col), ("pos", pos_col))
               if col is not None}
    if not columns:
        raise ValueError("no annotation column: give the NER, chunk or POS column")
    sentence: Optional[Sentence] = None
    document = 0
    seen_docstart = False
    with Path(path).open(encoding="utf8") as handle:
        for number, raw in enumerate(handle, start=1):
            line = raw.rstrip("\r\n")
            if not line.strip():
                if sentence is not None:
                    yield sentence
                sentence = None
                continue
            cols = line.split(splitter) if splitter else line.split()
            if docstart and cols[0] == "-DOCSTART-":
                if sentence is not None:
                    yield sentence
                sentence = None
                document += seen_docstart
                seen_docstart = True
                continue
            try:
                word = cols[token_col]
                values = {name: cols[col].strip() for name, col in columns.items()}
            except IndexError:
                raise ValueError(
                    f"{path}:{number}: {len(cols)} column(s) with separator {sep!r}, "
                    f"need token column {token_col} and annotation columns {sorted(columns.values())}: {line!r}"
                ) from None
            if word == "" or (splitter and not word.strip()):
                raise ValueError(f"{path}:{number}: empty token: {line!r}")
            for name, value in values.items():
                if name != "pos" and not _TAG.match(value):
                    raise ValueError(f"{path}:{number}: not an IOB tag: {value!r} (line {line!r})")
                if not value:
                    raise ValueError(f"{path}:{number}: empty tag: {line!r}")
            if sentence is None:
                sentence = Sentence([], [], number, document)
            sentence.words.append(word)
            for name, value in values.items():
                getattr(sentence, name).append(value)
    if sentence is not None:
        yield sentence


def group_sentences(sentences: List[Sentence], group: str) -> List[List[Sentence]]:
    """Sentences per Doc: "sentences" (one each), "docs" (per -DOCSTART- document) or N."""
    if group == "sentences":
        return [[sent] for sent in sentences]
    if group == "docs":
        groups: Dict[int, List[Sentence]] = {}
        for sent in sentences:
            groups.setdefault(sent.document, []).append(sent)
        return list(groups.values())
    if group.isdigit() and int(group) >= 1:
        size = int(group)
        return [sentences[i : i + size] for i in range(0, len(sentences), size)]
    raise ValueError(f"group {group!r}: accepted are 'sentences', 'docs' or a positive number of sentences")


def invalid_iob2(tags: List[str]) -> int:
    """How many I- tags do not continue an entity of the same type (IOB2 violations)."""
    bad = 0
    previous = "O"
    for tag in tags:
        if tag.startswith("I-") and previous[2:] != tag[2:]:
            bad += 1
        previous = tag
    return bad


def sentences_to_docs(groups: List[List[Sentence]], vocab=None):
    """Build one spaCy Doc per group of sentences: entities from the NER tags, the span
    group `doc.spans["chunks"]` from the chunk tags, `token.tag_` from the POS column.

    Each sentence's IOB tags are read on their own (a span never crosses a sentence
    boundary); the Doc keeps the sentence starts.
    """
    from spacy.tokens import Doc
    from spacy.training import biluo_tags_to_spans, iob_to_biluo
    from spacy.vocab import Vocab

    vocab = vocab if vocab is not None else Vocab()
    for group in groups:
        words = [w for sent in group for w in sent.words]
        starts = [i == 0 for sent in group for i in range(len(sent.words))]
        pos = [t for sent in group for t in sent.pos] or None
        doc = Doc(vocab, words=words, sent_starts=starts, tags=pos)
        if any(sent.tags for sent in group):
            doc.ents = biluo_tags_to_spans(doc, [t for sent in group for t in iob_to_biluo(sent.tags)])
        if any(sent.chunks for sent in group):
            doc.spans[CHUNKS_KEY] = biluo_tags_to_spans(doc, [t for sent in group for t in iob_to_biluo(sent.chunks)])
        yield doc


def convert_file(
    input_path: Path,
    output_path: Path,
    *,
    token_col: int = 0,
    tag_col: Optional[int] = -1,
    sep: str = "tab",
    docstart: bool = False,
    limit: int = 0,
    group: str = "sentences",
    quiet: bool = False,
    chunk_col: Optional[int] = None,
    pos_col: Optional[int] = None,
    skip: int = 0,
    take: int = 0,
) -> Dict[str, object]:
    """Convert one file; write the DocBin; return (and print) its statistics.

    `limit` counts sentences; `group` says how sentences become Docs (see
    `group_sentences`); `skip` and `take` (0: all) select the sentences from `skip` on,
    `take` of them, before `limit` (a dev split held out of a training file).
    """
    sentences = list(read_sentences(input_path, token_col=token_col, tag_col=tag_col, sep=sep,
                                    docstart=docstart, chunk_col=chunk_col, pos_col=pos_col))
    sentences = sentences[skip: skip + take if take else None]
    if limit:
        sentences = sentences[:limit]
    return write_docs(sentences, input_path, output_path, group=group, quiet=quiet)


def write_docs(sentences: List[Sentence], input_path: Path, output_path: Path, *, group: str,
               quiet: bool) -> Dict[str, object]:
    from spacy.tokens import DocBin

    bad = sum(invalid_iob2(s.tags) + invalid_iob2(s.chunks) for s in sentences)
    groups = group_sentences(sentences, group)
    docbin = DocBin(attrs=DOCBIN_ATTRS, store_user_data=False)
    per_type: Counter = Counter()
    per_chunk: Counter = Counter()
    tokens = 0
    for doc in sentences_to_docs(groups):
        docbin.add(doc)
        tokens += len(doc)
        per_type.update(ent.label_ for ent in doc.ents)
        per_chunk.update(span.label_ for span in doc.spans.get(CHUNKS_KEY, []))
    output_path = Path(output_path)
    output_path.parent.mkdir(parents=True, exist_ok=True)
    docbin.to_disk(output_path)
    stats = {
        "input": str(input_path),
        "output": str(output_path),
        "docs": len(groups),
        "sentences": len(sentences),
        "tokens": tokens,
        "entities": sum(per_type.values()),
        "per_type": dict(sorted(per_type.items())),
        "chunks": sum(per_chunk.values()),
        "per_chunk_type": dict(sorted(per_chunk.items())),
        "pos_tagged": sum(len(s.pos) for s in sentences),
        "invalid_iob2": bad,
    }
    if not quiet:
        print_stats(stats)
    return stats


def print_stats(stats: Dict[str, object]) -> None:
    types = ", ".join(f"{label} {count}" for label, count in stats["per_type"].items()) or "none"
    print(
        f"{stats['input']} -> {stats['output']}: {stats['docs']} docs, {stats['sentences']} sentences, "
        f"{stats['tokens']} tokens, "
        f"{stats['entities']} entities ({types}), {stats['chunks']} chunks, {stats['pos_tagged']} POS tags"
    )
    if stats["invalid_iob2"]:
        print(
            f"  warning: {stats['invalid_iob2']} I- tag(s) do not continue an entity of the same type "
            "(read as entity starts, as spaCy's converters and IOB1 do)"
        )


def convert_preset(
    name: str,
    output_dir: Path,
    *,
    limit: int = 0,
    dev_limit: int = 0,
    root: Path = Path("."),
    group: str = "sentences",
    quiet: bool = False,
) -> Dict[str, Dict[str, object]]:
    if name not in PRESETS:
        raise SystemExit(f"unknown corpus {name!r}; known: {', '.join(sorted(PRESETS))}")
    preset = PRESETS[name]
    directory = Path(root) / preset.directory
    missing = [f for f in preset.splits.values() if not (directory / f).is_file()]
    if missing:
        raise SystemExit(f"{name}: missing {', '.join(missing)} in {directory} ({preset.note})")
    limits = {"train": limit, "dev": dev_limit, "test": 0}
    columns = dict(token_col=preset.token_col, tag_col=preset.tag_col, chunk_col=preset.chunk_col,
                   pos_col=preset.pos_col, sep=preset.sep, docstart=preset.docstart)
    sources = {split: (directory / filename, 0, 0) for split, filename in preset.splits.items()}
    if preset.dev_from_train:  # (file, skip, take): dev is the tail of the training file
        held_out = preset.dev_from_train
        total = sum(1 for _ in read_sentences(sources["train"][0], **columns))
        if total <= held_out:
            raise SystemExit(f"{name}: {total} training sentences, too few to hold out {held_out} for dev")
        sources["dev"] = (sources["train"][0], total - held_out, held_out)
        sources["train"] = (sources["train"][0], 0, total - held_out)
    groups = {"": group, ".doc": preset.doc_group}  # the document-level copy beside the sentence-level one
    results = {}
    for suffix, how in groups.items():
        for split in ("train", "dev", "test"):
            path, skip, take = sources[split]
            results[f"{split}{suffix}"] = convert_file(
                path, Path(output_dir) / f"{split}{suffix}.spacy", limit=limits[split], group=how,
                quiet=quiet, skip=skip, take=take, **columns,
            )
    if preset.doc_group != "sentences":  # where documents differ from sentences
        results["train.mix"] = write_mix(
            [Path(output_dir) / "train.spacy", Path(output_dir) / "train.doc.spacy"],
            Path(output_dir) / "train.mix.spacy",
            quiet=quiet,
        )
    return results


def write_mix(inputs: List[Path], output_path: Path, *, quiet: bool = False) -> Dict[str, object]:
    """Concatenate DocBins: one training file with inputs of several lengths."""
    from spacy.tokens import DocBin

    merged = DocBin(attrs=DOCBIN_ATTRS, store_user_data=False)
    for path in inputs:
        merged.merge(DocBin().from_disk(path))
    merged.to_disk(output_path)
    stats = {"inputs": [str(p) for p in inputs], "output": str(output_path), "docs": len(merged)}
    if not quiet:
        print(f"{' + '.join(stats['inputs'])} -> {output_path}: {len(merged)} docs")
    return stats


GROUP_HELP = (
    "one Doc per: 'sentences' (default), 'docs' (each -DOCSTART- document; sentence "
    "boundaries kept) or N consecutive sentences"
)


def column(value: str) -> Optional[int]:
    """A column index, or 'none' (not read)."""
    if value.lower() == "none":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: give a column index (0, 1, -1, ...) or 'none'") from None


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)

    one = sub.add_parser("file", help="convert one CoNLL/IOB2 file")
    one.add_argument("input", type=Path)
    one.add_argument("output", type=Path, help="the .spacy file to write")
    one.add_argument("--token-col", type=int, default=0, help="index of the token column (default 0)")
    one.add_argument("--tag-col", type=column, default=-1,
                     help="index of the NER column, IOB2 (default -1, the last; 'none': no NER column)")
    one.add_argument("--chunk-col", type=column, default=None, help="index of a chunk column, IOB2 (to doc.spans['chunks'])")
    one.add_argument("--pos-col", type=column, default=None, help="index of a part-of-speech column (to token.tag_)")
    one.add_argument("--sep", choices=sorted(SEPARATORS), default="tab", help="column separator (default tab)")
    one.add_argument("--docstart", action="store_true", help="the file has -DOCSTART- lines: drop them")
    one.add_argument("--limit", type=int, default=0, help="keep the first N sentences (0 = all)")
    one.add_argument("--group", default="sentences", help=GROUP_HELP)

    named = sub.add_parser("preset", help="convert a known corpus: " + ", ".join(sorted(PRESETS)))
    named.add_argument("name", choices=sorted(PRESETS))
    named.add_argument("output_dir", type=Path, help="writes train.spacy, dev.spacy, test.spacy here")
    named.add_argument("--limit", type=int, default=0, help="keep the first N train sentences (0 = all)")
    named.add_argument("--dev-limit", type=int, default=0, help="keep the first N dev sentences (0 = all)")
    named.add_argument("--root", type=Path, default=Path("."), help="project root holding assets/")
    named.add_argument("--group", default="sentences", help=GROUP_HELP)

    args = parser.parse_args(argv)
    try:
        if args.mode == "file":
            convert_file(
                args.input, args.output, token_col=args.token_col, tag_col=args.tag_col,
                sep=args.sep, docstart=args.docstart, limit=args.limit, group=args.group,
                chunk_col=args.chunk_col, pos_col=args.pos_col,
            )
        else:
            convert_preset(
                args.name, args.output_dir, limit=args.limit, dev_limit=args.dev_limit, root=args.root,
                group=args.group,
            )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
