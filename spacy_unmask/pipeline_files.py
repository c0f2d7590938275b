"""A pipeline folder from someone else, checked before anything in it is read.

`check_folder` walks a folder with `lstat` (a link is never followed): it must hold
only folders and regular files (no links, FIFOs, sockets or devices), each file within
its size bound, and a bounded number of entries. `spacy_unmask.load` (sharing.py)
checks the whole pipeline folder and its config this way before `spacy.load` reads
it, and `spacy_unmask.save` the folder it saves into; `unmask_ner` checks its own
folder again whenever spaCy hands it one (so a plain `spacy.load` is covered for its
files), and refuses to save through a link.
"""
import os
import stat
from pathlib import Path

from .opt_ins import UnsafePipelineError

MAX_ENTRIES = 10_000
MAX_DEPTH = 8
# Files read whole as text or JSON (spaCy's config.cfg and meta.json, a component's cfg).
SMALL_FILES = ("config.cfg", "meta.json", "cfg")
SMALL_BYTES = 16 << 20
# spaCy writes each component's model as one msgpack value, which holds less than 4 GiB.
MAX_BYTES = 1 << 32
# Registries whose functions read or run what is outside the folder; a shared config may
# not call them while it is loaded.
REFUSED_REGISTRIES = ("@readers", "@callbacks", "@loggers")
_DONE = {"read from": "read", "saved into": "written"}


def check_folder(path, action: str = "read from") -> None:
    """Refuse a folder holding anything but folders and regular files of bounded size
    (`action`: "read from" or "saved into", for the message). The folder `path` itself
    may be a link: the caller named it."""
    root = Path(path)
    try:
        is_dir = stat.S_ISDIR(os.stat(root).st_mode)
    except OSError:
        is_dir = False
    if not is_dir:
        raise UnsafePipelineError(f"{str(root)!r} is not a folder that can be {action} (a saved pipeline is a folder)")
    pending, seen = [(root, 0)], 0
    while pending:
        folder, depth = pending.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                seen += 1
                where = Path(entry.path).relative_to(root).as_posix()
                if seen > MAX_ENTRIES:
                    raise UnsafePipelineError(f"the pipeline folder holds more than {MAX_ENTRIES} entries")
                mode = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(mode.st_mode):
                    if depth + 1 >= MAX_DEPTH:
                        raise UnsafePipelineError(f"the pipeline folder nests folders deeper than {MAX_DEPTH} ({where[:200]!r})")
                    pending.append((Path(entry.path), depth + 1))
                    continue
                if not stat.S_ISREG(mode.st_mode):
                    raise UnsafePipelineError(
                        f"the pipeline folder holds {where[:200]!r}, which is {_kind(mode.st_mode)}: a pipeline is "
                        f"{action} folders and regular files only, and nothing was {_DONE[action]}"
                    )
                limit = SMALL_BYTES if entry.name in SMALL_FILES else MAX_BYTES
                if mode.st_size > limit:
                    raise UnsafePipelineError(
                        f"the pipeline file {where[:200]!r} has {mode.st_size} bytes, more than the {limit} it may have"
                    )


def check_config(config) -> None:
    """Refuse a pipeline config (read without interpolation) that calls a function of
    REFUSED_REGISTRIES in the sections spacy.load resolves ([nlp], [components])."""
    def walk(block, at):
        if isinstance(block, dict):
            for key, value in block.items():
                if key in REFUSED_REGISTRIES:
                    raise UnsafePipelineError(
                        f"config.cfg calls a function of {key} in [{'.'.join(at)}], which reads or runs what is "
                        "outside the pipeline while it is loaded: refused"
                    )
                walk(value, at + [str(key)])

    for section in ("nlp", "components"):
        walk(config.get(section, {}), [section])


def check_not_linked(path) -> None:
    """Refuse to save into `path` (a component's folder) where it or a file in it is a
    link or anything but a folder and regular files: the write would land elsewhere."""
    path = Path(path)
    targets = [path] + (list(path.iterdir()) if path.is_dir() and not path.is_symlink() else [])
    for target in targets:
        try:
            mode = os.lstat(target).st_mode
        except FileNotFoundError:
            continue
        if not (stat.S_ISREG(mode) or (target == path and stat.S_ISDIR(mode))):
            raise UnsafePipelineError(
                f"refusing to save into {str(target)!r}: it is {_kind(mode)}, and writing there would write elsewhere"
            )


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def read_component(pipe, path, read):
    """`read()` (an `unmask_ner`'s own from_disk or from_bytes) with every failure an
    `UnsafePipelineError` naming the component and its folder (`path`, None for bytes); the
    folder checked first, and the loaded component checked to hold its backbone's state."""
    from .layers.decoder_tok2vec import require_loaded_backbones

    where = f"[{pipe.name}] the saved component" + (f" in {str(path)!r}" if path is not None else "")
    if path is not None:
        check_folder(path)
    try:
        loaded = read()
    except UnsafePipelineError as err:  # already says what is wrong without quoting values
        raise UnsafePipelineError(f"{where}: {err}") from None
    except ImportError:  # a package this environment lacks, whatever the file holds
        raise
    except Exception as err:  # msgpack, JSON, thinc: their messages may quote what they read
        raise UnsafePipelineError(
            f"{where} cannot be read ({type(err).__name__} in its 'cfg' or 'model' file): it is truncated, "
            "damaged or hostile"
        ) from None
    labels, scheme = pipe.cfg.get("labels"), pipe.cfg.get("scheme")
    if not (isinstance(labels, list) and all(isinstance(x, str) for x in labels) and scheme in ("BILUO", "BIO")):
        raise UnsafePipelineError(f"{where}: its 'cfg' file holds no list of labels and scheme BILUO or BIO")
    require_loaded_backbones(pipe)
    return loaded
