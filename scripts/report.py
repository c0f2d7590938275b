"""Summarize `spacy evaluate` metrics into a Markdown table per corpus.

    python -m scripts.report metrics            # every metrics/<corpus>/ folder
    python -m scripts.report metrics/wnut17     # one corpus
    python -m scripts.report metrics/conll03/recipe --split dev   # runs scored on dev

A run is a `metrics/<corpus>/<run>.json` written by `spacy evaluate --output`
(keys ents_f, ents_p, ents_r, ents_per_type, speed). Optional sidecars next to it:
`<run>.train.json` (scripts/timed.py: wall_s, peak_rss_mib of the training) and
`<run>.seqeval.json` (scripts/seqeval_check.py: seqeval strict IOB2 F1) and
`<run>.doc.json` (`spacy evaluate` of the same pipeline on whole documents:
test.doc.spacy) and `<run>.log.jsonl` (the dev curve spaCy's logger wrote during
training). Runs named `<name>-seed<N>` are also gathered per name:
`metrics/<corpus>/summary.json` maps each name to {"mean_f", "std_f", "seeds",
"f", "doc_mean_f", "doc_std_f", "train_minutes", "dev_best_f"} (F1 in percent; std
is the sample standard deviation, null for one seed, which has no spread; dev_best_f: the
best dev F1 of each seed's curve, averaged). SUMMARY.md ends with the comparisons the
results rest on, judged from these means: each unmasked run (`<prefix>all`) against its causal twin (`<prefix>none`;
the gap must exceed three standard deviations) and against the baselines (cnn, minilm),
on sentences and on whole documents. Writes `metrics/<corpus>/SUMMARY.md`, summary.json and, where
runs have dev curves, curves.png (dev F1 against step, one line per seed), and prints
the table.
"""
import argparse
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

SIDECARS = (".train.json", ".seqeval.json", ".doc.json", ".calibration.json")
SEED = re.compile(r"^(?P<name>.+)-seed(?P<seed>\d+)$")
# Runs in this order first (also within each prefix group), baselines last.
FIRST = ("none", "middle", "all")
LAST = ("cnn", "minilm")


def main_prefix(metrics: dict) -> Optional[str]:
    """The prefix of a run's headline span scores: "ents" (NER), else its span group's
    ("spans_chunks"), else None (a tagger: `tag_acc`)."""
    if "ents_f" in metrics:
        return "ents"
    spans = sorted(k[: -len("_f")] for k in metrics if k.startswith("spans_") and k.endswith("_f"))
    return spans[0] if spans else None


def main_score(metrics: dict, part: str = "f") -> Optional[float]:
    """A run's headline score, as a fraction: part "f", "p" or "r" of NER, else of its span
    group (chunks); a tagger's accuracy (`tag_acc`) as its "f"; None where there is none."""
    prefix = main_prefix(metrics)
    if prefix:
        return metrics.get(f"{prefix}_{part}")
    return metrics.get("tag_acc") if part == "f" else None


def per_type(metrics: dict) -> dict:
    """Per-label P/R/F of the headline span task (entities, else the span group)."""
    prefix = main_prefix(metrics)
    return (metrics.get(f"{prefix}_per_type") or {}) if prefix else {}


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
        if not isinstance(metrics, dict) or main_score(metrics) is None and "ents_f" not in metrics:
            continue
        name = path.name[: -len(".json")]
        train = read_json(folder / f"{name}.train.json")
        runs[name] = {
            "metrics": metrics,
            "train": train,
            "seqeval": read_json(folder / f"{name}.seqeval.json"),
            "doc": read_json(folder / f"{name}.doc.json"),
            # a curve read on a cut dev set (the sweeps' one document) says nothing of dev
            "curve": [] if cut_dev(train) else read_curve(folder / f"{name}.log.jsonl"),
        }
    return runs


