"""The readers of `annotate`: INPUT (a JSONL file, a Parquet file or a folder of .txt
files) as a stream of `Record`s, bad ones included with the reason they cannot be
annotated. Both engines read through these functions, so they agree on ids, line
numbers and reasons.
"""
import dataclasses
import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO, Dict, Iterator, List, Optional, Union

PathLike = Union[str, Path]
# spaCy's default nlp.max_length: longer texts would make the pipeline raise.
DEFAULT_MAX_CHARS = 1_000_000
_CHUNK_BYTES = 1 << 20
EXCERPT_BYTES = 1000  # of a bad record, in its error row


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


def input_kind(path: PathLike) -> str:
    """"jsonl", "parquet" or "txt" (a folder), from INPUT's name; UsageError otherwise."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"INPUT {str(path)!r} does not exist")
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
    """Ids are written as strings: the input's id as text, else the line or row number.

    An id is only ever written inside a row, never used as a file name."""
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


@dataclasses.dataclass
class LongLine:
    """A line longer than the reader's limit: only its first EXCERPT_BYTES were kept."""

    head: bytes
    size: int  # bytes, without the newline


def line_limit(max_chars: int) -> int:
    """The most bytes a JSONL line may have: a text of --max-chars characters written as
    JSON escapes (up to 12 bytes a character), and 1 MiB for the other fields."""
    return 12 * max_chars + (1 << 20)


def iter_lines(stream: BinaryIO, limit: Optional[int] = None) -> Iterator[Union[bytes, LongLine]]:
    """The lines of a binary stream, split at b"\\n" only (JSON strings may hold U+2028), in
    linear time however long a line is. A line of more than `limit` bytes is not kept: it
    comes as a `LongLine`, so no more than `limit` bytes and one chunk are ever held."""
    pieces: List[bytes] = []
    size, head = 0, None
    while chunk := stream.read(_CHUNK_BYTES):
        parts = chunk.split(b"\n")
        for i, part in enumerate(parts):
            size += len(part)
            if head is None:
                pieces.append(part)
                if limit is not None and size > limit:
                    head = b"".join(pieces)[:EXCERPT_BYTES]
                    pieces = []
            if i < len(parts) - 1:
                yield b"".join(pieces) if head is None else LongLine(head, size)
                pieces, size, head = [], 0, None
    if size:
        yield b"".join(pieces) if head is None else LongLine(head, size)


def is_record(raw: Union[bytes, LongLine]) -> bool:
    """Whether a line holds a record (blank lines do not)."""
    return isinstance(raw, LongLine) or bool(raw.strip())


def parse_jsonl_line(raw: bytes, line: int, text_field: str, id_field: str, max_chars: int) -> Optional[Record]:
    """The record on one JSONL line; None for a blank line (not a record)."""
    if line == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark
        raw = raw[3:]
    if not raw.strip():
        return None
    shown = excerpt(raw)
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        try:  # the id may still be readable
            data = json.loads(raw.decode("utf-8", "replace"))
            value = data.get(id_field) if isinstance(data, dict) else None
        except (ValueError, RecursionError):
            value = None
        reason = f"not valid UTF-8: byte 0x{raw[e.start]:02x} at byte {e.start}"
        return Record(record_id(value, line), line, None, reason, shown)
    try:
        data = json.loads(decoded)
    except RecursionError:
        return Record(str(line), line, None, "not JSON this reader takes: nested too deeply", shown)
    except ValueError as e:
        reason = f"not JSON: {getattr(e, 'msg', e)} (column {getattr(e, 'colno', '?')})"
        return Record(str(line), line, None, reason, shown)
    if not isinstance(data, dict):
        return Record(str(line), line, None, f"not a JSON object but {_json_type(data)}", shown)
    text = data.get(text_field)
    reason = text_problem(text, text_field, max_chars)
    key = record_id(data.get(id_field), line)
    return Record(key, line, None, reason, shown) if reason else Record(key, line, text)


def excerpt(raw: bytes, size: Optional[int] = None) -> str:
    """What an error row shows of a bad record (of `size` bytes, by default all of `raw`):
    at most EXCERPT_BYTES of it."""
    size = len(raw) if size is None else size
    cut = raw[:EXCERPT_BYTES].decode("utf-8", "backslashreplace")
    return cut if size <= EXCERPT_BYTES else cut + f"… ({size} bytes)"


