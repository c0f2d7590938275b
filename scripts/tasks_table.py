"""The results of the tasks beyond NER, with the published systems beside them: chunking
(CoNLL-2003's chunk column, CoNLL-2000), part-of-speech tags, and NER + chunks + tags
from one shared decoder pass (its accuracy against each task's own pipeline at the same
seeds, and its speed against the three pipelines run in turn). `scripts/results.py`
puts the table on docs/results.md and in the README."""
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from scripts.report import load_runs, read_json, seed_groups


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
# one shared pass: each task's score key, and where the same task's own pipeline is
SHARED = ("conll03_multitask", "multitask-all")
ALONE = {"ents_f": ("NER", "conll03", "gemma3-mlp-layers12-all"),
         "spans_chunks_f": ("chunks", "conll03_chunk", "chunk-all"),
         "tag_acc": ("POS", "conll03_pos", "pos-all")}
SPEED_FILE = "bench/multitask-speed.json"


def scores(metrics: Path, folder: str, name: str, key: Optional[str] = None) -> Dict[int, float]:
    """seed -> test score in % of the runs <name>-seed<N>: their headline score, or `key`."""
    group = seed_groups(load_runs(metrics / folder)).get(name) if (metrics / folder).is_dir() else None
    if group is None:
        return {}
    if key is None:
        return group.scores("f")
    return {seed: 100 * float(run["metrics"][key]) for seed, run in group.runs.items()
            if run["metrics"].get(key) is not None}


def tasks_table(metrics: Path) -> List[str]:
    from scripts.results import fmt, machine_text, mean_sd

    rows = []
    for task in TASKS:
        unmasked, causal = scores(metrics, task.folder, task.unmasked), scores(metrics, task.folder, task.causal)
        if not unmasked and not causal:
            continue
        published = "; ".join(f"{system} {score:.2f}" for system, score in task.published)
        seeds = sorted(unmasked) or sorted(causal)
        rows.append(f"| {task.name} | {mean_sd(list(unmasked.values()))} | {mean_sd(list(causal.values()))} | "
                    f"{', '.join(map(str, seeds))} | {published} |")
    lines = []
    if rows:
        lines += ["| test | unmasked (`all`) | causal (`none`) | seeds | published |", "|---|---:|---:|---|---|"] + rows
    shared = {key: scores(metrics, *SHARED, key) for key in ALONE}
    if any(shared.values()):
        cells = []
        for key, (task, folder, name) in ALONE.items():
            alone = scores(metrics, folder, name, key)
            seeds = sorted(set(shared[key]) & set(alone))
            if shared[key]:
                paired = f" (alone, same seeds: {mean_sd([alone[s] for s in seeds])})" if seeds else " (alone: not run)"
                cells.append(f"{task} {mean_sd(list(shared[key].values()))}{paired}")
        lines += ["", f"One decoder pass for all three (`configs/multitask.cfg`, `metrics/{SHARED[0]}/`, seeds "
                      f"{', '.join(map(str, sorted(set().union(*map(set, shared.values())))))}): " + "; ".join(cells) + "."]
    speed = read_json(metrics / SPEED_FILE)
    if speed:
        lines += ["", f"Words/s on {speed['docs']} CoNLL-2003 test sentences: one shared pass "
                      f"{fmt(speed['shared_words_per_s'], 1)}, the three pipelines in turn "
                      f"{fmt(speed['three_pipelines_words_per_s'], 1)}: {fmt(speed['speedup'])}x "
                      f"({machine_text(speed)}; `metrics/{SPEED_FILE}`)."]
    return lines
