"""How well unmask_ner's entity scores are calibrated, and a temperature that improves them.

    python -m scripts.calibrate training/conll03/all/model-best corpus/conll03/dev.spacy \
        corpus/conll03/test.spacy --output metrics/conll03/calibration --fit-temperature

An entity's score is the probability the model gives to exactly that span with that
label (`doc.spans["ner"].attrs["scores"]`). A predicted entity counts as correct iff
its span and label match a gold entity exactly, judged as `spacy evaluate` judges it
(spacy.training.Corpus without gold preprocessing, spaCy's NER scorer alignment;
predictions over tokens without gold annotation are neither right nor wrong and are
left out). At threshold 0 the precision and recall here are spaCy's ents_p, ents_r.

Expected calibration error (ECE): the scores are cut into --bins equal-width bins, and
ECE = sum over bins of (entities in bin / entities) * |accuracy in bin - mean score
in bin|.

--fit-temperature fits one temperature T on dev (logits / T before the scores; T never
changes the decoded entities, so only the scores move). The objective is the negative
log-likelihood of entity correctness, -mean(c log s + (1 - c) log(1 - s)) over dev's
predicted entities: it scores exactly the quantity ECE judges, and is a proper scoring
rule, which ECE itself (binned, not smooth) is not. The token-level NLL of the gold
tags is the other choice; it calibrates per-token tag probabilities, is dominated by
the many easy O tokens, and says nothing directly about span scores. ECE before and
after is reported on dev and test; --save-pipeline writes a copy of the pipeline with
the fitted temperature in its config.

Writes <output>.json, <output>.reliability.png (reliability diagram) and
<output>.threshold.png (precision, recall and F1 on test against the threshold).
"""
import argparse
import json
import math
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

# Scores are clipped this far from 0 and 1 inside the log-likelihood.
EPS = 1e-12
THRESHOLDS = np.round(np.linspace(0.0, 1.0, 101), 2)
TARGET_PRECISIONS = (0.9, 0.95, 0.99)


class Split:
    """The decoded entities of one .spacy file: their logits and correctness."""

    def __init__(self, examples: list, logits: List[np.ndarray], correct: List[np.ndarray],
                 counted: List[np.ndarray], gold_entities: int):
        self.examples = examples  # spacy Examples, .predicted annotated by the pipeline as read
        self.logits = logits  # per doc, (tokens, tags)
        self.correct = correct  # per doc, one bool per decoded entity
        self.counted = counted  # per doc: False where spaCy's scorer ignores the entity
        self.gold_entities = gold_entities

    def scores(self, ner, temperature: float) -> Tuple[np.ndarray, np.ndarray]:
        """(score, correct) of every counted entity, at this temperature."""
        saved = ner.temperature
        ner.temperature = temperature
        try:
            predictions = ner.decode(self.logits)
        finally:
            ner.temperature = saved
        scores = [p.scores[: p.n_decoded][keep] for p, keep in zip(predictions, self.counted)]
        correct = [c[keep] for c, keep in zip(self.correct, self.counted)]
        return np.concatenate(scores + [np.zeros(0)]), np.concatenate(correct + [np.zeros(0, dtype=bool)])


def find_component(nlp):
    from spacy_unmask.pipeline.unmask_ner import UnmaskNER

    found = [(name, proc) for name, proc in nlp.pipeline if isinstance(proc, UnmaskNER)]
    if len(found) != 1:
        raise SystemExit(f"the pipeline needs exactly one unmask_ner component; it has {[n for n, _ in found]}")
    return found[0]


def read_split(nlp, ner_name: str, path: Path, batch_size: int) -> Split:
    """Run the pipeline over a .spacy file as `spacy evaluate` does, keeping the ner's logits."""
    from spacy.training import Corpus
    from spacy.util import minibatch

    ner = nlp.get_pipe(ner_name)
    names = [name for name, _ in nlp.pipeline]
    before, after = names[: names.index(ner_name)], names[names.index(ner_name) + 1:]
    examples = list(Corpus(path, gold_preproc=False)(nlp))
    logits, correct, counted, gold_entities = [], [], [], 0
    for batch in minibatch(examples, size=batch_size):
        with nlp.select_pipes(enable=before):
            docs = list(nlp.pipe(eg.predicted for eg in batch))
        batch_logits = ner.logits(docs)
        ner.set_annotations(docs, ner.decode(batch_logits))
        for name in after:
            docs = [nlp.get_pipe(name)(doc) for doc in docs]
        for eg, doc, doc_logits in zip(batch, docs, batch_logits):
            eg.predicted = doc
            is_correct, is_counted, n_gold = judge(eg, doc.ents)
            logits.append(doc_logits)
            correct.append(is_correct)
            counted.append(is_counted)
            gold_entities += n_gold
    return Split(examples, logits, correct, counted, gold_entities)


