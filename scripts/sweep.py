"""Sweep unmask configurations x seeds on one corpus, then plot F1 per configuration.

    # train + evaluate every spec for every seed (resumes: finished runs are skipped)
    python scripts/sweep.py run --corpus wnut17 --seeds 1,2,3 --max-steps 500

    # plot and tabulate whatever metrics/<corpus>/sweep/*.json exist
    python scripts/sweep.py plot --corpus wnut17

Specs: none, all, middle and groups:0000 ... groups:1111 (the layers split into 4
consecutive groups, 1 = that group attends both ways; groups:0000 is the same model as
none and groups:1111 the same as all, kept as a check of seed noise). Each run is
`spacy train` with --components.ner.model.tok2vec.unmask SPEC, --system.seed K and
--training.max_steps N on corpus/<corpus>/train.spacy (model selection on dev), then
`spacy evaluate` of model-best on the --eval-split set (default dev: the sweep is for
choosing a configuration; the test set is for the final runs) into
metrics/<corpus>/sweep/<spec>-seed<K>.json (':' in a spec becomes '-' in file names),
with the training time and peak memory in <spec>-seed<K>.train.json. The trained
pipeline is deleted after evaluation unless --keep-models.

The plot (metrics/<corpus>/sweep.png) shows every seed as a dot and the mean with
one standard deviation as a bar; the table (metrics/<corpus>/sweep.md) gives
mean, standard deviation, min, max and number of seeds per spec.
"""
import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

SPECS = ["none", "all", "middle"] + [f"groups:{i:04b}" for i in range(16)]
UNMASK_KEY = "components.ner.model.tok2vec.unmask"
MODEL_KEY = "components.ner.model.tok2vec.name"
HERE = Path(__file__).resolve().parent


def spec_slug(spec: str) -> str:
    return spec.replace(":", "-").replace(",", "_")


def run_name(spec: str, seed: int) -> str:
    return f"{spec_slug(spec)}-seed{seed}"


def parse_list(text: str) -> List[str]:
    return [item.strip() for item in text.split(",") if item.strip()] if text else []


def train_command(args, spec: str, seed: int, model_dir: Path) -> List[str]:
    corpus = Path(args.corpus_dir or f"corpus/{args.corpus}")
    command = [
        sys.executable, "-m", "spacy", "train", str(args.config),
        "--output", str(model_dir),
        "--paths.train", str(corpus / "train.spacy"),
        "--paths.dev", str(corpus / "dev.spacy"),
        f"--{args.unmask_key}", spec,
        "--system.seed", str(seed),
        "--gpu-id", str(args.gpu_id),
    ]
    if args.model:
        command += [f"--{MODEL_KEY}", args.model]
    if args.max_steps:
        command += ["--training.max_steps", str(args.max_steps)]
    return command + list(args.extra)


def evaluate_command(args, model_dir: Path, output: Path) -> List[str]:
    corpus = Path(args.corpus_dir or f"corpus/{args.corpus}")
    return [
        sys.executable, "-m", "spacy", "evaluate", str(model_dir / "model-best"),
        str(corpus / f"{args.eval_split}.spacy"), "--output", str(output), "--gpu-id", str(args.gpu_id),
    ]