def cut_dev(train: Optional[dict]) -> bool:
    """Whether the training (its recorded command) evaluated on part of the dev corpus."""
    command = (train or {}).get("command") or []
    return any(str(part).startswith("--corpora.dev.limit") for part in command)


def read_curve(path: Path) -> List[tuple]:
    """(step, dev F1 in %) of each evaluation in a spaCy ConsoleLogger.v3 JSONL file."""
    curve = []
    try:
        lines = path.read_text(encoding="utf8").splitlines()
    except OSError:
        return curve
    for line in lines:
        try:
            row = json.loads(line)
            curve.append((int(row["step"]), float(main_score(row["scores"]))))
        except (ValueError, KeyError, TypeError):
            continue
    return curve


@dataclass
class SeedGroup:
    """The runs `<name>-seed<N>` of one folder, by seed (a run named without a seed: seed -1)."""
    name: str
    runs: Dict[int, dict]

    def scores(self, key: str = "f") -> Dict[int, float]:
        """seed -> score in %: the headline test (or dev) score ("f"), the whole-document one
        ("doc"), or the best dev score of the training curve ("dev_best"). A best dev score
        only where every seed has a curve (a run whose training read a cut dev set has none:
        cut_dev), never a mean of some."""
        out = {}
        for seed, run in self.runs.items():
            if key == "f":
                value = main_score(run["metrics"])
            elif key == "doc":
                value = main_score(run["doc"]) if run["doc"] else None
            elif key == "dev_best":
                value = max(f for _, f in run["curve"]) / 100 if run["curve"] else None
            else:
                raise ValueError(key)
            if value is not None:
                out[seed] = 100 * float(value)
        return {} if key == "dev_best" and len(out) != len(self.runs) else out

    def minutes(self) -> Optional[float]:
        values = [run["train"]["wall_s"] / 60 for run in self.runs.values() if run["train"]]
        return statistics.mean(values) if values else None

    def peak_gib(self) -> Optional[float]:
        values = [run["train"]["peak_rss_mib"] / 1024 for run in self.runs.values()
                  if run["train"] and run["train"].get("peak_rss_mib")]
        return statistics.mean(values) if values else None

    def first_train(self) -> Optional[dict]:
        return next((run["train"] for _, run in sorted(self.runs.items()) if run["train"]), None)


def seed_groups(runs: Dict[str, dict]) -> Dict[str, SeedGroup]:
    """Runs gathered over seeds; a run named without a seed is a group of its own (named
    `<name> (no seed)` where seeded runs of the same name exist)."""
    seeded = {m["name"] for m in map(SEED.match, runs) if m}
    groups: Dict[str, SeedGroup] = {}
    for name, run in runs.items():
        match = SEED.match(name)
        if match:
            key, seed = match["name"], int(match["seed"])
        else:
            key, seed = (f"{name} (no seed)" if name in seeded else name), -1
        groups.setdefault(key, SeedGroup(key, {})).runs[seed] = run
    return groups


def seed_summary(runs: Dict[str, dict]) -> Dict[str, dict]:
    """Runs `<name>-seed<N>` gathered per name: mean and spread of test F1 over seeds."""
    groups = {name: group for name, group in seed_groups(runs).items() if -1 not in group.runs}
    summary = {}
    for name in order(groups):
        group = groups[name]
        seeds = sorted(group.runs)
        f, doc, best_dev = (list(group.scores(key).values()) for key in ("f", "doc", "dev_best"))
        minutes = group.minutes()
        summary[name] = {
            "mean_f": round(statistics.mean(f), 2),
            "std_f": spread(f),
            "seeds": seeds,
            "f": [round(x, 2) for x in f],
            "doc_mean_f": round(statistics.mean(doc), 2) if len(doc) == len(f) else None,
            "doc_std_f": spread(doc) if len(doc) == len(f) else None,
            "train_minutes": round(minutes, 1) if minutes is not None else None,
            "dev_best_f": round(statistics.mean(best_dev), 2) if best_dev else None,
        }
    return summary


