"""What a saved pipeline costs: its size on disk, and `spacy.load`'s time and peak memory.

    python -m scripts.load_cost --model gemma3-270m --num-layers -6 --dtype bfloat16 \
        --output metrics/bench/load-gemma3-bf16.json

A fresh (untrained) pipeline on `--model` is saved under `--workdir` (untrained weights
are as large as trained ones), then loaded `--loads` times, each in a fresh process: the
wall time of `spacy.load` and the process's peak resident memory (VmHWM) are recorded,
with its resident memory after the imports, before loading. Before the first load the
pipeline's files are dropped from the page cache (posix_fadvise), so it reads them from
disk (cold); the later ones find them in the page cache (warm). `--wheel` also builds
the pipeline's `spacy package` wheel and records its size. `--pipeline PATH` measures a
saved pipeline instead (a trained one, or a copy made by `trim-vocabulary`), leaving it
as it is. `--without bitsandbytes` loads as an install without the `qlora` extra would:
peft imports bitsandbytes whenever it is installed, and bitsandbytes sets up torch.compile
as it is imported.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

LOAD = """
import json, sys, time
sys.modules.update(dict.fromkeys({without!r}))  # packages the process acts as if it lacked (importing them fails)
from pathlib import Path
def status(key):  # VmRSS / VmHWM of this process (VmHWM: its peak; ru_maxrss would carry the parent's over exec)
    return int(next(l for l in Path('/proc/self/status').read_text().splitlines() if l.startswith(key)).split()[1]) / 1024
import spacy, spacy_unmask, torch
imported = status('VmRSS:')
start = time.perf_counter()
spacy.load({path!r})
seconds = time.perf_counter() - start
print(json.dumps({{"load_s": round(seconds, 2), "peak_rss_mib": round(status('VmHWM:')), "rss_mib_after_imports": round(imported),
                  "rss_mib_after_load": round(status('VmRSS:'))}}))
"""


def save_pipeline(args, path: Path) -> None:
    import spacy

    nlp = spacy.blank("en")
    tok2vec = {"name": args.model, "num_layers": args.num_layers, "dtype": args.dtype,
               "base_quantization": args.base_quantization, "save_embedding": args.save_embedding}
    nlp.add_pipe("unmask_ner", name="ner", config={"model": {"tok2vec": tok2vec}}).add_label("ENT")
    nlp.initialize()
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    nlp.to_disk(path)


def describe_pipeline(args, path: Path) -> None:
    """The settings of a saved pipeline's decoder, in `args` (for the record)."""
    from spacy_unmask import get_backbone, load

    backbone = get_backbone(load(path))
    settings = backbone.settings
    args.model, args.num_layers, args.dtype = settings.name, settings.num_layers, settings.dtype
    args.base_quantization, args.save_embedding = settings.base_quantization, settings.save_embedding
    args.embedding_rows = backbone.model.get_input_embeddings().num_embeddings


def drop_from_page_cache(path: Path) -> None:
    """Evict the files under `path` from the page cache (clean pages: nothing is lost)."""
    for file in path.rglob("*"):
        if file.is_file():
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def wheel_mib(path: Path, workdir: Path) -> float:
    """The size of the pipeline's `spacy package` wheel."""
    out = workdir / "package"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "spacy", "package", str(path), str(out), "--build", "wheel",
                    "--name", "load_cost", "--version", "0.0.0", "--force"], check=True, capture_output=True)
    (wheel,) = out.rglob("*.whl")
    return round(wheel.stat().st_size / 2**20, 1)


