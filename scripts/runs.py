"""Train and evaluate NER runs (one setting or a sweep of them, over seeds); plot a sweep.

    # CoNLL-2003, causal and unmasked, three seeds, tested on sentences and on articles
    python -m scripts.runs run --corpus conll03 --specs none all --seeds 0 1 2 \
        --max-steps 1000 --prefix gemma3- --seqeval

    # the mask study on dev: none, all, middle and groups:0001 ... groups:1110, each
    # scored once, at its last step (model-last), so that training's own evaluation only
    # needs one dev document (evaluation does not change the training)
    python -m scripts.runs run --corpus conll03 --specs sweep --seeds 1 2 3 --max-steps 250 \
        --eval dev --evaluate-model last --metrics-dir metrics/conll03/sweep \
        --training-dir training/conll03/sweep --delete-models \
        -- --training.eval_frequency 250 --corpora.dev.limit 1
    python -m scripts.runs plot --corpus conll03 --metrics-dir metrics/conll03/sweep

    # a baseline: a config of its own, no unmask setting
    python -m scripts.runs run --corpus bc5cdr --config configs/baseline_cnn.cfg --name cnn --seeds 0

A run is named <prefix><spec>-seed<K> (':' and ',' of a spec become '-' and '_') or,
with --name, <prefix><name>-seed<K>. Each run is
  1. `spacy train` (--components.ner.model.tok2vec.unmask SPEC, --system.seed K) on
     corpus/<corpus>/<train>.spacy with model selection on <dev>.spacy; wall time and
     peak memory go to <run>.train.json (scripts/timed.py), the dev curve to
     <run>.log.jsonl. --train/--dev "auto" (the default) take train.mix and dev.doc
     where the corpus has documents (the converter writes them: every sentence alone and
     inside its document), else train and dev: the model reads single sentences and whole
     documents alike and is chosen on documents;
  2. `spacy evaluate` of model-best (--evaluate-model last: model-last) on each --eval
     split: test -> <run>.json, test.doc -> <run>.doc.json, dev -> <run>.json;
  3. with --seqeval, scripts/seqeval_check.py on the first --eval split (<run>.seqeval.json).
A run whose <run>.json exists is skipped (--force reruns it), so a campaign resumes
where it stopped. scripts/report.py gathers runs over seeds.

The plot (metrics/<corpus>/sweep.png) shows every seed as a dot and the mean with one
standard deviation as a bar; the table (sweep.md) gives mean, standard deviation, min,
max and number of seeds per spec. A seed moves every pattern together (its data order and
initial adapters are shared), so patterns are also compared with the reference spec
(`all`) at the same seed: the table's paired columns and the plot's lower panel give each
spec's difference to the reference, seed by seed, and how many seeds it is above. Below
the table, each layer group's effect: over the patterns that differ in that group only.
"""
import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from functools import lru_cache
from typing import Dict, List, Optional, Tuple

from scripts.report import main_score

# Dukic & Snajder's 16 patterns of four layer groups, and the middle band: groups:0000 and
# groups:1111 resolve to the same layers as none and all (the same model at a seed), so
# the sweep trains them once, under those names
SWEEP = ["none", "all", "middle"] + [f"groups:{i:04b}" for i in range(1, 15)]
SAME_AS = {"none": "groups:0000", "all": "groups:1111"}
# the backbone settings a run sets, under the config's decoder block (`backbone_block`:
# components.ner.model.tok2vec in configs/ner.cfg)
UNMASK_KEY = "unmask"
MODEL_KEY = "name"
LAYERS_KEY = "num_layers"
REPEAT_KEY = "repeat"
BASE_QUANTIZATION_KEY = "base_quantization"
DECODER = "spacy_unmask.DecoderTok2Vec.v1"
HERE = Path(__file__).resolve().parent
# "auto" split -> the document-level file to prefer, when the corpus has one
AUTO = {"train": "train.mix", "dev": "dev.doc"}


def spec_slug(spec: str) -> str:
    return spec.replace(":", "-").replace(",", "_")


def run_name(spec: str, seed: int, prefix: str = "") -> str:
    return f"{prefix}{spec_slug(spec)}-seed{seed}"