def jsonl_records(stream: BinaryIO, text_field: str, id_field: str, max_chars: int) -> Iterator[Record]:
    limit = line_limit(max_chars)
    for line, raw in enumerate(iter_lines(stream, limit), start=1):
        if isinstance(raw, LongLine):
            reason = f"line has {raw.size} bytes, more than the {limit} a record of --max-chars {max_chars} may have"
            yield Record(str(line), line, None, reason, excerpt(raw.head, raw.size))
            continue
        try:
            record = parse_jsonl_line(raw, line, text_field, id_field, max_chars)
        except Exception as e:  # one record never stops the run
            record = Record(str(line), line, None, f"cannot be read ({type(e).__name__})", excerpt(raw))
        if record is not None:
            yield record


def require_pyarrow():
    """pyarrow (with pyarrow.parquet), or a UsageError naming the extra that brings it."""
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
    pa = require_pyarrow()
    parquet = pa.parquet.ParquetFile(str(source) if isinstance(source, Path) else source)
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
        return Record(id, line, None, reason, excerpt(raw))
    reason = text_problem(text, field, max_chars)
    return Record(id, line, None if reason else text, reason)


def txt_files(folder: PathLike) -> List[Path]:
    """The .txt files under `folder`, by relative path, skipping names that start with '.' or
    '_' (as Ray Data does when it lists a folder)."""
    folder = Path(folder)
    names = {p.relative_to(folder).as_posix(): p for p in folder.rglob("*.txt") if p.is_file() or p.is_symlink()}
    return [names[name] for name in sorted(names) if not name.startswith((".", "_"))]


def txt_record(content: bytes, id: str, max_chars: int) -> Record:
    """A .txt file as a record; its id is its path relative to INPUT (written in rows only)."""
    return _text_record(content, safe_text(id), None, "text", max_chars)


def read_txt(file: Path, root: Path, max_chars: int) -> Record:
    """The record of a .txt file under `root`: a link (or any other file that is not a
    regular one, anywhere on its path under `root`) is not followed, and a file too long
    for --max-chars is not read; each is an error row."""
    id = file.relative_to(root).as_posix()
    place = root
    for part in file.relative_to(root).parts:
        place = place / part
        if os.path.islink(place):
            return Record(safe_text(id), None, None, "a symbolic link under INPUT: not followed")
    mode = os.lstat(file)
    if not stat.S_ISREG(mode.st_mode):
        return Record(safe_text(id), None, None, "not a regular file: not read")
    if mode.st_size > 4 * max_chars:  # UTF-8 takes at most 4 bytes a character
        return Record(safe_text(id), None, None, f"file has {mode.st_size} bytes, more than --max-chars {max_chars} allows")
    with open(file, "rb", opener=_no_follow) as f:
        return txt_record(f.read(), id, max_chars)


def _no_follow(path, flags):
    return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))


def iter_records(
    path: PathLike, text_field: str = "text", id_field: str = "id", max_chars: int = DEFAULT_MAX_CHARS
) -> Iterator[Record]:
    """Every record of INPUT, in input order."""
    path = Path(path)
    kind = input_kind(path)
    if kind == "jsonl":
        with path.open("rb") as stream:
            yield from jsonl_records(stream, text_field, id_field, max_chars)
    elif kind == "parquet":
        yield from parquet_records(str(path), text_field, id_field, max_chars)
    else:
        for file in txt_files(path):
            yield read_txt(file, path, max_chars)


def count_input(path: PathLike, max_chars: int = DEFAULT_MAX_CHARS) -> int:
    """How many records INPUT holds (non-blank lines, rows, files), without parsing them."""
    path = Path(path)
    kind = input_kind(path)
    if kind == "jsonl":
        with path.open("rb") as stream:
            return sum(1 for raw in iter_lines(stream, line_limit(max_chars)) if is_record(raw))
    if kind == "parquet":
        return require_pyarrow().parquet.ParquetFile(str(path)).metadata.num_rows
    return len(txt_files(path))


def input_fingerprint(path: PathLike) -> Dict[str, int]:
    """Size and modification time of INPUT, to refuse resuming on a changed input."""
    path = Path(path)
    files = txt_files(path) if path.is_dir() else [path]
    stats = [os.lstat(f) for f in files]
    return {
        "files": len(files),
        "bytes": sum(s.st_size for s in stats),
        "mtime_ns": max((s.st_mtime_ns for s in stats), default=0),
    }
