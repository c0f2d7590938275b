"""The results of the tasks beyond NER, with the published systems beside them: chunking
(CoNLL-2003's chunk column, CoNLL-2000), part-of-speech tags, and NER + chunks + tags
from one shared decoder pass (its accuracy against each task's own pipeline at the same
seeds, and its speed against the three pipelines run in turn). `scripts/results.py`
puts the table on docs/results.md and in the README."""
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

from scripts.report import SeedGroup, load_runs, read_json, seed_groups


@dataclass
class Task:
    name: str
    folder: str  # under metrics/
    unmasked: str  # run names, without -seed<N>
    causal: str
    published: List[Tuple[str, float]]  # (system, test score in %), best first


TASKS = [
    Task("CoNLL-2003 chunks (F1)", "conll03_chunk", "chunk-all", "chunk-none",
         [("ACE + fine-tuning", 92.5), ("Flair + BERT + word + char", 92.0)]),
    Task("CoNLL-2000 chunks (F1)", "conll2000_chunk", "chunk-all", "chunk-none",
         [("ACE + fine-tuning", 97.30), ("Flair embeddings", 96.72), ("Flair chunk-english", 96.48)]),
    # CoNLL-2003's POS column was tagged automatically and has no published benchmark; the
    # best published accuracy on hand-tagged WSJ text is the nearest figure
    Task("CoNLL-2003 POS (accuracy)", "conll03_pos", "pos-all", "pos-none",
         [("Meta-BiLSTM (Penn Treebank WSJ, another corpus)", 97.96)]),
]
# the runs of one shared pass (configs/multitask.cfg); each task's score key, and where the
# same task's own pipeline is
SHARED = "conll03_multitask"
ALONE = {"ents_f": ("NER", "conll03", "gemma3-mlp-layers12-all"),
         "spans_chunks_f": ("chunks", "conll03_chunk", "chunk-all"),
         "tag_acc": ("POS", "conll03_pos", "pos-all")}
GRAD_FACTOR = re.compile(r"^--components\.(?P<component>[^.]+)\.model\.tok2vec\.grad_factor$")
SPEED_FILE = "bench/multitask-speed.json"


def groups(metrics: Path, folder: str) -> Dict[str, SeedGroup]:
    return seed_groups(load_runs(metrics / folder)) if (metrics / folder).is_dir() else {}


def scores(metrics: Path, folder: str, name: str) -> Dict[int, float]:
    """seed -> test score in % of the runs <name>-seed<N>."""
    group = groups(metrics, folder).get(name)
    return group.scores("f") if group else {}


def chosen(metrics: Path, folder: str, group: SeedGroup, key: str) -> Tuple[Dict[int, float], Dict[int, float]]:
    """seed -> score `key` in %, on dev at the checkpoint training kept (the first evaluation
    with the best weighted score, from the run's dev curve) and on test."""
    dev, test = {}, {}
    for seed, run in group.runs.items():
        if run["metrics"].get(key) is not None:
            test[seed] = 100 * float(run["metrics"][key])
        rows = []
        try:
            lines = (metrics / folder / f"{group.name}-seed{seed}.log.jsonl").read_text(encoding="utf8").splitlines()
        except OSError:
            lines = []
        for line in lines:
            try:
                row = json.loads(line)
                rows.append((float(row["score"]), float(row["scores"][key])))
            except (ValueError, KeyError, TypeError):
                continue
        if rows:
            best = max(score for score, _ in rows)
            dev[seed] = next(value for score, value in rows if score == best)
    return dev, test


def grad_factors(group: SeedGroup) -> str:
    """The listeners' grad_factor overrides in the first seed's training command."""
    command = [str(part) for part in (group.first_train() or {}).get("command") or []]
    found = [f"{m['component']} {command[i + 1]}" for i, part in enumerate(command[:-1])
             if (m := GRAD_FACTOR.match(part))]
    return f"grad_factor {', '.join(found)}" if found else "grad_factor 1 for all"


def with_seeds(scores: Dict[int, float]) -> str:
    """Mean ± spread over seeds, and which seeds ("–" where none ran)."""
    if not scores:
        return "–"
    seeds = sorted(scores)
    return f"{mean_sd_of(scores)} (seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))})"


def mean_sd_of(scores: Dict[int, float]) -> str:
    from scripts.results import mean_sd

    return mean_sd([scores[s] for s in sorted(scores)])


def tasks_table(metrics: Path) -> List[str]:
    from scripts.results import fmt, machine_text

    rows = []
    for task in TASKS:
        unmasked, causal = scores(metrics, task.folder, task.unmasked), scores(metrics, task.folder, task.causal)
        if not unmasked and not causal:
            continue
        published = "; ".join(f"{system} {score:.2f}" for system, score in task.published)
        rows.append(f"| {task.name} | {with_seeds(unmasked)} | {with_seeds(causal)} | {published} |")
    lines = []
    if rows:
        lines += ["| test | unmasked (`all`) | causal (`none`) | published |", "|---|---:|---:|---|"] + rows
    shared = {name: group for name, group in groups(metrics, SHARED).items() if min(group.runs) >= 0}
    if shared:
        seeds = sorted(set().union(*(group.runs for group in shared.values())))
        lines += ["", f"One decoder pass for all three (`configs/multitask.cfg`, `metrics/{SHARED}/`) against each "
                      "task's own pipeline at the same seeds; dev at the checkpoint each training kept:", "",
                  "| run | seeds | " + " | ".join(f"{task}, dev / test" for task, _, _ in ALONE.values()) + " |",
                  "|---|---|" + "---:|" * len(ALONE)]
        for name, group in sorted(shared.items(), key=lambda item: item[0] != "multitask-all"):
            cells = [" / ".join(map(mean_sd_of, chosen(metrics, SHARED, group, key))) for key in ALONE]
            lines.append(f"| `{name}` ({grad_factors(group)}) | {', '.join(map(str, sorted(group.runs)))} | "
                         + " | ".join(cells) + " |")
        cells = []
        for key, (_, folder, name) in ALONE.items():
            alone = groups(metrics, folder).get(name)
            alone = SeedGroup(name, {s: r for s, r in alone.runs.items() if s in seeds}) if alone else None
            cells.append(" / ".join(map(mean_sd_of, chosen(metrics, folder, alone, key))) if alone and alone.runs else "not run")
        lines.append(f"| each task alone | {', '.join(map(str, seeds))} | " + " | ".join(cells) + " |")
    speed = read_json(metrics / SPEED_FILE)
    if speed:
        lines += ["", f"Words/s on {speed['docs']} CoNLL-2003 test sentences: one shared pass "
                      f"{fmt(speed['shared_words_per_s'], 1)}, the three pipelines in turn "
                      f"{fmt(speed['three_pipelines_words_per_s'], 1)}: {fmt(speed['speedup'])}x "
                      f"({machine_text(speed)}; `metrics/{SPEED_FILE}`)."]
    return lines
