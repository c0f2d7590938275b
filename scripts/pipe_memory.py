"""Stream documents through `nlp.pipe` and record resident memory every `--every` documents.

    python -m scripts.pipe_memory --pipeline training/conll03/all-seed0/model-best \
        --data corpus/conll03/test.spacy --n-docs 100000 --output metrics/bench/pipe-memory.json

The texts of `--data` (a .spacy file, or a text file with one document a line) are
cycled until `--n-docs` documents have gone through one `nlp.pipe` call, as a
long-running service would send them. Without `--pipeline`, a fresh (untrained)
pipeline is built on `--model`, which is enough for memory. `--shrink` builds it on a
random decoder of the model's family with two layers of width 64 and the model's own
tokenizer and vocabulary: the same tokenizer, windows, pipeline and Doc code at a
small part of the compute, for streams too long to run through the full decoder. `--onednn-cache N` sets
LRU_CACHE_CAPACITY and ONEDNN_PRIMITIVE_CACHE_CAPACITY (the kernel caches of torch's
oneDNN path, which bfloat16 prediction on CPU takes; 1,024 entries each unless set)
before the first product runs. The JSON holds the
resident set size (VmRSS, MiB) after every `--every` documents, its peak, and the
growth from the first record to the last (`growth`: last / first - 1). It is not a
speed benchmark; the seconds are recorded for orientation only, with the CPU flags.
"""
import argparse
import itertools
import json
import os
import platform
import sys
import tempfile
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


def shrunk(name: str, folder: Path) -> str:
    """A random decoder of `name`'s family and vocabulary (2 layers of width 64) saved in
    `folder` with `name`'s tokenizer files; returns the folder."""
    import shutil

    import transformers

    from spacy_unmask.loading import load_config, resolve_source

    config = load_config(name, num_layers=2)
    config.update({"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
                   "num_key_value_heads": 1, "head_dim": 32})
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    source, _ = resolve_source(name)
    for pattern in ("tokenizer*", "special_tokens_map.json"):
        for file in Path(source).glob(pattern):
            shutil.copy(file, folder / file.name)
    return str(folder)


def decoder_dtype(nlp) -> str:
    """The dtype of the pipeline's decoder embedding (the dtype it predicts in)."""
    from spacy_unmask.layers.decoder_tok2vec import get_backbone

    return str(get_backbone(nlp).model.get_input_embeddings().weight.dtype).replace("torch.", "")


def build(args):
    import spacy

    if args.pipeline:
        from spacy_unmask import load

        return load(args.pipeline, **({"base_quantization": args.base_quantization} if args.base_quantization else {}))
    nlp = spacy.blank("en")
    tok2vec = {"name": args.model, "num_layers": args.num_layers, "dtype": args.dtype}
    if args.base_quantization:
        tok2vec["base_quantization"] = args.base_quantization
    ner = nlp.add_pipe("unmask_ner", name="ner", config={"model": {"tok2vec": tok2vec}})
    ner.add_label("ENT")
    nlp.initialize()
    return nlp


def summarise(paths: List[Path]) -> List[str]:
    """The results page's lines for pipe-memory files: a row per file."""
    from scripts.results import command_text, fmt, machine_text, read_json, rel

    rows, commands = [], []
    for path in paths:
        data = read_json(path)
        if not isinstance(data, dict) or "records" not in data:
            continue
        at = {r["docs"]: r["rss_mib"] for r in data["records"]}
        caches = ", ".join(f"{k}={v}" for k, v in (data.get("environment") or {}).items() if v) or "unset (1,024)"
        rows.append(f"| `{rel(path)}` | {data.get('model') or data.get('pipeline')} | {data.get('dtype') or '–'} | "
                    f"{caches} | {data['n_docs']:,} | {fmt(data['rss_mib_first'], 1)} | {fmt(at.get(10_000), 1)} | "
                    f"{fmt(data['rss_mib_last'], 1)} | {fmt(100 * data['growth'], 2, sign=True)} | {machine_text(data)} |")
        commands.append(f"- `{command_text(data['command'])}`")
    if not rows:
        return []
    return (["Resident memory (MiB) of one `nlp.pipe` call streaming the texts of a corpus (CoNLL-2003 test sentences), cycled, in batches of 64 "
             "(`scripts/pipe_memory.py`): after the first 1,000 documents, after 10,000, at the end, and the growth "
             "from first to last. Not a speed benchmark.", "",
             "| file | decoder | dtype | kernel caches | documents | RSS at 1,000 | at 10,000 | at the end | growth, % | "
             "machine |", "|---|---|---|---|---:|---:|---:|---:|---:|---|"] + rows + ["", "Commands:", ""]
            + commands + [""])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipeline", type=Path, help="a saved pipeline (else a fresh one on --model)")
    parser.add_argument("--model", default="gemma3-270m", help="backbone for a fresh pipeline")
    parser.add_argument("--num-layers", type=int, default=0, help="num_layers of a fresh pipeline")
    parser.add_argument("--dtype", default="auto", help="dtype of a fresh pipeline (auto, float32, bfloat16)")
    parser.add_argument("--shrink", action="store_true",
                        help="a random 2-layer, 64-wide decoder with --model's tokenizer and vocabulary")
    parser.add_argument("--base-quantization", choices=("none", "nf4", "int8"), help="set base_quantization")
    parser.add_argument("--data", type=Path, required=True, help=".spacy file or text file (one document a line)")
    parser.add_argument("--n-docs", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=1000, help="record memory every N documents")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--onednn-cache", type=int,
                        help="entries of torch's oneDNN kernel caches (LRU_CACHE_CAPACITY, ONEDNN_PRIMITIVE_CACHE_CAPACITY)")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    from spacy_unmask.cpu import KERNEL_CACHE_VARIABLES, cpu_flags

    if args.onednn_cache is not None:
        for variable in KERNEL_CACHE_VARIABLES:
            os.environ[variable] = str(args.onednn_cache)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    texts = read_texts(args.data)
    name = args.model
    with tempfile.TemporaryDirectory() as folder:
        if args.shrink:
            args.model = shrunk(args.model, Path(folder))
        before_load = rss_mib()
        nlp = build(args)
    model = "random 2-layer, 64-wide decoder with the tokenizer of " + name if args.shrink else name
    records, start = [], time.perf_counter()
    stream = itertools.islice(itertools.cycle(texts), args.n_docs)
    for done, _ in enumerate(nlp.pipe(stream, batch_size=args.batch_size), 1):
        if done % args.every == 0 or done == args.n_docs:
            records.append({"docs": done, "rss_mib": round(rss_mib(), 1), "seconds": round(time.perf_counter() - start, 1)})
    first, last = records[0]["rss_mib"], records[-1]["rss_mib"]
    result = {
        "command": "python -m scripts.pipe_memory " + " ".join(argv if argv is not None else sys.argv[1:]),
        "pipeline": str(args.pipeline) if args.pipeline else None,
        "model": None if args.pipeline else model,
        "base_quantization": args.base_quantization,
        "data": str(args.data),
        "distinct_texts": len(texts),
        "n_docs": args.n_docs,
        "batch_size": args.batch_size,
        "torch_threads": torch.get_num_threads(),
        "dtype": decoder_dtype(nlp),
        "environment": {variable: os.environ.get(variable) for variable in KERNEL_CACHE_VARIABLES},
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
