"""`annotate --engine ray`: the same records, rows and errors as the local engine, on Ray Data.

    read (record_source, per file or files) ──────┬─ bad records ─→ write_json(OUTPUT/_errors)
                                                  └─ good records ─→ map_batches(PipelineAnnotator,
                                                       actors) ─→ write_json / write_parquet(OUTPUT)

Records are read by datasources around the local engine's readers, not by read_json /
read_text / read_parquet: read_json fails the whole job on one line that is not JSON,
read_text fails it on one invalid UTF-8 byte and splits at U+2028 inside JSON strings,
none of them gives line or row numbers, which are the ids of records without one, and
they follow links. A JSONL or Parquet file is read by a FileBasedDatasource (the base of
Ray Data's own readers); a folder of .txt files by the local engine's file list and
reader (`txt_files`, `read_txt`).
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
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional

import pyarrow as pa
import pyarrow.compute as pc
import ray
import ray.data
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, FileBasedDatasource, FilenameProvider, ReadTask

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
from .records import PathLike, Record, UsageError, input_kind, jsonl_records, parquet_records, read_txt, txt_files

RECORD_SCHEMA = pa.schema(
    [("id", pa.string()), ("line", pa.int64()), ("text", pa.string()), ("reason", pa.string()), ("raw", pa.string())]
)
_RECORDS_PER_BLOCK = 1000
# CPUs reserved by each read, filter and write task: they are light, and must still find
# room beside actors that reserve the rest (a 2-CPU Ray with two 1-CPU actors hangs).
LIGHT_TASK_CPUS = 0.25


def record_blocks(records: Iterable[Record]) -> Iterator[pa.Table]:
    """Records as blocks of RECORD_SCHEMA, of at most _RECORDS_PER_BLOCK each."""
    block = []
    for record in records:
        block.append(record.__dict__)
        if len(block) == _RECORDS_PER_BLOCK:
            yield pa.Table.from_pylist(block, schema=RECORD_SCHEMA)
            block = []
    if block:
        yield pa.Table.from_pylist(block, schema=RECORD_SCHEMA)


class RecordSource(FileBasedDatasource):
    """A JSONL or Parquet INPUT as blocks of records (RECORD_SCHEMA), bad ones included
    with their reason."""

    def __init__(self, path: PathLike, *, text_field: str, id_field: str, max_chars: int):
        path = Path(path)
        self.kind = input_kind(path)
        self.fields = (text_field, id_field, max_chars)
        super().__init__(str(path.resolve()))

    def _open_input_source(self, filesystem, path: str, **open_args):
        if self.kind == "parquet":  # Parquet needs random access
            return filesystem.open_input_file(path)
        return super()._open_input_source(filesystem, path, **open_args)

    def _read_stream(self, f, path: str):
        reader = jsonl_records if self.kind == "jsonl" else parquet_records
        yield from record_blocks(reader(f, *self.fields))


class TxtSource(Datasource):
    """A folder of .txt files as blocks of records: the files the local engine reads
    (`txt_files`), each read by `read_txt` (links are not followed out of INPUT, and a
    file too long is not read: each is an error row), a few files per read task."""

    def __init__(self, path: PathLike, *, max_chars: int):
        self.root = Path(path)
        self.files = txt_files(self.root)
        self.max_chars = max_chars

    def estimate_inmemory_data_size(self) -> Optional[int]:
        return None

    def get_read_tasks(self, parallelism: int, per_task_row_limit=None, data_context=None) -> List[ReadTask]:
        tasks, root, max_chars = [], self.root, self.max_chars
        size = max(1, -(-len(self.files) // max(1, parallelism)))
        for start in range(0, len(self.files), size):
            files = self.files[start:start + size]

            def read(files=files):  # ships its own files only, not the whole list
                return record_blocks(read_txt(file, root, max_chars) for file in files)

            metadata = BlockMetadata(num_rows=len(files), size_bytes=None, exec_stats=None, input_files=None)
            tasks.append(ReadTask(read, metadata, per_task_row_limit=per_task_row_limit))
        return tasks


def record_source(path: PathLike, *, text_field: str, id_field: str, max_chars: int) -> Datasource:
    if input_kind(path) == "txt":
        return TxtSource(path, max_chars=max_chars)
    return RecordSource(path, text_field=text_field, id_field=id_field, max_chars=max_chars)


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
    # Loaded here once, before any actor starts: a damaged or hostile pipeline is refused
    # at once, and the run record holds the digest of what was loaded.
    nlp = load_pipeline(str(pipeline), options.max_chars, -1, options.quantize)
    prepare_output(output, run_record(pipeline, nlp, input, "ray", options, fmt), resume=False)
    del nlp
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
    source = record_source(input, text_field=options.text_field, id_field=options.id_field, max_chars=options.max_chars)
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
    return summarize(input, output, options.max_chars)