def parse_seeds(values: List[str]) -> List[int]:
    """Seeds given as `0 1 2` or `0,1,2`."""
    seeds = []
    for value in values:
        for item in value.split(","):
            if item.strip():
                try:
                    seeds.append(int(item))
                except ValueError:
                    raise SystemExit(f"--seeds: {item!r} is not an integer (e.g. --seeds 0 1 2)")
    return seeds


def parse_bool(value: str) -> bool:
    """`true` / `false` (any case), as project.yml passes a boolean var."""
    if value.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"{value!r}: give true or false")
    return value.lower() == "true"


def resolve_split(corpus: Path, split: str, role: str) -> Path:
    """corpus/<split>.spacy; "auto" prefers the documents file (AUTO) where it exists."""
    if split == "auto" and role in AUTO:
        preferred = corpus / f"{AUTO[role]}.spacy"
        split = AUTO[role] if preferred.exists() else role
    path = corpus / f"{split}.spacy"
    if not path.exists():
        found = sorted(p.name[: -len(".spacy")] for p in corpus.glob("*.spacy"))
        raise SystemExit(f"--{role} {split}: no {path}; {corpus} has {found or 'no .spacy files'} "
                         f"(or 'auto'; run the corpus's convert command first)")
    return path


def metrics_suffix(split: str) -> str:
    """test -> "", test.doc -> ".doc": the part of a split name after its first dot."""
    return "." + split.split(".", 1)[1] if "." in split else ""


def is_test_split(split: str) -> bool:
    """test, test.doc, ...: the splits read once, for the final scores, never to choose."""
    return split.split(".", 1)[0] == "test"


def check_dev_only(args, specs: List[str]) -> None:
    """Refuse to choose with test data: model selection (--dev) never reads a test split,
    and a sweep or any campaign that chooses (--select) is scored on dev splits only."""
    if is_test_split(args.dev):
        raise SystemExit(f"--dev {args.dev}: model selection on a test split is refused; select on dev "
                         f"(e.g. --dev dev or --dev dev.doc)")
    choosing = args.select or any(spec in SWEEP[3:] for spec in specs)  # a probe, or a mask study
    tested = [split for split in args.eval if is_test_split(split)]
    if choosing and tested:
        what = "--select" if args.select else "a mask study (groups:* patterns)"
        raise SystemExit(f"--eval {' '.join(tested)}: {what} chooses between settings, and choices are made "
                         f"on dev only; score it with --eval dev (read test once, for the settings chosen)")


def plan(args) -> List[dict]:
    """Every run of the campaign: its name, seed, spec (None with --name) and files."""
    corpus = Path(args.corpus_dir or f"corpus/{args.corpus}")
    train = resolve_split(corpus, args.train, "train")
    dev = resolve_split(corpus, args.dev, "dev")
    evals = {split: resolve_split(corpus, split, "eval") for split in args.eval}
    suffixes = [metrics_suffix(s) for s in args.eval]
    if len(set(suffixes)) != len(suffixes):
        raise SystemExit(f"--eval {' '.join(args.eval)}: two splits would write the same metrics file "
                         f"(dev and test both write <run>.json); evaluate them in separate campaigns")
    if args.name and args.specs:
        raise SystemExit("--name and --specs: give one (--name for a config without an unmask setting)")
    specs = [s for spec in (args.specs or []) for s in (SWEEP if spec == "sweep" else [spec])]
    check_dev_only(args, specs)
    out_dir = Path(args.metrics_dir or f"metrics/{args.corpus}")
    train_root = Path(args.training_dir or f"training/{args.corpus}")
    runs = []
    for seed in parse_seeds(args.seeds):
        for spec in specs or [None]:
            name = run_name(spec if spec is not None else args.name, seed, args.prefix)
            runs.append({
                "name": name, "seed": seed, "spec": spec, "train": train, "dev": dev,
                "model_dir": train_root / name,
                "evals": [(evals[s], out_dir / f"{name}{metrics_suffix(s)}.json") for s in args.eval],
                "out_dir": out_dir,
                "curve": out_dir / f"{name}.log.jsonl",
            })
    return runs


