"""`python -m spacy_unmask annotate PIPELINE INPUT OUTPUT`: tag a corpus with a trained pipeline.

INPUT is a JSONL file, a Parquet file, or a folder of `.txt` files. OUTPUT is a
directory named for its format (`ents.jsonl`, `ents.parquet` or `ents.spacy`):

    OUTPUT/part-00000.jsonl …     one row per good record: id, entities [, text]
    OUTPUT/_errors/part-00000.jsonl …   one row per bad record: id, line, reason, raw
    OUTPUT/_run.json              the settings that decide what the parts hold

Names starting with "_" or "." are skipped by pyarrow, pandas and Ray Data when they
read OUTPUT as a dataset, so they see the annotations only.

The local engine writes part i from input records [i * part_size, (i + 1) * part_size),
in input order: first its errors file, then its data file, each to a hidden temporary
name and renamed into place. A part is complete when its data file exists; a rerun of
the same command skips complete parts and rewrites the others, so no record is
written twice. A rerun with settings that change what the parts hold is refused.
The Ray engine (`annotate_ray.py`) shares the readers and the row format below.
"""
import dataclasses
import json
import os
import sys
from collections import deque
from pathlib import Path
from typing import Any, BinaryIO, Dict, Iterable, Iterator, List, Optional

# Exit codes of `python -m spacy_unmask annotate` (README, "Annotate a corpus").
EXIT_OK = 0  # every record annotated
EXIT_USAGE = 2  # the command could not start (argparse uses 2 as well)
EXIT_BAD_RECORDS = 3  # finished; some records are in OUTPUT/_errors
EXIT_COUNTS_DIFFER = 4  # finished, but read != written + errors: OUTPUT is not trustworthy

OUTPUT_FORMATS = {".jsonl": "jsonl", ".parquet": "parquet", ".spacy": "spacy"}
ERRORS_DIR = "_errors"
RUN_FILE = "_run.json"
# spaCy's default nlp.max_length: longer texts would make the pipeline raise.
DEFAULT_MAX_CHARS = 1_000_000
_CHUNK_BYTES = 1 << 20


class UsageError(ValueError):
    """The command cannot start: a setting, the input or OUTPUT is wrong."""


@dataclasses.dataclass
class Record:
    """One input record; `reason` says why it cannot be annotated (None: it can)."""

    id: str
    line: Optional[int]  # JSONL line or Parquet row (1-based); None for a .txt file
    text: Optional[str]
    reason: Optional[str] = None
    raw: Optional[str] = None  # the JSONL line or .txt content of a bad record


@dataclasses.dataclass
class Summary:
    read: int
    written: int
    errors: int

    @property
    def exit_code(self) -> int:
        if self.read != self.written + self.errors:
            return EXIT_COUNTS_DIFFER
        return EXIT_BAD_RECORDS if self.errors else EXIT_OK

    def __str__(self) -> str:
        sign = "=" if self.read == self.written + self.errors else "!="
        return f"read {self.read} {sign} written {self.written} + errors {self.errors}"


# --- reading ---------------------------------------------------------------------------


def input_kind(path: Path) -> str:
    if path.is_dir():
        return "txt"
    if path.suffix == ".parquet":
        return "parquet"
    if path.suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    raise UsageError(
        f"INPUT {str(path)!r}: expected a .jsonl file, a .parquet file or a folder of .txt files"
    )


def safe_text(text: str) -> str:
    """`text`, with lone surrogates (which no UTF-8 writer accepts) as \\udXXX escapes."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def record_id(value: Any, line: Optional[int]) -> str:
    """Ids are written as strings: the input's id as text, else the line or row number."""
    if value is None:
        return str(line)
    return safe_text(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str))


def text_problem(text: Any, field: str, max_chars: int) -> Optional[str]:
    """Why `text` cannot be annotated, or None."""
    if text is None:
        return f"field {field!r} is missing or null"
    if not isinstance(text, str):
        return f"field {field!r} is {_json_type(text)}, not a string"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"field {field!r} is not valid Unicode: lone surrogate at character {e.start}"
    if len(text) > max_chars:
        return f"text has {len(text)} characters, more than --max-chars {max_chars}"
    return None


