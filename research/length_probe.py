"""F1 of a trained pipeline as the input grows from one sentence to whole documents.

The same text and entities are scored with different Doc boundaries: each Doc of
the corpus (one sentence, or a document with its sentence boundaries kept) is
regrouped into Docs of N consecutive sentences (N = 1, 2, 4, 10, or "doc": as
converted). Backbone settings can be overridden as at `spacy.load` time
(window, stride, lookahead, sentence_windows); `--sents` says where the pipeline's sentence
boundaries come from: "gold" (the corpus's, copied onto the input Doc),
"sentencizer" (spaCy's rule-based one, added before the NER component) or
"none". For each grouping it also reports the tag error rate of tokens (their
BILUO tag differs from the gold one) by distance from the nearest window cut, in
pieces (docs short enough for one window are "uncut"), and by distance from the
nearest edge of the token's sentence, in tokens: errors that pile up next to
cuts point at the stitching, errors spread evenly point at the model.

    python -m research.length_probe training/conll03/all/model-best corpus/conll03-doc/dev.spacy \\
        --groups 1,10,doc --override window=64 --override stride=32 --output metrics/x.json
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def regroup(docs, group: str):
    """Docs of `group` consecutive sentences ("doc": unchanged), sentence starts and entities kept."""
    from spacy.tokens import Doc

    if group == "doc":
        return list(docs)
    size = int(group)
    sentences = [sent.as_doc() for doc in docs for sent in doc.sents]
    return [Doc.from_docs(sentences[i : i + size], ensure_whitespace=True) for i in range(0, len(sentences), size)]


EDGES = (0, 1, 2, 4, 8, 16, 32, 64)  # lower bounds of the distance buckets


def bucket(distance: int) -> str:
    """"0", "1", "2-3", "4-7", ... "64+" for a distance; "uncut" for -1."""
    if distance < 0:
        return "uncut"
    low = max(edge for edge in EDGES if edge <= distance)
    following = [edge for edge in EDGES if edge > low]
    if not following:
        return f"{low}+"
    return str(low) if following[0] - low == 1 else f"{low}-{following[0] - 1}"


def sentence_edge_distance(doc):
    """Per token: tokens to the nearer edge of its sentence (0 = first or last token)."""
    distance = np.zeros(len(doc), dtype=np.int64)
    for sent in (doc.sents if doc.has_annotation("SENT_START") else [doc[:]]):
        index = np.arange(sent.start, sent.end)
        distance[sent.start : sent.end] = np.minimum(index - sent.start, sent.end - 1 - index)
    return distance


def window_cut_distance(doc, tokenizer, window: int, stride: int):
    """Per token: pieces from its first piece to the nearest cut of the window it takes its
    vector from, as the backbone windows running text (-1: the doc is not cut, or the
    token has no piece). A window edge at the start or end of the doc is no cut."""
    from spacy_unmask.windows import align_pieces, assign_windows, token_spans, window_starts

    encoded = tokenizer(doc.text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = np.asarray(encoded["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    n = len(offsets)
    if n <= window:
        return np.full(len(doc), -1, dtype=np.int64)
    first, _ = align_pieces(*token_spans(doc), offsets[:, 0], offsets[:, 1])
    piece = np.maximum(first, 0)
    starts = window_starts(n, window, stride)
    start = starts[assign_windows(n, starts, window)][piece]
    far = np.iinfo(np.int64).max
    left = np.where(start > 0, piece - start, far)
    right = np.where(start + window < n, start + window - 1 - piece, far)
    return np.where(first >= 0, np.minimum(left, right), -1)


def error_rates(examples, distances) -> dict:
    """Tag error rate per distance bucket: {bucket: {"tokens", "errors", "rate"}}, buckets in order.

    `distances` holds one array per example (one value per token); predicted and
    reference Docs have the same tokens."""
    counts = {}
    for eg, distance in zip(examples, distances):
        gold = [(t.ent_iob_, t.ent_type_) for t in eg.reference]
        predicted = [(t.ent_iob_, t.ent_type_) for t in eg.predicted]
        for d, g, p in zip(distance, gold, predicted):
            row = counts.setdefault(bucket(int(d)), [0, 0])
            row[0] += 1
            row[1] += g != p
    order = ["uncut"] + [bucket(edge) for edge in EDGES]
    return {
        name: {"tokens": counts[name][0], "errors": counts[name][1], "rate": round(counts[name][1] / counts[name][0], 4)}
        for name in order
        if name in counts
    }


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


def find_backbone(nlp):
    """The pipeline's spacy-unmask backbone, or None (a baseline: no windows to analyse)."""
    from spacy_unmask import get_backbone

    try:
        return get_backbone(nlp)
    except ValueError:
        return None


def score(nlp, examples) -> dict:
    """Run the pipeline on the examples' predicted Docs, in place (spaCy's `evaluate`
    works on copies, and the error rates need the predictions), and score them as
    `spacy evaluate` does."""
    from spacy.scorer import Scorer

    start = time.perf_counter()
    for eg, doc in zip(examples, nlp.pipe([eg.predicted for eg in examples])):
        eg.predicted = doc
    seconds = time.perf_counter() - start
    scores = Scorer(nlp=nlp).score(examples)
    return {
        "ents_f": round(100 * scores["ents_f"], 2),
        "ents_p": round(100 * scores["ents_p"], 2),
        "ents_r": round(100 * scores["ents_r"], 2),
        "words_per_second": round(sum(len(eg.predicted) for eg in examples) / seconds, 1),
    }


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
    backbone = find_backbone(nlp)
    settings = backbone.settings.to_dict() if backbone is not None else None
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
        row = {"docs": len(gold), **score(nlp, examples)}
        row["errors_by_sentence_edge"] = error_rates(examples, [sentence_edge_distance(eg.reference) for eg in examples])
        if backbone is not None and not backbone.settings.sentence_windows:
            s = backbone.settings
            cuts = [window_cut_distance(eg.predicted, backbone.tokenizer, s.window, s.stride) for eg in examples]
            row["errors_by_window_cut"] = error_rates(examples, cuts)
        results["groups"][group] = row
        print(f"{group:>4} sentences/Doc: {row['docs']:5d} docs  F1 {row['ents_f']:6.2f}  P {row['ents_p']:6.2f}  R {row['ents_r']:6.2f}  {row['words_per_second']} words/s", flush=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
