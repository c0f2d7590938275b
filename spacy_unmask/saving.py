"""The backbone's bytes inside a saved pipeline: config, tokenizer files, safetensors.

No pickle anywhere: the weights are safetensors with their SHA-256, the config
is JSON and the tokenizer is its own files. Non-finite weights (a diverged run)
are never written. In adapter mode only the LoRA weights are stored and the
base model is loaded again from the setting `name`.
"""
import hashlib
import tempfile
from pathlib import Path
from typing import Dict

from .settings import BackboneSettings

FORMAT = 1
MAX_BYTES = 2**32 - 2**20  # spaCy writes each component's model as one msgpack value


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
        "config": backbone.model.config.to_json_string(use_diff=False),
        "tokenizer": tokenizer_files(backbone.tokenizer),
        "weights": weights,
        "sha256": hashlib.sha256(weights).hexdigest(),
    }
    return srsly.msgpack_dumps(msg)


def backbone_from_bytes(data: bytes, settings: BackboneSettings, device):
    import srsly
    import transformers
    from safetensors.torch import load as load_tensors

    from .backbone import Backbone
    from .loading import load_tokenizer

    try:
        msg = srsly.msgpack_loads(data)
        digest = hashlib.sha256(msg["weights"]).hexdigest()
        if msg.get("sha256", digest) != digest:
            raise ValueError("the weights do not match their SHA-256")
        state = load_tensors(msg["weights"])
        config_text, files = msg["config"], msg["tokenizer"]
    except Exception as err:  # a truncated, damaged or foreign file
        raise ValueError(f"the saved decoder backbone is unreadable (truncated or corrupted?): {err}") from err
    with tempfile.TemporaryDirectory() as tmp:
        for file_name, content in files.items():
            (Path(tmp) / file_name).write_bytes(content)
        tokenizer = load_tokenizer(tmp)
        (Path(tmp) / "config.json").write_text(config_text)
        config = transformers.AutoConfig.from_pretrained(tmp)
    return Backbone.rebuild(settings, config, tokenizer, state).to(device)


def tokenizer_files(tokenizer) -> Dict[str, bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        return {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}