def _json_type(value: Any) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", list: "an array", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def _lines(stream: BinaryIO) -> Iterator[bytes]:
    """The lines of a binary stream, split at b"\\n" only (JSON strings may hold U+2028)."""
    rest = b""
    while True:
        chunk = stream.read(_CHUNK_BYTES)
        if not chunk:
            break
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        yield from parts
    if rest:
        yield rest


def parse_jsonl_line(raw: bytes, line: int, text_field: str, id_field: str, max_chars: int) -> Optional[Record]:
    """The record on one JSONL line; None for a blank line (not a record)."""
    if line == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark
        raw = raw[3:]
    if not raw.strip():
        return None
    shown = raw.decode("utf-8", "backslashreplace")
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        try:  # the id may still be readable
            data = json.loads(raw.decode("utf-8", "replace"))
            value = data.get(id_field) if isinstance(data, dict) else None
        except ValueError:
            value = None
        reason = f"not valid UTF-8: byte 0x{raw[e.start]:02x} at byte {e.start}"
        return Record(record_id(value, line), line, None, reason, shown)
    try:
        data = json.loads(decoded)
    except ValueError as e:
        reason = f"not JSON: {getattr(e, 'msg', e)} (column {getattr(e, 'colno', '?')})"
        return Record(str(line), line, None, reason, shown)
    if not isinstance(data, dict):
        return Record(str(line), line, None, f"not a JSON object but {_json_type(data)}", shown)
    text = data.get(text_field)
    reason = text_problem(text, text_field, max_chars)
    key = record_id(data.get(id_field), line)
    return Record(key, line, None, reason, shown) if reason else Record(key, line, text)


def jsonl_records(stream: BinaryIO, text_field: str, id_field: str, max_chars: int) -> Iterator[Record]:
    for line, raw in enumerate(_lines(stream), start=1):
        record = parse_jsonl_line(raw, line, text_field, id_field, max_chars)
        if record is not None:
            yield record


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise UsageError(
            "Parquet needs pyarrow: pip install 'spacy-unmask[ray]' (or pip install pyarrow)"
        ) from None
    return pyarrow


def parquet_records(source, text_field: str, id_field: str, max_chars: int) -> Iterator[Record]:
    """Records of a Parquet file (a path or a random-access file); `line` is the row number."""
    pa = _pyarrow()
    parquet = pa.parquet.ParquetFile(source)
    schema = parquet.schema_arrow
    if text_field not in schema.names:
        raise UsageError(f"INPUT has no column {text_field!r} (columns: {schema.names}); choose one with --text-field")
    text_type = schema.field(text_field).type
    if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type) or pa.types.is_binary(text_type)
            or pa.types.is_large_binary(text_type)):
        raise UsageError(
            f"INPUT column {text_field!r} is {text_type}, not a string column; choose one with --text-field"
        )
    columns = [text_field] + ([id_field] if id_field in schema.names else [])
    row = 0
    for batch in parquet.iter_batches(batch_size=4096, columns=columns):
        # As bytes: a string column may still hold invalid UTF-8, which must not stop the run.
        texts = batch.column(text_field).cast(pa.large_binary()).to_pylist()
        ids = batch.column(id_field).to_pylist() if id_field in schema.names else [None] * len(texts)
        for raw, value in zip(texts, ids):
            row += 1
            yield _text_record(raw, record_id(value, row), row, text_field, max_chars)


def _text_record(raw: Optional[bytes], id: str, line: Optional[int], field: str, max_chars: int) -> Record:
    if raw is None:
        return Record(id, line, None, f"field {field!r} is missing or null")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        reason = f"not valid UTF-8: byte 0x{raw[e.start]:02x} at byte {e.start}"
        return Record(id, line, None, reason, raw.decode("utf-8", "backslashreplace"))
    reason = text_problem(text, field, max_chars)
    return Record(id, line, None if reason else text, reason)


