"""Summarize `spacy evaluate` metrics into a Markdown table per corpus.

    python scripts/report.py metrics            # every metrics/<corpus>/ folder
    python scripts/report.py metrics/wnut17     # one corpus

A run is a `metrics/<corpus>/<run>.json` written by `spacy evaluate --output`
(keys ents_f, ents_p, ents_r, ents_per_type, speed). Optional sidecars next to it:
`<run>.train.json` (scripts/timed.py: wall_s, peak_rss_mib of the training) and
`<run>.seqeval.json` (scripts/seqeval_check.py: seqeval strict IOB2 F1). Writes
`metrics/<corpus>/SUMMARY.md` and prints it.
"""
import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional

SIDECARS = (".train.json", ".seqeval.json")
# Runs in this order first (also within each prefix group), baselines last.
FIRST = ("none", "middle", "all")
LAST = ("cnn", "minilm")


def is_run_file(path: Path) -> bool:
    return path.suffix == ".json" and not any(path.name.endswith(s) for s in SIDECARS)


def read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text(encoding="utf8"))
    except (OSError, ValueError):
        return None


def load_runs(folder: Path) -> Dict[str, dict]:
    """run name -> {"metrics": ..., "train": ... or None, "seqeval": ... or None}."""
    runs = {}
    for path in sorted(folder.glob("*.json")):
        if not is_run_file(path):
            continue
        metrics = read_json(path)
        if not isinstance(metrics, dict) or "ents_f" not in metrics:
            continue
        name = path.name[: -len(".json")]
        runs[name] = {
            "metrics": metrics,
            "train": read_json(folder / f"{name}.train.json"),
            "seqeval": read_json(folder / f"{name}.seqeval.json"),
        }
    return runs


def order(names) -> List[str]:
    """Default runs first (none, middle, all), then each run_prefix group in the same
    order (gemma3-none, gemma3-middle, gemma3-all), other runs by name, baselines last."""

    def key(name):
        if name in LAST:
            return (2, "", LAST.index(name), name)
        prefix, _, base = name.rpartition("-")
        if base in FIRST:
            return (0 if not prefix else 1, prefix, FIRST.index(base), name)
        return (1, name, len(FIRST), name)

    return sorted(names, key=key)


def pct(value) -> str:
    return "–" if value is None else f"{100 * float(value):.2f}"


def duration(seconds) -> str:
    if seconds is None:
        return "–"
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def memory(mib) -> str:
    if mib is None:
        return "–"
    mib = float(mib)
    return f"{mib / 1024:.2f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"


def speed(value) -> str:
    return "–" if value is None else f"{float(value):,.0f}"


def summarize(folder: Path) -> str:
    runs = load_runs(folder)
    corpus = folder.name
    lines = [
        f"# {corpus}: NER results",
        "",
        "Span-level scores from `spacy evaluate` (exact match of label and boundaries, in %).",
        "seqeval F1: strict IOB2 span F1 recomputed by scripts/seqeval_check.py, where run.",
        "Training time and peak memory (CPU RSS of the training process) come from scripts/timed.py.",
        "",
        "| run | F1 | P | R | seqeval F1 | words/s | training time | peak memory |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    labels = set()
    for name in order(runs):
        run = runs[name]
        m, train, seq = run["metrics"], run["train"] or {}, run["seqeval"] or {}
        labels.update((m.get("ents_per_type") or {}).keys())
        lines.append(
            f"| {name} | {pct(m.get('ents_f'))} | {pct(m.get('ents_p'))} | {pct(m.get('ents_r'))} "
            f"| {pct(seq.get('seqeval_f1'))} | {speed(m.get('speed'))} "
            f"| {duration(train.get('wall_s'))} | {memory(train.get('peak_rss_mib'))} |"
        )
    if not runs:
        lines.append("| (no runs yet) | | | | | | | |")
    if labels:
        labels = sorted(labels)
        lines += ["", "F1 per entity type:", "", "| run | " + " | ".join(labels) + " |",
                  "|---|" + "---:|" * len(labels)]
        for name in order(runs):
            per_type = runs[name]["metrics"].get("ents_per_type") or {}
            cells = [pct((per_type.get(label) or {}).get("f")) for label in labels]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    extras = [f"[{p.name}]({p.name})" for p in (folder / "sweep.md", folder / "sweep.png") if p.exists()]
    if extras:
        lines += ["", "Unmask sweep: " + ", ".join(extras) + "."]
    return "\n".join(lines) + "\n"


def corpus_folders(path: Path) -> List[Path]:
    """`path` itself if it holds runs, else its subfolders that do (other JSON, such as
    the bench figures in metrics/bench, is not a run)."""
    if load_runs(path):
        return [path]
    return [p for p in sorted(path.iterdir()) if p.is_dir() and load_runs(p)]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path, default=[Path("metrics")],
                        help="metrics/<corpus> folders, or a folder holding them (default: metrics)")
    parser.add_argument("--no-write", action="store_true", help="print only, do not write SUMMARY.md")
    args = parser.parse_args(argv)
    found = 0
    for path in args.paths:
        if not path.is_dir():
            print(f"report: no folder {path}", file=sys.stderr)
            continue
        for folder in corpus_folders(path):
            text = summarize(folder)
            found += 1
            if not args.no_write:
                (folder / "SUMMARY.md").write_text(text, encoding="utf8")
            print(text)
    if not found:
        print("report: no metrics found (run a training workflow first)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