def spread(values: List[float]) -> Optional[float]:
    """The sample standard deviation, rounded; None for fewer than two values (no spread)."""
    return round(statistics.stdev(values), 2) if len(values) > 1 else None


def comparisons(runs: Dict[str, dict], seeds: Dict[str, dict]) -> List[str]:
    """Markdown rows for the comparisons, one set per unmasked run name (`<prefix>all`):
    against its causal twin (`<prefix>none`), on sentences and on whole documents, the gap
    in mean F1 must exceed three standard deviations (the larger of the two runs' spreads
    over seeds; judged only with two or more seeds of each); against each baseline (cnn,
    minilm, with or without seeds) the unmasked mean must be higher."""

    def score(name, reading):
        """(mean F1, spread or None, number of seeds) of a run name on "sentences" or "documents"."""
        mean_key, std_key = ("mean_f", "std_f") if reading == "sentences" else ("doc_mean_f", "doc_std_f")
        if name in seeds:
            row = seeds[name]
            return None if row[mean_key] is None else (row[mean_key], row[std_key], len(row["seeds"]))
        run = runs.get(name)
        metrics = run and (run["metrics"] if reading == "sentences" else run["doc"])
        return (round(100 * float(main_score(metrics) or 0.0), 2), None, 1) if metrics else None

    rows = []
    for name in seeds:
        if name != "all" and not name.endswith("-all"):
            continue
        causal_name = name[: -len("all")] + "none"
        for reading in ("sentences", "documents"):
            unmasked = score(name, reading)
            if unmasked is None:
                continue
            f, std, n = unmasked
            causal = score(causal_name, reading)
            if causal is None:
                rows.append(f"| {name} − {causal_name} > 3 sd, {reading} | {f:.2f} vs – | | | no causal run |")
            else:
                # The larger spread of the two; one seed has none (null in summary.json).
                known = [s for s, k in ((std, n), (causal[1], causal[2])) if k > 1 and s is not None]
                gap, widest = f - causal[0], max(known, default=None)
                verdict = (f"not judged ({n} / {causal[2]} seeds)" if min(n, causal[2]) < 2
                           else "met" if gap > 3 * widest else "missed")
                threshold = "–" if widest is None else f"{3 * widest:.2f}"
                rows.append(f"| {name} − {causal_name} > 3 sd, {reading} | {f:.2f} vs {causal[0]:.2f} "
                            f"| {gap:+.2f} | {threshold} | {verdict} |")
            for baseline in LAST:  # seed runs cnn-seed<N> are gathered as "cnn"
                other = score(baseline, reading)
                if other is not None:
                    rows.append(f"| {name} > {baseline}, {reading} | {f:.2f} vs {other[0]:.2f} | {f - other[0]:+.2f} "
                                f"| 0.00 | {'met' if f > other[0] else 'missed'} |")
    return rows


def order(names) -> List[str]:
    """Default runs first (none, middle, all), then each run_prefix group in the same
    order (gemma3-none, gemma3-middle, gemma3-all), other runs by name, baselines last;
    the seeds of a run together, in seed order."""

    def key(name):
        match = SEED.match(name)
        base_name, seed = (match["name"], int(match["seed"])) if match else (name, -1)
        if base_name in LAST:
            return (2, "", LAST.index(base_name), base_name, seed)
        prefix, _, base = base_name.rpartition("-")
        if base in FIRST:
            return (0 if not prefix else 1, prefix, FIRST.index(base), base_name, seed)
        return (1, base_name, len(FIRST), base_name, seed)

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


SPAN_MATCH = "exact match of label and boundaries, in %"


