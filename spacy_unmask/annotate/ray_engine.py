"""`annotate --engine ray`: the same records, rows and errors as the local engine, on Ray Data.

    read (RecordSource, one read task per file) ──┬─ bad records ─→ write_json(OUTPUT/_errors)
                                                  └─ good records ─→ map_batches(PipelineAnnotator,
                                                       actors) ─→ write_json / write_parquet(OUTPUT)

Records are read by a FileBasedDatasource (the base of Ray Data's own read_json and
read_text) around the local engine's readers, not by read_json / read_text /
read_parquet: read_json fails the whole job on one line that is not JSON, read_text
fails it on one invalid UTF-8 byte and splits at U+2028 inside JSON strings, and none
of them gives line or row numbers, which are the ids of records without one.
Each write executes the plan once, so the input is read (and parsed, cheaply) twice;
only good records reach the actors.

Faults: an actor that dies is restarted and its batch retried (Ray Data's actor pools
default to max_restarts=-1, max_task_retries=-1: without limit, so a record that kills
every process it meets would be retried forever; --max-chars bounds the text size). A
batch's rows reach the writer only when its task succeeds, so each id is written once.
A run is not resumable: OUTPUT must be new.

Only the command line imports this module (it needs pyarrow and ray).
"""
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Dict, Optional

import pyarrow as pa
import pyarrow.compute as pc
import ray
import ray.data
from ray.data.datasource import FileBasedDatasource, FilenameProvider

from .options import RayOptions, load_pipeline
from .output import (
    ERRORS_DIR,
    Summary,
    annotation_row,
    annotation_schema,
    output_format,
    plain_name,
    prepare_output,
    run_record,
    summarize,
)
from .records import PathLike, UsageError, input_kind, jsonl_records, parquet_records, txt_record

RECORD_SCHEMA = pa.schema(
    [("id", pa.string()), ("line", pa.int64()), ("text", pa.string()), ("reason", pa.string()), ("raw", pa.string())]
)
_RECORDS_PER_BLOCK = 1000
# CPUs reserved by each read, filter and write task: they are light, and must still find
# room beside actors that reserve the rest (a 2-CPU Ray with two 1-CPU actors hangs).
LIGHT_TASK_CPUS = 0.25


class RecordSource(FileBasedDatasource):
    """INPUT as blocks of records (RECORD_SCHEMA), bad ones included with their reason."""

    def __init__(self, path: PathLike, *, text_field: str, id_field: str, max_chars: int):
        path = Path(path)
        self.kind = input_kind(path)
        self.root = str(path.resolve())
        self.fields = (text_field, id_field, max_chars)
        super().__init__(self.root, file_extensions=["txt"] if self.kind == "txt" else None)

    def _open_input_source(self, filesystem, path: str, **open_args):
        if self.kind == "parquet":  # Parquet needs random access
            return filesystem.open_input_file(path)
        return super()._open_input_source(filesystem, path, **open_args)

    def _read_stream(self, f, path: str):
        text_field, id_field, max_chars = self.fields
        if self.kind == "jsonl":
            records = jsonl_records(f, text_field, id_field, max_chars)
        elif self.kind == "parquet":
            records = parquet_records(f, text_field, id_field, max_chars)
        else:
            records = iter([txt_record(f.readall(), os.path.relpath(path, self.root).replace(os.sep, "/"), max_chars)])
        block = []
        for record in records:
            block.append(record.__dict__)
            if len(block) == _RECORDS_PER_BLOCK:
                yield pa.Table.from_pylist(block, schema=RECORD_SCHEMA)
                block = []
        if block:
            yield pa.Table.from_pylist(block, schema=RECORD_SCHEMA)


def good_records(batch: pa.Table) -> pa.Table:
    return batch.filter(pc.is_null(batch["reason"])).select(["id", "text"])


def bad_records(batch: pa.Table) -> pa.Table:
    return batch.filter(pc.is_valid(batch["reason"])).select(["id", "line", "reason", "raw"])


