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
    for key in ("matmul_gflops", "pipeline_gflops", "pipeline_share_of_matmul_peak", "raw_forward_words_per_s", "pipeline_words_per_s", "pipeline_over_raw_forward", "raw_sorted_words_per_s", "pipeline_over_raw_sorted", "train_words_per_s_none",
                "train_words_per_s_all", "train_pieces_per_s_all", "peak_rss_mb_inference", "peak_rss_mb_training"):
        assert figures[key] > 0
    assert "aten::" in capsys.readouterr().out  # the --profile table


def saved_pipeline_and_data(tmp_path, **tok2vec):
    """A saved (initialised, untrained) pipeline and four docs of gold data: their paths."""
    from spacy.training import Example

    nlp = spacy.blank("en")
    nlp.add_pipe("unmask_ner", name="ner", config={"model": {"tok2vec": tok2vec}})
    doc = nlp.make_doc("Peter Blackburn visited Brussels .")
    doc.ents = [doc.char_span(0, 15, label="PER")]
    nlp.initialize(lambda: [Example(nlp.make_doc(doc.text), doc)])
    nlp.to_disk(tmp_path / "pipeline")
    DocBin(docs=[doc] * 4).to_disk(tmp_path / "data.spacy")
    return str(tmp_path / "pipeline"), str(tmp_path / "data.spacy")


def test_bench_times_a_saved_pipeline(tmp_path, tiny_dirs):
    pipeline, data = saved_pipeline_and_data(tmp_path, name=tiny_dirs("llama"), unmask="2-3", dtype="bfloat16")
    out = tmp_path / "bench.json"
    assert main(["bench", "--pipeline", pipeline, "--data", data,
                 "--batch-size", "2", "--train-steps", "1", "--train-batch", "2", "--output", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["pipeline"] == pipeline and figures["unmask"] == "2-3"
    assert figures["command"].startswith("python -m spacy_unmask bench --pipeline") and figures["base_quantization"] == "none"
    assert figures["dtype"] == "bfloat16"  # the saved pipeline's own, for the raw pass too
    assert figures["train_words_per_s_2-3"] > 0 and figures["train_words_per_s_none"] > 0


def test_bench_quantize_int8_times_the_int8_pipeline_and_records_the_cpu(tmp_path, tiny_dirs):
    from spacy_unmask.cpu import CPU_FLAGS

    pipeline, data = saved_pipeline_and_data(tmp_path, name=tiny_dirs("llama"), dtype="float32")
    out = tmp_path / "bench.json"
    assert main(["bench", "--pipeline", pipeline, "--data", data,
                 "--batch-size", "2", "--quantize", "int8", "--output", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["quantize"] == "int8" and figures["pipeline_over_raw_sorted"] > 0
    assert "prediction only" in figures["training"]
    assert set(figures["cpu_flags"]) <= set(CPU_FLAGS)
