"""Editing a saved pipeline the way an attacker would: the decoder backbone's message
inside `ner/model`, read and written back."""
import hashlib
import shutil
import uuid
from pathlib import Path

import srsly


def read_backbone(model_file: Path) -> dict:
    """The decoder's own serialisation inside the thinc model file (msgpack all the way),
    its weights read into the message from the file beside it where they are there."""
    msg = srsly.msgpack_loads(model_file.read_bytes())
    (blob,) = [blob for node in msg["shims"] for blob in node]
    backbone = srsly.msgpack_loads(srsly.msgpack_loads(blob)["state"])
    if isinstance(backbone, dict) and "weights_file" in backbone:
        backbone["weights"] = (model_file.parent / backbone.pop("weights_file")).read_bytes()
    return backbone


def write_backbone(model_file: Path, backbone) -> None:
    """Put a (forged) backbone message back into the thinc model file."""
    msg = srsly.msgpack_loads(model_file.read_bytes())
    for node in msg["shims"]:
        for i, blob in enumerate(node):
            shim = srsly.msgpack_loads(blob)
            shim["state"] = backbone if isinstance(backbone, bytes) else srsly.msgpack_dumps(backbone)
            node[i] = srsly.msgpack_dumps(shim)
    model_file.write_bytes(srsly.msgpack_dumps(msg))


def forged_copy(saved: Path, tmp_path: Path, forge) -> Path:
    """A copy of the saved pipeline whose backbone message `forge` has edited."""
    target = tmp_path / f"forged-{uuid.uuid4().hex[:8]}"
    shutil.copytree(saved, target)
    backbone = read_backbone(target / "ner" / "model")
    forged = forge(backbone)
    write_backbone(target / "ner" / "model", backbone if forged is None else forged)
    return target


def with_digest(backbone: dict) -> dict:
    backbone["sha256"] = hashlib.sha256(backbone["weights"]).hexdigest()
    return backbone
