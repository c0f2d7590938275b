"""spacy_unmask/annotate/ray_engine.py: `--engine ray` against the local engine, on one
local Ray (2 CPUs) shared by the tests of this module."""
import os
import signal

import pytest

from annotate_fixtures import (  # noqa: F401 (fixtures)
    MAX_CHARS,
    check_errors,
    corpus,
    errors_of,
    expected_spans,
    nlp,
    pipeline_dir,
    spans_of,
    write_parquet_corpus,
    write_txt_corpus,
)
from spacy_unmask.__main__ import main
from spacy_unmask.annotate import EXIT_BAD_RECORDS, annotate_local, read_errors, read_output

pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


def test_ray_equals_local_record_for_record(local_ray, pipeline_dir, nlp, corpus, tmp_path, capsys):
    path, good, bad, read = corpus
    output = tmp_path / "ents.jsonl"
    argv = ["annotate", pipeline_dir, str(path), str(output), "--engine", "ray", "--concurrency", "2",
            "--num-cpus", "0.5", "--batch-size", "4", "--max-chars", str(MAX_CHARS)]
    assert main(argv) == EXIT_BAD_RECORDS
    assert f"read {read} = written {len(good)} + errors {len(bad)}" in capsys.readouterr().out
    local = tmp_path / "local.jsonl"
    annotate_local(pipeline_dir, path, local, max_chars=MAX_CHARS, progress=False)
    ray_rows = {row["id"]: row["entities"] for row in read_output(output)}
    local_rows = {row["id"]: row["entities"] for row in read_output(local)}
    assert spans_of(read_output(output)) == spans_of(read_output(local)) == expected_spans(nlp, good)
    for id, ents in local_rows.items():
        # Actors batch (and so pack) docs differently: float32 sums round differently, ~1e-6.
        assert [e["score"] for e in ray_rows[id]] == pytest.approx([e["score"] for e in ents], abs=1e-4)
    check_errors(output, bad)
    assert sorted(read_errors(output), key=lambda e: e["line"]) == sorted(read_errors(local), key=lambda e: e["line"])


def test_ray_parquet_and_txt_input(local_ray, pipeline_dir, nlp, corpus, tmp_path):
    from spacy_unmask.annotate.ray_engine import annotate_ray

    _, good, _, _ = corpus
    want = expected_spans(nlp, good)
    parquet = tmp_path / "corpus.parquet"
    write_parquet_corpus(parquet, good)
    output = tmp_path / "ents.parquet"
    summary = annotate_ray(pipeline_dir, str(parquet), str(output), text_field="body", id_field="key", batch_size=8)
    assert (summary.read, summary.written, summary.errors) == (len(good) + 2, len(good), 2)
    assert spans_of(read_output(output)) == want
    assert [e[0] for e in errors_of(output)] == ["bad-bytes", "null-text"]

    folder = tmp_path / "texts"
    texts = write_txt_corpus(folder, good)
    output = tmp_path / "txt.jsonl"
    summary = annotate_ray(pipeline_dir, folder, output, keep_text=True)
    assert (summary.read, summary.written, summary.errors) == (len(texts) + 1, len(texts), 1)
    rows = list(read_output(output))
    assert {row["id"]: row["text"] for row in rows} == texts
    by_text = {good[id]: spans for id, spans in want.items()}
    assert spans_of(rows) == {name: by_text[text] for name, text in texts.items()}


def test_ray_killed_actor_is_restarted_and_each_id_written_once(local_ray, pipeline_dir, nlp, corpus, tmp_path):
    from spacy_unmask.annotate.ray_engine import PipelineAnnotator, annotate_ray

    path, good, bad, _ = corpus
    marker = str(tmp_path / "killed")

    class KillOnce(PipelineAnnotator):
        """The first actor to reach its second batch creates `marker` and kills its own
        process (SIGKILL); the restarted actors find the marker and carry on. Defined in
        the test, so Ray ships the class by value."""

        batches = 0

        def __call__(self, batch):
            self.batches += 1
            if self.batches == 2:
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
                    os.kill(os.getpid(), signal.SIGKILL)
                except FileExistsError:
                    pass
            return super().__call__(batch)

    output = tmp_path / "ents.jsonl"
    summary = annotate_ray(pipeline_dir, path, output, batch_size=3, max_chars=MAX_CHARS, annotator=KillOnce)
    assert os.path.exists(marker), "no actor killed itself: the test tested nothing"
    assert (summary.written, summary.errors) == (len(good), len(bad))
    assert spans_of(read_output(output)) == expected_spans(nlp, good)


def test_ray_does_not_follow_links_out_of_a_txt_folder(local_ray, pipeline_dir, tmp_path):
    """The same files, reasons and rows as the local engine: a link is an error row naming
    it, a file too long is not read, and nothing they point at reaches OUTPUT."""
    from spacy_unmask.annotate.ray_engine import annotate_ray

    secret = tmp_path / "secret.txt"
    secret.write_text("secret-value")
    folder = tmp_path / "texts"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("Peter Blackburn visited Brussels .")
    (folder / "link.txt").symlink_to(secret)
    (folder / "environ.txt").symlink_to("/proc/self/environ")
    (folder / "linked-dir").symlink_to(tmp_path, target_is_directory=True)
    with (folder / "sub" / "huge.txt").open("wb") as f:
        f.truncate(1 << 30)  # sparse
    outputs = {"ray": tmp_path / "ray.jsonl", "local": tmp_path / "local.jsonl"}
    summary = annotate_ray(pipeline_dir, folder, outputs["ray"], keep_text=True, max_chars=MAX_CHARS)
    annotate_local(pipeline_dir, folder, outputs["local"], keep_text=True, max_chars=MAX_CHARS, progress=False)
    assert (summary.read, summary.written, summary.errors) == (4, 1, 3)
    errors = {e["id"]: e["reason"] for e in read_errors(outputs["ray"])}
    assert sorted(errors) == ["environ.txt", "link.txt", "sub/huge.txt"]
    assert "symbolic link" in errors["link.txt"] and "symbolic link" in errors["environ.txt"]
    assert "more than --max-chars" in errors["sub/huge.txt"]
    assert errors == {e["id"]: e["reason"] for e in read_errors(outputs["local"])}
    assert [row["id"] for row in read_output(outputs["ray"])] == ["a.txt"]
    written = b"".join(p.read_bytes() for p in outputs["ray"].rglob("*") if p.is_file())
    assert b"secret-value" not in written and b"PATH=" not in written
