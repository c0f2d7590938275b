"""scripts/pipe_memory.py: resident memory recorded while documents stream through nlp.pipe."""
import json

from scripts import pipe_memory
from spacy_unmask.cpu import KERNEL_CACHE_VARIABLES


def test_records_memory_every_n_documents(tiny_dirs, tmp_path):
    data = tmp_path / "texts.txt"
    data.write_text("Peter visited Berlin .\n\nEU rejects German call .\n", encoding="utf8")
    output = tmp_path / "memory.json"
    args = ["--model", tiny_dirs("llama"), "--data", str(data), "--n-docs", "50", "--every", "20",
            "--batch-size", "8", "--output", str(output)]
    assert pipe_memory.main(args) == 0
    result = json.loads(output.read_text())
    assert [r["docs"] for r in result["records"]] == [20, 40, 50]
    assert result["distinct_texts"] == 2 and result["n_docs"] == 50
    assert all(r["rss_mib"] > 0 for r in result["records"])
    assert result["growth"] == round(result["rss_mib_last"] / result["rss_mib_first"] - 1, 4)


def test_shrunk_decoder_keeps_the_tokenizer_and_the_cache_setting_is_recorded(tiny_dirs, tmp_path, monkeypatch):
    import transformers

    for variable in KERNEL_CACHE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    model = tiny_dirs("llama")
    folder = tmp_path / "shrunk"
    folder.mkdir()
    pipe_memory.shrunk(model, folder)
    config = transformers.AutoConfig.from_pretrained(folder)
    assert (config.num_hidden_layers, config.hidden_size) == (2, 64)
    ours, theirs = (transformers.AutoTokenizer.from_pretrained(p) for p in (folder, model))
    assert ours("Peter visited Berlin .")["input_ids"] == theirs("Peter visited Berlin .")["input_ids"]

    data = tmp_path / "texts.txt"
    data.write_text("Peter visited Berlin .\n", encoding="utf8")
    output = tmp_path / "metrics" / "bench" / "pipe-memory.json"
    args = ["--model", model, "--shrink", "--onednn-cache", "64", "--data", str(data), "--n-docs", "4",
            "--every", "2", "--batch-size", "2", "--output", str(output)]
    assert pipe_memory.main(args) == 0
    result = json.loads(output.read_text())
    assert result["environment"] == {variable: "64" for variable in KERNEL_CACHE_VARIABLES}
    assert result["model"].startswith("random 2-layer, 64-wide decoder")
    assert result["dtype"] in ("float32", "bfloat16")
    assert "| 4 |" in "\n".join(pipe_memory.summarise([output]))
