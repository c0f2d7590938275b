"""`python -m spacy_unmask download NAME`, `python -m spacy_unmask bench ...`,
`python -m spacy_unmask annotate PIPELINE INPUT OUTPUT` and
`python -m spacy_unmask trim-vocabulary PIPELINE OUTPUT --corpus FILE...`."""
import argparse
import shlex
import sys


def main(argv=None) -> int:
    from .download import REGISTRY_MODELS

    parser = argparse.ArgumentParser(prog="python -m spacy_unmask")
    commands = parser.add_subparsers(dest="command", required=True)
    download = commands.add_parser(
        "download",
        help=f"fetch and convert a registry model ({', '.join(sorted(REGISTRY_MODELS))}) once and print "
        "its directory; for a directory, .gguf file or Hugging Face id, check that it loads and print it",
    )
    download.add_argument("name")
    bench = commands.add_parser("bench", help="words/s of the raw decoder vs the spaCy pipeline, training, memory")
    from .bench import add_arguments

    add_arguments(bench)
    annotate = commands.add_parser(
        "annotate", help="tag a corpus (JSONL, Parquet, .txt folder) into resumable parts, bad records set aside"
    )
    from .annotate.cli import add_arguments as add_annotate_arguments

    add_annotate_arguments(annotate)
    trim = commands.add_parser(
        "trim-vocabulary", help="a copy of a pipeline whose decoder keeps only the pieces of a corpus (smaller, quicker to load)"
    )
    from .trim_cli import add_arguments as add_trim_arguments

    add_trim_arguments(trim)
    args = parser.parse_args(argv)
    args.command_line = "python -m spacy_unmask " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.command == "trim-vocabulary":
        from .trim_cli import run as run_trim

        return run_trim(args)
    if args.command == "annotate":
        from .annotate.cli import run as run_annotate

        return run_annotate(args)
    if args.command == "download":
        if args.name in REGISTRY_MODELS:
            from .download import model_dir

            print(model_dir(args.name, log=lambda msg: print(msg, file=sys.stderr)))
        else:
            from .loading import load_config

            load_config(args.name)  # a clear error if it cannot be loaded or is unsupported
            print(args.name)
        return 0
    from .bench import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
