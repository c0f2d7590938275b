"""A frozen base held in 4 or 8 bits (QLoRA), through bitsandbytes.

`base_quantization = "nf4"` replaces every linear layer of the decoder blocks by a
bitsandbytes `Linear4bit`: NF4 in blocks of 64 weights, the block scales quantised
again (double quantisation), computing in the backbone's compute dtype (bfloat16
where the machine has it), as QLoRA (Dettmers et al. 2023) does. "int8" uses
`Linear8bitLt` (LLM.int8(): int8 weights with a scale per output channel, input
columns above `INT8_THRESHOLD` kept in 16 bits). The embedding, the norms and LoRA
are not quantised (LoRA stays float32).

peft sees the bitsandbytes layers (`is_loaded_in_4bit` / `is_loaded_in_8bit` on the
decoder) and puts its own QLoRA layers around them. peft's
`prepare_model_for_kbit_training` is not used: it casts the embedding and norms to
float32 (twice the memory of Gemma 3's 262k-row embedding in bfloat16), and the rest
of what it does (freezing the base, gradient checkpointing) `lora.py` and the
`gradient_checkpointing` setting already do.

LoRA is never folded into a quantised weight (that would round the update away):
prediction runs the adapter beside the base, as training did. A saved pipeline holds
the quantised weights as they are (bitsandbytes' state-dict form: packed weights,
block scales and a small JSON quant state), so a loaded pipeline runs the very
weights it was trained on.

On CPUs with AVX-512 BF16, bitsandbytes repacks a 4-bit weight in place at its first
prediction into a layout whose kernel has no backward pass, so a training step after
a prediction would get no gradient through it; that repacking is switched off, and
prediction and training share one layout.
"""
import json
import logging
from typing import Dict, Optional, Set

import torch
from torch import nn

from .families import decoder_layers

# LLM.int8()'s outlier threshold (bitsandbytes' and transformers' default).
INT8_THRESHOLD = 6.0
INSTALL_HINT = "pip install 'spacy-unmask[qlora]' (bitsandbytes >= 0.47; on x86 CPUs it needs AVX2)"
# bitsandbytes logs a warning for every int8 product ("inputs will be cast to float16"),
# and one when peft first imports it where an optional kernel package is missing.
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)


def bitsandbytes():
    """The bitsandbytes module; a clear error where it is not installed."""
    try:
        import bitsandbytes as bnb
    except ImportError as err:
        raise ValueError(f"base_quantization needs bitsandbytes, which is not installed: {INSTALL_HINT}") from err
    return bnb


def is_quantized(model: nn.Module) -> bool:
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False))


def quantize_base(model: nn.Module, mode: str, compute_dtype: Optional[torch.dtype]) -> nn.Module:
    """Quantise the linear layers of the decoder blocks in place (from their weights)."""
    return _replace_linears(model, mode, compute_dtype, from_weights=True)


def quantized_shells(model: nn.Module, mode: str, compute_dtype: Optional[torch.dtype]) -> nn.Module:
    """The same layers as `quantize_base`, without weights yet: `install_quantized` fills them
    from a saved state (after LoRA is added, so the names are the saved ones)."""
    return _replace_linears(model, mode, compute_dtype, from_weights=False)


def _replace_linears(model, mode: str, compute_dtype, *, from_weights: bool):
    bnb = bitsandbytes()
    with torch.no_grad():
        for block in decoder_layers(model):
            for parent in list(block.modules()):
                for name, child in list(parent.named_children()):
                    if type(child) is nn.Linear:
                        setattr(parent, name, _quantized_layer(bnb, child, mode, compute_dtype, from_weights))
    model.is_loaded_in_4bit = mode == "nf4"
    model.is_loaded_in_8bit = mode == "int8"
    return model


def _quantized_layer(bnb, linear: nn.Linear, mode: str, compute_dtype, from_weights: bool) -> nn.Module:
    shape = (linear.in_features, linear.out_features, linear.bias is not None)
    device = linear.weight.device
    if mode == "nf4":
        layer = bnb.nn.Linear4bit(
            *shape, compute_dtype=compute_dtype or torch.float32, compress_statistics=True, quant_type="nf4", device="meta"
        )
        layer.support_avx512bf16_for_cpu = False  # see the module's docstring
        # A shell's weight is empty (not on the meta device: peft puts LoRA where it is).
        data = linear.weight.data if from_weights else torch.empty(0, dtype=torch.uint8, device=device)
        weight = bnb.nn.Params4bit(data, requires_grad=False, compress_statistics=True, quant_type="nf4", module=layer)
        layer.weight = weight._quantize(device) if from_weights else weight
    else:
        layer = bnb.nn.Linear8bitLt(*shape, has_fp16_weights=False, threshold=INT8_THRESHOLD, device="meta")
        data = linear.weight.data.cpu() if from_weights else torch.empty(0, dtype=torch.int8, device=device)
        weight = bnb.nn.Int8Params(data, requires_grad=False, has_fp16_weights=False)
        layer.weight = weight._quantize(device) if from_weights else weight
    layer.bias = linear.bias
    return layer