def txt_files(folder: Path) -> List[Path]:
    """The .txt files under `folder`, by relative path, skipping names that start with '.' or
    '_' (as Ray Data does when it lists a folder)."""
    names = {p.relative_to(folder).as_posix(): p for p in folder.rglob("*.txt") if p.is_file()}
    return [names[name] for name in sorted(names) if not name.startswith((".", "_"))]


def txt_record(content: bytes, id: str, max_chars: int) -> Record:
    """A .txt file as a record; its id is its path relative to INPUT."""
    return _text_record(content, safe_text(id), None, "text", max_chars)


def iter_records(
    path: Path, text_field: str = "text", id_field: str = "id", max_chars: int = DEFAULT_MAX_CHARS
) -> Iterator[Record]:
    kind = input_kind(path)
    if kind == "jsonl":
        with path.open("rb") as stream:
            yield from jsonl_records(stream, text_field, id_field, max_chars)
    elif kind == "parquet":
        yield from parquet_records(str(path), text_field, id_field, max_chars)
    else:
        for file in txt_files(path):
            yield txt_record(file.read_bytes(), file.relative_to(path).as_posix(), max_chars)


def count_input(path: Path) -> int:
    """How many records INPUT holds (non-blank lines, rows, files), without parsing them."""
    kind = input_kind(path)
    if kind == "jsonl":
        with path.open("rb") as stream:
            return sum(1 for raw in _lines(stream) if raw.strip())
    if kind == "parquet":
        return _pyarrow().parquet.ParquetFile(str(path)).metadata.num_rows
    return len(txt_files(path))


def input_fingerprint(path: Path) -> Dict[str, int]:
    """Size and modification time of INPUT, to refuse resuming on a changed input."""
    files = txt_files(path) if path.is_dir() else [path]
    stats = [f.stat() for f in files]
    return {
        "files": len(files),
        "bytes": sum(s.st_size for s in stats),
        "mtime_ns": max((s.st_mtime_ns for s in stats), default=0),
    }


# --- annotating ------------------------------------------------------------------------


def load_pipeline(pipeline: str, max_chars: int = DEFAULT_MAX_CHARS, gpu_id: int = -1):
    import spacy

    if gpu_id >= 0:
        spacy.require_gpu(gpu_id)
    nlp = spacy.load(pipeline)
    nlp.max_length = max(nlp.max_length, max_chars)
    return nlp


def entities(doc, spans_key: str = "ner") -> List[Dict[str, Any]]:
    """doc.ents as rows; `score` comes from doc.spans[spans_key].attrs["scores"] where the
    component puts one (spaCy's spancat convention), else None."""
    scores = {}
    group = doc.spans.get(spans_key) if spans_key in doc.spans else None
    if group is not None and "scores" in group.attrs:
        for span, score in zip(group, group.attrs["scores"]):
            scores[(span.start_char, span.end_char, span.label_)] = float(score)
    return [
        {
            "start_char": ent.start_char,
            "end_char": ent.end_char,
            "label": ent.label_,
            "score": scores.get((ent.start_char, ent.end_char, ent.label_)),
        }
        for ent in doc.ents
    ]


def annotation_row(id: str, doc, keep_text: bool, spans_key: str) -> Dict[str, Any]:
    row = {"id": id, "entities": entities(doc, spans_key)}
    if keep_text:
        row["text"] = doc.text
    return row


def error_row(record: Record) -> Dict[str, Any]:
    return {"id": record.id, "line": record.line, "reason": record.reason, "raw": record.raw}


def annotation_schema(keep_text: bool):
    pa = _pyarrow()
    entity = pa.struct(
        [("start_char", pa.int64()), ("end_char", pa.int64()), ("label", pa.string()), ("score", pa.float64())]
    )
    fields = [("id", pa.string()), ("entities", pa.list_(entity))]
    return pa.schema(fields + ([("text", pa.string())] if keep_text else []))


# --- writing ---------------------------------------------------------------------------


