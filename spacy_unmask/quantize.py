"""Dynamic int8 inference on the CPU: int8 weights, activations quantised per token.

`quantize = "int8"` replaces each linear layer of the decoder blocks (its LoRA
adapter folded in first, exactly, in float32) by an `Int8Linear`: the weight is
stored as int8 with one scale per output channel, and at each call every row
(piece) of the input gets its own scale from its largest absolute value, so a
piece with large activations does not crush the resolution of the others. The
product runs as an int8 x int8 -> int32 matrix multiply (`int_product`: torch._int_mm,
VNNI or AMX on x86 CPUs; used only where `cpu.int8_products_exact` finds it exact) and
is rescaled into the input's dtype.

Outlier channels: Gemma-style decoders carry a few input channels tens or hundreds
of times larger than the rest (up to ~330 against a median channel maximum of ~4.5
on Gemma 3's attention inputs), and they set the scale of every row they are in.
`Int8Linear(outliers=N)` can take the N largest input channels of each call out of
the int8 product (and out of the row scales) and multiply them in the activations'
own precision against their int8 weight rows (LLM.int8()'s decomposition, chosen per
batch). On Gemma 3's last hidden state 16 such channels halve the relative error
(0.21 -> 0.10), but F1 did not follow: on dev of CoNLL-2003, NCBI-disease and BC5CDR
the plain scheme scored 0.02 to 0.14 higher (docs/speed.md), and it is faster, so
`OUTLIER_CHANNELS` is 0 and the decomposition is a measured option, not the default.

The model stays a torch module: the per-layer mask hooks still see every layer.
The stored full-precision weights are kept aside, never changed, and put back
for saving or any training step (`Backbone.set_inference_form`), so a pipeline
saved with `quantize = "int8"` in its config keeps its full weights and loads
quantised.

Per-tensor activation scales (torch's legacy `quantize_dynamic`) moved Gemma 3's
last hidden state by a relative error of 0.65; see docs/speed.md.
"""
from typing import Dict, Tuple

import torch
from torch import nn

from .families import decoder_layers
from .lora import folded_weight

# Input channels per call taken out of the int8 product and multiplied in the
# activations' precision. 0, chosen on dev F1 (docs/speed.md); the relative error of
# Gemma 3's last hidden state falls with more (8 -> 0.115, 16 -> 0.099, 32 -> 0.095;
# research/quantize_error.py), the F1 of three corpora did not.
OUTLIER_CHANNELS = 0


def int_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The exact int32 product of two int8 matrices (where `cpu.int8_products_exact`)."""
    return torch._int_mm(a, b)


class Int8Linear(nn.Module):
    """y = x W^T (+ b) with W in int8 (per output channel) and x quantised per row,
    but for its `outliers` largest input channels, kept in x's precision."""

    def __init__(self, weight: torch.Tensor, bias=None, outliers: int = OUTLIER_CHANNELS):
        super().__init__()
        weight = weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        q = torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.outliers = min(outliers, self.in_features)
        self.register_buffer("weight_t", q.t().contiguous(), persistent=False)  # (in, out)
        self.register_buffer("weight_scale", scale, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().float(), persistent=False)

    @property
    def weight(self) -> torch.Tensor:
        """The int8 weight, (out, in), as nn.Linear lays it out (for inspection)."""
        return self.weight_t.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        # (abs().amax() is several times faster than vector_norm(inf) on the CPU; the
        # rescale stays in float32 so that rounding to int8 is the only rounding.)
        magnitude = rows.abs()
        if self.outliers:
            outliers = magnitude.amax(dim=0).topk(self.outliers).indices
            magnitude.index_fill_(1, outliers, 0)
        top = magnitude.amax(dim=1, keepdim=True).float().clamp_(min=1e-12)
        q = (rows * (127.0 / top)).round_().clamp_(-127, 127).to(torch.int8)
        scale = self.weight_scale.to(x.dtype)
        if self.outliers:
            q.index_fill_(1, outliers, 0)
        out = int_product(q, self.weight_t).to(x.dtype)
        out.mul_((top / 127.0).to(x.dtype)).mul_(scale)
        if self.outliers:
            outlier_rows = self.weight_t.index_select(0, outliers).to(x.dtype).mul_(scale)
            out.addmm_(rows.index_select(1, outliers), outlier_rows)
        if self.bias is not None:
            out.add_(self.bias.to(x.dtype))
        return out.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8, outliers={self.outliers}"


def weight_and_bias(module: nn.Module) -> Tuple[torch.Tensor, object]:
    """(weight with any active LoRA adapter folded in, in float32; bias) of a linear layer."""
    from peft.tuners.lora import LoraLayer

    if isinstance(module, LoraLayer):
        return folded_weight(module), module.get_base_layer().bias
    return module.weight.detach().float(), module.bias


def quantize_linears(model: nn.Module, outliers: int = OUTLIER_CHANNELS) -> Dict[Tuple[nn.Module, str], nn.Module]:
    """Swap every linear layer of the decoder blocks (LoRA-wrapped or plain) for an
    `Int8Linear`; return {(parent, name): original module} for `restore_linears`."""
    from peft.tuners.lora import LoraLayer

    originals: Dict[Tuple[nn.Module, str], nn.Module] = {}
    with torch.no_grad():
        for block in decoder_layers(model):
            # A LoRA layer is replaced whole; the linear layers inside it are its own.
            inside = {id(m) for lora in block.modules() if isinstance(lora, LoraLayer) for m in lora.modules() if m is not lora}
            targets = [
                (parent, name, child)
                for parent in block.modules()
                if id(parent) not in inside
                for name, child in parent.named_children()
                if isinstance(child, (LoraLayer, nn.Linear)) and id(child) not in inside
            ]
            for parent, name, child in targets:
                weight, bias = weight_and_bias(child)
                setattr(parent, name, Int8Linear(weight, bias, outliers).to(weight.device))
                originals[(parent, name)] = child
    return originals


def restore_linears(originals: Dict[Tuple[nn.Module, str], nn.Module]) -> None:
    for (parent, name), module in originals.items():
        setattr(parent, name, module)
