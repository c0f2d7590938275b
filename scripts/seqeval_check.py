"""Recompute a pipeline's span score with seqeval (strict IOB2) and check it agrees with spaCy.

    python -m scripts.seqeval_check training/conll03/all/model-best corpus/conll03/test.spacy \
        --metrics metrics/conll03/all.json --output metrics/conll03/all.seqeval.json

The test set is read and run exactly as `spacy evaluate` does it (spacy.training.Corpus
without gold preprocessing, `nlp.pipe`, then the pipeline's own scorers). Each
predicted entity is mapped onto the gold tokens the way spaCy's NER scorer maps it
(`spacy.scorer.get_ner_prf`: through the tokenization alignment, first to last gold
token touched), both sides are written as IOB2 tags over the gold tokens, and
seqeval's strict-mode span F1 (mode="strict", scheme=IOB2) is computed. The script
fails (exit 1) unless seqeval's F1 agrees with spaCy's ents_f recomputed here and,
with --metrics, with the ents_f stored by `spacy evaluate`, within --tol.
`--spans-key chunks` checks a span group instead of the entities (a chunker's
doc.spans["chunks"] against the gold chunks; spaCy's score spans_chunks_f).

Writes a JSON sidecar (by default <metrics stem>.seqeval.json beside --metrics) and
never edits the metrics file itself.
"""
import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple


def gold_tags(example, spans_key: Optional[str] = None) -> List[str]:
    if spans_key is not None:
        gold = [(s.label_, s.start, s.end) for s in example.reference.spans.get(spans_key, [])]
        return spans_to_iob2(gold, len(example.reference))
    return [tok.ent_iob_ + ("-" + tok.ent_type_ if tok.ent_type_ else "") if tok.ent_iob_ else "O"
            for tok in example.reference]


def predicted_gold_spans(example, spans_key: Optional[str] = None) -> Tuple[List[Tuple[str, int, int]], int]:
    """Predicted entities (or the span group `spans_key`) as (label, start, end) over gold
    tokens, as spaCy's scorer sees them.

    Returns the non-overlapping spans in order and the number of predicted entities
    that had to be dropped because they land on gold tokens another prediction
    already covers (IOB2 cannot express that; spaCy would count them as false positives).
    """
    align_x2y = example.alignment.x2y
    spans: List[Tuple[str, int, int]] = []
    predicted = example.predicted.ents if spans_key is None else example.predicted.spans.get(spans_key, [])
    for ent in predicted:
        indices = align_x2y[ent.start : ent.end]
        if not len(indices):
            continue
        start, end = int(indices[0]), int(indices[-1]) + 1
        if spans_key is None and any(tok.ent_iob == 0 for tok in example.reference[start:end]):
            continue  # missing gold annotation: spaCy ignores the prediction
        spans.append((ent.label_, start, end))
    spans.sort(key=lambda s: (s[1], s[2]))
    kept, dropped, last_end = [], 0, 0
    for span in spans:
        if span[1] < last_end:
            dropped += 1
            continue
        kept.append(span)
        last_end = span[2]
    return kept, dropped


def spans_to_iob2(spans, length: int) -> List[str]:
    tags = ["O"] * length
    for label, start, end in spans:
        tags[start] = f"B-{label}"
        for i in range(start + 1, end):
            tags[i] = f"I-{label}"
    return tags


