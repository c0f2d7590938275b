"""scripts/multitask_speed.py: one shared decoder pass against three pipelines in turn."""
import json
from pathlib import Path

from spacy.tokens import Doc, DocBin, Span
from spacy.vocab import Vocab

from scripts import multitask_speed

ROOT = Path(__file__).parent.parent


def test_one_shared_pass_is_timed_against_three_pipelines(tiny_dirs, tmp_path):
    # the shipped configs on a tiny random decoder (all its layers, its hidden size)
    configs = tmp_path / "configs"
    configs.mkdir()
    for name in (*multitask_speed.SINGLE, multitask_speed.SHARED):
        text = (ROOT / "configs" / name).read_text()
        text = text.replace('name = "gemma3-270m"', f'name = "{tiny_dirs("llama", "metaspace")}"')
        text = text.replace("num_layers = -6", "num_layers = 0").replace("width = 640", "width = 32")
        (configs / name).write_text(text.replace('dtype = "auto"', 'dtype = "float32"'))
    vocab, docbin = Vocab(), DocBin()
    for i in range(12):
        doc = Doc(vocab, words=["Peter", "Blackburn", "visited", "Brussels", str(i), "."],
                  tags=["NNP", "NNP", "VBD", "NNP", "CD", "."])
        doc.ents = [Span(doc, 0, 2, "PER"), Span(doc, 3, 4, "LOC")]
        doc.spans["chunks"] = [Span(doc, 0, 2, "NP"), Span(doc, 2, 3, "VP"), Span(doc, 3, 5, "NP")]
        docbin.add(doc)
    docbin.to_disk(tmp_path / "test.spacy")
    output = tmp_path / "speed.json"
    assert multitask_speed.main([str(tmp_path / "test.spacy"), "--output", str(output), "--configs", str(configs),
                                 "--docs", "10", "--rounds", "2", "--threads", "1"]) == 0
    result = json.loads(output.read_text())
    assert result["docs"] == 10 and result["words"] == 60 and len(result["rounds"]) == 2
    assert result["shared_words_per_s"] > 0 and result["three_pipelines_words_per_s"] > 0
    assert result["speedup"] == round(result["shared_words_per_s"] / result["three_pipelines_words_per_s"], 2)
    assert "cpu_flags" in result and result["command"].startswith("python -m scripts.multitask_speed")
    assert result["torch_threads"] == 1
