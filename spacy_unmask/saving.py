"""The backbone's bytes inside a saved pipeline: config, tokenizer files, safetensors.

A saved pipeline is data, whoever made it. Reading one never writes outside a
private temporary directory and never runs code from it:

- no pickle anywhere: the weights are safetensors, checked against their SHA-256
  (required), the config is JSON read into the class of a supported family
  directly (never through `auto_map`), its declared sizes bounded and checked
  against the weights' shapes before anything is built (`saved_shapes.py`), and
  the tokenizer is built in memory from its data (`saved_tokenizer.py`);
- every tokenizer file name is a plain base name with a data suffix;
- a pipeline whose config asks for `trust_remote_code` is refused unless the
  caller opts in (`opt_ins.py`), so a shared config cannot switch it on;
- whatever fails while reading it is an `UnsafePipelineError` naming the field.

The weights are stored as they are used, the frozen embedding in 8 bits
(`compact.py`); saved to a folder they are a safetensors file beside the component's
`model` file, read once without a copy per msgpack layer (`weights_file.py`). Format 1
pipelines (weights inside the message, not compacted) still load.

Saving is reproducible: no path of the saving machine is written (the config's
`_name_or_path`), so load -> predict -> save gives the same bytes. Non-finite
weights (a diverged run) are never written. In adapter mode only the LoRA
weights are stored, with the digest of the base they were trained on; the base is
loaded again from the setting `name` and checked against it (`base_model.py`).
"""
import hashlib
import json
import os
from pathlib import Path

from .opt_ins import UnsafePipelineError, require_remote_code_opt_in
from .settings import BackboneSettings

FORMAT = 2
READS = (1, 2)
MAX_BYTES = 2**32 - 2**20  # spaCy writes each component's model as one msgpack value
# The names of saved tokenizer files (pipelines saved with save_pretrained's files too):
# JSON, SentencePiece models, vocabularies, chat templates.
TOKENIZER_SUFFIXES = (".json", ".model", ".txt", ".jinja")
MAX_FILE_NAME = 128
# Keys of the saved decoder config that name a place on the saving machine.
MACHINE_KEYS = ("_name_or_path",)


def backbone_to_bytes(backbone) -> bytes:
    import srsly
    import torch
    from safetensors.torch import save as save_tensors

    from .compact import compact_state
    from .saved_tokenizer import tokenizer_data
    from .weights_file import current_folder, write_weights

    if backbone is None:
        raise ValueError("cannot save an uninitialised decoder backbone: call nlp.initialize() first")
    state = backbone.saved_state()
    broken = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if broken:
        raise ValueError(f"refusing to save a backbone with non-finite weights ({broken[:3]}): training diverged")
    weights = save_tensors(compact_state(backbone.model, state, backbone.settings.save_embedding))
    if len(weights) >= MAX_BYTES:
        raise ValueError(
            f"the backbone weights take {len(weights) / 2**30:.1f} GiB, over the 4 GiB a spaCy "
            "model file can hold; use save_mode = \"adapter\" or dtype = \"bfloat16\""
        )
    msg = {
        "format": FORMAT,
        "config": config_json(backbone.model.config),
        "tokenizer": tokenizer_data(backbone.tokenizer),
        "sha256": hashlib.sha256(weights).hexdigest(),
    }
    if current_folder() is None:
        msg["weights"] = weights
    else:
        msg["weights_file"] = write_weights(weights)
    if backbone.settings.save_mode == "adapter":
        msg["base"] = backbone.base_record
    return srsly.msgpack_dumps(msg)


def config_json(config) -> str:
    """The decoder config as JSON, without the paths of the machine that saved it."""
    data = config.to_dict()
    for key in MACHINE_KEYS:
        data.pop(key, None)
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def backbone_from_bytes(data: bytes, settings: BackboneSettings, device):
    require_remote_code_opt_in(settings.trust_remote_code)
    msg = read_message(data)
    try:
        backbone = rebuild(msg, settings)
    except (UnsafePipelineError, ImportError):  # a package this environment lacks is not the file's fault
        raise
    except Exception as err:  # whatever else a forged message makes torch or transformers raise
        raise UnsafePipelineError(
            f"the saved decoder backbone is damaged or hostile: it does not rebuild ({type(err).__name__})"
        ) from None
    backbone.loaded_sha256 = loaded_digest(msg, backbone.base_record)
    return backbone.to(device)


def rebuild(msg: dict, settings: BackboneSettings):
    """The backbone of a checked message: sizes checked before anything is built."""
    from .backbone import Backbone, resolve_dtypes
    from .base_model import verified_base
    from .compact import expand_state
    from .saved_shapes import check_against_weights
    from .saved_tokenizer import check_fits, tokenizer_from_data

    state = expand_state(saved_tensors(msg), resolve_dtypes(settings.dtype, settings.finetune)[0])
    config = config_from_json(msg["config"])
    tokenizer = tokenizer_from_data(msg["tokenizer"])
    base, base_record = None, msg.get("base")
    if settings.save_mode == "full":
        # LoRA wraps a linear layer's own weight as `base_layer` (peft)
        check_against_weights(config, {k.replace(".base_layer.", "."): v for k, v in state.items() if "lora_" not in k})
    else:
        base, base_record = verified_base(settings.name, msg.get("base"))
    backbone = Backbone.rebuild(settings, config, tokenizer, state, base)
    check_fits(tokenizer, backbone.model.get_input_embeddings().num_embeddings)
    backbone.base_record = base_record
    return backbone


