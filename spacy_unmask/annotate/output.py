"""The rules of OUTPUT, a directory named for its format (`ents.jsonl`, `ents.parquet`
or `ents.spacy`):

    OUTPUT/part-00000.jsonl …           one row per good record: id, entities [, text]
    OUTPUT/_errors/part-00000.jsonl …   one row per bad record: id, line, reason, raw
    OUTPUT/_run.json                    the run record: what decides what the parts hold

Names starting with "_" or "." are skipped by pyarrow, pandas and Ray Data when they
read OUTPUT as a dataset, so they see the annotations only.

Every file name written here is generated (part-<number>, part-<uuid>-<task>), never
taken from the input, and `plain_name` checks each one: no file lands outside OUTPUT.
The run record holds a SHA-256 of the pipeline as loaded (`sharing.loaded_digest`: each
backbone's config, tokenizer and weights as read, an adapter's base as found, the
config and the other weights), so a run resumed with another model (retrained into the
same directory, or an adapter over another base) is refused rather than mixing models.
"""
import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List

from .options import Options
from .records import (
    DEFAULT_MAX_CHARS,
    PathLike,
    UsageError,
    count_input,
    input_fingerprint,
    iter_lines,
    require_pyarrow,
)

# Exit codes of `python -m spacy_unmask annotate` (README, "Annotate a corpus").
EXIT_OK = 0  # every record annotated
EXIT_USAGE = 2  # the command could not start (argparse uses 2 as well)
EXIT_BAD_RECORDS = 3  # finished; some records are in OUTPUT/_errors
EXIT_COUNTS_DIFFER = 4  # finished, but read != written + errors: OUTPUT is not trustworthy

OUTPUT_FORMATS = {".jsonl": "jsonl", ".parquet": "parquet", ".spacy": "spacy"}
ERRORS_DIR = "_errors"
RUN_FILE = "_run.json"


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


# --- rows ------------------------------------------------------------------------------


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


def error_row(record) -> Dict[str, Any]:
    return {"id": record.id, "line": record.line, "reason": record.reason, "raw": record.raw}


def annotation_schema(keep_text: bool):
    pa = require_pyarrow()
    entity = pa.struct(
        [("start_char", pa.int64()), ("end_char", pa.int64()), ("label", pa.string()), ("score", pa.float64())]
    )
    fields = [("id", pa.string()), ("entities", pa.list_(entity))]
    return pa.schema(fields + ([("text", pa.string())] if keep_text else []))


def jsonl_bytes(rows: Iterable[Dict[str, Any]], ensure_ascii: bool = False) -> bytes:
    return "".join(json.dumps(row, ensure_ascii=ensure_ascii) + "\n" for row in rows).encode("utf-8")


def part_bytes(fmt: str, rows: List[Any], keep_text: bool) -> bytes:
    """A data part: rows (docs with user_data["id"] for "spacy") in OUTPUT's format."""
    if fmt == "jsonl":
        return jsonl_bytes(rows)
    if fmt == "spacy":
        from spacy.tokens import DocBin

        return DocBin(docs=rows, store_user_data=True).to_bytes()
    pa = require_pyarrow()
    sink = pa.BufferOutputStream()
    pa.parquet.write_table(pa.Table.from_pylist(rows, schema=annotation_schema(keep_text)), sink)
    return sink.getvalue().to_pybytes()


# --- files -----------------------------------------------------------------------------


def output_format(path: PathLike) -> str:
    fmt = OUTPUT_FORMATS.get(Path(path).suffix)
    if fmt is None:
        raise UsageError(
            f"OUTPUT {str(path)!r}: name it for its format, ending in {', '.join(OUTPUT_FORMATS)} "
            "(it is a directory of parts)"
        )
    return fmt


def plain_name(name: str) -> str:
    """`name`, checked to be a plain file name: written in a folder, it stays in that folder."""
    if (not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name
            or os.sep in name or (os.altsep and os.altsep in name) or os.path.isabs(name)):
        raise ValueError(f"not a plain file name: {name!r}")
    return name


def part_name(index: int, suffix: str) -> str:
    """The local engine's part file: part-00000.jsonl …"""
    return plain_name(f"part-{index:05d}{suffix}")