def task_words(runs: Dict[str, dict]) -> Tuple[str, str, str, str]:
    """What a folder's runs label, in the summary's words: the task, its headline score and
    how it is counted, and what the per-label scores are of; from the runs' score keys."""
    prefixes = {main_prefix(run["metrics"]) for run in runs.values()}
    if prefixes == {None}:
        return "part-of-speech results", "Token accuracy of the tags", "in the F1 column, in %", "tag"
    spans = sorted(prefix[len("spans_"):] for prefix in prefixes if prefix and prefix.startswith("spans_"))
    if spans and "ents" not in prefixes:
        return ("results of " + ", ".join(f'doc.spans["{key}"]' for key in spans),
                "Span-level scores", SPAN_MATCH, "label")
    return "NER results", "Span-level scores", SPAN_MATCH, "entity type"


def summarize(folder: Path, runs: Optional[Dict[str, dict]] = None, split: str = "test") -> str:
    """The Markdown summary of a corpus folder's runs (`runs`: load_runs(folder), read here
    if not given), scored on `split`."""
    runs = load_runs(folder) if runs is None else runs
    corpus = folder.name
    task, headline, counted, label = task_words(runs)
    lines = [
        f"# {corpus}: {task}",
        "",
        f"{headline} on {split} from `spacy evaluate` ({counted}).",
    ]
    if any(run["seqeval"] for run in runs.values()):
        lines.append("seqeval F1: strict IOB2 span F1 recomputed by scripts/seqeval_check.py, where run.")
    lines += [
        "Training time and peak memory (CPU RSS of the training process) come from scripts/timed.py.",
        "",
        f"Documents F1: the same pipeline on whole documents ({split}.doc.spacy: the corpus's documents,",
        "such as CoNLL-2003 articles; 10-sentence groups where the files mark none).",
        "",
        "| run | F1 | P | R | documents F1 | seqeval F1 | words/s | training time | peak memory |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    labels = set()
    for name in order(runs):
        run = runs[name]
        m, train, seq, doc = run["metrics"], run["train"] or {}, run["seqeval"] or {}, run["doc"] or {}
        labels.update(per_type(m).keys())
        lines.append(
            f"| {name} | {pct(main_score(m))} | {pct(main_score(m, 'p'))} | {pct(main_score(m, 'r'))} "
            f"| {pct(main_score(doc))} | {pct(seq.get('seqeval_f1'))} | {speed(m.get('speed'))} "
            f"| {duration(train.get('wall_s'))} | {memory(train.get('peak_rss_mib'))} |"
        )
    if not runs:
        lines.append("| (no runs yet) | | | | | | | | |")
    if labels:
        labels = sorted(labels)
        lines += ["", f"F1 per {label}:", "", "| run | " + " | ".join(labels) + " |",
                  "|---|" + "---:|" * len(labels)]
        for name in order(runs):
            found = per_type(runs[name]["metrics"])
            cells = [pct((found.get(label) or {}).get("f")) for label in labels]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    seeds = seed_summary(runs)
    if seeds:
        lines += ["", f"Over seeds ({split} F1 in %, mean ± sample standard deviation; best dev F1 of each",
                  "seed's curve, averaged):", "",
                  "| run | seeds | F1 | documents F1 | best dev F1 | training time per run |",
                  "|---|---:|---:|---:|---:|---:|"]
        for name, row in seeds.items():
            def cell(mean, std):
                return f"{mean:.2f}" if std is None else f"{mean:.2f} ± {std:.2f}"  # one seed: no spread

            doc = "–" if row["doc_mean_f"] is None else cell(row["doc_mean_f"], row["doc_std_f"])
            minutes = "–" if row["train_minutes"] is None else f"{row['train_minutes']:.0f} min"
            dev = "–" if row["dev_best_f"] is None else f"{row['dev_best_f']:.2f}"
            lines.append(f"| {name} | {len(row['seeds'])} | {cell(row['mean_f'], row['std_f'])} | {doc} | {dev} "
                         f"| {minutes} |")
    goals = comparisons(runs, seeds)
    if goals:
        lines += ["", f"Goals ({split} F1 means over seeds; a gap must exceed three standard deviations, the",
                  "larger of the two runs' spreads, judged with two or more seeds of each):", "",
                  "| goal | F1 | difference | threshold | verdict |", "|---|---:|---:|---:|---|"] + goals
    if any(run["curve"] and SEED.match(name) for name, run in runs.items()):
        lines += ["", "Dev curves of the seed runs: [curves.png](curves.png)."]
    extras = [f"[{p.name}]({p.name})" for p in (folder / "sweep.md", folder / "sweep.png") if p.exists()]
    if extras:
        lines += ["", "Unmask sweep: " + ", ".join(extras) + "."]
    return "\n".join(lines) + "\n"


def plot_curves(folder: Path, runs: Dict[str, dict]) -> Optional[Path]:
    """curves.png: dev F1 against training step for every seed run with a curve, one
    colour per run name (seeds of a name share it)."""
    named = {}
    for run_name in order(runs):
        match = SEED.match(run_name)
        if match and runs[run_name]["curve"]:
            named.setdefault(match["name"], []).append((int(match["seed"]), runs[run_name]["curve"]))
    if not named:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for colour, (name, seeds) in enumerate(named.items()):
        for i, (seed, curve) in enumerate(seeds):
            steps, scores = zip(*[(step, f) for step, f in curve if step > 0] or [(0, 0.0)])
            ax.plot(steps, scores, marker="o", markersize=3, color=f"C{colour % 10}", alpha=0.8,
                    label=f"{name} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})" if i == 0 else None)
    ax.set_xlabel("training step")
    ax.set_ylabel("dev F1 (%)")
    ax.set_title(f"{folder.name}: dev F1 during training")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path = folder / "curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def corpus_folders(path: Path) -> Dict[Path, Dict[str, dict]]:
    """`path` itself if it holds runs, else its subfolders that do (other JSON, such as
    the bench figures in metrics/bench, is not a run), each with its runs."""
    runs = load_runs(path)
    if runs:
        return {path: runs}
    found = {p: load_runs(p) for p in sorted(path.iterdir()) if p.is_dir()}
    return {p: runs for p, runs in found.items() if runs}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path, default=[Path("metrics")],
                        help="metrics/<corpus> folders, or a folder holding them (default: metrics)")
    parser.add_argument("--split", default="test", help="the split the runs were scored on, for the headings (default test)")
    parser.add_argument("--no-write", action="store_true", help="print only, do not write SUMMARY.md")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a SUMMARY.md or summary.json is not what the runs beside it "
                             "give (the split is the one summary.json records)")
    args = parser.parse_args(argv)
    found = 0
    stale = []
    for path in args.paths:
        if not path.is_dir():
            print(f"report: no folder {path}", file=sys.stderr)
            continue
        for folder, runs in corpus_folders(path).items():
            found += 1
            split = recorded_split(folder, args.split) if args.check else args.split
            text = summarize(folder, runs, split)
            seeds = seed_summary(runs)
            # the split the runs were scored on, beside the runs' rows
            outputs = {folder / "SUMMARY.md": text}
            if seeds:
                outputs[folder / "summary.json"] = json.dumps({"split": split, **seeds}, indent=2) + "\n"
            if args.check:
                stale += [path for path, content in outputs.items()
                          if not path.is_file() or path.read_text(encoding="utf8") != content]
                continue
            if not args.no_write:
                for out, content in outputs.items():
                    out.write_text(content, encoding="utf8")
                plot_curves(folder, runs)
            print(text)
    if not found:
        print("report: no metrics found (run a training workflow first)", file=sys.stderr)
    for path in stale:
        print(f"stale: {path} (run `python -m spacy project run report`)", file=sys.stderr)
    return 1 if stale else 0


def recorded_split(folder: Path, default: str) -> str:
    """The split a folder's summary.json says its runs were scored on (`default` where none)."""
    path = folder / "summary.json"
    if not path.is_file():
        return default
    return json.loads(path.read_text(encoding="utf8")).get("split", default)


if __name__ == "__main__":
    sys.exit(main())