def run(args) -> int:
    specs = parse_list(args.specs) or SPECS
    seeds = [int(s) for s in parse_list(args.seeds)]
    out_dir = Path(args.metrics_dir or f"metrics/{args.corpus}/sweep")
    train_root = Path(args.training_dir or f"training/{args.corpus}/sweep")
    out_dir.mkdir(parents=True, exist_ok=True)
    failures = []
    total = len(specs) * len(seeds)
    for i, (spec, seed) in enumerate(((sp, se) for se in seeds for sp in specs), start=1):
        name = run_name(spec, seed)
        metrics = out_dir / f"{name}.json"
        if metrics.exists() and not args.force:
            print(f"[{i}/{total}] {name}: done already, skipping", flush=True)
            continue
        model_dir = train_root / name
        train = train_command(args, spec, seed, model_dir)
        evaluate = evaluate_command(args, model_dir, metrics)
        print(f"[{i}/{total}] {name}: {' '.join(train[1:])}", flush=True)
        if args.dry_run:
            print(f"    then: {' '.join(evaluate[1:])}")
            continue
        t0 = time.perf_counter()
        # scripts/timed.py records wall time and the peak RSS of this training alone.
        timed = [sys.executable, str(HERE / "timed.py"), "--output", str(out_dir / f"{name}.train.json"), "--"]
        if subprocess.call(timed + train) != 0:
            failures.append(name)
            print(f"    {name}: training failed", file=sys.stderr)
            if args.stop_on_error:
                break
            continue
        if subprocess.call(evaluate) != 0:
            failures.append(name)
            print(f"    {name}: evaluation failed", file=sys.stderr)
            if args.stop_on_error:
                break
            continue
        f1 = json.loads(metrics.read_text()).get("ents_f")
        print(f"    {name}: {args.eval_split} F1 {100 * (f1 or 0):.2f} ({time.perf_counter() - t0:.0f} s)", flush=True)
        if not args.keep_models:
            shutil.rmtree(model_dir, ignore_errors=True)
    if failures:
        print(f"{len(failures)} run(s) failed: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


def collect(folder: Path) -> Dict[str, List[float]]:
    """spec slug -> F1 (in %) of each seed found."""
    by_slug = {spec_slug(s): s for s in SPECS}
    scores: Dict[str, List[float]] = {}
    for path in sorted(folder.glob("*-seed*.json")):
        if path.name.endswith(".train.json"):
            continue
        slug = path.name[: -len(".json")].rsplit("-seed", 1)[0]
        try:
            f1 = json.loads(path.read_text()).get("ents_f")
        except ValueError:
            continue
        if f1 is None:
            f1 = 0.0
        scores.setdefault(by_slug.get(slug, slug), []).append(100 * float(f1))
    return scores


def ordered(specs) -> List[str]:
    known = [s for s in SPECS if s in specs]
    return known + sorted(s for s in specs if s not in SPECS)


def table(scores: Dict[str, List[float]], title: str) -> str:
    lines = [f"# {title}", "", "F1 in %, over seeds.", "",
             "| spec | mean F1 | std | min | max | seeds |", "|---|---:|---:|---:|---:|---:|"]
    for spec in ordered(scores):
        values = scores[spec]
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        lines.append(f"| {spec} | {statistics.mean(values):.2f} | {std:.2f} | {min(values):.2f} "
                     f"| {max(values):.2f} | {len(values)} |")
    return "\n".join(lines) + "\n"


def plot(args) -> int:
    folder = Path(args.metrics_dir or f"metrics/{args.corpus}/sweep")
    scores = collect(folder) if folder.is_dir() else {}
    if not scores:
        print(f"no sweep metrics in {folder}", file=sys.stderr)
        return 1
    title = args.title or f"{args.corpus}: unmask sweep ({args.eval_split} F1)"
    text = table(scores, title)
    table_path = Path(args.table or folder.parent / "sweep.md")
    table_path.write_text(text, encoding="utf8")
    print(text)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    specs = ordered(scores)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(specs) + 2), 4.2))
    for x, spec in enumerate(specs):
        values = scores[spec]
        mean = statistics.mean(values)
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        first = x == 0
        ax.errorbar([x], [mean], yerr=[std], fmt="o", color="C0", capsize=4, markersize=7, zorder=3,
                    label="mean ± std" if first else None)
        offsets = [0.18 * (j - (len(values) - 1) / 2) / max(1, len(values) - 1) for j in range(len(values))]
        ax.scatter([x + 0.25 + o for o in offsets], values, color="C1", s=14, alpha=0.8, zorder=2,
                   label="one seed" if first else None)
    ax.set_xticks(range(len(specs)))
    ax.set_xticklabels([s.replace("groups:", "g:") for s in specs], rotation=60, ha="right")
    ax.set_xlabel("unmasked layers (g:abcd = four layer groups, input side first)")
    ax.set_ylabel("span F1 (%)")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    png = Path(args.output or folder.parent / "sweep.png")
    fig.savefig(png, dpi=120)
    print(f"wrote {png} and {table_path}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--corpus", default="wnut17", help="corpus name: corpus/<corpus>/, metrics/<corpus>/")
    common.add_argument("--metrics-dir", help="default metrics/<corpus>/sweep")
    common.add_argument("--eval-split", default="dev", choices=["dev", "test"], help="split scored (default dev)")

    r = sub.add_parser("run", parents=[common], help="train and evaluate every spec for every seed")
    r.add_argument("--config", type=Path, default=Path("configs/ner.cfg"))
    r.add_argument("--corpus-dir", help="default corpus/<corpus>")
    r.add_argument("--training-dir", help="default training/<corpus>/sweep")
    r.add_argument("--specs", default="", help="comma-separated specs (default: none, all, middle, groups:0000..1111)")
    r.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default 1,2,3)")
    r.add_argument("--model", default="", help=f"backbone ({MODEL_KEY}; default: the config's)")
    r.add_argument("--max-steps", type=int, default=500, help="training.max_steps per run (0: the config's)")
    r.add_argument("--gpu-id", type=int, default=-1)
    r.add_argument("--unmask-key", default=UNMASK_KEY, help=f"config key the spec goes to (default {UNMASK_KEY})")
    r.add_argument("--keep-models", action="store_true", help="keep the trained pipelines")
    r.add_argument("--force", action="store_true", help="rerun runs whose metrics exist")
    r.add_argument("--stop-on-error", action="store_true")
    r.add_argument("--dry-run", action="store_true", help="print the commands only")
    r.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more `spacy train` overrides")

    p = sub.add_parser("plot", parents=[common], help="plot and tabulate the sweep metrics")
    p.add_argument("--output", help="default metrics/<corpus>/sweep.png")
    p.add_argument("--table", help="default metrics/<corpus>/sweep.md")
    p.add_argument("--title")

    args = parser.parse_args(argv)
    if args.mode == "run":
        if args.extra and args.extra[0] == "--":
            args.extra = args.extra[1:]
        return run(args)
    return plot(args)


if __name__ == "__main__":
    sys.exit(main())
