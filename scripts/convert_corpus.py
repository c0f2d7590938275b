"""Convert CoNLL-style IOB2 files to spaCy's binary `.spacy` (DocBin) format.

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

`--limit N` keeps the first N sentences (0 = all); in preset mode it applies to
train (and, with `--dev-limit`, to dev), never to test.
"""
import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional

SEPARATORS = {"tab": "\t", "space": " ", "whitespace": None}
_TAG = re.compile(r"^(O|[BI]-.+)$")
# what the written DocBins keep: the words, the entities and the sentence starts
DOCBIN_ATTRS = ["ORTH", "ENT_IOB", "ENT_TYPE", "SENT_START"]


@dataclass(frozen=True)
class Preset:
    """A corpus: where its splits live and how its columns are laid out."""

    directory: str
    splits: Dict[str, str]  # split name -> file name inside `directory`
    token_col: int
    tag_col: int
    sep: str
    docstart: bool
    note: str = ""
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
        token_col=0, tag_col=3, sep="whitespace", docstart=True,
        note="not shipped: run `python -m spacy project run copy-conll` first", doc_group="docs",
    ),
}


@dataclass
class Sentence:
    words: List[str]
    tags: List[str]
    line: int  # 1-based line number of the first token
    document: int = 0  # index of the -DOCSTART- document it belongs to


def read_sentences(
    path: Path, *, token_col: int = 0, tag_col: int = -1, sep: str = "tab", docstart: bool = False
) -> Iterator[Sentence]:
    """Yield the sentences of a column file, one per blank-line-separated block."""
    if sep not in SEPARATORS:
        raise ValueError(f"unknown separator {sep!r}; choose one of {sorted(SEPARATORS)}")
    splitter = SEPARATORS[sep]
    words: List[str] = []
    tags: List[str] = []
    start = 0
    document = 0
    seen_docstart = False
    with Path(path).open(encoding="utf8") as handle:
        for number, raw in enumerate(handle, start=1):
            line = raw.rstrip("\r\n")
            if not line.strip():
                if words:
                    yield Sentence(words, tags, start, document)
                words, tags = [], []
                continue
            cols = line.split(splitter) if splitter else line.split()
            if docstart and cols[0] == "-DOCSTART-":
                if words:
                    yield Sentence(words, tags, start, document)
                words, tags = [], []
                document += seen_docstart
                seen_docstart = True
                continue
            try:
                word, tag = cols[token_col], cols[tag_col].strip()
            except IndexError:
                raise ValueError(
                    f"{path}:{number}: {len(cols)} column(s) with separator {sep!r}, "
                    f"need token column {token_col} and tag column {tag_col}: {line!r}"
                ) from None
            if word == "" or (splitter and not word.strip()):
                raise ValueError(f"{path}:{number}: empty token: {line!r}")
            if not _TAG.match(tag):
                raise ValueError(f"{path}:{number}: not an IOB tag: {tag!r} (line {line!r})")
            if not words:
                start = number
            words.append(word)
            tags.append(tag)
    if words:
        yield Sentence(words, tags, start, document)


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
    """Build one spaCy Doc per group of sentences, entities from the IOB tags.

    Each sentence's IOB tags are read on their own (an entity never crosses a
    sentence boundary); the Doc keeps the sentence starts.
    """
    from spacy.tokens import Doc
    from spacy.training import biluo_tags_to_spans, iob_to_biluo
    from spacy.vocab import Vocab

    vocab = vocab if vocab is not None else Vocab()
    for group in groups:
        words = [w for sent in group for w in sent.words]
        biluo = [t for sent in group for t in iob_to_biluo(sent.tags)]
        starts = [i == 0 for sent in group for i in range(len(sent.words))]
        doc = Doc(vocab, words=words, sent_starts=starts)
        doc.ents = biluo_tags_to_spans(doc, biluo)
        yield doc


def convert_file(
    input_path: Path,
    output_path: Path,
    *,
    token_col: int = 0,
    tag_col: int = -1,
    sep: str = "tab",
    docstart: bool = False,
    limit: int = 0,
    group: str = "sentences",
    quiet: bool = False,
) -> Dict[str, object]:
    """Convert one file; write the DocBin; return (and print) its statistics.

    `limit` counts sentences; `group` says how sentences become Docs (see `group_sentences`).
    """
    from spacy.tokens import DocBin

    sentences = []
    for sent in read_sentences(input_path, token_col=token_col, tag_col=tag_col, sep=sep, docstart=docstart):
        if limit and len(sentences) >= limit:
            break
        sentences.append(sent)
    bad = sum(invalid_iob2(s.tags) for s in sentences)
    groups = group_sentences(sentences, group)
    docbin = DocBin(attrs=DOCBIN_ATTRS, store_user_data=False)
    per_type: Counter = Counter()
    tokens = 0
    for doc in sentences_to_docs(groups):
        docbin.add(doc)
        tokens += len(doc)
        per_type.update(ent.label_ for ent in doc.ents)
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
        f"{stats['entities']} entities ({types})"
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
    groups = {"": group, ".doc": preset.doc_group}  # the document-level copy beside the sentence-level one
    results = {}
    for suffix, how in groups.items():
        for split, filename in preset.splits.items():
            results[f"{split}{suffix}"] = convert_file(
                directory / filename,
                Path(output_dir) / f"{split}{suffix}.spacy",
                token_col=preset.token_col,
                tag_col=preset.tag_col,
                sep=preset.sep,
                docstart=preset.docstart,
                limit=limits[split],
                group=how,
                quiet=quiet,
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


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)

    one = sub.add_parser("file", help="convert one CoNLL/IOB2 file")
    one.add_argument("input", type=Path)
    one.add_argument("output", type=Path, help="the .spacy file to write")
    one.add_argument("--token-col", type=int, default=0, help="index of the token column (default 0)")
    one.add_argument("--tag-col", type=int, default=-1, help="index of the IOB2 tag column (default -1, the last)")
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
