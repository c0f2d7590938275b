"""scripts/seqeval_check.py: span F1 recomputed by seqeval agrees with spaCy's scorer."""
import json

import pytest

from scripts import seqeval_check


def ruler_pipeline(path, patterns):
    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns(patterns)
    nlp.to_disk(path)


def gold_docbin(path, sentences, with_spaces):
    import spacy
    from spacy.tokens import Doc, DocBin
    from spacy.training import biluo_tags_to_spans, iob_to_biluo

    vocab = spacy.blank("en").vocab
    docbin = DocBin()
    for words, tags in sentences:
        spaces = [True] * (len(words) - 1) + [False] if with_spaces else None
        doc = Doc(vocab, words=words, spaces=spaces)
        doc.ents = biluo_tags_to_spans(doc, iob_to_biluo(tags))
        docbin.add(doc)
    docbin.to_disk(path)


SENTENCES = [
    (["Alice", "met", "Bob", "in", "Paris", "."], ["B-PER", "O", "B-PER", "O", "B-LOC", "O"]),
    (["Acme", "Corp", "don't", "care"], ["B-ORG", "I-ORG", "B-PER", "O"]),
    (["Paris", "Hilton", "sings"], ["B-PER", "I-PER", "O"]),
    (["nothing", "here"], ["O", "O"]),
]


@pytest.mark.parametrize("with_spaces", [False, True])
def test_seqeval_check_agrees_with_spacy_evaluate(tmp_path, with_spaces):
    from spacy.cli.evaluate import evaluate

    # "n't" is only part of the gold token "don't" once spaCy's tokenizer re-splits the text
    # (with_spaces): spaCy's scorer maps it onto the whole gold token, and so must the check.
    ruler_pipeline(tmp_path / "model", [
        {"label": "PER", "pattern": "Alice"}, {"label": "LOC", "pattern": "Bob"},
        {"label": "LOC", "pattern": "Paris"}, {"label": "ORG", "pattern": [{"LOWER": "acme"}, {"LOWER": "corp"}]},
        {"label": "PER", "pattern": [{"ORTH": "n't"}]},
    ])
    gold_docbin(tmp_path / "test.spacy", SENTENCES, with_spaces)
    metrics = tmp_path / "run.json"
    scores = evaluate(str(tmp_path / "model"), tmp_path / "test.spacy", output=metrics)
    assert 0 < scores["ents_f"] < 1
    code = seqeval_check.main([str(tmp_path / "model"), str(tmp_path / "test.spacy"), "--metrics", str(metrics)])
    assert code == 0
    result = json.loads((tmp_path / "run.seqeval.json").read_text())
    assert result["agree"] and result["docs"] == 4
    assert abs(result["seqeval_f1"] - scores["ents_f"]) < 1e-9
    assert set(result["seqeval_per_type"]) == {"PER", "LOC", "ORG"}


def test_seqeval_check_reports_disagreement(tmp_path):
    # Two predictions inside one gold token cannot both be written as IOB2: spaCy counts
    # both, seqeval only one, and the check must say so rather than pass.
    ruler_pipeline(tmp_path / "model", [{"label": "LOC", "pattern": [{"ORTH": "do"}]},
                                        {"label": "PER", "pattern": [{"ORTH": "n't"}]}])
    gold_docbin(tmp_path / "test.spacy", SENTENCES, with_spaces=True)
    result = seqeval_check.check(str(tmp_path / "model"), tmp_path / "test.spacy")
    assert not result["agree"] and result["overlapping_predictions_dropped"] == 1


def test_seqeval_check_of_a_span_group_agrees_with_spacy_evaluate(tmp_path):
    import spacy
    from spacy.cli.evaluate import evaluate
    from spacy.tokens import Doc, DocBin, Span

    nlp = spacy.blank("en")
    scorer = {"@scorers": "spacy.overlapping_labeled_spans_scorer.v1", "spans_key": "chunks"}
    nlp.add_pipe("span_ruler", config={"spans_key": "chunks", "scorer": scorer}).add_patterns([
        {"label": "NP", "pattern": "Alice"}, {"label": "VP", "pattern": "met"}, {"label": "NP", "pattern": "Paris"},
        {"label": "NP", "pattern": [{"LOWER": "acme"}]},  # half of the gold NP "Acme Corp": wrong
    ])
    nlp.to_disk(tmp_path / "model")
    docbin = DocBin()
    for words, chunks in [(["Alice", "met", "Bob", "in", "Paris"], [("NP", 0, 1), ("VP", 1, 2), ("NP", 2, 3),
                                                                   ("PP", 3, 4), ("NP", 4, 5)]),
                          (["Acme", "Corp", "sings"], [("NP", 0, 2), ("VP", 2, 3)])]:
        doc = Doc(nlp.vocab, words=words)
        doc.spans["chunks"] = [Span(doc, start, end, label) for label, start, end in chunks]
        docbin.add(doc)
    docbin.to_disk(tmp_path / "test.spacy")
    scores = evaluate(str(tmp_path / "model"), tmp_path / "test.spacy", output=tmp_path / "run.json", spans_key="chunks")
    assert 0 < scores["spans_chunks_f"] < 1
    assert seqeval_check.main([str(tmp_path / "model"), str(tmp_path / "test.spacy"), "--spans-key", "chunks",
                               "--metrics", str(tmp_path / "run.json")]) == 0
    result = json.loads((tmp_path / "run.seqeval.json").read_text())
    assert result["agree"] and result["score"] == "spans_chunks_f"
    assert abs(result["seqeval_f1"] - scores["spans_chunks_f"]) < 1e-9 and set(result["seqeval_per_type"]) == {"NP", "VP", "PP"}