class PipelineAnnotator:
    """Loads the pipeline once per actor; annotates batches of good records."""

    def __init__(self, pipeline: str, *, keep_text: bool, spans_key: str, max_chars: int, use_gpu: bool,
                 num_threads: int = 1, quantize=None):
        import torch

        torch.set_num_threads(num_threads)  # the actor's CPUs, whatever OMP_NUM_THREADS the driver had
        self.nlp = load_pipeline(pipeline, max_chars, 0 if use_gpu else -1, quantize)  # Ray sets CUDA_VISIBLE_DEVICES
        self.keep_text = keep_text
        self.spans_key = spans_key
        self.schema = annotation_schema(keep_text)

    def __call__(self, batch: pa.Table) -> pa.Table:
        ids = batch.column("id").to_pylist()
        docs = self.nlp.pipe(batch.column("text").to_pylist(), batch_size=len(ids))
        rows = [annotation_row(id, doc, self.keep_text, self.spans_key) for id, doc in zip(ids, docs)]
        return pa.Table.from_pylist(rows, schema=self.schema)


class _PartNames(FilenameProvider):
    """part-<write uuid>-<task>.jsonl|parquet, as the local engine's part-<index> files."""

    def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
        return plain_name(f"part-{write_uuid}-{task_index:06d}.{self.file_format}")


def annotate_ray(
    pipeline: PathLike,
    input: PathLike,
    output: PathLike,
    options: Optional[RayOptions] = None,
    *,
    annotator: type = PipelineAnnotator,
    **fields,
) -> Summary:
    """Annotate INPUT into OUTPUT on Ray Data (a local Ray unless `ray_address` is given).

    `options`, or its fields as keywords, or both (keywords win). `annotator` is the
    actor class: PipelineAnnotator or a subclass taking the same arguments."""
    input, output = Path(input), Path(output)
    options = dataclasses.replace(options or RayOptions(), **fields)
    fmt = output_format(output)
    if fmt == "spacy":
        raise UsageError("OUTPUT *.spacy (DocBin) is written by the local engine only; use *.jsonl or *.parquet")
    prepare_output(output, run_record(pipeline, input, "ray", options, fmt), resume=False)
    if not ray.is_initialized():
        ray.init(address=options.ray_address)
    spare = ray.cluster_resources().get("CPU", 0) - options.concurrency * options.num_cpus
    if spare < LIGHT_TASK_CPUS:
        print(
            f"annotate: warning: {options.concurrency} actors x --num-cpus {options.num_cpus} leave {spare:g} CPUs "
            f"of this Ray for reading and writing ({LIGHT_TASK_CPUS} each); unless the cluster grows, the job "
            "waits forever",
            file=sys.stderr,
        )
    light = {"num_cpus": LIGHT_TASK_CPUS}
    source = RecordSource(
        input, text_field=options.text_field, id_field=options.id_field, max_chars=options.max_chars
    )
    records = ray.data.read_datasource(source, num_cpus=LIGHT_TASK_CPUS)
    records.map_batches(bad_records, batch_format="pyarrow", **light).write_json(
        str(output / ERRORS_DIR), filename_provider=_PartNames(file_format="jsonl"), ray_remote_args=light,
        force_ascii=True,
    )
    constructor: Dict[str, Any] = dict(
        pipeline=str(Path(pipeline).resolve()), keep_text=options.keep_text, spans_key=options.spans_key,
        max_chars=options.max_chars, use_gpu=options.num_gpus > 0, num_threads=max(1, round(options.num_cpus)),
        quantize=options.quantize,
    )
    annotated = records.map_batches(good_records, batch_format="pyarrow", **light).map_batches(
        annotator,
        fn_constructor_kwargs=constructor,
        batch_size=options.batch_size,
        batch_format="pyarrow",
        concurrency=options.concurrency,
        num_gpus=options.num_gpus,
        num_cpus=options.num_cpus,
        # Fault tolerance is Ray Data's default for actor pools: max_restarts=-1 and
        # max_task_retries=-1 (a dead actor is replaced and its batch retried, without limit).
    )
    if fmt == "jsonl":
        annotated.write_json(
            str(output), filename_provider=_PartNames(file_format="jsonl"), ray_remote_args=light,
            force_ascii=False, double_precision=15,
        )
    else:
        annotated.write_parquet(str(output), filename_provider=_PartNames(file_format="parquet"), ray_remote_args=light)
    return summarize(input, output)
