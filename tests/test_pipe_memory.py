"""scripts/pipe_memory.py: resident memory recorded while documents stream through nlp.pipe."""
import json

from scripts import pipe_memory


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
