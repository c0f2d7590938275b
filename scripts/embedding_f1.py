"""What the 8-bit embedding (save_embedding = "int8") costs a trained pipeline, on dev.

    python -m scripts.embedding_f1 training/conll03_chunk/chunk-all-seed0/model-best \
        corpus/conll03/dev.spacy --spans-key chunks \
        --output metrics/bench/load-cost/embedding-int8-f1-conll03-chunk-dev.json

Scores the pipeline as saved (`spacy evaluate`), saves it again with its embedding in 8
bits into a temporary folder, and scores that copy on the same data: the F1 (or the
headline score) of each, their difference, and the two pipelines' sizes. Dev data, so
that the default can be chosen on it.
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


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pipeline", type=Path)
    parser.add_argument("data", type=Path, help="a dev .spacy file")
    parser.add_argument("--spans-key", default="sc", help="the span group a chunker writes (chunks)")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)

    from spacy_unmask import load
    from spacy_unmask.cpu import machine

    exact = score(args.pipeline, args.data, args.spans_key)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "int8"
        load(args.pipeline, save_embedding="int8").to_disk(copy)
        int8 = score(copy, args.data, args.spans_key)
        sizes = {"exact_bytes": folder_size(args.pipeline), "int8_bytes": folder_size(copy)}
    result = {
        "command": " ".join(["python -m scripts.embedding_f1", *(sys.argv[1:] if argv is None else argv)]),
        "pipeline": str(args.pipeline), "data": str(args.data), "split": "dev",
        "f1_exact": round(exact, 2), "f1_int8": round(int8, 2), "difference": round(int8 - exact, 2),
        **sizes, **machine(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf8")
    print(f"dev F1 {exact:.2f} exact, {int8:.2f} with the 8-bit embedding ({int8 - exact:+.2f}); "
          f"{sizes['exact_bytes'] / 2**20:.1f} -> {sizes['int8_bytes'] / 2**20:.1f} MiB -> {args.output}")
    return 0


def summarise(paths: List[Path]) -> List[str]:
    """Rows for docs/results.md: each file's dev F1, exact against the 8-bit embedding."""
    from scripts.results import fmt, machine_text

    rows = []
    for path in paths:
        data = read_json(path)
        if isinstance(data, dict) and "f1_int8" in data:
            rows.append(f"| `{path.name}` | {data['data']} | {fmt(data['f1_exact'])} | {fmt(data['f1_int8'])} | "
                        f"{fmt(data['difference'], sign=True)} | {fmt(data['exact_bytes'] / 2**20, 1)} | "
                        f"{fmt(data['int8_bytes'] / 2**20, 1)} | "
                        f"{machine_text(data)} |")
    if not rows:
        return []
    return (["`python -m scripts.embedding_f1 PIPELINE DEV --spans-key KEY --output FILE`: a trained pipeline "
             "scored on dev as saved, then saved again with `save_embedding = \"int8\"` and scored again.", "",
             "| file | data | F1 exact | F1 8-bit embedding | difference | MiB exact | MiB 8-bit | machine |",
             "|---|---|---:|---:|---:|---:|---:|---|"] + rows + [""])


if __name__ == "__main__":
    raise SystemExit(main())
