"""A backbone's weights as a safetensors file beside the component's `model` file.

Inside `model` (thinc's msgpack, holding the backbone's own msgpack) the weights were
copied at every layer of msgpack when loading: about five full copies at once. Saved
to a folder (`nlp.to_disk`), each backbone of a component writes its weights to its own
file in the component's folder instead (`backbone.safetensors`, then
`backbone-2.safetensors`, ...), and its message names the file and its SHA-256.
`nlp.to_bytes` keeps the weights inside the message, as before.

Reading never maps the file: the header is parsed and checked (names, dtypes, shapes,
offsets that tile the data exactly), then each tensor is read straight into its own
memory while the whole file is hashed; a digest that is not the saved one refuses it.
"""
import hashlib
import json
import os
import re
import stat
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Dict, Optional

import torch

from .opt_ins import UnsafePipelineError

FILE_NAME = re.compile(r"backbone(-[2-9]|-[1-9][0-9])?\.safetensors")
MAX_HEADER = 16 << 20
DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
_FOLDER: ContextVar[Optional[dict]] = ContextVar("weights_folder", default=None)


@contextmanager
def weights_folder(path):
    """While a component is saved to or read from the folder `path`, its backbones'
    weights are files in that folder."""
    token = _FOLDER.set({"path": Path(path), "names": []})
    try:
        yield
    finally:
        _FOLDER.reset(token)


def current_folder() -> Optional[Path]:
    folder = _FOLDER.get()
    return None if folder is None else folder["path"]


def write_weights(data: bytes) -> str:
    """Write safetensors `data` to the next free backbone file name of the current folder;
    return the name."""
    folder = _FOLDER.get()
    names = folder["names"]
    name = "backbone.safetensors" if not names else f"backbone-{len(names) + 1}.safetensors"
    names.append(name)
    (folder["path"] / name).write_bytes(data)
    return name


def read_weights(name: str, sha256: str) -> Dict[str, torch.Tensor]:
    """The tensors of the backbone file `name` in the current folder, its digest checked."""
    folder = current_folder()
    if folder is None:
        raise UnsafePipelineError(
            f"the saved decoder backbone keeps its weights in the file {name!r} beside the component's "
            "'model' file: read the pipeline from its folder (spacy.load(path)), not from bytes"
        )
    if not isinstance(name, str) or not FILE_NAME.fullmatch(name):
        raise UnsafePipelineError("the saved decoder backbone names a weights file (field 'weights_file') that is "
                                  "not backbone.safetensors or backbone-N.safetensors")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(folder / name, flags)
    except OSError:
        raise UnsafePipelineError(f"the saved decoder weights file {name!r} is missing or not a file") from None
    with os.fdopen(fd, "rb", buffering=0) as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePipelineError(f"the saved decoder weights file {name!r} is not a regular file")
        digest = hashlib.sha256()
        state = _read_tensors(file, info.st_size, digest)
    if digest.hexdigest() != sha256:
        raise UnsafePipelineError(f"the saved decoder backbone is damaged or hostile: {name!r} does not match its SHA-256")
    return state


def _read_tensors(file, size: int, digest) -> Dict[str, torch.Tensor]:
    head = _read_exact(file, 8, digest)
    length = int.from_bytes(head, "little") if head is not None else -1
    if not 2 <= length <= min(MAX_HEADER, size - 8):
        raise unreadable()
    try:
        header = json.loads(_read_exact(file, length, digest))
    except (ValueError, RecursionError, TypeError):
        raise unreadable() from None
    entries = _checked_entries(header, size - 8 - length)
    state = {}
    for name, dtype, shape in entries:
        tensor = torch.empty(shape, dtype=dtype)
        if _read_into(file, tensor.reshape(-1).view(torch.uint8).numpy(), digest) is None:
            raise unreadable()
        state[name] = tensor
    return state


def _checked_entries(header, data_bytes: int):
    """[(name, dtype, shape)] in file order, each entry's offsets checked to tile the data."""
    if not isinstance(header, dict):
        raise unreadable()
    header.pop("__metadata__", None)
    entries, at = [], 0
    for name, entry in sorted(header.items(), key=lambda item: _begin(item[1])):
        try:
            dtype = DTYPES[entry["dtype"]]
            shape = [int(d) for d in entry["shape"] if isinstance(d, int) and not isinstance(d, bool) and d >= 0]
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise unreadable() from None
        numel = 1
        for dim in shape:
            numel *= dim
        if len(shape) != len(entry["shape"]) or begin != at or end - begin != numel * dtype.itemsize:
            raise unreadable()
        entries.append((name, dtype, shape))
        at = end
    if at != data_bytes:
        raise unreadable()
    return entries


def _begin(entry) -> int:
    try:
        return int(entry["data_offsets"][0])
    except (KeyError, TypeError, ValueError, IndexError):
        raise unreadable() from None


def _read_exact(file, count: int, digest) -> Optional[bytes]:
    buffer = bytearray(count)
    return bytes(buffer) if _read_into(file, memoryview(buffer), digest) is not None else None


def _read_into(file, target, digest):
    """Fill `target` (a writable buffer) from `file`, hashing what is read; None if the
    file ends first."""
    view = memoryview(target).cast("B")
    done = 0
    while done < len(view):
        got = file.readinto(view[done:])
        if not got:
            return None
        done += got
    digest.update(view)
    return target


def unreadable() -> UnsafePipelineError:
    return UnsafePipelineError("the saved decoder weights (field 'weights') are unreadable (truncated or corrupted?)")