def output_format(path: Path) -> str:
    fmt = OUTPUT_FORMATS.get(path.suffix)
    if fmt is None:
        raise UsageError(
            f"OUTPUT {str(path)!r}: name it for its format, ending in {', '.join(OUTPUT_FORMATS)} "
            "(it is a directory of parts)"
        )
    return fmt


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def jsonl_bytes(rows: Iterable[Dict[str, Any]], ensure_ascii: bool = False) -> bytes:
    return "".join(json.dumps(row, ensure_ascii=ensure_ascii) + "\n" for row in rows).encode("utf-8")


def prepare_output(output: Path, settings: Dict[str, Any], *, resume: bool) -> None:
    """Create OUTPUT with its _run.json, or check that a rerun uses the same settings."""
    run_file = output / RUN_FILE
    if output.exists() and any(output.iterdir()):
        if not resume:
            raise UsageError(f"OUTPUT {str(output)!r} is not empty; the Ray engine writes a new directory")
        if not run_file.exists():
            raise UsageError(f"OUTPUT {str(output)!r} is not empty and holds no {RUN_FILE}: not a spacy-unmask output")
        previous = json.loads(run_file.read_text())
        changed = sorted(k for k in settings.keys() | previous.keys() if previous.get(k) != settings.get(k))
        if changed:
            detail = ", ".join(f"{k}: {previous.get(k)!r} then, {settings.get(k)!r} now" for k in changed)
            raise UsageError(
                f"OUTPUT {str(output)!r} was started with other settings ({detail}); resuming would mix parts. "
                "Rerun with the same settings, or choose a new OUTPUT"
            )
        return
    (output / ERRORS_DIR).mkdir(parents=True, exist_ok=True)
    _atomic_write(run_file, json.dumps(settings, indent=2).encode("utf-8"))


def data_files(output: Path) -> List[Path]:
    suffix = next(s for s, f in OUTPUT_FORMATS.items() if f == output_format(output))
    return sorted(p for p in output.glob(f"*{suffix}") if not p.name.startswith((".", "_")))


def error_files(output: Path) -> List[Path]:
    return sorted(p for p in (output / ERRORS_DIR).glob("*.jsonl") if not p.name.startswith("."))


def read_output(output: Path) -> Iterator[Dict[str, Any]]:
    """The annotation rows of OUTPUT (any engine): id, entities [, text]."""
    fmt = output_format(output)
    for path in data_files(output):
        if fmt == "jsonl":
            with path.open("rb") as stream:
                yield from (json.loads(line) for line in _lines(stream) if line.strip())
        elif fmt == "parquet":
            yield from _pyarrow().parquet.read_table(str(path)).to_pylist()
        else:
            import spacy
            from spacy.tokens import DocBin

            vocab = spacy.blank("xx").vocab
            for doc in DocBin().from_bytes(path.read_bytes()).get_docs(vocab):
                yield {"id": doc.user_data.get("id"), "entities": entities(doc), "text": doc.text}


def read_errors(output: Path) -> Iterator[Dict[str, Any]]:
    for path in error_files(output):
        with path.open("rb") as stream:
            yield from (json.loads(line) for line in _lines(stream) if line.strip())


def count_rows(output: Path) -> int:
    fmt = output_format(output)
    if fmt == "parquet":
        return sum(_pyarrow().parquet.ParquetFile(str(p)).metadata.num_rows for p in data_files(output))
    if fmt == "jsonl":
        return sum(_count_lines(p) for p in data_files(output))
    return sum(1 for _ in read_output(output))


def _count_lines(path: Path) -> int:
    with path.open("rb") as stream:
        return sum(1 for line in _lines(stream) if line.strip())


def summarize(input: Path, output: Path) -> Summary:
    """Counted from INPUT and from the files in OUTPUT, not from the run's own tallies."""
    errors = sum(_count_lines(p) for p in error_files(output))
    return Summary(read=count_input(input), written=count_rows(output), errors=errors)


@dataclasses.dataclass
class _Part:
    index: int
    records: List[Record]
    rows: List[Any] = dataclasses.field(default_factory=list)


