"""The backbone's bytes inside a saved pipeline: config, tokenizer files, safetensors.

A saved pipeline is data, whoever made it. Reading one never writes outside a
private temporary directory and never runs code from it:

- no pickle anywhere: the weights are safetensors, checked against their SHA-256
  (required), the config is JSON read into the class of a supported family
  directly (never through `auto_map`), and the tokenizer is its own data files;
- every tokenizer file name is a plain base name with a data suffix, checked
  before anything is written (no separator, no "..", not absolute, no NUL, no
  Python file), and no tokenizer config may point at code (`auto_map`);
- a pipeline whose config asks for `trust_remote_code` is refused unless the
  caller opts in (`TRUST_REMOTE_CODE_ENV`), so a shared config cannot switch it on.

Saving is reproducible: no path of the saving machine is written (the config's
`_name_or_path`), so load -> predict -> save gives the same bytes. Non-finite
weights (a diverged run) are never written. In adapter mode only the LoRA
weights are stored and the base model is loaded again from the setting `name`.
"""
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Dict

from .settings import BackboneSettings

FORMAT = 1
MAX_BYTES = 2**32 - 2**20  # spaCy writes each component's model as one msgpack value
# The caller's explicit opt-in to a saved pipeline that asks for trust_remote_code.
TRUST_REMOTE_CODE_ENV = "SPACY_UNMASK_TRUST_REMOTE_CODE"
# What a tokenizer's save_pretrained writes: JSON, SentencePiece models, vocabularies,
# chat templates. Nothing else is written out of a saved pipeline.
TOKENIZER_SUFFIXES = (".json", ".model", ".txt", ".jinja")
# Keys of the saved decoder config that name a place on the saving machine.
MACHINE_KEYS = ("_name_or_path",)


class UnsafePipelineError(ValueError):
    """A saved pipeline that is damaged or hostile: refused before anything is written or run."""


def backbone_to_bytes(backbone) -> bytes:
    import srsly
    import torch
    from safetensors.torch import save as save_tensors

    if backbone is None:
        raise ValueError("cannot save an uninitialised decoder backbone: call nlp.initialize() first")
    state = backbone.saved_state()
    broken = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if broken:
        raise ValueError(f"refusing to save a backbone with non-finite weights ({broken[:3]}): training diverged")
    weights = save_tensors(state)
    if len(weights) >= MAX_BYTES:
        raise ValueError(
            f"the backbone weights take {len(weights) / 2**30:.1f} GiB, over the 4 GiB a spaCy "
            "model file can hold; use save_mode = \"adapter\" or dtype = \"bfloat16\""
        )
    msg = {
        "format": FORMAT,
        "config": config_json(backbone.model.config),
        "tokenizer": tokenizer_files(backbone.tokenizer),
        "weights": weights,
        "sha256": hashlib.sha256(weights).hexdigest(),
    }
    return srsly.msgpack_dumps(msg)


def config_json(config) -> str:
    """The decoder config as JSON, without the paths of the machine that saved it."""
    data = config.to_dict()
    for key in MACHINE_KEYS:
        data.pop(key, None)
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def backbone_from_bytes(data: bytes, settings: BackboneSettings, device):
    from safetensors.torch import load as load_tensors

    from .backbone import Backbone

    check_remote_code_opt_in(settings)
    msg = read_message(data)
    try:
        state = load_tensors(msg["weights"])
    except Exception as err:  # a truncated or forged safetensors header
        raise UnsafePipelineError(f"the saved decoder weights are unreadable (truncated or corrupted?): {err}") from err
    config = config_from_json(msg["config"])
    tokenizer = tokenizer_from_files(msg["tokenizer"])
    return Backbone.rebuild(settings, config, tokenizer, state).to(device)


def check_remote_code_opt_in(settings: BackboneSettings) -> None:
    """A loaded pipeline may not switch trust_remote_code on by itself."""
    if settings.trust_remote_code and os.environ.get(TRUST_REMOTE_CODE_ENV) != "1":
        raise UnsafePipelineError(
            "this pipeline's config sets trust_remote_code = true, which would run code from the "
            f"model repository {settings.name!r} while loading it. A saved pipeline cannot switch "
            f"this on by itself: if you trust its source, set the environment variable "
            f"{TRUST_REMOTE_CODE_ENV}=1 in the process that loads it"
        )