def judge(example, entities) -> Tuple[np.ndarray, np.ndarray, int]:
    """Per predicted entity: correct, counted; and the number of gold entities.

    As spacy.scorer.get_ner_prf: through the tokenization alignment, first to last gold
    token touched; an entity over tokens without gold annotation is not counted."""
    if not example.reference.has_annotation("ENT_IOB"):
        return np.zeros(len(entities), dtype=bool), np.zeros(len(entities), dtype=bool), 0
    golds = {(e.label_, e.start, e.end) for e in example.reference.ents}
    n_gold = len(golds)
    align = example.alignment.x2y
    correct, counted = [], []
    for ent in entities:
        indices = align[ent.start: ent.end]
        gold_span = example.reference[indices[0]: indices[-1] + 1] if len(indices) else None
        is_counted = gold_span is not None and all(token.ent_iob != 0 for token in gold_span)
        key = (ent.label_, int(indices[0]), int(indices[-1]) + 1) if is_counted else None
        correct.append(key in golds)
        counted.append(is_counted)
        golds.discard(key)
    return np.array(correct, dtype=bool), np.array(counted, dtype=bool), n_gold


def calibration(scores: np.ndarray, correct: np.ndarray, bins: int) -> Dict[str, object]:
    """ECE, maximum calibration error, Brier score, NLL and the reliability table."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.searchsorted(edges, scores, side="right") - 1, 0, bins - 1)  # 1.0 in the last bin
    table, ece, mce = [], 0.0, 0.0
    for b in range(bins):
        inside = which == b
        row = {"lower": float(edges[b]), "upper": float(edges[b + 1]), "count": int(inside.sum()),
               "mean_score": None, "accuracy": None}
        if inside.any():
            row["mean_score"] = float(scores[inside].mean())
            row["accuracy"] = float(correct[inside].mean())
            gap = abs(row["accuracy"] - row["mean_score"])
            ece += inside.mean() * gap
            mce = max(mce, gap)
        table.append(row)
    n = len(scores)
    return {
        "entities": n,
        "ece": float(ece) if n else None,
        "mce": float(mce) if n else None,
        "brier": float(np.mean((scores - correct) ** 2)) if n else None,
        "nll": correctness_nll(scores, correct) if n else None,
        "accuracy": float(correct.mean()) if n else None,
        "mean_score": float(scores.mean()) if n else None,
        "bins": table,
    }


def correctness_nll(scores: np.ndarray, correct: np.ndarray) -> float:
    s = np.clip(scores, EPS, 1 - EPS)
    return float(-np.mean(np.where(correct, np.log(s), np.log1p(-s))))


def threshold_curve(scores: np.ndarray, correct: np.ndarray, gold_entities: int) -> Dict[str, list]:
    precision, recall, f1 = [], [], []
    for t in THRESHOLDS:
        kept = scores >= t
        tp = int(correct[kept].sum())
        p = tp / int(kept.sum()) if kept.any() else None  # nothing kept: undefined
        r = tp / gold_entities if gold_entities else None
        precision.append(p)
        recall.append(r)
        f1.append(None if p is None or r is None else (2 * p * r / (p + r) if p + r else 0.0))
    return {"thresholds": THRESHOLDS.tolist(), "precision": precision, "recall": recall, "f1": f1}


def thresholds_for_precision(dev_curve: Dict[str, list], test_curve: Dict[str, list]) -> List[Dict[str, object]]:
    """For each target, the smallest threshold reaching that precision on dev, and test P/R there."""
    rows = []
    for target in TARGET_PRECISIONS:
        hits = [i for i, p in enumerate(dev_curve["precision"]) if p is not None and p >= target]
        i = hits[0] if hits else None
        rows.append({
            "target_precision": target,
            "threshold": dev_curve["thresholds"][i] if i is not None else None,
            "dev_precision": dev_curve["precision"][i] if i is not None else None,
            "dev_recall": dev_curve["recall"][i] if i is not None else None,
            "test_precision": test_curve["precision"][i] if i is not None else None,
            "test_recall": test_curve["recall"][i] if i is not None else None,
        })
    return rows


# The temperature search range; a fit at either end says the scores want to go further.
TEMPERATURE_RANGE = (0.05, 20.0)


def fit_temperature(ner, dev: Split, low: float = TEMPERATURE_RANGE[0], high: float = TEMPERATURE_RANGE[1]) -> float:
    """The temperature minimising dev's correctness NLL: a grid over log T, then golden section."""
    def loss(log_t: float) -> float:
        return correctness_nll(*dev.scores(ner, math.exp(log_t)))

    grid = np.linspace(math.log(low), math.log(high), 25)
    values = [loss(x) for x in grid]
    best = int(np.argmin(values))
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = loss(c), loss(d)
    for _ in range(20):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = loss(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = loss(d)
    candidates = [(values[best], grid[best]), (fc, c), (fd, d)]
    return float(math.exp(min(candidates)[1]))


def plot_reliability(path: Path, panels: Sequence[Tuple[str, Dict[str, object]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.4), squeeze=False)
    for ax, (title, summary) in zip(axes[0], panels):
        rows = [r for r in summary["bins"] if r["count"]]
        width = rows[0]["upper"] - rows[0]["lower"] if rows else 0.1
        ax.bar([r["lower"] for r in rows], [r["accuracy"] for r in rows], width=width, align="edge",
               edgecolor="black", color="#4c72b0", label="accuracy")
        ax.plot([r["mean_score"] for r in rows], [r["accuracy"] for r in rows], "o", color="#dd8452",
                label="bin: (mean score, accuracy)")
        ax.plot([0, 1], [0, 1], "--", color="gray", label="perfect calibration")
        ece = summary["ece"]
        ax.set_title(f"{title}\nECE {ece:.3f}, {summary['entities']} entities" if ece is not None else title)
        ax.set_xlabel("entity score")
        ax.set_ylabel("fraction correct")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_thresholds(path: Path, curves: Sequence[Tuple[str, Dict[str, list]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for (label, curve), style in zip(curves, ("-", "--")):
        x = curve["thresholds"]
        for name, color in (("precision", "#4c72b0"), ("recall", "#dd8452"), ("f1", "#55a868")):
            y = [np.nan if v is None else v for v in curve[name]]
            ax.plot(x, y, style, color=color, label=f"{name} ({label})")
    ax.set_xlabel("threshold (entities scoring below it are left out)")
    ax.set_ylabel("test score")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(pipeline: str, dev_path: Path, test_path: Path, output: Path, *, bins: int = 15,
        fit: bool = False, save_pipeline: Optional[Path] = None, batch_size: int = 64,
        gpu_id: int = -1) -> Dict[str, object]:
    import spacy
    from spacy.cli._util import setup_gpu

    setup_gpu(gpu_id, silent=True)
    nlp = spacy.load(pipeline)
    ner_name, ner = find_component(nlp)
    # Every decoded entity is judged: no threshold, no candidates.
    ner.threshold, ner.candidates_min_score = 0.0, None
    stored = float(ner.temperature)
    splits = {"dev": read_split(nlp, ner_name, dev_path, batch_size),
              "test": read_split(nlp, ner_name, test_path, batch_size)}
    result: Dict[str, object] = {
        "pipeline": str(pipeline), "component": ner_name, "dev": str(dev_path), "test": str(test_path),
        "bins": bins, "temperature_stored": stored, "temperature_fitted": None,
        "objective": "negative log-likelihood of entity correctness on dev",
    }
    measured = {"before": {}, "after": {}}
    scored = {}
    for name, split in splits.items():
        scored[("before", name)] = split.scores(ner, stored)
        measured["before"][name] = calibration(*scored[("before", name)], bins)
        measured["before"][name]["gold_entities"] = split.gold_entities
    if fit:
        if not measured["before"]["dev"]["entities"]:
            raise SystemExit(f"no entities predicted on {dev_path}: nothing to fit a temperature on")
        fitted = fit_temperature(ner, splits["dev"])
        result["temperature_fitted"] = fitted
        result["temperature_at_search_bound"] = not (
            1.01 * TEMPERATURE_RANGE[0] < fitted < TEMPERATURE_RANGE[1] / 1.01)
        for name, split in splits.items():
            scored[("after", name)] = split.scores(ner, fitted)
            measured["after"][name] = calibration(*scored[("after", name)], bins)
            measured["after"][name]["gold_entities"] = split.gold_entities
    result["before"] = measured["before"]
    result["after"] = measured["after"] or None
    stages = ["before", "after"] if fit else ["before"]
    curves = {(stage, name): threshold_curve(*scored[(stage, name)], splits[name].gold_entities)
              for stage in stages for name in splits}
    final = stages[-1]
    result["threshold_curve"] = {"split": "test", "temperature": result["temperature_fitted"] or stored,
                                 **curves[(final, "test")]}
    result["thresholds_for_precision"] = thresholds_for_precision(curves[(final, "dev")], curves[(final, "test")])
    if save_pipeline is not None and fit:
        calibrated = spacy.load(pipeline, config={"components": {ner_name: {"temperature": result["temperature_fitted"]}}})
        calibrated.to_disk(save_pipeline)
        result["saved_pipeline"] = str(save_pipeline)

    output.parent.mkdir(parents=True, exist_ok=True)
    temperatures = {"before": stored, "after": result["temperature_fitted"]}
    plot_reliability(output.with_name(output.name + ".reliability.png"),
                     [(f"test, T = {temperatures[stage]:.3g}", measured[stage]["test"]) for stage in stages])
    plot_thresholds(output.with_name(output.name + ".threshold.png"),
                    [(f"T = {temperatures[stage]:.3g}", curves[(stage, "test")]) for stage in stages])
    output.with_name(output.name + ".json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf8")
    return result


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pipeline", help="a saved pipeline with an unmask_ner component")
    parser.add_argument("dev", type=Path, help="the .spacy dev set (the temperature is fitted on it)")
    parser.add_argument("test", type=Path, help="the .spacy test set (measured only)")
    parser.add_argument("--output", type=Path, required=True,
                        help="path prefix: writes <output>.json, <output>.reliability.png, <output>.threshold.png")
    parser.add_argument("--bins", type=int, default=15, help="equal-width score bins for ECE (default 15)")
    parser.add_argument("--fit-temperature", action="store_true", help="fit one temperature on dev")
    parser.add_argument("--save-pipeline", type=Path, help="with --fit-temperature: write the pipeline with it here")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--gpu-id", type=int, default=-1)
    parser.add_argument("--code", type=Path, help="Python file to import (registered functions)")
    args = parser.parse_args(argv)
    if args.bins < 1:
        parser.error(f"--bins must be at least 1, got {args.bins}")
    if args.save_pipeline and not args.fit_temperature:
        parser.error("--save-pipeline needs --fit-temperature")
    if args.code:
        from spacy.cli._util import import_code

        import_code(args.code)
    result = run(args.pipeline, args.dev, args.test, args.output, bins=args.bins, fit=args.fit_temperature,
                 save_pipeline=args.save_pipeline, batch_size=args.batch_size, gpu_id=args.gpu_id)
    for stage in ("before", "after"):
        if not result[stage]:
            continue
        temperature = result["temperature_stored"] if stage == "before" else result["temperature_fitted"]
        parts = [f"{split} ECE {m['ece']:.4f} ({m['entities']} entities)" if m["ece"] is not None
                 else f"{split}: no entities" for split, m in result[stage].items()]
        print(f"T = {temperature:.4g}: " + ", ".join(parts))
    for row in result["thresholds_for_precision"]:
        if row["threshold"] is None:
            print(f"precision {row['target_precision']}: not reached on dev at any threshold")
        else:
            p, r = (f"{v:.3f}" if v is not None else "n/a" for v in (row["test_precision"], row["test_recall"]))
            print(f"precision {row['target_precision']}: threshold {row['threshold']:.2f} on dev -> test P {p} R {r}")
    print(f"-> {args.output}.json, .reliability.png, .threshold.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
