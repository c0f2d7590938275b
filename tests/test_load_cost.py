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


def test_measures_a_saved_pipeline_as_it_is(tiny_dirs, tmp_path):
    from tiny_models import make_pipeline

    nlp = make_pipeline(tiny_dirs("llama"), save_embedding="int8")
    nlp.get_pipe("ner").add_label("PER")
    nlp.initialize()
    nlp.to_disk(tmp_path / "pipeline")
    before = {p: p.read_bytes() for p in (tmp_path / "pipeline").rglob("*") if p.is_file()}
    output = tmp_path / "metrics" / "saved.json"
    args = ["--pipeline", str(tmp_path / "pipeline"), "--loads", "1", "--workdir", str(tmp_path / "work"),
            "--output", str(output)]
    assert load_cost.main(args) == 0
    result = json.loads(output.read_text())
    assert result["pipeline"] == str(tmp_path / "pipeline") and result["save_embedding"] == "int8"
    assert result["embedding_rows"] == 320 and result["dtype"] == "float32"
    assert {p: p.read_bytes() for p in (tmp_path / "pipeline").rglob("*") if p.is_file()} == before
    assert "embedding rows 320" in "\n".join(load_cost.summarise([output]))


def test_loads_as_an_install_without_a_package_would(tiny_dirs, tmp_path):
    import pytest

    args = ["--model", tiny_dirs("llama"), "--dtype", "float32", "--loads", "1", "--workdir", str(tmp_path / "work")]
    output = tmp_path / "metrics" / "without-bnb.json"
    assert load_cost.main(args + ["--without", "bitsandbytes", "--output", str(output)]) == 0
    assert json.loads(output.read_text())["without"] == ["bitsandbytes"]
    assert "without bitsandbytes" in "\n".join(load_cost.summarise([output]))
    with pytest.raises(SystemExit, match="peft") as info:  # the loader needs peft: the load fails, saying so
        load_cost.main(args + ["--without", "peft", "--output", str(tmp_path / "without-peft.json")])
    assert "Error: import of peft halted" in str(info.value) and "hostile" not in str(info.value)
