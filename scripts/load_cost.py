"""What a saved pipeline costs: its size on disk, and `spacy.load`'s time and peak memory.

    python -m scripts.load_cost --model gemma3-270m --num-layers -6 --dtype bfloat16 \
        --output metrics/bench/load-gemma3-bf16.json

A fresh (untrained) pipeline on `--model` is saved under `--workdir` (untrained weights
are as large as trained ones), then loaded `--loads` times, each in a fresh process: the
wall time of `spacy.load` and the process's peak resident memory (VmHWM) are recorded,
with its resident memory after the imports, before loading. The first load
may read the file from disk; the later ones find it in the page cache (warm).
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

LOAD = """
import json, time
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
               "base_quantization": args.base_quantization}
    nlp.add_pipe("unmask_ner", name="ner", config={"model": {"tok2vec": tok2vec}}).add_label("ENT")
    nlp.initialize()
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    nlp.to_disk(path)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--num-layers", type=int, default=0)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--base-quantization", default="none", choices=("none", "nf4", "int8"))
    parser.add_argument("--loads", type=int, default=3, help="loads, each in a fresh process")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/spacy-unmask-load-cost"))
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)

    from spacy_unmask.cpu import cpu_flags

    path = args.workdir / "pipeline"
    save_pipeline(args, path)
    files = {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}
    loads = []
    for _ in range(args.loads):
        done = subprocess.run([sys.executable, "-c", LOAD.format(path=str(path))], capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        if done.returncode:
            raise SystemExit(done.stderr[-2000:])
        loads.append(json.loads(done.stdout.strip().splitlines()[-1]))
    result = {
        "command": "python -m scripts.load_cost " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": args.model,
        "num_layers": args.num_layers,
        "dtype": args.dtype,
        "base_quantization": args.base_quantization,
        "pipeline_mib": round(sum(files.values()) / 2**20, 1),
        "backbone_file_mib": round(files.get("ner/model", 0) / 2**20, 1),
        "loads": loads,
        "machine": platform.machine(),
        "cpu_flags": cpu_flags(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
