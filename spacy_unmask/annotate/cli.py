"""`python -m spacy_unmask annotate PIPELINE INPUT OUTPUT`: the command line.

Its defaults are those of `Options`, `LocalOptions` and `RayOptions`; it refuses the
options of the engine it does not run, and maps the outcome to an exit code.
"""
import dataclasses
import sys
from pathlib import Path

from ..opt_ins import UnsafePipelineError
from ..settings import QUANTIZE_MODES
from .options import LocalOptions, Options, RayOptions, flag
from .output import EXIT_COUNTS_DIFFER, EXIT_USAGE, ERRORS_DIR
from .records import UsageError


def add_arguments(parser) -> None:
    shared, local, ray = Options(), LocalOptions(), RayOptions()
    parser.add_argument("pipeline", help="a pipeline directory (spacy.load)")
    parser.add_argument("input", type=Path, help="a .jsonl file, a .parquet file, or a folder of .txt files")
    parser.add_argument(
        "output", type=Path,
        help="a directory named for its format: *.jsonl, *.parquet, or *.spacy (DocBin, local engine only)",
    )
    parser.add_argument("--engine", choices=("local", "ray"), default="local")
    parser.add_argument(
        "--text-field", default=shared.text_field,
        help=f"JSONL field / Parquet column of the text (default: {shared.text_field})",
    )
    parser.add_argument(
        "--id-field", default=shared.id_field,
        help=f"JSONL field / Parquet column of the id (default: {shared.id_field}); "
        "without one, the line or row number",
    )
    parser.add_argument("--keep-text", action="store_true", default=shared.keep_text,
                        help="write the text beside the entities")
    parser.add_argument("--batch-size", type=int, default=shared.batch_size,
                        help=f"docs per nlp.pipe batch, or per Ray batch (default: {shared.batch_size})")
    parser.add_argument(
        "--max-chars", type=int, default=shared.max_chars,
        help=f"longer texts go to the errors (default {shared.max_chars}, spaCy's nlp.max_length)",
    )
    parser.add_argument("--spans-key", default=shared.spans_key,
                        help=f"doc.spans key holding entity scores (default: {shared.spans_key})")
    parser.add_argument("--quantize", choices=QUANTIZE_MODES, default=shared.quantize,
                        help="the backbone's quantize setting for this run: int8 runs the decoder's linear "
                        "layers in int8 (CPU); default: as the pipeline was saved")
    group = parser.add_argument_group("local engine")
    group.add_argument("--part-size", type=int, default=local.part_size,
                       help=f"records per output part, the unit of resuming (default: {local.part_size})")
    group.add_argument("--n-process", type=int, default=local.n_process, help="nlp.pipe worker processes")
    group.add_argument("--gpu-id", type=int, default=local.gpu_id, help="GPU to run on (-1: CPU)")
    group = parser.add_argument_group("ray engine (pip install 'spacy-unmask[ray]')")
    group.add_argument("--ray-address", default=ray.ray_address, help="a Ray cluster (default: start a local Ray)")
    group.add_argument("--concurrency", type=int, default=ray.concurrency,
                       help="actors, each holding one copy of the pipeline")
    group.add_argument("--num-gpus", type=float, default=ray.num_gpus, help="GPUs per actor (1 on a GPU cluster)")
    group.add_argument("--num-cpus", type=float, default=ray.num_cpus, help="CPUs per actor (also its torch threads)")


def _options(cls, args):
    """`cls` from the parsed arguments: every field the command line has."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)})


def _set_away_from_default(cls, args):
    """The flags of `cls`'s own options that the arguments set to something else than its default."""
    default = cls()
    return [flag(name) for name in cls.own_fields()
            if hasattr(args, name) and getattr(args, name) != getattr(default, name)]


def run(args) -> int:
    from ..cpu import bound_kernel_caches

    bound_kernel_caches()  # a stream of documents: keep memory flat (docs/speed.md)
    try:
        if args.engine == "local":
            refused = _set_away_from_default(RayOptions, args)
            if refused:
                raise UsageError(f"{', '.join(refused)}: settings of --engine ray, not of the local engine")
            from .local import annotate_local

            summary = annotate_local(args.pipeline, args.input, args.output, _options(LocalOptions, args))
        else:
            refused = _set_away_from_default(LocalOptions, args)
            if refused:
                raise UsageError(
                    f"{', '.join(refused)}: settings of the local engine; "
                    "with --engine ray use --concurrency, --num-gpus"
                )
            try:
                from .ray_engine import annotate_ray
            except ModuleNotFoundError as e:
                if e.name is None or e.name.split(".")[0] not in ("ray", "pyarrow"):
                    raise
                raise UsageError(f"--engine ray needs {e.name}: pip install 'spacy-unmask[ray]'") from None

            summary = annotate_ray(args.pipeline, args.input, args.output, _options(RayOptions, args))
    except UsageError as e:
        print(f"annotate: {e}", file=sys.stderr)
        return EXIT_USAGE
    except UnsafePipelineError as e:  # names the field, quotes no content of the pipeline
        print(f"annotate: PIPELINE {str(args.pipeline)!r} was not loaded: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"annotate: {summary}" + (f" (see {args.output / ERRORS_DIR})" if summary.errors else ""))
    if summary.exit_code == EXIT_COUNTS_DIFFER:
        print("annotate: the counts do not add up; OUTPUT is not trustworthy", file=sys.stderr)
    return summary.exit_code
