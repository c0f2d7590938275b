"""A backbone's weights stored as they are used, and its embedding in 8 bits.

- A frozen float32 weight whose every value is a bfloat16 value (a base read from a
  bfloat16 checkpoint into float32 on a CPU without bfloat16) is stored in bfloat16;
  loading widens it back, exactly. Trained weights (LoRA, a fully fine-tuned decoder)
  are stored as they are.
- The frozen input embedding (71.5% of Gemma 3 270M's parameters, of which a labeller
  only looks up rows) is stored in 8 bits with a scale per row that is a power of two:
  each row is q * 2**e with integers |q| <= 127, so each value is exact in bfloat16 and
  float32, and is dequantised on load into the dtype the decoder computes in. Its
  largest |q| is 64-127, so quantising a dequantised row gives the same q and e back:
  load -> save keeps the same bytes. The error of each value is at most half a step,
  2**(e-1) <= max|row| / 127.
"""
from typing import Dict, Optional

import torch
from torch import nn

from .opt_ins import UnsafePipelineError

SCALE_SUFFIX = ".row_scale"
LEVELS = 127
_CHUNK_ROWS = 8192  # rows dequantised at a time: no float32 copy of the whole table


def compact_state(model: nn.Module, state: Dict[str, torch.Tensor], embedding: str) -> Dict[str, torch.Tensor]:
    """`state` (the weights to save) with frozen float32 weights holding bfloat16 values
    narrowed and, with `embedding` "int8", the frozen input embedding in 8 bits with its
    row scales. Trained weights and anything else (a quantised base's statistics) as they are."""
    frozen = {name for name, param in model.named_parameters() if not param.requires_grad}
    out = {key: narrowed(value) if key in frozen else value for key, value in state.items()}
    key = frozen_embedding_key(model, state) if embedding == "int8" else None
    if key is not None:
        out[key], out[key + SCALE_SUFFIX] = quantize_rows(state[key])
    return out


def narrowed(tensor: torch.Tensor) -> torch.Tensor:
    """A float32 tensor in bfloat16 where that loses nothing; any other as it is."""
    if tensor.dtype != torch.float32:
        return tensor
    narrow = tensor.to(torch.bfloat16)
    return narrow if torch.equal(narrow.float(), tensor) else tensor


def frozen_embedding_key(model: nn.Module, state: Dict[str, torch.Tensor]) -> Optional[str]:
    """The key of the input embedding's weight in `state`, if it is there and frozen."""
    embeddings = model.get_input_embeddings()
    weight = getattr(embeddings, "weight", None)
    if not isinstance(embeddings, nn.Embedding) or weight is None or weight.requires_grad:
        return None
    key = next((name for name, param in model.named_parameters() if param is weight), None)
    return key if key in state and state[key].is_floating_point() else None


def quantize_rows(weight: torch.Tensor):
    """(int8 values, float32 power-of-two scale per row) of a 2-d weight."""
    rows = weight.detach().float()
    peak = rows.abs().amax(dim=1)
    mantissa, exponent = torch.frexp(peak / LEVELS)  # peak / LEVELS = mantissa * 2**exponent
    exponent = exponent - (mantissa == 0.5).int()  # the least e with LEVELS * 2**e >= peak
    scale = torch.where(peak > 0, torch.ldexp(torch.ones_like(peak), exponent), torch.ones_like(peak))
    values = torch.round(rows / scale[:, None]).clamp_(-LEVELS, LEVELS).to(torch.int8)
    return values, scale


def expand_state(state: Dict[str, torch.Tensor], dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    """`state` as read, each 8-bit weight with row scales dequantised into `dtype` (in
    place). A scale that is not one positive finite power of two per row is refused."""
    for scale_key in [k for k in state if k.endswith(SCALE_SUFFIX)]:
        key = scale_key[: -len(SCALE_SUFFIX)]
        values, scale = state.get(key), state.pop(scale_key)
        if not (isinstance(values, torch.Tensor) and values.dtype == torch.int8 and values.dim() == 2):
            raise damaged(f"the row scales {scale_key!r} belong to no 8-bit table {key!r}")
        if scale.dtype != torch.float32 or tuple(scale.shape) != values.shape[:1] or not _powers_of_two(scale):
            raise damaged(f"{scale_key!r} is not one positive power of two per row of {key!r}")
        state[key] = dequantize_rows(values, scale, dtype)
    return state


def damaged(why: str) -> UnsafePipelineError:
    return UnsafePipelineError(f"the saved decoder weights (field 'weights') are damaged or hostile: {why}")


def _powers_of_two(scale: torch.Tensor) -> bool:
    mantissa, _ = torch.frexp(scale)
    return bool(torch.isfinite(scale).all() and (scale > 0).all() and (mantissa == 0.5).all())


def dequantize_rows(values: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """values * scale per row, in `dtype`, a block of rows at a time."""
    out = torch.empty(values.shape, dtype=dtype)
    for start in range(0, values.shape[0], _CHUNK_ROWS):
        block = slice(start, start + _CHUNK_ROWS)
        out[block] = values[block].float().mul_(scale[block, None])
    return out


def as_model_dtypes(model: nn.Module, state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """`state` (in place) with each floating tensor in the dtype of the model's tensor of
    that name (a narrowed weight widened back, exactly), so that loading can take the
    tensors themselves instead of copying them."""
    current = model.state_dict(keep_vars=True)
    for key, value in state.items():
        target = current.get(key)
        if target is not None and value.is_floating_point() and target.is_floating_point() and value.dtype != target.dtype:
            state[key] = value.to(target.dtype)
    return state
