"""The settings of an `annotate` run, each default written once.

`Options` holds what both engines share; `LocalOptions` and `RayOptions` add each
engine's own. The command line takes its defaults from these classes, and the engines
take either an instance or its fields as keywords.
"""
import dataclasses
from typing import Optional

from .records import DEFAULT_MAX_CHARS, UsageError


def _at_least_one(options, names) -> None:
    low = [name for name in names if getattr(options, name) < 1]
    if low:
        flags = ", ".join(flag(name) for name in low)
        got = ", ".join(str(getattr(options, name)) for name in low)
        raise UsageError(f"{flags} must be at least 1, got {got}")


def _quantize_mode(options) -> None:
    from ..settings import QUANTIZE_MODES

    if options.quantize is not None and options.quantize not in QUANTIZE_MODES:
        raise UsageError(f"--quantize {options.quantize!r} is not supported; accepted: {', '.join(QUANTIZE_MODES)}")


def flag(name: str) -> str:
    """The command-line flag of an option: part_size -> --part-size."""
    return "--" + name.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class Options:
    """What both engines share."""

    text_field: str = "text"  # JSONL field / Parquet column of the text
    id_field: str = "id"  # JSONL field / Parquet column of the id; without one, the line or row number
    keep_text: bool = False  # write the text beside the entities
    batch_size: int = 64  # docs per nlp.pipe batch, or per Ray batch
    max_chars: int = DEFAULT_MAX_CHARS  # longer texts go to the errors
    spans_key: str = "ner"  # doc.spans key holding entity scores
    quantize: Optional[str] = None  # the backbones' `quantize` for this run: none | int8 (CPU); None: as saved

    def __post_init__(self):
        _at_least_one(self, ["batch_size"])
        _quantize_mode(self)

    @classmethod
    def own_fields(cls):
        """The names of the fields this class adds to `Options`."""
        shared = {f.name for f in dataclasses.fields(Options)}
        return [f.name for f in dataclasses.fields(cls) if f.name not in shared]


@dataclasses.dataclass(frozen=True)
class LocalOptions(Options):
    part_size: int = 10_000  # records per output part (the unit of resuming)
    n_process: int = 1  # nlp.pipe worker processes
    gpu_id: int = -1  # GPU to run on (-1: CPU)
    progress: bool = True  # a tqdm bar on stderr (not a command-line option)

    def __post_init__(self):
        _at_least_one(self, ["part_size", "batch_size", "n_process"])
        _quantize_mode(self)


@dataclasses.dataclass(frozen=True)
class RayOptions(Options):
    ray_address: Optional[str] = None  # a Ray cluster (None: start a local Ray)
    concurrency: int = 1  # actors, each holding one copy of the pipeline
    num_gpus: float = 0  # GPUs per actor
    num_cpus: float = 1  # CPUs per actor (also its torch threads)

    def __post_init__(self):
        _at_least_one(self, ["concurrency", "batch_size"])
        _quantize_mode(self)


def load_pipeline(pipeline, max_chars: int = DEFAULT_MAX_CHARS, gpu_id: int = -1, quantize: Optional[str] = None):
    """spacy_unmask.load(pipeline) (checked as a pipeline from anyone), on GPU `gpu_id`
    (-1: CPU), accepting texts of `max_chars`, with its decoder backbones' `quantize`
    setting changed at load time (None: as saved)."""
    import spacy

    from ..sharing import load

    if gpu_id >= 0:
        spacy.require_gpu(gpu_id)
    nlp = load(pipeline, **({} if quantize is None else {"quantize": quantize}))
    nlp.max_length = max(nlp.max_length, max_chars)
    return nlp
