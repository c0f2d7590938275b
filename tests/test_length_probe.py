"""research/length_probe.py: F1 and tag errors as the input grows from sentences to documents."""
import json

from research import length_probe
from scripts import convert_corpus
from test_convert_corpus import CONLL_LIKE


def one_piece_per_word(text, add_special_tokens=False, return_offsets_mapping=True):
    import re

    offsets = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    return {"input_ids": list(range(len(offsets))), "offset_mapping": offsets}


def test_length_probe_distance_buckets():
    assert [length_probe.bucket(d) for d in (-1, 0, 1, 2, 3, 4, 7, 8, 63, 64, 500)] == [
        "uncut", "0", "1", "2-3", "2-3", "4-7", "4-7", "8-15", "32-63", "64+", "64+"
    ]


def test_length_probe_distance_from_window_cuts_and_sentence_edges():
    from spacy.tokens import Doc
    from spacy.vocab import Vocab

    words = ["a", "b", "c", "d", "e", "f", "g", "h"]
    doc = Doc(Vocab(), words=words, sent_starts=[True, False, False, True, False, False, False, False])
    # windows of 4 pieces every 2: [0-3] [2-5] [4-7]; each piece reads from the window where it
    # sits furthest from an edge, and the doc's own start and end are no cuts
    cut = length_probe.window_cut_distance(doc, one_piece_per_word, window=4, stride=2)
    assert cut.tolist() == [3, 2, 1, 1, 1, 1, 2, 3]
    assert length_probe.window_cut_distance(doc, one_piece_per_word, window=8, stride=4).tolist() == [-1] * 8
    assert length_probe.sentence_edge_distance(doc).tolist() == [0, 1, 0, 0, 1, 2, 1, 0]


def test_length_probe_error_rates_count_wrong_tags_per_bucket():
    from spacy.tokens import Doc, Span
    from spacy.training import Example
    from spacy.vocab import Vocab

    vocab = Vocab()
    words = ["Peter", "Blackburn", "visited", "Brussels"]
    reference = Doc(vocab, words=words, ents=["B-PER", "I-PER", "O", "B-LOC"])
    predicted = Doc(vocab, words=words)
    predicted.ents = [Span(predicted, 1, 2, label="PER"), Span(predicted, 3, 4, label="ORG")]
    rates = length_probe.error_rates([Example(predicted, reference)], [[0, 1, 1, -1]])
    assert rates == {
        "uncut": {"tokens": 1, "errors": 1, "rate": 1.0},  # LOC read as ORG
        "0": {"tokens": 1, "errors": 1, "rate": 1.0},  # Peter missed
        "1": {"tokens": 2, "errors": 1, "rate": 0.5},  # Blackburn begins the entity instead of continuing it
    }


def test_length_probe_scores_and_locates_errors_of_any_pipeline(tmp_path):
    """A rule-based pipeline that finds every entity but one: F1 and the error rates say so."""
    import spacy

    source = tmp_path / "c.txt"
    source.write_text(CONLL_LIKE, encoding="utf8")
    convert_corpus.convert_file(source, tmp_path / "docs.spacy", token_col=0, tag_col=3, sep="whitespace",
                                docstart=True, group="docs", quiet=True)
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("entity_ruler")
    ruler.add_patterns([{"label": "ORG", "pattern": "EU"}, {"label": "MISC", "pattern": "German"},
                        {"label": "PER", "pattern": [{"ORTH": "Peter"}, {"ORTH": "Blackburn"}]}])  # BRUSSELS missed
    nlp.to_disk(tmp_path / "ruler")
    output = tmp_path / "probe.json"
    assert length_probe.main([str(tmp_path / "ruler"), str(tmp_path / "docs.spacy"), "--groups", "1,doc",
                              "--output", str(output)]) == 0
    result = json.loads(output.read_text())
    assert result["settings"] is None  # not a spacy-unmask pipeline: no windows
    for group in ("1", "doc"):
        row = result["groups"][group]
        assert (row["ents_p"], row["ents_r"]) == (100.0, 75.0)
        assert "errors_by_window_cut" not in row
        errors = row["errors_by_sentence_edge"]
        assert sum(b["tokens"] for b in errors.values()) == 6
        assert errors["0"]["errors"] == 1 and sum(b["errors"] for b in errors.values()) == 1  # BRUSSELS, alone