def saved_tensors(msg: dict) -> dict:
    """The saved weights: inside the message, or in the file it names (digest checked)."""
    from safetensors.torch import load as load_tensors

    from .weights_file import read_weights, unreadable

    if "weights_file" in msg:
        return read_weights(msg["weights_file"], msg["sha256"])
    try:
        return load_tensors(msg["weights"])
    except Exception:  # a truncated or forged safetensors header
        raise unreadable() from None


def loaded_digest(msg: dict, base_record) -> str:
    """SHA-256 of what a backbone was rebuilt from: every field (the weights by their
    checked digest, the tokenizer files as read) and, in adapter mode, the record of the
    base it found (`base_model.verified_base`), whether or not the pipeline saved one."""
    import srsly

    fields = {key: value for key, value in msg.items() if key not in ("weights", "base")}
    fields["base"] = base_record
    return hashlib.sha256(srsly.msgpack_dumps(fields)).hexdigest()


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
    if not isinstance(msg, dict):
        raise damaged(f"expected a map of fields, found {type(msg).__name__}")
    # the weights inside the message, or (format 2, saved to a folder) in a file beside it
    in_file = msg.get("format") != 1 and "weights_file" in msg
    msg.pop("weights" if in_file else "weights_file", None)
    weights = {"weights_file": str} if in_file else {"weights": bytes}
    expected = {"format": int, "config": str, "tokenizer": dict, **weights, "sha256": str}
    for key, kind in expected.items():
        if key not in msg:
            raise damaged(f"the field {key!r} is missing")
        if not isinstance(msg[key], kind):
            raise damaged(f"the field {key!r} is {type(msg[key]).__name__}, not {kind.__name__}")
    if msg["format"] not in READS:
        raise damaged(f"format {msg['format']!r} is not one this version reads ({', '.join(map(str, READS))})")
    if not in_file and hashlib.sha256(msg["weights"]).hexdigest() != msg["sha256"]:
        raise damaged("the weights do not match their SHA-256")
    base = msg.get("base")
    if base is not None and not (
        isinstance(base, dict) and isinstance(base.get("sha256"), str) and isinstance(base.get("revision"), (str, type(None)))
    ):
        raise damaged("the field 'base' is not a digest and revision of a base model")
    for file_name, content in msg["tokenizer"].items():
        check_file_name(file_name)
        if not isinstance(content, bytes):
            raise damaged(f"tokenizer file {file_name!r} holds {type(content).__name__}, not bytes")
    return msg


def check_file_name(file_name) -> str:
    """`file_name` if it is a plain base name of a tokenizer data file; else refuse it."""
    plain = (
        isinstance(file_name, str)
        and len(file_name) <= MAX_FILE_NAME
        and file_name not in ("", ".", "..")
        and not any(c in file_name for c in ("/", "\\", "\0"))
        and not os.path.isabs(file_name)
        and Path(file_name).name == file_name
    )
    if not plain or not file_name.endswith(TOKENIZER_SUFFIXES) or file_name.startswith("."):
        raise UnsafePipelineError(
            f"the saved decoder backbone holds a tokenizer file named {repr(file_name)[:MAX_FILE_NAME]}, which is "
            f"not a plain file name of at most {MAX_FILE_NAME} characters ending in {', '.join(TOKENIZER_SUFFIXES)}: "
            "the pipeline is damaged or hostile, and nothing was written"
        )
    return file_name


def config_from_json(text: str):
    """The decoder config, made by the class of its (supported) family; `auto_map` refused."""
    from transformers import CONFIG_MAPPING

    from .families import SUPPORTED_MODEL_TYPES
    from .saved_shapes import check_declared_sizes

    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise UnsafePipelineError("the saved decoder config (field 'config') is not JSON, or is nested too deeply") from None
    if not isinstance(data, dict):
        raise UnsafePipelineError(f"the saved decoder config (field 'config') is {type(data).__name__}, not a map")
    if "auto_map" in data:
        raise UnsafePipelineError(
            "the saved decoder config has an 'auto_map' entry, which points at code to import: "
            "a saved pipeline never runs code, so it is refused as damaged or hostile"
        )
    model_type = data.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsafePipelineError(
            f"the saved decoder config (field 'config') has a model_type that is not supported; supported: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    check_declared_sizes(data)
    data = {k: v for k, v in data.items() if k not in MACHINE_KEYS}
    return CONFIG_MAPPING[model_type].from_dict(data)
