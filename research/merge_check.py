"""Does folding LoRA into bfloat16 weight copies cost F1? (docs/tried.md)

    python -m research.merge_check training/conll03/recipe/all-seed0/model-best \
        corpus/conll03/dev.spacy corpus/conll03/dev.doc.spacy

A loaded pipeline predicts with LoRA folded into a copy of each base weight, rounded to
the weights' dtype (bfloat16 on CPUs that have it: 8 mantissa bits for W + dW); training
and the unmerged path compute W x + B A x instead. For each .spacy file this scores the
same pipeline both ways (spaCy's NER scorer), and prints F1 and how many docs' entities
differ.
"""
import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    import spacy
    from spacy.scorer import get_ner_prf
    from spacy.training import Corpus, Example

    from spacy_unmask import get_backbone

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pipeline", type=Path)
    parser.add_argument("data", nargs="+", type=Path)
    parser.add_argument("--output", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)

    nlp = spacy.load(args.pipeline)
    backbone = get_backbone(nlp)
    results = {"pipeline": str(args.pipeline), "weights_dtype": str(backbone.model.get_input_embeddings().weight.dtype)}
    for path in args.data:
        examples = list(Corpus(path)(nlp))  # the input Docs `spacy evaluate` reads (the corpus's tokens)
        found = {}
        for merged in (True, False):
            backbone.merge_for_inference = merged
            predicted = list(nlp.pipe(eg.predicted.copy() for eg in examples))
            scores = get_ner_prf([Example(doc, eg.reference) for doc, eg in zip(predicted, examples)])
            found["merged" if merged else "unmerged"] = {
                "f1": round(100 * scores["ents_f"], 2),
                "ents": [[(e.start, e.end, e.label_) for e in doc.ents] for doc in predicted],
            }
        differ = sum(a != b for a, b in zip(found["merged"]["ents"], found["unmerged"]["ents"]))
        row = {mode: found[mode]["f1"] for mode in found}
        row.update({"docs": len(examples), "docs_whose_entities_differ": differ})
        results[path.name] = row
        print(path.name, row, flush=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