def train_command(args, run: dict) -> List[str]:
    out = run["out_dir"] / run["name"]
    command = [
        sys.executable, str(HERE / "timed.py"), "--output", f"{out}.train.json", "--",
        args.python, "-m", "spacy", "train", str(args.config),
        "--output", str(run["model_dir"]),
        "--training.logger.output_file", str(run["curve"]),
        "--paths.train", str(run["train"]),
        "--paths.dev", str(run["dev"]),
        "--system.seed", str(run["seed"]),
        "--gpu-id", str(args.gpu_id),
    ]
    settings = {UNMASK_KEY: run["spec"], MODEL_KEY: args.model or None, LAYERS_KEY: args.num_layers,
                REPEAT_KEY: args.repeat, BASE_QUANTIZATION_KEY: args.base_quantization}
    for key, value in settings.items():
        if value is not None:
            command += [f"--{backbone_block(args.config)}.{key}", str(value)]
    if args.max_steps:
        command += ["--training.max_steps", str(args.max_steps)]
    return command + list(args.extra)


@lru_cache(maxsize=None)
def read_config(config: Path):
    """A config as written (uninterpolated), read once per campaign."""
    from spacy.util import load_config

    return load_config(config, interpolate=False)


def backbone_block(config: Path) -> str:
    """The dotted path of the config's decoder block (@architectures = DecoderTok2Vec):
    components.ner.model.tok2vec (configs/ner.cfg), components.chunker.model.tok2vec
    (chunk.cfg), components.tok2vec.model (a shared decoder: multitask.cfg)."""
    found = []

    def walk(section, path):
        if isinstance(section, dict):
            if section.get("@architectures") == DECODER:
                found.append(".".join(path))
            for key, value in section.items():
                walk(value, path + [key])

    walk(read_config(config), [])
    if len(found) != 1:
        raise SystemExit(f"{config}: {len(found)} decoder blocks (@architectures = {DECODER}); the backbone "
                         f"settings (--specs, --model, --num-layers, --repeat) need exactly one")
    return found[0]


def components(config: Path) -> Dict[str, dict]:
    """The [components] of a config, uninterpolated."""
    return dict(read_config(config).get("components", {}))


def span_group(config: Path) -> Optional[str]:
    """The span group that a config's `unmask_ner` with target = "spans" writes (chunks in
    chunk.cfg and multitask.cfg), which `spacy evaluate` must be told to score; else None."""
    keys = [c.get("spans_key", "ner") for c in components(config).values()
            if c.get("factory") == "unmask_ner" and c.get("target") == "spans"]
    return keys[0] if keys else None


def has_entities(config: Path) -> bool:
    """Does the config's pipeline set doc.ents (an NER component)?"""
    return any(c.get("factory") == "ner" or (c.get("factory") == "unmask_ner" and c.get("target", "ents") == "ents")
               for c in components(config).values())


def evaluate_commands(args, run: dict) -> List[Tuple[str, List[str]]]:
    """(step, command) pairs: spacy evaluate on each split, then the seqeval check (of the
    entities, or of the span group where the pipeline has no entities)."""
    model = str(run["model_dir"] / f"model-{args.evaluate_model}")
    key = span_group(args.config)
    spans = ["--spans-key", key] if key else []
    commands = [(f"evaluation on {data.name}", [args.python, "-m", "spacy", "evaluate", model, str(data),
                                                "--output", str(output), "--gpu-id", str(args.gpu_id), *spans])
                for data, output in run["evals"]]
    if args.seqeval:
        data, output = run["evals"][0]
        checked = spans if key and not has_entities(args.config) else []
        commands.append(("seqeval check", [args.python, "-m", "scripts.seqeval_check", model, str(data),
                                           "--metrics", str(output), "--gpu-id", str(args.gpu_id), *checked]))
    return commands


