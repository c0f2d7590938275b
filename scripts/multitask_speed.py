"""NER, chunks and POS tags: one shared decoder pass against three pipelines in turn.

    python -m scripts.multitask_speed corpus/conll03/test.spacy \
        --output metrics/bench/multitask-speed.json --docs 1000 --rounds 3

Builds four pipelines from the shipped configs (`ner.cfg`, `chunk.cfg`, `tagger.cfg`
and `multitask.cfg`, each with its decoder settings as shipped), initialises them on the
corpus (their labels), and times `nlp.pipe` over the first --docs docs: the multitask
pipeline once, and the three single-task pipelines one after the other, alternating the
two in each round so that the machine's state (another process, the CPU's clock) falls
on both alike. Words per second are the words of the docs over the seconds of a pass;
the figures of every round are kept. Speed does not depend on what the weights have
learned, so the pipelines are freshly initialised (trained pipelines time the same);
each pass is preceded by a warm-up on a few docs. The machine (CPU flags included) goes
into the output.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

SINGLE = ("ner.cfg", "chunk.cfg", "tagger.cfg")
SHARED = "multitask.cfg"


def build(config: Path, examples, overrides: Dict[str, object]):
    """A pipeline from a shipped config, its decoder settings overridden, initialised on `examples`."""
    from spacy.util import load_config, load_model_from_config

    from scripts.runs import backbone_block

    block = backbone_block(config)
    nlp = load_model_from_config(load_config(config, overrides={f"{block}.{k}": v for k, v in overrides.items()},
                                             interpolate=True),
                                 auto_fill=True)
    nlp.initialize(lambda: examples)
    return nlp


def words_per_second(pipelines: List, texts: List[str], batch_size: int) -> float:
    """Words of `texts` over the seconds that running every pipeline over them takes."""
    for nlp in pipelines:
        for _ in nlp.pipe(texts[:8], batch_size=batch_size):  # warm-up
            pass
    words = sum(len(t.split()) for t in texts)
    start = time.perf_counter()
    for nlp in pipelines:
        for _ in nlp.pipe(texts, batch_size=batch_size):
            pass
    return words / (time.perf_counter() - start)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="a .spacy corpus holding entities, chunks and tags (conll03)")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--configs", type=Path, default=Path("configs"))
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--model", help="the decoder (name), default: the configs'")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)

    import spacy
    from spacy.tokens import DocBin
    from spacy.training import Example

    import torch

    from spacy_unmask.cpu import machine

    if args.threads:
        torch.set_num_threads(args.threads)
    nlp = spacy.blank("en")
    docs = list(DocBin().from_disk(args.data).get_docs(nlp.vocab))[: args.docs]
    examples = [Example(nlp.make_doc(doc.text), doc) for doc in docs[:200]]
    texts = [doc.text for doc in docs]
    overrides = {"name": args.model} if args.model else {}
    single = [build(args.configs / name, examples, overrides) for name in SINGLE]
    shared = build(args.configs / SHARED, examples, overrides)
    rounds = []
    for _ in range(args.rounds):
        rounds.append({"shared": words_per_second([shared], texts, args.batch_size),
                       "three_pipelines": words_per_second(single, texts, args.batch_size)})
    shared_wps = statistics.median(r["shared"] for r in rounds)
    three_wps = statistics.median(r["three_pipelines"] for r in rounds)
    result = {
        "command": " ".join(["python -m scripts.multitask_speed", *(sys.argv[1:] if argv is None else argv)]),
        "data": str(args.data), "docs": len(texts), "words": sum(len(t.split()) for t in texts),
        "batch_size": args.batch_size, "torch_threads": torch.get_num_threads(), "rounds": [{k: round(v, 1) for k, v in r.items()} for r in rounds],
        "shared_words_per_s": round(shared_wps, 1), "three_pipelines_words_per_s": round(three_wps, 1),
        "speedup": round(shared_wps / three_wps, 2), **machine(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf8")
    print(f"one shared pass {shared_wps:.1f} words/s, three pipelines in turn {three_wps:.1f} words/s: "
          f"{result['speedup']:.2f}x -> {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
