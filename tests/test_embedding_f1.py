"""scripts/embedding_f1.py: a trained pipeline scored as saved and with its embedding in 8 bits."""
import json

from spacy.tokens import DocBin

from scripts import embedding_f1
from scripts.results import results_page
from tiny_models import gold_examples, make_pipeline, train_pipeline


def test_scores_the_pipeline_exact_and_with_an_8_bit_embedding(tiny_dirs, tmp_path):
    nlp = make_pipeline(tiny_dirs("llama", "metaspace"), lora_r=4)
    train_pipeline(nlp, 20, learn_rate=0.01)
    nlp.to_disk(tmp_path / "pipeline")
    DocBin(docs=[eg.reference for eg in gold_examples(nlp)]).to_disk(tmp_path / "dev.spacy")
    output = tmp_path / "metrics" / "bench" / "load-cost" / "embedding-int8-f1-toy.json"
    assert embedding_f1.main([str(tmp_path / "pipeline"), str(tmp_path / "dev.spacy"), "--output", str(output)]) == 0
    result = json.loads(output.read_text())
    assert result["f1_exact"] == round(100 * nlp.evaluate(gold_examples(nlp))["ents_f"], 2)
    assert 0 <= result["f1_int8"] <= 100 and result["difference"] == round(result["f1_int8"] - result["f1_exact"], 2)
    assert result["int8_bytes"] < result["exact_bytes"] and result["split"] == "dev" and "cpu_flags" in result
    assert "| `embedding-int8-f1-toy.json` |" in results_page(tmp_path / "metrics")
