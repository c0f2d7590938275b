"""The local engine of `annotate`: `nlp.pipe` on this machine, resumable.

Part i holds input records [i * part_size, (i + 1) * part_size), in input order: first
its errors file, then its data file, each written to a hidden temporary name and
renamed into place. A part is complete when its data file exists; a rerun of the same
command skips complete parts and rewrites the others, so no record is written twice.
A rerun whose run record differs (settings, INPUT, or the pipeline as loaded) is refused.
"""
import dataclasses
import sys
from collections import deque
from pathlib import Path
from typing import Any, List, Optional

from .options import LocalOptions, load_pipeline
from .output import (
    ERRORS_DIR,
    Summary,
    annotation_row,
    atomic_write,
    error_row,
    jsonl_bytes,
    output_format,
    part_bytes,
    part_name,
    prepare_output,
    run_record,
    summarize,
)
from .records import PathLike, Record, count_input, input_kind, iter_records, require_pyarrow


@dataclasses.dataclass
class _Part:
    index: int
    records: List[Record]
    rows: List[Any] = dataclasses.field(default_factory=list)


def annotate_local(
    pipeline: PathLike, input: PathLike, output: PathLike, options: Optional[LocalOptions] = None, **fields
) -> Summary:
    """Annotate INPUT into the parts of OUTPUT with `nlp.pipe`, skipping complete parts.

    `options`, or its fields as keywords (`part_size=5`), or both (keywords win)."""
    input, output = Path(input), Path(output)
    options = dataclasses.replace(options or LocalOptions(), **fields)
    fmt = output_format(output)
    input_kind(input)
    if fmt == "parquet":
        require_pyarrow()
    nlp = load_pipeline(str(pipeline), options.max_chars, options.gpu_id, options.quantize)
    prepare_output(output, run_record(pipeline, nlp, input, "local", options, fmt), resume=True)
    suffix = "." + fmt

    from spacy.util import minibatch
    from tqdm import tqdm

    bar = tqdm(total=count_input(input, options.max_chars), unit="doc", desc="annotate", disable=not options.progress, file=sys.stderr)
    pending: deque = deque()

    def part_path(index: int) -> Path:
        return output / part_name(index, suffix)

    def texts():
        records = iter_records(input, options.text_field, options.id_field, options.max_chars)
        for index, part in enumerate(minibatch(records, options.part_size)):
            if part_path(index).exists():
                bar.update(len(part))
                continue
            pending.append(_Part(index, part))
            for position, record in enumerate(part):
                if record.reason is None:
                    yield record.text, (index, position)

    def write(part: _Part) -> None:
        errors = [error_row(r) for r in part.records if r.reason is not None]
        if errors:  # before the data file, whose presence marks the part complete
            atomic_write(output / ERRORS_DIR / part_name(part.index, ".jsonl"), jsonl_bytes(errors, ensure_ascii=True))
        atomic_write(part_path(part.index), part_bytes(fmt, part.rows, options.keep_text))
        bar.update(len(errors))

    docs = nlp.pipe(texts(), as_tuples=True, batch_size=options.batch_size, n_process=options.n_process)
    for doc, (index, position) in docs:
        while pending[0].index < index:  # docs come in input order: earlier parts are done
            write(pending.popleft())
        record = pending[0].records[position]
        if fmt == "spacy":
            doc.user_data["id"] = record.id
            pending[0].rows.append(doc)
        else:
            pending[0].rows.append(annotation_row(record.id, doc, options.keep_text, options.spans_key))
        bar.update(1)
    while pending:
        write(pending.popleft())
    bar.close()
    return summarize(input, output, options.max_chars)
