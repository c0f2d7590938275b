"""`python -m spacy_unmask bench` runs and reports every figure (speed itself is not asserted)."""
import json

import spacy
from spacy.tokens import DocBin

from spacy_unmask.__main__ import main


def test_bench_reports_raw_pipeline_training_and_memory(tmp_path, tiny_dirs, capsys):
    nlp = spacy.blank("en")
    docs = []
    for i in range(12):
        doc = nlp.make_doc(f"Peter Blackburn visited Brussels on day {i} .")
        doc.ents = [doc.char_span(0, 15, label="PER"), doc.char_span(24, 32, label="LOC")]
        docs.append(doc)
    DocBin(docs=docs).to_disk(tmp_path / "data.spacy")
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", tiny_dirs("llama"), "--data", str(tmp_path / "data.spacy"), "--n-docs", "12",
                 "--batch-size", "4", "--train-steps", "1", "--train-batch", "4", "--profile", "5", "--output", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["words"] == sum(len(d) for d in docs) and figures["docs"] == 12
    for key in ("raw_forward_words_per_s", "pipeline_words_per_s", "pipeline_over_raw_forward", "raw_sorted_words_per_s", "pipeline_over_raw_sorted", "train_words_per_s_none",
                "train_words_per_s_all", "train_pieces_per_s_all", "peak_rss_mb_inference", "peak_rss_mb_training"):
        assert figures[key] > 0
    assert "aten::" in capsys.readouterr().out  # the --profile table
