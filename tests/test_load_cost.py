"""scripts/load_cost.py: a saved pipeline's size on disk and spacy.load's time and memory."""
import json

from scripts import load_cost


def test_records_size_loads_and_the_embedding_format(tiny_dirs, tmp_path):
    for embedding, loads in (("exact", 2), ("int8", 1)):
        output = tmp_path / "metrics" / "bench" / "load-cost" / f"{embedding}.json"
        args = ["--model", tiny_dirs("llama"), "--dtype", "float32", "--save-embedding", embedding, "--loads", str(loads),
                "--workdir", str(tmp_path / embedding), "--output", str(output)]
        assert load_cost.main(args) == 0
        result = json.loads(output.read_text())
        assert [x["cache"] for x in result["loads"]] == ["cold", "warm"][:loads]
        assert all(x["load_s"] > 0 and x["peak_rss_mib"] > 0 for x in result["loads"])
        assert result["save_embedding"] == embedding and result["pipeline_mib"] > 0
        assert f"embedding {embedding}" in "\n".join(load_cost.summarise([output]))
