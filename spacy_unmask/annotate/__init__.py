"""`python -m spacy_unmask annotate PIPELINE INPUT OUTPUT`: tag a corpus with a trained pipeline.

    records.py     the readers: INPUT (JSONL, Parquet, a folder of .txt) as Records
    output.py      the rules of OUTPUT: parts, atomic writes, the run record, reading back
    options.py     the settings both engines share, and each engine's own, defaults once
    local.py       the local engine (nlp.pipe, resumable)
    ray_engine.py  the Ray Data engine (imported only by the command line, or on demand here)
    cli.py         the command line

The engines import records, output and options; only cli imports the engines.
"""
from .options import LocalOptions, Options, RayOptions, load_pipeline
from .output import (
    ERRORS_DIR,
    EXIT_BAD_RECORDS,
    EXIT_COUNTS_DIFFER,
    EXIT_OK,
    EXIT_USAGE,
    RUN_FILE,
    Summary,
    count_rows,
    entities,
    read_errors,
    read_output,
    summarize,
)
from .records import DEFAULT_MAX_CHARS, Record, UsageError, count_input, iter_records, jsonl_records

__all__ = [
    "DEFAULT_MAX_CHARS", "ERRORS_DIR", "EXIT_BAD_RECORDS", "EXIT_COUNTS_DIFFER", "EXIT_OK", "EXIT_USAGE",
    "LocalOptions", "Options", "RayOptions", "Record", "RUN_FILE", "Summary", "UsageError",
    "annotate_local", "count_input", "count_rows", "entities", "iter_records", "jsonl_records",
    "load_pipeline", "read_errors", "read_output", "summarize",
]


def __getattr__(name):
    # The engines load on demand: nothing here imports them (ray_engine needs ray and pyarrow).
    if name == "annotate_local":
        from .local import annotate_local

        return annotate_local
    if name == "annotate_ray":
        from .ray_engine import annotate_ray

        return annotate_ray
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
