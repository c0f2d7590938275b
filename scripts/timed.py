"""Run a command; record its wall time and peak memory in a JSON sidecar.

    python -m scripts.timed --output metrics/wnut17/all.train.json -- \
        python -m spacy train configs/ner.cfg --output training/wnut17/all ...

The sidecar holds the command, wall seconds, exit status, the machine
(`spacy_unmask.cpu.machine`: CPU model, cores, flags, the kernels' caps, and whether
dtype "auto" trains in bfloat16 there) and the peak resident set size of the children (`resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`: the largest
peak of any one waited-for descendant, in MiB; GPU memory is not included). A
leading `python`/`python3` is replaced by this interpreter, as `spacy project run`
does for its own commands. The exit status of the command is passed on; the sidecar
is written only when the command succeeds, unless --always is given.
"""
import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone

from spacy_unmask.cpu import machine
from pathlib import Path
from typing import List, Optional


def peak_rss_mib() -> float:
    """Peak RSS of the waited-for children so far, in MiB."""
    maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return maxrss / (1024 * 1024) if sys.platform == "darwin" else maxrss / 1024


def run_timed(command: List[str]) -> dict:
    if command and command[0] in ("python", "python3"):
        command = [sys.executable, *command[1:]]
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    returncode = subprocess.call(command)
    wall = time.perf_counter() - t0
    return {
        "command": command,
        "started": started,
        "wall_s": round(wall, 3),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "returncode": returncode,
        "host": platform.node(),
        "machine": machine(),
    }


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(
        usage="timed.py --output SIDECAR.json [--always] -- COMMAND ...",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--output", type=Path, required=True, help="the JSON sidecar to write")
    parser.add_argument("--always", action="store_true", help="write the sidecar even if the command fails")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        parser.error("no command after --")
    info = run_timed(command)
    if info["returncode"] == 0 or args.always:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(info, indent=2) + "\n", encoding="utf8")
    print(
        f"timed: {info['wall_s']:.1f} s wall, peak RSS {info['peak_rss_mib']:.0f} MiB, "
        f"exit {info['returncode']}" + (f" -> {args.output}" if info["returncode"] == 0 or args.always else ""),
        file=sys.stderr,
    )
    return info["returncode"]


if __name__ == "__main__":
    sys.exit(main())
