"""Accuracy, calibration and speed of one saved pipeline at each precision (docs/speed.md).

    python -m research.quantize_eval training/conll03/recipe/all-seed0/model-best \
        --corpus conll03 --data corpus/conll03/test.spacy corpus/conll03/test.doc.spacy \
        --modes float32 bfloat16 int8 --rounds 3

Each mode is the saved pipeline loaded with load-time overrides (its weights are not
changed): `float32` (dtype float32), `bfloat16` (dtype bfloat16; skipped where the CPU has
no bfloat16), `int8` (quantize int8, activations in the dtype "auto" picks), and
`int8-no-outliers` (the same with no outlier channels, set on the loaded pipeline's
`Int8Linear` layers: what ships since dev chose it; `--int8-outliers 16` gives the
`int8` mode the outlier scheme it is compared with). For each
data file it writes, per mode:
- F1 (spaCy's NER scorer rules, as `scripts/calibrate.py` applies them) and the entity
  scores' calibration (ECE, 15 bins), and
- with --rounds > 0, `nlp.pipe` words/s: every mode warmed up once, then the modes
  alternated for --rounds rounds, the median kept.
Results merge into metrics/bench/quantize-<cpu kind>.json (one file per CPU kind, its
flags recorded): {"cpu_flags", "words_per_s": {split: {mode}}, "f1": {corpus: {split:
{mode}}}, "ece": ...}. Timings are only comparable within one file.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path


MODES = {
    "float32": {"dtype": "float32", "quantize": "none"},
    "bfloat16": {"dtype": "bfloat16", "quantize": "none"},
    "int8": {"dtype": "auto", "quantize": "int8"},
    "int8-no-outliers": {"dtype": "auto", "quantize": "int8"},
}


def set_outlier_channels(nlp, outliers: int):
    """The int8 pipeline with every `Int8Linear` taking `outliers` channels out of int8."""
    from spacy_unmask.layers.decoder_tok2vec import get_backbone
    from spacy_unmask.quantize import Int8Linear

    nlp("A first call quantises the decoder .")
    layers = [m for m in get_backbone(nlp).model.modules() if isinstance(m, Int8Linear)]
    assert layers, "no Int8Linear in the int8 pipeline"
    for layer in layers:
        layer.outliers = min(outliers, layer.in_features)
    return nlp


def split_name(path: Path) -> str:
    return path.name[: -len(".spacy")]


def accuracy(nlp, path: Path) -> dict:
    import numpy as np

    from scripts.calibrate import calibration, find_component, read_split

    name, ner = find_component(nlp)
    split = read_split(nlp, name, path, batch_size=64)
    scores, correct = split.scores(ner, ner.temperature)
    predicted, right = len(scores), int(correct.sum())
    p = right / predicted if predicted else 0.0
    r = right / split.gold_entities if split.gold_entities else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"f1": round(100 * f, 2), "p": round(100 * p, 2), "r": round(100 * r, 2),
            "ece": round(calibration(scores, np.asarray(correct, dtype=float), 15)["ece"], 4)}


def words_per_s(pipelines: dict, path: Path, rounds: int, batch_size: int, limit: int) -> dict:
    from spacy.tokens import DocBin

    some = next(iter(pipelines.values()))
    texts = [d.text for d in DocBin().from_disk(path).get_docs(some.vocab)][: limit or None]
    words = sum(len(some.make_doc(t)) for t in texts)

    def once(nlp) -> float:
        start = time.perf_counter()
        for _ in nlp.pipe(texts, batch_size=batch_size):
            pass
        return words / (time.perf_counter() - start)

    for nlp in pipelines.values():
        once(nlp)  # warm-up
    seen = {mode: [] for mode in pipelines}
    for _ in range(rounds):
        for mode, nlp in pipelines.items():
            seen[mode].append(once(nlp))
    speed = {mode: round(statistics.median(values), 1) for mode, values in seen.items()}
    return {**speed, "docs": len(texts), "words": words, "rounds": rounds, "batch_size": batch_size}


def main(argv=None) -> int:
    from spacy_unmask.cpu import bf16_supported
    from spacy_unmask.cpu import cpu_flags, cpu_kind
    from spacy_unmask import load

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pipeline", type=Path)
    parser.add_argument("--corpus", required=True, help="corpus name for the JSON (e.g. conll03)")
    parser.add_argument("--data", nargs="+", type=Path, required=True, help=".spacy files with gold entities")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per mode (0: accuracy only)")
    parser.add_argument("--no-accuracy", action="store_true", help="time only")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--speed-docs", type=int, default=0, help="time the first N docs of each file (0: all)")
    parser.add_argument("--dtype", default=None, help="the dtype of every mode but bfloat16 (e.g. float32 where "
                        "the CPU has bfloat16 but one without it is emulated)")
    parser.add_argument("--int8-outliers", type=int, default=None, help="outlier channels of the int8 mode (default: "
                        "what ships); give --output with it, so the per-CPU file keeps the shipped scheme")
    parser.add_argument("--output", type=Path, help="default metrics/bench/quantize-<cpu kind>.json")
    parser.add_argument("--kind", help="the CPU kind to file the results under (default: this CPU's; say "
                        "e.g. avx2-emulated when ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA restrict the kernels)")
    args = parser.parse_args(argv)
    if args.int8_outliers is not None and args.int8_outliers < 0:
        parser.error(f"--int8-outliers must be 0 or more channels, got {args.int8_outliers}")

    flags = cpu_flags()
    kind = args.kind or cpu_kind(flags)
    output = args.output or Path("metrics/bench") / f"quantize-{kind}.json"
    results = json.loads(output.read_text()) if output.exists() else {}
    results.update({"cpu_flags": flags, "cpu_kind": kind})
    modes = [m for m in args.modes if m != "bfloat16" or bf16_supported()]
    settings = {mode: {**MODES[mode], **({"dtype": args.dtype} if args.dtype and mode != "bfloat16" else {})}
                for mode in modes}
    pipelines = {mode: load(args.pipeline, **settings[mode]) for mode in modes}
    if "int8-no-outliers" in pipelines:
        set_outlier_channels(pipelines["int8-no-outliers"], 0)
    if args.int8_outliers is not None and "int8" in pipelines:
        set_outlier_channels(pipelines["int8"], args.int8_outliers)
    results.setdefault("modes", {}).update(settings)
    for path in args.data:
        split = split_name(path)
        if not args.no_accuracy:
            for mode, nlp in pipelines.items():
                found = accuracy(nlp, path)
                print(f"{args.corpus} {split} {mode}: {found}", flush=True)
                for key in ("f1", "ece"):
                    results.setdefault(key, {}).setdefault(args.corpus, {}).setdefault(split, {})[mode] = found[key]
        if args.rounds:
            speed = words_per_s(pipelines, path, args.rounds, args.batch_size, args.speed_docs)
            print(f"{args.corpus} {split} words/s: {speed}", flush=True)
            results.setdefault("words_per_s", {}).setdefault(f"{args.corpus}/{split}", {}).update(speed)
        results.setdefault("commands", [])
        command = "python -m research.quantize_eval " + " ".join(sys.argv[1:] if argv is None else argv)
        if command not in results["commands"]:
            results["commands"].append(command)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"-> {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
