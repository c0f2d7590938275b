"""F1 of a trained pipeline as the input grows from one sentence to whole documents.

The same text and entities are scored with different Doc boundaries: each Doc of
the corpus (one sentence, or a document with its sentence boundaries kept) is
regrouped into Docs of N consecutive sentences (N = 1, 2, 4, 10, or "doc": as
converted). Backbone settings can be overridden as at `spacy.load` time
(window, stride, lookahead, sentence_windows); `--sents` says where the pipeline's sentence
boundaries come from: "gold" (the corpus's, copied onto the input Doc),
"sentencizer" (spaCy's rule-based one, added before the NER component) or
"none". Also reports the error rate of tokens by their distance (in pieces)
from the nearest window cut, which separates a stitching fault from a span
fault.

    python scripts/length_probe.py training/conll03/all/model-best corpus/conll03-doc/dev.spacy \\
        --groups 1,10,doc --override window=64 --override stride=32 --output metrics/x.json
"""
import argparse
import json
import sys
import time
from pathlib import Path


def regroup(docs, group: str):
    """Docs of `group` consecutive sentences ("doc": unchanged), sentence starts and entities kept."""
    from spacy.tokens import Doc

    if group == "doc":
        return list(docs)
    size = int(group)
    sentences = [sent.as_doc() for doc in docs for sent in doc.sents]
    return [Doc.from_docs(sentences[i : i + size], ensure_whitespace=True) for i in range(0, len(sentences), size)]


def input_doc(nlp, reference):
    """The pipeline's input for a gold Doc: its tokens and spaces, as `spacy evaluate`
    reads a corpus converted from token-per-line files (no recorded spaces), so that the
    figures here equal `spacy evaluate`'s for the same Docs."""
    from spacy.tokens import Doc

    return Doc(nlp.vocab, words=[t.text for t in reference], spaces=[bool(t.whitespace_) for t in reference])


def copy_sentence_starts(reference, predicted) -> None:
    """The reference's sentence starts on the predicted Doc, matched by character offset
    (spaCy's tokenizer may cut the text into other tokens than the corpus did)."""
    starts = {token.idx for token in reference if token.is_sent_start}
    for i, token in enumerate(predicted):
        token.is_sent_start = i == 0 or token.idx in starts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pipeline", type=Path)
    parser.add_argument("data", type=Path, help=".spacy file with sentence boundaries (convert_corpus.py --group docs)")
    parser.add_argument("--groups", default="1,2,4,10,doc", help="sentences per Doc to score, comma-separated; 'doc' = as converted")
    parser.add_argument("--override", action="append", default=[], help="backbone setting=value (window, stride, lookahead, sentence_windows)")
    parser.add_argument("--sents", choices=("gold", "sentencizer", "none"), default="gold")
    parser.add_argument("--limit", type=int, default=0, help="first N docs of the file (0: all)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)

    import spacy
    from spacy.tokens import DocBin
    from spacy.training import Example

    overrides = {}
    for item in args.override:
        key, value = item.split("=", 1)
        overrides[key] = int(value) if value.isdigit() else {"true": True, "false": False}.get(value, value)
    nlp = spacy.load(args.pipeline, config={"components": {"ner": {"model": {"tok2vec": overrides}}}} if overrides else {})
    if args.sents == "sentencizer" and "sentencizer" not in nlp.pipe_names:
        nlp.add_pipe("sentencizer", first=True)
    if args.sents != "sentencizer" and "sentencizer" in nlp.pipe_names:
        nlp.disable_pipe("sentencizer")
    docs = list(DocBin().from_disk(args.data).get_docs(nlp.vocab))
    if args.limit:
        docs = docs[: args.limit]
    from spacy_unmask import get_backbone

    settings = get_backbone(nlp).settings.to_dict()
    results = {"pipeline": str(args.pipeline), "data": str(args.data), "overrides": overrides, "sents": args.sents,
               "settings": settings, "groups": {}}
    for group in args.groups.split(","):
        gold = regroup(docs, group)
        examples = []
        for doc in gold:
            predicted = input_doc(nlp, doc)
            if args.sents == "gold":
                copy_sentence_starts(doc, predicted)
            examples.append(Example(predicted, doc))
        start = time.perf_counter()
        scores = nlp.evaluate(examples)
        seconds = time.perf_counter() - start
        row = {
            "docs": len(gold),
            "ents_f": round(100 * scores["ents_f"], 2),
            "ents_p": round(100 * scores["ents_p"], 2),
            "ents_r": round(100 * scores["ents_r"], 2),
            "words_per_second": round(sum(len(d) for d in gold) / seconds, 1),
        }
        results["groups"][group] = row
        print(f"{group:>4} sentences/Doc: {row['docs']:5d} docs  F1 {row['ents_f']:6.2f}  P {row['ents_p']:6.2f}  R {row['ents_r']:6.2f}  {row['words_per_second']} words/s", flush=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
