"""`python -m spacy_unmask trim-vocabulary PIPELINE OUTPUT --script ascii --corpus FILE...`: a
copy of a saved pipeline whose decoder keeps only the pieces of a script and a corpus
(`vocabulary.py`)."""
import argparse
import sys
from pathlib import Path
from typing import Iterator, List

from .vocabulary import SCRIPTS

CORPUS_SUFFIXES = (".spacy", ".txt")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pipeline", type=Path, help="a saved pipeline with a spacy_unmask decoder")
    parser.add_argument("output", type=Path, help="where the trimmed copy is saved (a new or empty folder)")
    parser.add_argument(
        "--script", choices=SCRIPTS, default=None,
        help="keep every piece written in this script, so that all its text reads as before (ascii: English)",
    )
    parser.add_argument(
        "--corpus", type=Path, nargs="+", default=[],
        help="keep the pieces of these texts too: .spacy files (DocBin, e.g. the training and dev corpus) or "
        ".txt files (one text per line)",
    )
    parser.add_argument(
        "--save-embedding", choices=("exact", "int8"), default=None,
        help="store the embedding exact or in 8 bits a row (save_embedding; default: as the pipeline has it)",
    )
    parser.add_argument("--overwrite", action="store_true", help="save into OUTPUT even where it holds files already")
    parser.add_argument("--pipe-name", default=None, help="the component whose decoder to trim, where there are several")


def corpus_docs(nlp, paths: List[Path]) -> Iterator:
    """The docs of each file: a DocBin's docs, or one doc per line of a text file."""
    from spacy.tokens import DocBin

    for path in paths:
        if path.suffix not in CORPUS_SUFFIXES or not path.is_file():
            raise ValueError(f"--corpus {path}: expected an existing {' or '.join(CORPUS_SUFFIXES)} file")
        if path.suffix == ".spacy":
            yield from DocBin().from_disk(path).get_docs(nlp.vocab)
        else:
            with path.open(encoding="utf8") as lines:
                yield from (nlp.make_doc(line.rstrip("\n")) for line in lines if line.strip())


def run(args) -> int:
    from .layers.decoder_tok2vec import get_backbone
    from .sharing import load, save
    from .vocabulary import trim_backbone

    if args.script is None and not args.corpus:
        raise SystemExit("nothing to keep: give --script, --corpus, or both")
    if args.output.resolve() == args.pipeline.resolve():
        raise SystemExit("the trimmed pipeline cannot replace the one it is made from: give another OUTPUT")
    if args.output.is_dir() and any(args.output.iterdir()) and not args.overwrite:
        raise SystemExit(f"{args.output} is not empty: give a new or empty folder, or --overwrite")
    nlp = load(args.pipeline, **({"save_embedding": args.save_embedding} if args.save_embedding else {}))
    report = trim_backbone(get_backbone(nlp, args.pipe_name), corpus_docs(nlp, args.corpus), script=args.script)
    save(nlp, args.output)
    print(
        f"kept {report.rows_after:,} of {report.rows_before:,} pieces ({report.pieces_seen:,} seen in "
        f"{report.texts:,} texts) -> {args.output}",
        file=sys.stderr,
    )
    return 0
