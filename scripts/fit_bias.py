"""Fit unmask_ner's `entity_bias` on dev: how far decoding leans towards recall.

    python -m scripts.fit_bias training/wnut17/model-best corpus/wnut17/dev.spacy \
        corpus/wnut17/test.spacy --output metrics/wnut17/bias.json \
        --save-pipeline training/wnut17/model-best-biased

`entity_bias` is added to every entity tag's log-probability in Viterbi decoding (the
scores stay the model's probabilities). The pipeline reads dev and test once each,
keeping the ner's logits as scripts/calibrate.py does; then every bias of the grid
(--biases) decodes dev again from those logits and is scored as `spacy evaluate` scores
it (spaCy's NER scorer). The bias with the best dev F1 is chosen (on a tie, the one
nearest 0); test is scored at the pipeline's stored bias and at the chosen one, and at
nothing else. Components after the ner are not rerun on re-decoded docs, so a pipeline
whose later components edit `doc.ents` is refused. --save-pipeline writes a copy of the
pipeline with the chosen bias in its config (or set it at load time:
`spacy.load(path, config={"components": {"ner": {"entity_bias": 1.5}}})`).
"""
import argparse
import json
import math
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence


DEFAULT_BIASES = [round(-1.0 + 0.25 * i, 2) for i in range(21)]  # -1 ... 4


def scores_at(ner, split, bias: float) -> Dict[str, float]:
    """P, R, F1 (in %) of the split's docs decoded again at this bias."""
    from spacy.scorer import get_ner_prf

    saved = ner.entity_bias
    ner.entity_bias = bias
    try:
        ner.set_annotations([eg.predicted for eg in split.examples], ner.decode(split.logits))
    finally:
        ner.entity_bias = saved
    prf = get_ner_prf(split.examples)
    return {"p": round(100 * prf["ents_p"], 2), "r": round(100 * prf["ents_r"], 2),
            "f1": round(100 * prf["ents_f"], 2)}


def choose(grid: Sequence[Dict[str, float]]) -> float:
    """The bias of the best dev F1; on a tie, the one nearest 0."""
    return min(grid, key=lambda row: (-row["f1"], abs(row["bias"])))["bias"]


def run(pipeline: str, dev_path: Path, test_path: Path, output: Path, *, biases: Sequence[float] = DEFAULT_BIASES,
        save_pipeline: Optional[Path] = None, batch_size: int = 64, gpu_id: int = -1) -> Dict[str, object]:
    import spacy
    from spacy.cli._util import setup_gpu

    from scripts.calibrate import find_component, read_split

    setup_gpu(gpu_id, silent=True)
    nlp = spacy.load(pipeline)
    ner_name, ner = find_component(nlp)
    names = [name for name, _ in nlp.pipeline]
    later = [name for name in names[names.index(ner_name) + 1:] if "doc.ents" in nlp.get_pipe_meta(name).assigns]
    if later:
        raise SystemExit(f"components after {ner_name!r} set doc.ents ({later}): re-decoding would skip them")
    ner.candidates_min_score = None  # they never enter doc.ents; decoding is faster without
    stored = float(ner.entity_bias)
    dev = read_split(nlp, ner_name, dev_path, batch_size)
    grid = [{"bias": float(b), **scores_at(ner, dev, b)} for b in sorted(set(biases) | {stored})]
    chosen = choose(grid)
    test = read_split(nlp, ner_name, test_path, batch_size)
    result: Dict[str, object] = {
        "pipeline": str(pipeline), "component": ner_name, "dev": str(dev_path), "test": str(test_path),
        "threshold": ner.threshold, "bias_stored": stored, "bias_chosen": chosen, "dev_grid": grid,
        "dev_scores": {"stored": next(r for r in grid if r["bias"] == stored),
                       "chosen": next(r for r in grid if r["bias"] == chosen)},
        "test_scores": {"stored": scores_at(ner, test, stored), "chosen": scores_at(ner, test, chosen)},
    }
    if save_pipeline is not None:
        spacy.load(pipeline, config={"components": {ner_name: {"entity_bias": chosen}}}).to_disk(save_pipeline)
        result["saved_pipeline"] = str(save_pipeline)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf8")
    return result


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pipeline", help="a saved pipeline with an unmask_ner component")
    parser.add_argument("dev", type=Path, help="the .spacy dev set (the bias is chosen on it)")
    parser.add_argument("test", type=Path, help="the .spacy test set (scored at the stored and the chosen bias only)")
    parser.add_argument("--output", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--biases", type=float, nargs="+", default=DEFAULT_BIASES,
                        help="the grid searched on dev (default -1 to 4 in steps of 0.25)")
    parser.add_argument("--save-pipeline", type=Path, help="write the pipeline with the chosen bias here")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--gpu-id", type=int, default=-1)
    parser.add_argument("--code", type=Path, help="Python file to import (registered functions)")
    args = parser.parse_args(argv)
    bad = [b for b in args.biases if not math.isfinite(b)]
    if bad:
        parser.error(f"--biases must be finite numbers, got {bad}")
    if args.code:
        from spacy.cli._util import import_code

        import_code(args.code)
    result = run(args.pipeline, args.dev, args.test, args.output, biases=args.biases,
                 save_pipeline=args.save_pipeline, batch_size=args.batch_size, gpu_id=args.gpu_id)
    for split in ("dev", "test"):
        stored, chosen = result[f"{split}_scores"]["stored"], result[f"{split}_scores"]["chosen"]
        print(f"{split}: F1 {stored['f1']:.2f} at bias {result['bias_stored']:g} (P {stored['p']:.2f}, R {stored['r']:.2f}),"
              f" {chosen['f1']:.2f} at {result['bias_chosen']:g} (P {chosen['p']:.2f}, R {chosen['r']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
