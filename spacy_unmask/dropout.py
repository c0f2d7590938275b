"""Dropout whose mask is cheap to draw on CPU.

torch draws a CPU dropout mask one random number per element, which on this
project's machine costs about as much as the projection it regularises: LoRA
dropout on q/k/v/o was a fifth of a SmolLM2 training step. `CheapDropout`
draws 32 random bits per two elements and keeps an element where its 16 bits
clear the threshold, so the drop rate is `p` to within 2**-16, at about a third
of the cost. On other devices it is `torch.nn.functional.dropout`.

Projections that read the same input (q/k/v; gate/up) can share one mask:
`SharedDropout` draws it for the first of them and hands the same dropped
tensor to the others, so a block draws two masks instead of five.
"""
import torch
from torch import nn


class CheapDropout(nn.Dropout):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu" or self.p >= 1.0:
            return super().forward(x)
        count = x.numel()
        bits = torch.empty((count + 1) // 2, dtype=torch.int32, device=x.device)
        bits = bits.random_(-(2**31), 2**31).view(torch.int16)[:count].view(x.shape)
        keep = bits >= round(self.p * 65536) - 32768
        return x * keep * (1.0 / (1.0 - self.p))


class SharedDropout(CheapDropout):
    """CheapDropout shared by `group_size` layers that read the same input tensor.

    The first call with an input draws the mask; the next `group_size - 1` calls
    with that same tensor get the same output (then it is forgotten, so nothing
    is kept between steps). Any other input draws afresh.
    """

    def __init__(self, p: float, group_size: int):
        super().__init__(p, inplace=False)
        self.group_size = group_size
        self._input = self._output = None
        self._uses_left = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self._uses_left and x is self._input:
            output = self._output
        else:
            output = super().forward(x)
            self._input, self._output, self._uses_left = x, output, self.group_size
        self._uses_left -= 1
        if not self._uses_left:
            self._input = self._output = None
        return output


def use_cheap_dropout(model: nn.Module) -> None:
    """Swap every plain `nn.Dropout` inside `model` (e.g. peft's lora_dropout) for CheapDropout."""
    for module in list(model.modules()):
        for name, child in module.named_children():
            if type(child) is nn.Dropout:
                setattr(module, name, CheapDropout(child.p, inplace=False))
