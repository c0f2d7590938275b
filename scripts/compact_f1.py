"""What the compact formats cost a trained pipeline: F1 and size as saved, with the
embedding in 8 bits, and with the vocabulary trimmed to a corpus.

    python -m scripts.compact_f1 training/conll03/int8-scheme/int8-scheme-all-seed0/model-best \
        corpus/conll03/dev.spacy --trim-corpus corpus/conll03/train.spacy \
        --script ascii --output metrics/bench/load-cost/compact-f1-conll03-dev.json

Scores the pipeline as saved (`spacy evaluate`), then copies of it saved into a
temporary folder: with `save_embedding = "int8"`; and, with `--trim-corpus` or
`--script`, trimmed to the pieces of those files and that script (`python -m
spacy_unmask trim-vocabulary`), with the exact and with the 8-bit embedding. Each copy's F1 (or headline score), its difference
from the pipeline as saved, its size and its embedding's rows. `--split` names the
data's split (dev unless told): choose on dev, and read test once. Trimmed to the
training text alone, dev text shows what text the vocabulary has not seen costs.
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

from scripts.report import main_score, read_json


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def score(pipeline: Path, data: Path, spans_key: str) -> float:
    from spacy.cli.evaluate import evaluate

    return 100 * float(main_score(evaluate(str(pipeline), data, spans_key=spans_key, silent=True)))


def variants(trim: bool) -> List[tuple]:
    """(name, save_embedding, trimmed) of each copy scored beside the pipeline as saved."""
    copies = [("8-bit embedding", "int8", False)]
    if trim:
        copies += [("vocabulary trimmed", "exact", True), ("vocabulary trimmed, 8-bit embedding", "int8", True)]
    return copies


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pipeline", type=Path)
    parser.add_argument("data", type=Path, help="a .spacy file to score on (dev, unless --split says otherwise)")
    parser.add_argument("--split", default="dev", choices=("dev", "test"))
    parser.add_argument("--spans-key", default="sc", help="the span group a chunker writes (chunks)")
    parser.add_argument("--trim-corpus", type=Path, nargs="*", default=[],
                        help="also score copies trimmed to the pieces of these .spacy / .txt files")
    parser.add_argument("--script", choices=("ascii", "latin"), default=None,
                        help="trimmed copies also keep every piece written in this script")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)

    from spacy_unmask import get_backbone, load
    from spacy_unmask.cpu import machine
    from spacy_unmask.trim_cli import corpus_docs
    from spacy_unmask.vocabulary import trim_backbone

    def rows(nlp) -> int:
        return get_backbone(nlp).model.get_input_embeddings().num_embeddings

    as_saved = score(args.pipeline, args.data, args.spans_key)
    found = [{"name": "as saved", "f1": round(as_saved, 2), "bytes": folder_size(args.pipeline),
              "rows": rows(load(args.pipeline))}]
    with tempfile.TemporaryDirectory() as tmp:
        for number, (name, embedding, trimmed) in enumerate(variants(bool(args.trim_corpus or args.script))):
            nlp = load(args.pipeline, save_embedding=embedding)
            if trimmed:
                trim_backbone(get_backbone(nlp), corpus_docs(nlp, args.trim_corpus), script=args.script)
            copy = Path(tmp) / str(number)
            nlp.to_disk(copy)
            f1 = score(copy, args.data, args.spans_key)
            found.append({"name": name, "f1": round(f1, 2), "difference": round(f1 - as_saved, 2),
                          "bytes": folder_size(copy), "rows": rows(nlp)})
    result = {
        "command": " ".join(["python -m scripts.compact_f1", *(sys.argv[1:] if argv is None else argv)]),
        "pipeline": str(args.pipeline), "data": str(args.data), "split": args.split,
        "trim_corpus": [str(p) for p in args.trim_corpus], "script": args.script, "variants": found, **machine(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf8")
    for variant in found:
        print(f"{variant['name']}: {args.split} F1 {variant['f1']:.2f}, {variant['bytes'] / 2**20:.1f} MiB, "
              f"{variant['rows']:,} embedding rows")
    return 0


def summarise(paths: List[Path]) -> List[str]:
    """Rows for docs/results.md: each file's variants, F1 and size."""
    from scripts.results import fmt, machine_text, rel

    rows = []
    for path in paths:
        data = read_json(path)
        if not isinstance(data, dict) or "variants" not in data:
            continue
        trimmed = ", ".join([f"script {data['script']}"] * bool(data.get("script")) +
                            [f"`{p}`" for p in data.get("trim_corpus") or []]) or "–"
        for variant in data["variants"]:
            rows.append(f"| `{rel(path)}` | {data['data']} ({data['split']}) | {variant['name']} | {trimmed} | "
                        f"{fmt(variant['f1'])} | {fmt(variant.get('difference'), sign=True)} | "
                        f"{fmt(variant['bytes'] / 2**20, 1)} | {variant['rows']:,} | {machine_text(data)} |")
    if not rows:
        return []
    return (["`python -m scripts.compact_f1 PIPELINE DATA [--split test] [--script ascii] [--trim-corpus FILE...] --output FILE`: a "
             "trained pipeline scored as saved, then copies of it saved with `save_embedding = \"int8\"` and trimmed "
             "to the pieces of the trimming corpus, each scored on the same data.", "",
             "| file | data | copy | trimmed to | F1 | difference | MiB | embedding rows | machine |",
             "|---|---|---|---|---:|---:|---:|---:|---|"] + rows + [""])


if __name__ == "__main__":
    raise SystemExit(main())