# --- a saved quantised base -----------------------------------------------------------

# What a saved NF4 layer's JSON quant state may hold (bitsandbytes writes these keys).
NF4_STATE = {"quant_type": "nf4", "blocksize": 64, "nested_blocksize": 256, "nested_dtype": "float32"}


def install_quantized(model: nn.Module, state: Dict[str, torch.Tensor]) -> Set[str]:
    """Give each quantised layer its saved weights (on the CPU), taking their entries out
    of `state`; return the names of the weights so filled.

    Everything read is checked against the layer it is for (shapes, dtypes, the quant
    state's fields): a saved pipeline is data and may be damaged."""
    if not is_quantized(model):
        return set()
    bnb = bitsandbytes()
    installed = set()
    for name, layer in model.named_modules():
        if isinstance(layer, bnb.nn.Linear4bit):
            _install_nf4(bnb, name, layer, state)
        elif isinstance(layer, bnb.nn.Linear8bitLt):
            _install_int8(bnb, name, layer, state)
        else:
            continue
        installed.add(f"{name}.weight")
    return installed


def _take(state: dict, key: str, dtype: torch.dtype, numel: Optional[int] = None) -> torch.Tensor:
    value = state.pop(key, None)
    if value is None:
        raise ValueError(f"the saved quantised base lacks {key!r}")
    if value.dtype != dtype or (numel is not None and value.numel() != numel):
        raise ValueError(
            f"the saved quantised weight {key!r} is not {dtype}{f' with {numel} values' if numel is not None else ''}"
        )
    return value


def _install_nf4(bnb, name: str, layer, state: dict) -> None:
    out_features, in_features = layer.out_features, layer.in_features
    prefix = f"{name}.weight"
    blocks = -(-out_features * in_features // NF4_STATE["blocksize"])
    packed = _take(state, prefix, torch.uint8, (out_features * in_features + 1) // 2)
    stats = {
        "absmax": _take(state, f"{prefix}.absmax", torch.uint8, blocks),
        "quant_map": _take(state, f"{prefix}.quant_map", torch.float32, 16),
        "nested_absmax": _take(state, f"{prefix}.nested_absmax", torch.float32, -(-blocks // NF4_STATE["nested_blocksize"])),
        "nested_quant_map": _take(state, f"{prefix}.nested_quant_map", torch.float32, 256),
    }
    raw = _take(state, f"{prefix}.quant_state.bitsandbytes__nf4", torch.uint8)
    try:
        info = json.loads(bytes(raw.tolist()).decode("utf-8"))
    except ValueError:  # UnicodeDecodeError included
        raise ValueError(f"the saved quant state of {prefix!r} is not JSON") from None
    expected = {**NF4_STATE, "shape": [out_features, in_features]}
    if not isinstance(info, dict) or any(info.get(k) != v for k, v in expected.items()) or not (
        info.get("dtype") in ("float32", "bfloat16", "float16") and isinstance(info.get("nested_offset"), float)
    ):
        raise ValueError(f"the saved quant state of {prefix!r} is not an NF4 state of this layer")
    stats.update({k: info[k] for k in ("quant_type", "blocksize", "dtype", "shape", "nested_blocksize", "nested_dtype", "nested_offset")})
    layer.weight = bnb.nn.Params4bit.from_prequantized(packed, stats, device="cpu", module=layer)


def _install_int8(bnb, name: str, layer, state: dict) -> None:
    weight = _take(state, f"{name}.weight", torch.int8, layer.out_features * layer.in_features)
    scales = _take(state, f"{name}.SCB", torch.float32, layer.out_features)
    _take(state, f"{name}.weight_format", torch.uint8, 1)  # 0: row-major, the only layout written
    weight = weight.reshape(layer.out_features, layer.in_features)
    layer.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False, CB=weight, SCB=scales)