def run(args) -> int:
    runs = plan(args)
    failures = []
    for i, one in enumerate(runs, start=1):
        name, metrics = one["name"], one["evals"][0][1]
        if metrics.exists() and not args.force:
            print(f"[{i}/{len(runs)}] {name}: done already ({metrics} exists; --force reruns it)", flush=True)
            continue
        steps = [("training", train_command(args, one))] + evaluate_commands(args, one)
        print(f"[{i}/{len(runs)}] {name}: {' '.join(steps[0][1][5:])}", flush=True)
        if args.dry_run:
            for _, command in steps[1:]:
                print(f"    then: {' '.join(command)}")
            continue
        one["out_dir"].mkdir(parents=True, exist_ok=True)
        # spaCy's logger writes no curve where its file exists: an earlier or interrupted
        # run's curve goes first
        one["curve"].unlink(missing_ok=True)
        t0 = time.perf_counter()
        for step, command in steps:
            if subprocess.call(command) != 0:
                failures.append(name)
                print(f"    {name}: {step} failed: {' '.join(command)}", file=sys.stderr)
                break
        else:
            f1 = main_score(json.loads(metrics.read_text()))
            print(f"    {name}: {one['evals'][0][0].name} F1 {100 * (f1 or 0):.2f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
        if args.delete_models:
            shutil.rmtree(one["model_dir"], ignore_errors=True)
        if failures and args.stop_on_error:
            break
    if failures:
        print(f"{len(failures)} run(s) failed: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


def collect(folder: Path, prefix: str = "") -> Dict[str, Dict[int, float]]:
    """spec -> {seed: F1 in %} for the runs found in a sweep's metrics folder (runs and
    their sidecars told apart as scripts/report.py does); `prefix` is the runs' name prefix."""
    from scripts.report import SEED, load_runs, main_score

    by_slug = {spec_slug(s): s for s in SWEEP}
    by_slug.update({spec_slug(same): spec for spec, same in SAME_AS.items()})  # older sweeps trained both
    scores: Dict[str, Dict[int, float]] = {}
    for name, run in load_runs(folder).items():
        match = SEED.match(name)
        if match:
            slug = match["name"].removeprefix(prefix)
            f1 = 100 * float(main_score(run["metrics"]) or 0.0)
            scores.setdefault(by_slug.get(slug, slug), {})[int(match["seed"])] = f1
    return scores


def paired(scores: Dict[str, Dict[int, float]], spec: str, reference: str) -> Dict[int, float]:
    """seed -> F1 of `spec` minus F1 of `reference`, for the seeds both were trained with."""
    ref = scores.get(reference, {})
    return {seed: f1 - ref[seed] for seed, f1 in sorted(scores[spec].items()) if seed in ref}


def ordered(specs) -> List[str]:
    known = [s for s in SWEEP if s in specs]
    return known + sorted(s for s in specs if s not in SWEEP)


def label(spec: str) -> str:
    """none -> "none = groups:0000": the name a sweep spec is shown under."""
    return f"{spec} = {SAME_AS[spec]}" if spec in SAME_AS else spec


def table(scores: Dict[str, Dict[int, float]], title: str, reference: str = "all") -> str:
    lines = [f"# {title}", "",
             "F1 in %, over seeds (std: sample standard deviation; – for one seed). "
             f"`vs {reference}`: the spec's F1 minus `{reference}`'s at the same seed, mean over the "
             f"seeds both have (each seed's difference in brackets); `above`: at how many of them "
             "the spec scores higher.", "",
             f"| spec | mean F1 | std | min | max | seeds | vs {reference}, same seed | above |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for spec in ordered(scores):
        values = list(scores[spec].values())
        std = f"{statistics.stdev(values):.2f}" if len(values) > 1 else "–"
        diffs = paired(scores, spec, reference)
        if spec == reference or not diffs:
            versus, above = "–", "–"
        else:
            each = ", ".join(f"{d:+.2f}" for d in diffs.values())
            versus = f"{statistics.mean(diffs.values()):+.2f} ({each})"
            above = f"{sum(d > 0 for d in diffs.values())} of {len(diffs)}"
        lines.append(f"| {label(spec)} | {statistics.mean(values):.2f} | {std} | {min(values):.2f} "
                     f"| {max(values):.2f} | {len(values)} | {versus} | {above} |")
    return "\n".join(lines) + "\n"


FLOOR = -3.0  # the lower panel's floor (F1 points below the reference): keeps close patterns apart


def group_effects(scores: Dict[str, Dict[int, float]]) -> str:
    """What unmasking each layer group does, from the `groups:` patterns (none and all
    counting as 0000 and 1111): for every two patterns that differ in that group only, the
    F1 with it unmasked minus without, at the same seed. The pairs from causal (0000: the
    group is the only one unmasked) are kept apart from those where it joins groups already
    unmasked. "" when the sweep has no patterns, or patterns of different lengths."""
    patterns = {}
    for spec in scores:
        name = SAME_AS.get(spec, spec)
        if name.startswith("groups:"):
            patterns[name.removeprefix("groups:")] = spec
    widths = {len(bits) for bits in patterns}
    if len(widths) != 1:
        return ""
    width = widths.pop()
    lines = ["**Each layer group's effect**, from the pairs of patterns that differ in that group only, "
             "at the same seed: F1 with the group unmasked minus without; `alone`: from causal "
             f"(groups:{'0' * width}), `joining`: added to patterns that already unmask another group "
             "(mean, range, and in how many pairs it is higher).", "",
             "| group (input side first) | alone | joining: mean | min | max | higher |",
             "|---|---:|---:|---:|---:|---:|"]
    for g in range(width):
        alone, joining = [], []
        for off, spec in patterns.items():
            on = off[:g] + "1" + off[g + 1:]
            if off[g] == "0" and on in patterns:
                diffs = paired(scores, patterns[on], spec).values()
                (alone if "1" not in off else joining).extend(diffs)
        first = f"{statistics.mean(alone):+.2f} ({len(alone)})" if alone else "–"
        rest = (f"{statistics.mean(joining):+.2f} | {min(joining):+.2f} | {max(joining):+.2f} "
                f"| {sum(d > 0 for d in joining)} of {len(joining)}") if joining else "– | – | – | –"
        lines.append(f"| {g + 1} of {width} | {first} | {rest} |")
    return "\n".join(lines) + "\n"


def spread(n: int) -> List[float]:
    """x offsets that set n dots of one spec side by side."""
    return [0.18 * (j - (n - 1) / 2) / max(1, n - 1) for j in range(n)]


def plot(args) -> int:
    folder = Path(args.metrics_dir or f"metrics/{args.corpus}/sweep")
    scores = collect(folder, args.prefix) if folder.is_dir() else {}
    if not scores:
        print(f"no sweep metrics in {folder}", file=sys.stderr)
        return 1
    title = args.title or f"{args.corpus}: unmask sweep ({args.eval_split} F1)"
    text = "\n".join(part for part in (table(scores, title), group_effects(scores)) if part)
    table_path = Path(args.table or folder.parent / "sweep.md")
    table_path.write_text(text, encoding="utf8")
    print(text)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    specs = ordered(scores)
    reference = "all"
    fig, (ax, low) = plt.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]},
                                  figsize=(max(6.0, 0.55 * len(specs) + 2), 6.4))
    for x, spec in enumerate(specs):
        values = list(scores[spec].values())
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        first = x == 0
        ax.errorbar([x], [statistics.mean(values)], yerr=[std], fmt="o", color="C0", capsize=4,
                    markersize=7, zorder=3, label="mean ± std" if first else None)
        ax.scatter([x + 0.25 + o for o in spread(len(values))], values, color="C1", s=14, alpha=0.8,
                   zorder=2, label="one seed" if first else None)
        diffs = list(paired(scores, spec, reference).values()) if spec != reference else []
        if not diffs:
            continue
        mean = statistics.mean(diffs)
        if mean < FLOOR:  # far below (none, say): a marker on the floor with its value
            low.plot([x], [FLOOR], "v", color="C0", markersize=7)
            low.annotate(f"{mean:+.1f}", (x, FLOOR), textcoords="offset points", xytext=(0, 6),
                         ha="center", fontsize=7)
            continue
        low.scatter([x + 0.25 + o for o in spread(len(diffs))], [max(d, FLOOR) for d in diffs],
                    color="C1", s=14, alpha=0.8)
        low.plot([x], [mean], "o", color="C0", markersize=7)
    low.axhline(0.0, color="0.4", linewidth=1)
    low.set_ylim(bottom=FLOOR - 0.3)
    low.set_xticks(range(len(specs)))
    low.set_xticklabels([label(s).replace("groups:", "g:") for s in specs], rotation=60, ha="right")
    low.set_xlabel("unmasked layers (g:abcd = four layer groups, input side first)")
    low.set_ylabel(f"minus `{reference}`,\nsame seed (F1)")
    ax.set_ylabel("span F1 (%)")
    ax.set_title(title)
    for axis in (ax, low):
        axis.grid(axis="y", alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    png = Path(args.output or folder.parent / "sweep.png")
    fig.savefig(png, dpi=120)
    print(f"wrote {png} and {table_path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)

    r = sub.add_parser("run", help="train and evaluate runs (specs x seeds)")
    r.add_argument("--corpus", required=True, help="corpus name: corpus/<corpus>/, metrics/<corpus>/")
    r.add_argument("--corpus-dir", help="default corpus/<corpus>")
    r.add_argument("--metrics-dir", help="default metrics/<corpus>")
    r.add_argument("--training-dir", help="default training/<corpus>")
    r.add_argument("--config", type=Path, default=Path("configs/ner.cfg"))
    r.add_argument("--specs", nargs="+", metavar="SPEC",
                   help="unmask settings, space-separated (`sweep`: none, all, middle, groups:0001..1110)")
    r.add_argument("--name", help="run name for a config without an unmask setting (baselines)")
    r.add_argument("--seeds", nargs="+", default=["0"], help="seeds, e.g. 0 1 2 (default 0)")
    r.add_argument("--prefix", default="", help="run name prefix, e.g. gemma3-")
    r.add_argument("--train", default="auto", help="training file stem in the corpus folder (default auto)")
    r.add_argument("--dev", default="auto", help="model-selection file stem (default auto)")
    r.add_argument("--eval", nargs="+", default=["test", "test.doc"], help="splits to evaluate (default test test.doc)")
    r.add_argument("--evaluate-model", choices=["best", "last"], default="best",
                   help="pipeline to evaluate: model-best (chosen on --dev; default) or model-last (the last step)")
    r.add_argument("--select", action="store_true",
                   help="this campaign chooses a setting (a probe): --eval must be dev splits (a sweep always is)")
    r.add_argument("--seqeval", action="store_true", help="check the first --eval split's F1 with seqeval")
    r.add_argument("--model", default="", help=f"backbone ({MODEL_KEY}; default: the config's)")
    r.add_argument("--num-layers", type=int, help=f"decoder layers kept ({LAYERS_KEY}: 0 all, N the first N, -N all but the last N; default: the config's)")
    r.add_argument("--repeat", type=int, help=f"sequence repetition ({REPEAT_KEY}: each window read N + 1 times; default: the config's)")
    r.add_argument("--base-quantization", choices=("none", "nf4", "int8"),
                   help=f"the frozen base in 4 or 8 bits ({BASE_QUANTIZATION_KEY}; default: the config's)")
    r.add_argument("--max-steps", type=int, default=0, help="training.max_steps per run (0: the config's)")
    r.add_argument("--gpu-id", type=int, default=-1)
    r.add_argument("--python", default=sys.executable, help="interpreter for spacy train / evaluate (default this one)")
    r.add_argument("--delete-models", action="store_true", help="delete each trained pipeline once evaluated")
    r.add_argument("--force", nargs="?", const=True, default=False, type=parse_bool,
                   help="rerun runs whose metrics exist (--force or --force=true; default false: skip them)")
    r.add_argument("--stop-on-error", action="store_true")
    r.add_argument("--dry-run", action="store_true", help="print the commands only")
    r.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more `spacy train` overrides")

    p = sub.add_parser("plot", help="plot and tabulate a sweep's metrics")
    p.add_argument("--corpus", default="wnut17")
    p.add_argument("--metrics-dir", help="default metrics/<corpus>/sweep")
    p.add_argument("--eval-split", default="dev", help="split the sweep was scored on (for the title)")
    p.add_argument("--output", help="default metrics/<corpus>/sweep.png")
    p.add_argument("--table", help="default metrics/<corpus>/sweep.md")
    p.add_argument("--prefix", default="", help="the runs' name prefix (run --prefix), e.g. gemma3-")
    p.add_argument("--title")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.mode == "run":
        if args.extra and args.extra[0] == "--":
            args.extra = args.extra[1:]
        if not (args.specs or args.name):
            parser.error("run: give --specs (unmask settings) or --name (a config without one)")
        return run(args)
    return plot(args)


if __name__ == "__main__":
    sys.exit(main())