def seqeval_scores(y_true: List[List[str]], y_pred: List[List[str]]) -> Dict[str, object]:
    import warnings

    from seqeval.metrics import classification_report, f1_score, precision_score, recall_score
    from seqeval.scheme import IOB2

    kw = dict(mode="strict", scheme=IOB2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # undefined P/R when nothing is predicted: seqeval gives 0
        report = classification_report(y_true, y_pred, output_dict=True, zero_division=0, **kw)
        return {
            "seqeval_p": float(precision_score(y_true, y_pred, zero_division=0, **kw)),
            "seqeval_r": float(recall_score(y_true, y_pred, zero_division=0, **kw)),
            "seqeval_f1": float(f1_score(y_true, y_pred, zero_division=0, **kw)),
            "seqeval_per_type": {
                label: {"p": float(v["precision"]), "r": float(v["recall"]), "f": float(v["f1-score"]),
                        "support": int(v["support"])}
                for label, v in report.items()
                if not label.endswith(" avg")
            },
        }


def check(model: str, data: Path, *, gpu_id: int = -1, metrics: Optional[Path] = None,
          tol: float = 1e-6, spans_key: Optional[str] = None) -> Dict[str, object]:
    import spacy
    from spacy.cli._util import setup_gpu
    from spacy.scorer import Scorer
    from spacy.training import Corpus
    from spacy.util import fix_random_seed

    fix_random_seed()
    setup_gpu(gpu_id, silent=True)
    nlp = spacy.load(model)
    examples = list(Corpus(data, gold_preproc=False)(nlp))
    docs = nlp.pipe((eg.predicted for eg in examples), batch_size=nlp.batch_size)
    for eg, doc in zip(examples, docs):
        eg.predicted = doc
    spacy_scores = Scorer(nlp).score(examples)

    y_true, y_pred, dropped = [], [], 0
    for eg in examples:
        spans, n_dropped = predicted_gold_spans(eg, spans_key)
        dropped += n_dropped
        y_true.append(gold_tags(eg, spans_key))
        y_pred.append(spans_to_iob2(spans, len(eg.reference)))
    key = "ents_f" if spans_key is None else f"spans_{spans_key}_f"
    result: Dict[str, object] = {"model": str(model), "data": str(data), "docs": len(examples), "score": key}
    result.update(seqeval_scores(y_true, y_pred))
    spacy_f = spacy_scores.get(key)
    result["spacy_ents_f"] = 0.0 if spacy_f is None else float(spacy_f)
    diffs = {"recomputed": abs(result["seqeval_f1"] - result["spacy_ents_f"])}
    if metrics is not None:
        stored = json.loads(Path(metrics).read_text(encoding="utf8")).get(key)
        result["metrics_file"] = str(metrics)
        result["metrics_ents_f"] = 0.0 if stored is None else float(stored)
        diffs["metrics_file"] = abs(result["seqeval_f1"] - result["metrics_ents_f"])
    result["abs_diff"] = diffs
    result["overlapping_predictions_dropped"] = dropped
    result["tol"] = tol
    result["agree"] = all(d <= tol for d in diffs.values())
    return result


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a saved pipeline (e.g. training/conll03/all/model-best)")
    parser.add_argument("data", type=Path, help="the .spacy test set")
    parser.add_argument("--metrics", type=Path, help="the `spacy evaluate --output` JSON to compare with")
    parser.add_argument("--output", type=Path, help="the JSON to write (default: <metrics stem>.seqeval.json)")
    parser.add_argument("--gpu-id", type=int, default=-1)
    parser.add_argument("--tol", type=float, default=1e-6, help="largest accepted |F1 difference| (default 1e-6)")
    parser.add_argument("--code", type=Path, help="Python file to import (registered functions)")
    parser.add_argument("--spans-key", help="check the span group doc.spans[KEY] (e.g. chunks) instead of the entities")
    args = parser.parse_args(argv)
    if args.code:
        from spacy.cli._util import import_code

        import_code(args.code)
    result = check(args.model, args.data, gpu_id=args.gpu_id, metrics=args.metrics, tol=args.tol,
                   spans_key=args.spans_key)
    output = args.output
    if output is None and args.metrics is not None:
        output = args.metrics.with_name(args.metrics.name[: -len(".json")] + ".seqeval.json")
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf8")
    line = (f"seqeval strict IOB2 F1 {100 * result['seqeval_f1']:.4f} | spaCy {result['score']} "
            f"{100 * result['spacy_ents_f']:.4f}")
    if "metrics_ents_f" in result:
        line += f" | stored {result['score']} {100 * result['metrics_ents_f']:.4f}"
    print(line + f" | {result['docs']} docs")
    if not result["agree"]:
        print(f"DISAGREE: |difference| {result['abs_diff']} > tol {args.tol}"
              + (f"; {result['overlapping_predictions_dropped']} overlapping predictions could not be "
                 "written as IOB2" if result["overlapping_predictions_dropped"] else ""), file=sys.stderr)
        return 1
    print(f"agree within {args.tol}" + (f" -> {output}" if output else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
