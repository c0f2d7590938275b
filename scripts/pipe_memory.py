"""Stream documents through `nlp.pipe` and record resident memory every `--every` documents.

    python -m scripts.pipe_memory --pipeline training/conll03/all-seed0/model-best \
        --data corpus/conll03/test.spacy --n-docs 100000 --output metrics/bench/pipe-memory.json

The texts of `--data` (a .spacy file, or a text file with one document a line) are
cycled until `--n-docs` documents have gone through one `nlp.pipe` call, as a
long-running service would send them. Without `--pipeline`, a fresh (untrained)
pipeline is built on `--model`, which is enough for memory. The JSON holds the
resident set size (VmRSS, MiB) after every `--every` documents, its peak, and the
growth from the first record to the last (`growth`: last / first - 1). It is not a
speed benchmark; the seconds are recorded for orientation only, with the CPU flags.
"""
import argparse
import itertools
import json
import platform
import sys
import time
from pathlib import Path
from typing import List, Optional


def rss_mib() -> float:
    """The current resident set size of this process, in MiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise OSError("no VmRSS in /proc/self/status (memory is measured on Linux only)")


def read_texts(path: Path) -> List[str]:
    if path.suffix == ".spacy":
        import spacy
        from spacy.tokens import DocBin

        texts = [doc.text for doc in DocBin().from_disk(path).get_docs(spacy.blank("xx").vocab)]
    else:
        texts = path.read_text(encoding="utf8").splitlines()
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise SystemExit(f"{path}: no documents")
    return texts


def build(args):
    import spacy

    if args.pipeline:
        from spacy_unmask import load

        return load(args.pipeline, **({"base_quantization": args.base_quantization} if args.base_quantization else {}))
    nlp = spacy.blank("en")
    tok2vec = {"name": args.model, "num_layers": args.num_layers}
    if args.base_quantization:
        tok2vec["base_quantization"] = args.base_quantization
    ner = nlp.add_pipe("unmask_ner", name="ner", config={"model": {"tok2vec": tok2vec}})
    ner.add_label("ENT")
    nlp.initialize()
    return nlp


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipeline", type=Path, help="a saved pipeline (else a fresh one on --model)")
    parser.add_argument("--model", default="gemma3-270m", help="backbone for a fresh pipeline")
    parser.add_argument("--num-layers", type=int, default=0, help="num_layers of a fresh pipeline")
    parser.add_argument("--base-quantization", choices=("none", "nf4", "int8"), help="set base_quantization")
    parser.add_argument("--data", type=Path, required=True, help=".spacy file or text file (one document a line)")
    parser.add_argument("--n-docs", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=1000, help="record memory every N documents")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)

    import torch

    from spacy_unmask.cpu import cpu_flags

    if args.threads:
        torch.set_num_threads(args.threads)
    texts = read_texts(args.data)
    before_load = rss_mib()
    nlp = build(args)
    records, start = [], time.perf_counter()
    stream = itertools.islice(itertools.cycle(texts), args.n_docs)
    for done, _ in enumerate(nlp.pipe(stream, batch_size=args.batch_size), 1):
        if done % args.every == 0 or done == args.n_docs:
            records.append({"docs": done, "rss_mib": round(rss_mib(), 1), "seconds": round(time.perf_counter() - start, 1)})
    first, last = records[0]["rss_mib"], records[-1]["rss_mib"]
    result = {
        "command": "python -m scripts.pipe_memory " + " ".join(argv if argv is not None else sys.argv[1:]),
        "pipeline": str(args.pipeline) if args.pipeline else None,
        "model": None if args.pipeline else args.model,
        "base_quantization": args.base_quantization,
        "data": str(args.data),
        "distinct_texts": len(texts),
        "n_docs": args.n_docs,
        "batch_size": args.batch_size,
        "torch_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "cpu_flags": cpu_flags(),
        "rss_mib_before_load": round(before_load, 1),
        "rss_mib_first": first,
        "rss_mib_last": last,
        "rss_mib_peak": max(r["rss_mib"] for r in records),
        "growth": round(last / first - 1, 4),
        "records": records,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{args.n_docs} docs: RSS {first} MiB after {records[0]['docs']}, {last} MiB at the end "
          f"(growth {result['growth']:+.2%}); {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
