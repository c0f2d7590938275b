"""spacy_unmask/annotate/cli.py: `python -m spacy_unmask annotate`, its defaults and usage errors."""
import argparse
import dataclasses
import os

from annotate_fixtures import corpus, pipeline_dir, write_parquet_corpus  # noqa: F401 (fixtures)
from spacy_unmask.__main__ import main
from spacy_unmask.annotate import EXIT_OK, EXIT_USAGE, LocalOptions, Options, RayOptions
from spacy_unmask.annotate.cli import add_arguments


def test_defaults_come_from_the_options():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["model", "in.jsonl", "out.jsonl"])
    for cls in (Options, LocalOptions, RayOptions):
        for field in dataclasses.fields(cls):
            if field.name != "progress":  # not a command-line option
                assert getattr(args, field.name) == getattr(cls(), field.name), field.name


def test_usage_errors_name_the_setting(pipeline_dir, corpus, tmp_path, capsys):
    path = str(corpus[0])
    assert main(["annotate", pipeline_dir, path, str(tmp_path / "ents.csv")]) == EXIT_USAGE
    assert ".jsonl, .parquet, .spacy" in capsys.readouterr().err
    assert main(["annotate", pipeline_dir, path, str(tmp_path / "a.jsonl"), "--concurrency", "2"]) == EXIT_USAGE
    assert "--concurrency" in capsys.readouterr().err
    argv = ["annotate", pipeline_dir, path, str(tmp_path / "b.jsonl"), "--engine", "ray", "--n-process", "2"]
    assert main(argv) == EXIT_USAGE
    assert "--n-process" in capsys.readouterr().err
    parquet = tmp_path / "c.parquet"
    write_parquet_corpus(parquet, {"a": "Berlin"})
    assert main(["annotate", pipeline_dir, str(parquet), str(tmp_path / "c.jsonl")]) == EXIT_USAGE
    assert "no column 'text'" in capsys.readouterr().err
    assert main(["annotate", pipeline_dir, path, str(tmp_path / "d.jsonl"), "--part-size", "0"]) == EXIT_USAGE
    assert "--part-size must be at least 1, got 0" in capsys.readouterr().err
    assert main(["annotate", str(tmp_path / "nothing"), path, str(tmp_path / "e.jsonl")]) == EXIT_USAGE
    assert "PIPELINE" in capsys.readouterr().err and not (tmp_path / "e.jsonl").exists()
    assert main(["annotate", pipeline_dir, str(tmp_path / "nothing.jsonl"), str(tmp_path / "f.jsonl")]) == EXIT_USAGE
    assert "does not exist" in capsys.readouterr().err


def test_annotate_bounds_the_kernel_caches_before_it_predicts(pipeline_dir, tmp_path, monkeypatch):
    from spacy_unmask.cpu import KERNEL_CACHE_VARIABLES, STREAMING_KERNEL_CACHE

    for variable in KERNEL_CACHE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    records = tmp_path / "in.jsonl"
    records.write_text('{"id": "a", "text": "Peter Blackburn visited Berlin ."}\n', encoding="utf8")
    assert main(["annotate", pipeline_dir, str(records), str(tmp_path / "out.jsonl")]) == EXIT_OK
    assert all(os.environ.get(v) == str(STREAMING_KERNEL_CACHE) for v in KERNEL_CACHE_VARIABLES)
