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
