"""scripts/compact_f1.py: a trained pipeline scored as saved, with its embedding in 8 bits
and with its vocabulary trimmed to a corpus."""
import json

from spacy.tokens import DocBin

from scripts import compact_f1
from scripts.results import results_page
from tiny_models import TRAIN, gold_examples, make_pipeline, train_pipeline


def test_scores_the_pipeline_as_saved_and_each_compact_copy(tiny_dirs, tmp_path):
    nlp = make_pipeline(tiny_dirs("llama", "metaspace", vocab_size=640), lora_r=4)
    train_pipeline(nlp, 20, learn_rate=0.01)
    nlp.to_disk(tmp_path / "pipeline")
    DocBin(docs=[eg.reference for eg in gold_examples(nlp)]).to_disk(tmp_path / "dev.spacy")
    (tmp_path / "train.txt").write_text(TRAIN[0][0] + "\n", encoding="utf8")
    output = tmp_path / "metrics" / "bench" / "load-cost" / "compact-f1-toy.json"
    argv = [str(tmp_path / "pipeline"), str(tmp_path / "dev.spacy"), "--trim-corpus", str(tmp_path / "train.txt"),
            "--output", str(output)]
    assert compact_f1.main(argv) == 0
    result = json.loads(output.read_text())
    found = {variant["name"]: variant for variant in result["variants"]}
    assert list(found) == ["as saved", "8-bit embedding", "vocabulary trimmed", "vocabulary trimmed, 8-bit embedding"]
    assert found["as saved"]["f1"] == round(100 * nlp.evaluate(gold_examples(nlp))["ents_f"], 2)
    for name, variant in found.items():
        assert 0 <= variant["f1"] <= 100
        if name != "as saved":
            assert variant["difference"] == round(variant["f1"] - found["as saved"]["f1"], 2)
            assert variant["bytes"] < found["as saved"]["bytes"]
    assert found["vocabulary trimmed"]["rows"] < found["as saved"]["rows"] == 640
    assert result["split"] == "dev" and "cpu_flags" in result
    assert "| `metrics/bench/load-cost/compact-f1-toy.json` | " in results_page(tmp_path / "metrics")