def read_message(data) -> dict:
    """The saved backbone's fields, each of the type it must have; the digest checked."""
    import srsly

    def damaged(why: str) -> UnsafePipelineError:
        return UnsafePipelineError(f"the saved decoder backbone is damaged or hostile: {why}")

    if not isinstance(data, (bytes, bytearray)):
        raise damaged(f"expected bytes, found {type(data).__name__}")
    try:
        msg = srsly.msgpack_loads(data)
    except Exception as err:  # a truncated, damaged or foreign file
        raise damaged(f"unreadable (truncated or corrupted?): {err}") from err
    expected = {"format": int, "config": str, "tokenizer": dict, "weights": bytes, "sha256": str}
    if not isinstance(msg, dict):
        raise damaged(f"expected a map of fields, found {type(msg).__name__}")
    for key, kind in expected.items():
        if key not in msg:
            raise damaged(f"the field {key!r} is missing")
        if not isinstance(msg[key], kind):
            raise damaged(f"the field {key!r} is {type(msg[key]).__name__}, not {kind.__name__}")
    if msg["format"] != FORMAT:
        raise damaged(f"format {msg['format']!r} is not one this version reads ({FORMAT})")
    if hashlib.sha256(msg["weights"]).hexdigest() != msg["sha256"]:
        raise damaged("the weights do not match their SHA-256")
    for file_name, content in msg["tokenizer"].items():
        check_file_name(file_name)
        if not isinstance(content, bytes):
            raise damaged(f"tokenizer file {file_name!r} holds {type(content).__name__}, not bytes")
    return msg


def check_file_name(file_name) -> str:
    """`file_name` if it is a plain base name of a tokenizer data file; else refuse it."""
    plain = (
        isinstance(file_name, str)
        and file_name not in ("", ".", "..")
        and not any(c in file_name for c in ("/", "\\", "\0"))
        and not os.path.isabs(file_name)
        and Path(file_name).name == file_name
    )
    if not plain or not file_name.endswith(TOKENIZER_SUFFIXES) or file_name.startswith("."):
        raise UnsafePipelineError(
            f"the saved decoder backbone holds a tokenizer file named {file_name!r}, which is not a plain "
            f"file name ending in {', '.join(TOKENIZER_SUFFIXES)}: the pipeline is damaged or hostile, "
            "and nothing was written"
        )
    return file_name


def config_from_json(text: str):
    """The decoder config, made by the class of its (supported) family; `auto_map` refused."""
    from transformers import CONFIG_MAPPING

    from .families import SUPPORTED_MODEL_TYPES

    try:
        data = json.loads(text)
    except ValueError as err:
        raise UnsafePipelineError(f"the saved decoder config is not JSON: {err}") from err
    if not isinstance(data, dict):
        raise UnsafePipelineError(f"the saved decoder config is {type(data).__name__}, not a map")
    if "auto_map" in data:
        raise UnsafePipelineError(
            "the saved decoder config has an 'auto_map' entry, which points at code to import: "
            "a saved pipeline never runs code, so it is refused as damaged or hostile"
        )
    model_type = data.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsafePipelineError(
            f"the saved decoder config has model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    data = {k: v for k, v in data.items() if k not in MACHINE_KEYS}
    return CONFIG_MAPPING[model_type].from_dict(data)


def tokenizer_from_files(files: Dict[str, bytes]):
    """The fast tokenizer from its saved files, written (names already checked) into a
    private temporary directory that is removed afterwards."""
    from .loading import load_tokenizer

    for file_name, content in files.items():
        if file_name.endswith(".json") and b"auto_map" in content:
            try:
                points_at_code = "auto_map" in json.loads(content)
            except ValueError:
                points_at_code = False  # a damaged file fails in the tokenizer below
            if points_at_code:
                raise UnsafePipelineError(
                    f"the saved tokenizer file {file_name!r} has an 'auto_map' entry, which points at "
                    "code to import: a saved pipeline never runs code, so it is refused"
                )
    with tempfile.TemporaryDirectory(prefix="spacy-unmask-tokenizer-") as tmp:
        for file_name, content in files.items():
            with open(Path(tmp) / check_file_name(file_name), "xb") as out:
                out.write(content)
        try:
            return load_tokenizer(tmp, trust_remote_code=False)
        except Exception as err:
            raise UnsafePipelineError(f"the saved tokenizer cannot be read (damaged?): {err}") from err


def tokenizer_files(tokenizer) -> Dict[str, bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        return {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}