def atomic_write(path: PathLike, data: bytes) -> None:
    """Write `path` whole or not at all: to a hidden temporary name, then renamed."""
    path = Path(path)
    tmp = path.with_name(f".{plain_name(path.name)}.tmp")
    tmp.unlink(missing_ok=True)  # left by a crash; "xb" then refuses to follow a link planted there
    with tmp.open("xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def data_files(output: PathLike) -> List[Path]:
    output = Path(output)
    suffix = next(s for s, f in OUTPUT_FORMATS.items() if f == output_format(output))
    return sorted(p for p in output.glob(f"*{suffix}") if not p.name.startswith((".", "_")))


def error_files(output: PathLike) -> List[Path]:
    return sorted(p for p in (Path(output) / ERRORS_DIR).glob("*.jsonl") if not p.name.startswith("."))


# --- the run record --------------------------------------------------------------------


def run_record(pipeline: PathLike, nlp, input: PathLike, engine: str, options: Options, fmt: str) -> Dict[str, Any]:
    """What decides the content of OUTPUT; a resumed run must match it. `nlp` is the
    pipeline as loaded from `pipeline`: its digest covers what was read, not the folder."""
    from ..sharing import loaded_digest

    record = {
        "engine": engine,
        "pipeline": str(Path(pipeline).resolve()),
        "pipeline_sha256": loaded_digest(nlp),
        "input": str(Path(input).resolve()),
        "input_fingerprint": input_fingerprint(input),
        "format": fmt,
        "text_field": options.text_field,
        "id_field": options.id_field,
        "keep_text": options.keep_text,
        "max_chars": options.max_chars,
        "spans_key": options.spans_key,
        "quantize": options.quantize,
    }
    if hasattr(options, "part_size"):
        record["part_size"] = options.part_size
    return record


def prepare_output(output: PathLike, record: Dict[str, Any], *, resume: bool) -> None:
    """Create OUTPUT with its run record, or check that a rerun's record is the same."""
    output = Path(output)
    run_file = output / RUN_FILE
    if output.exists() and any(output.iterdir()):
        if not resume:
            raise UsageError(f"OUTPUT {str(output)!r} is not empty; the Ray engine writes a new directory")
        if not run_file.exists():
            raise UsageError(f"OUTPUT {str(output)!r} is not empty and holds no {RUN_FILE}: not a spacy-unmask output")
        previous = json.loads(run_file.read_text())
        changed = sorted(k for k in record.keys() | previous.keys() if previous.get(k) != record.get(k))
        if "pipeline_sha256" in changed and previous.get("pipeline_sha256"):
            raise UsageError(
                f"PIPELINE {record['pipeline']!r} changed since OUTPUT {str(output)!r} was started "
                f"({previous.get('pipeline')!r} loaded as SHA-256 {previous['pipeline_sha256'][:16]}… then, "
                f"SHA-256 {record['pipeline_sha256'][:16]}… now); resuming would mix parts annotated by two models. "
                "Rerun with the pipeline it was started with, or choose a new OUTPUT"
            )
        if changed:
            detail = ", ".join(f"{k}: {previous.get(k)!r} then, {record.get(k)!r} now" for k in changed)
            raise UsageError(
                f"OUTPUT {str(output)!r} was started with other settings ({detail}); resuming would mix parts. "
                "Rerun with the same settings, or choose a new OUTPUT"
            )
        return
    (output / ERRORS_DIR).mkdir(parents=True, exist_ok=True)
    atomic_write(run_file, json.dumps(record, indent=2).encode("utf-8"))


# --- reading OUTPUT back ---------------------------------------------------------------


def read_output(output: PathLike) -> Iterator[Dict[str, Any]]:
    """The annotation rows of OUTPUT (any engine): id, entities [, text]."""
    output = Path(output)
    fmt = output_format(output)
    for path in data_files(output):
        if fmt == "jsonl":
            with path.open("rb") as stream:
                yield from (json.loads(line) for line in iter_lines(stream) if line.strip())
        elif fmt == "parquet":
            yield from require_pyarrow().parquet.read_table(str(path)).to_pylist()
        else:
            import spacy
            from spacy.tokens import DocBin

            vocab = spacy.blank("xx").vocab
            for doc in DocBin().from_bytes(path.read_bytes()).get_docs(vocab):
                yield {"id": doc.user_data.get("id"), "entities": entities(doc), "text": doc.text}


def read_errors(output: PathLike) -> Iterator[Dict[str, Any]]:
    """The bad records of OUTPUT: id, line, reason, raw."""
    for path in error_files(output):
        with path.open("rb") as stream:
            yield from (json.loads(line) for line in iter_lines(stream) if line.strip())


def count_rows(output: PathLike) -> int:
    output = Path(output)
    fmt = output_format(output)
    if fmt == "parquet":
        return sum(require_pyarrow().parquet.ParquetFile(str(p)).metadata.num_rows for p in data_files(output))
    if fmt == "jsonl":
        return sum(_count_lines(p) for p in data_files(output))
    return sum(1 for _ in read_output(output))


def _count_lines(path: Path) -> int:
    with path.open("rb") as stream:
        return sum(1 for line in iter_lines(stream) if line.strip())


def summarize(input: PathLike, output: PathLike, max_chars: int = DEFAULT_MAX_CHARS) -> Summary:
    """Counted from INPUT (as read with `max_chars`) and from the files in OUTPUT, not from
    the run's own tallies."""
    errors = sum(_count_lines(p) for p in error_files(output))
    return Summary(read=count_input(input, max_chars), written=count_rows(output), errors=errors)