def summarise(paths: List[Path]) -> List[str]:
    """The results page's lines for load-cost files: a row per file."""
    from scripts.results import fmt, machine_text, read_json, rel

    rows, notes = [], []
    for path in paths:
        data = read_json(path)
        if isinstance(data, dict) and "embedding_int8" in data:
            notes += embedding_lines(path, data)
        if not isinstance(data, dict) or "pipeline_mib" not in data:
            continue
        loads = data.get("loads") or []
        cold = [x["load_s"] for x in loads if x.get("cache") == "cold"]
        warm = [x["load_s"] for x in loads if x.get("cache") != "cold"]
        machine = data["machine"] if isinstance(data.get("machine"), dict) else data
        rows.append(f"| `{rel(path)}` | {data.get('dtype')}, base {data.get('base_quantization')}, embedding "
                    f"{data.get('save_embedding') or 'not recorded'}"
                    f"{', embedding rows ' + format(data['embedding_rows'], ',') if data.get('embedding_rows') else ''}"
                    f"{''.join(', without ' + name for name in data.get('without') or ())} | "
                    f"{fmt(data['pipeline_mib'], 1)} | {fmt(data.get('wheel_mib'), 1)} | "
                    f"{', '.join(fmt(x, 1) for x in cold) or '–'} | {', '.join(fmt(x, 1) for x in warm) or '–'} | "
                    f"{fmt(max((x['peak_rss_mib'] for x in loads), default=None), 0)} | {machine_text(machine)} |")
    if not rows:
        return notes
    return notes + ["`python -m scripts.load_cost --model MODEL --num-layers N --dtype DTYPE --loads N [--wheel] --output FILE`: "
            "a fresh pipeline's size on disk (MiB), its `spacy package` wheel, `spacy.load` in a fresh process "
            "(seconds; cold: its files dropped from the page cache first, or not recorded in files without a `cache` "
            "field) and the peak resident memory of loading (MiB). The CPU is shared: times compare only within a file "
            "and between files measured one after the other.", "",
            "| file | weights | pipeline MiB | wheel MiB | load s, cold | load s, warm | peak MiB | machine |",
            "|---|---|---:|---:|---:|---:|---:|---|"] + rows + [""]


def embedding_lines(path: Path, data: dict) -> List[str]:
    """A research.embedding_int8 file: how far the 8-bit embedding moves the vectors."""
    from scripts.results import command_text, fmt, machine_text, rel

    def moved(found: dict) -> str:
        return (f"relative error {fmt(100 * found['relative_error'], 1)}%, cosine min {fmt(found['cosine_min'], 4)}, "
                f"mean {fmt(found['cosine_mean'], 4)}")

    lines = [f"`{rel(path)}` (`{command_text(data['command'])}`; {data['docs']} sentences, {data['tokens']} tokens; "
             f"{machine_text(data.get('machine'))}):", ""]
    for scale, found in data["embedding_int8"].items():
        lines.append(f"- 8-bit embedding, {scale.replace('_', ' ')}: rows used {fmt(100 * found['rows'], 2)}% off; "
                     f"vectors {moved(found['vectors'])}")
    lines.append(f"- for comparison, a bfloat16 decoder against float32: vectors {moved(data['bfloat16_against_float32'])}")
    return lines + [""]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipeline", type=Path, default=None, help="measure this saved pipeline instead of a fresh one")
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--num-layers", type=int, default=0)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--base-quantization", default="none", choices=("none", "nf4", "int8"))
    parser.add_argument("--save-embedding", default="exact", choices=("exact", "int8"),
                        help="how the pipeline stores the frozen embedding (save_embedding)")
    parser.add_argument("--without", action="append", default=[], metavar="PACKAGE",
                        help="load as if PACKAGE were not installed (e.g. bitsandbytes: without the qlora extra)")
    parser.add_argument("--loads", type=int, default=3, help="loads, each in a fresh process")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/spacy-unmask-load-cost"))
    parser.add_argument("--wheel", action="store_true", help="also build the spacy package wheel")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)

    from spacy_unmask.cpu import machine

    if args.pipeline is None:
        path = args.workdir / "pipeline"
        save_pipeline(args, path)
    else:
        path = args.pipeline
        describe_pipeline(args, path)
    files = {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}
    loads = []
    for number in range(args.loads):
        if number == 0:
            drop_from_page_cache(path)
        done = subprocess.run([sys.executable, "-c", LOAD.format(path=str(path), without=args.without)], capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        if done.returncode:
            raise SystemExit(done.stderr[-2000:])
        loads.append({"cache": "warm" if number else "cold", **json.loads(done.stdout.strip().splitlines()[-1])})
    result = {
        "pipeline": str(args.pipeline) if args.pipeline else None,
        "embedding_rows": getattr(args, "embedding_rows", None),
        "command": "python -m scripts.load_cost " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": args.model,
        "num_layers": args.num_layers,
        "dtype": args.dtype,
        "base_quantization": args.base_quantization,
        "save_embedding": args.save_embedding,
        "without": args.without,
        "pipeline_mib": round(sum(files.values()) / 2**20, 1),
        "backbone_file_mib": round(sum(v for k, v in files.items() if k == "ner/model" or k.startswith("ner/backbone"))
                                   / 2**20, 1),
        "files_mib": {k: round(v / 2**20, 1) for k, v in files.items() if v >= 2**20},
        "wheel_mib": wheel_mib(path, args.workdir) if args.wheel else None,
        "loads": loads,
        "machine": machine(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
