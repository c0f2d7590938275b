"""The sizes a saved decoder config declares, checked before anything is built from it.

A config of a few hundred bytes can declare a model of any size, and the config
classes do arithmetic on what it declares (dividing by the number of heads, indexing
per-layer lists). So, in this order:

1. every size the supported families read is an integer within `BOUNDS` (checked on
   the parsed JSON, before a config class sees it);
2. the number of decoder layers is the number the weights hold (their names, from the
   safetensors header);
3. the decoder is built on the meta device (no memory) and each of its weights must be
   in the saved weights with the same shape: a config that declares more than the
   weights hold is refused before any real memory is taken for it.
"""
import re
from typing import TYPE_CHECKING, Dict, Tuple

from .opt_ins import UnsafePipelineError

if TYPE_CHECKING:
    import torch

# (least, most) for each size key; the largest supported models stay well inside.
BOUNDS: Dict[str, Tuple[int, int]] = {
    "num_hidden_layers": (1, 512),
    "hidden_size": (1, 1 << 16),
    "intermediate_size": (1, 1 << 18),
    "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024),
    "head_dim": (1, 4096),
    "vocab_size": (1, 1 << 22),
    "max_position_embeddings": (1, 1 << 24),
    "sliding_window": (1, 1 << 24),
    "max_window_layers": (0, 512),
    "sliding_window_pattern": (1, 512),
}
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def check_declared_sizes(data: dict) -> None:
    """Refuse a parsed config whose sizes are not integers within BOUNDS."""
    for key, (least, most) in BOUNDS.items():
        value = data.get(key)
        if value is None:  # the family's own default
            continue
        if not (isinstance(value, int) and not isinstance(value, bool) and least <= value <= most):
            raise declared(key, f"must be an integer from {least} to {most}")
    heads, kv_heads = data.get("num_attention_heads"), data.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv_heads, int) and heads % kv_heads:
        raise declared("num_key_value_heads", "must divide num_attention_heads")
    pad, vocab = data.get("pad_token_id"), data.get("vocab_size")
    if pad is not None and not (isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < (vocab or 1)):
        raise declared("pad_token_id", "must be null or a piece id below vocab_size")


def check_against_weights(config, weights: Dict[str, "torch.Tensor"]) -> None:
    """Refuse a config whose decoder does not have the layers and shapes of the saved
    `weights` (LoRA weights left out). A weight saved packed in fewer bits (a quantised
    base) must hold at least 4 bits for each value the config declares for it."""
    import torch
    import transformers

    layers = {int(m.group(1)) for name in weights if (m := _LAYER.search(name))}
    if len(layers) != config.num_hidden_layers or (layers and max(layers) != len(layers) - 1):
        raise declared("num_hidden_layers", f"must be the number of layers the weights hold ({len(layers)})")
    with torch.device("meta"):
        expected = transformers.AutoModel.from_config(config).state_dict()
    for name, tensor in expected.items():
        saved = weights.get(name)
        if saved is None:
            raise UnsafePipelineError(f"the saved decoder weights (field 'weights') lack {name!r}, which the config declares")
        if saved.is_floating_point():
            fits = tuple(saved.shape) == tuple(tensor.shape)
        else:
            fits = saved.numel() * saved.element_size() * 2 >= tensor.numel()
        if not fits:
            raise UnsafePipelineError(
                f"the saved decoder weight {name!r} (field 'weights') has shape {tuple(saved.shape)}, the config "
                f"declares {tuple(tensor.shape)}"
            )


def declared(key: str, accepted: str) -> UnsafePipelineError:
    return UnsafePipelineError(f"the saved decoder config (field 'config') declares {key!r}, which {accepted}")