def annotate_local(
    pipeline: str,
    input: Path,
    output: Path,
    *,
    text_field: str = "text",
    id_field: str = "id",
    keep_text: bool = False,
    batch_size: int = 64,
    part_size: int = 10_000,
    max_chars: int = DEFAULT_MAX_CHARS,
    spans_key: str = "ner",
    n_process: int = 1,
    gpu_id: int = -1,
    progress: bool = True,
) -> Summary:
    """Annotate INPUT into the parts of OUTPUT with `nlp.pipe`, skipping complete parts."""
    input, output = Path(input), Path(output)
    fmt = output_format(output)
    input_kind(input)
    if part_size < 1 or batch_size < 1 or n_process < 1:
        raise UsageError(
            f"--part-size, --batch-size and --n-process must be at least 1, got {part_size}, {batch_size}, {n_process}"
        )
    if fmt == "parquet":
        _pyarrow()
    settings = run_settings(pipeline, input, "local", text_field, id_field, keep_text, max_chars, spans_key, fmt)
    settings["part_size"] = part_size
    prepare_output(output, settings, resume=True)
    nlp = load_pipeline(pipeline, max_chars, gpu_id)
    suffix = "." + fmt

    from spacy.util import minibatch
    from tqdm import tqdm

    bar = tqdm(total=count_input(input), unit="doc", desc="annotate", disable=not progress, file=sys.stderr)
    pending: deque = deque()

    def part_path(index: int) -> Path:
        return output / f"part-{index:05d}{suffix}"

    def texts():
        for index, records in enumerate(minibatch(iter_records(input, text_field, id_field, max_chars), part_size)):
            if part_path(index).exists():
                bar.update(len(records))
                continue
            pending.append(_Part(index, records))
            for position, record in enumerate(records):
                if record.reason is None:
                    yield record.text, (index, position)

    def write(part: _Part) -> None:
        errors = [error_row(r) for r in part.records if r.reason is not None]
        if errors:  # before the data file, whose presence marks the part complete
            _atomic_write(output / ERRORS_DIR / f"part-{part.index:05d}.jsonl", jsonl_bytes(errors, ensure_ascii=True))
        _atomic_write(part_path(part.index), _part_bytes(fmt, part.rows, keep_text))
        bar.update(len(errors))

    for doc, (index, position) in nlp.pipe(texts(), as_tuples=True, batch_size=batch_size, n_process=n_process):
        while pending[0].index < index:  # docs come in input order: earlier parts are done
            write(pending.popleft())
        record = pending[0].records[position]
        if fmt == "spacy":
            doc.user_data["id"] = record.id
            pending[0].rows.append(doc)
        else:
            pending[0].rows.append(annotation_row(record.id, doc, keep_text, spans_key))
        bar.update(1)
    while pending:
        write(pending.popleft())
    bar.close()
    return summarize(input, output)


def run_settings(
    pipeline, input: Path, engine, text_field, id_field, keep_text, max_chars, spans_key, fmt
) -> Dict[str, Any]:
    """What decides the content of OUTPUT; a resumed run must match it."""
    return {
        "engine": engine,
        "pipeline": str(Path(pipeline).resolve()),
        "input": str(input.resolve()),
        "input_fingerprint": input_fingerprint(input),
        "format": fmt,
        "text_field": text_field,
        "id_field": id_field,
        "keep_text": keep_text,
        "max_chars": max_chars,
        "spans_key": spans_key,
    }


def _part_bytes(fmt: str, rows: List[Any], keep_text: bool) -> bytes:
    if fmt == "jsonl":
        return jsonl_bytes(rows)
    if fmt == "spacy":
        from spacy.tokens import DocBin

        return DocBin(docs=rows, store_user_data=True).to_bytes()
    pa = _pyarrow()
    sink = pa.BufferOutputStream()
    pa.parquet.write_table(pa.Table.from_pylist(rows, schema=annotation_schema(keep_text)), sink)
    return sink.getvalue().to_pybytes()


# --- command line ----------------------------------------------------------------------


def add_arguments(parser) -> None:
    parser.add_argument("pipeline", help="a pipeline directory (spacy.load)")
    parser.add_argument("input", type=Path, help="a .jsonl file, a .parquet file, or a folder of .txt files")
    parser.add_argument(
        "output", type=Path,
        help="a directory named for its format: *.jsonl, *.parquet, or *.spacy (DocBin, local engine only)",
    )
    parser.add_argument("--engine", choices=("local", "ray"), default="local")
    parser.add_argument("--text-field", default="text", help="JSONL field / Parquet column of the text (default: text)")
    parser.add_argument(
        "--id-field", default="id",
        help="JSONL field / Parquet column of the id (default: id); without one, the line or row number",
    )
    parser.add_argument("--keep-text", action="store_true", help="write the text beside the entities")
    parser.add_argument("--batch-size", type=int, default=64, help="docs per nlp.pipe batch, or per Ray batch")
    parser.add_argument(
        "--max-chars", type=int, default=DEFAULT_MAX_CHARS,
        help=f"longer texts go to the errors (default {DEFAULT_MAX_CHARS}, spaCy's nlp.max_length)",
    )
    parser.add_argument("--spans-key", default="ner", help="doc.spans key holding entity scores (default: ner)")
    local = parser.add_argument_group("local engine")
    local.add_argument("--part-size", type=int, default=10_000, help="records per output part (the unit of resuming)")
    local.add_argument("--n-process", type=int, default=1, help="nlp.pipe worker processes")
    local.add_argument("--gpu-id", type=int, default=-1, help="GPU to run on (-1: CPU)")
    ray = parser.add_argument_group("ray engine (pip install 'spacy-unmask[ray]')")
    ray.add_argument("--ray-address", default=None, help="a Ray cluster (default: start a local Ray)")
    ray.add_argument("--concurrency", type=int, default=1, help="actors, each holding one copy of the pipeline")
    ray.add_argument("--num-gpus", type=float, default=0, help="GPUs per actor (1 on a GPU cluster)")
    ray.add_argument("--num-cpus", type=float, default=1, help="CPUs per actor (also its torch threads)")


def run(args) -> int:
    common = dict(
        text_field=args.text_field, id_field=args.id_field, keep_text=args.keep_text, batch_size=args.batch_size,
        max_chars=args.max_chars, spans_key=args.spans_key,
    )
    try:
        if args.engine == "local":
            refused = [name for name, value, default in (
                ("--ray-address", args.ray_address, None), ("--concurrency", args.concurrency, 1),
                ("--num-gpus", args.num_gpus, 0), ("--num-cpus", args.num_cpus, 1),
            ) if value != default]
            if refused:
                raise UsageError(f"{', '.join(refused)}: settings of --engine ray, not of the local engine")
            summary = annotate_local(
                args.pipeline, args.input, args.output, part_size=args.part_size, n_process=args.n_process,
                gpu_id=args.gpu_id, **common,
            )
        else:
            refused = [name for name, value, default in (
                ("--part-size", args.part_size, 10_000),
                ("--n-process", args.n_process, 1),
                ("--gpu-id", args.gpu_id, -1),
            ) if value != default]
            if refused:
                raise UsageError(
                    f"{', '.join(refused)}: settings of the local engine; "
                    "with --engine ray use --concurrency, --num-gpus"
                )
            from .annotate_ray import annotate_ray

            summary = annotate_ray(
                args.pipeline, args.input, args.output, concurrency=args.concurrency, num_gpus=args.num_gpus,
                num_cpus=args.num_cpus, ray_address=args.ray_address, **common,
            )
    except UsageError as e:
        print(f"annotate: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"annotate: {summary}" + (f" (see {args.output / ERRORS_DIR})" if summary.errors else ""))
    if summary.exit_code == EXIT_COUNTS_DIFFER:
        print("annotate: the counts do not add up; OUTPUT is not trustworthy", file=sys.stderr)
    return summary.exit_code
