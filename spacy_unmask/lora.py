"""Fine-tuning modes (LoRA, frozen, full) and an exact LoRA merge for prediction.

LoRA is injected with peft into the chosen linear layers of the decoder blocks.
For prediction the adapter is folded into a *copy* of each base weight (one
matmul per projection instead of three); the stored base weights are never
changed in place, so any number of predictions, saves and training steps
leave them bit-identical.
"""
from typing import Dict, List, Sequence

import torch
from torch import nn

from .families import decoder_layers
from .settings import BackboneSettings


def linear_module_names(model) -> List[str]:
    """The short names of the linear layers inside the decoder blocks (LoRA targets)."""
    names = set()
    for full_name, module in decoder_layers(model).named_modules():
        if isinstance(module, nn.Linear):
            names.add(full_name.rsplit(".", 1)[-1])
    return sorted(names)


def expand_targets(model, targets: Sequence[str]) -> List[str]:
    """Replace "attention" by the attention projections (q/k/v/o, Phi-3's qkv/o) and
    "mlp" by the feed-forward projections (gate/up/down, Phi-3's gate_up/down)."""
    block = decoder_layers(model)[0]
    groups = {"attention": getattr(block, "self_attn", None), "mlp": getattr(block, "mlp", None)}
    expanded: List[str] = []
    for target in targets:
        if target in groups and groups[target] is not None:
            names = [n for n, m in groups[target].named_children() if isinstance(m, nn.Linear)]
            expanded.extend(n for n in names if n not in expanded)
        elif target not in expanded:
            expanded.append(target)
    return expanded


def apply_finetuning(model, settings: BackboneSettings):
    """Make only the weights of the chosen fine-tuning mode trainable (LoRA: inject it)."""
    if settings.finetune == "full":
        model.requires_grad_(True)
        return model
    model.requires_grad_(False)
    if settings.finetune == "frozen":
        return model
    available = linear_module_names(model)
    targets = expand_targets(model, settings.lora_targets)
    missing = [t for t in targets if t not in available]
    if missing:
        raise ValueError(
            f"lora_targets {settings.lora_targets!r}: {missing} not found in the model; its linear "
            f"layers are {available} (or use 'attention', 'mlp')"
        )
    import peft
    from peft.tuners.lora import LoraLayer

    from .dropout import use_cheap_dropout

    config = peft.LoraConfig(
        r=settings.lora_r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=settings.lora_dropout,
        target_modules=targets,
    )
    model = peft.inject_adapter_in_model(config, model)
    for module in model.modules():
        if isinstance(module, LoraLayer):
            # peft casts each input to float32 for the LoRA branch, which autocast then
            # casts back: two copies of every projection input, about 15% of a CPU step.
            module.cast_input_dtype_enabled = False
            use_cheap_dropout(module.lora_dropout)
    share_dropout_masks(model, settings.lora_dropout)
    for param_name, param in model.named_parameters():
        is_lora = "lora_" in param_name
        param.requires_grad_(is_lora)
        if is_lora:  # float32, so that the optimizer sees full-precision values
            param.data = param.data.float()
    return model


# Projections of one block that read the same input tensor.
SAME_INPUT = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def share_dropout_masks(model, p: float) -> None:
    """One LoRA dropout mask for the projections of a block that read the same input."""
    from peft.tuners.lora import LoraLayer

    from .dropout import SharedDropout

    if p == 0.0:
        return
    for block in decoder_layers(model):
        for names in SAME_INPUT:
            layers = [m for n, m in block.named_modules() if n.rsplit(".", 1)[-1] in names and isinstance(m, LoraLayer)]
            if len(layers) < 2:
                continue
            shared = SharedDropout(p, group_size=len(layers))
            for layer in layers:
                for adapter in layer.lora_dropout:
                    layer.lora_dropout[adapter] = shared


def lora_layers(model) -> List[nn.Module]:
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def folded_weight(layer) -> torch.Tensor:
    """A LoRA layer's base weight with its active adapters added, in float32 (a new tensor)."""
    weight = layer.get_base_layer().weight.detach().float()
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A:
            weight = weight + layer.get_delta_weight(adapter).float()
    return weight


def merge_copies(model) -> Dict[nn.Module, torch.Tensor]:
    """Point each LoRA layer's base weight at a merged copy; return the originals.

    peft's own merge adds the update in place (`weight += delta`) and its unmerge
    subtracts it, which does not give the same bits back in bfloat16, nor in
    float32. Here the original tensor is kept as it is and restored by `restore`.
    """
    originals: Dict[nn.Module, torch.Tensor] = {}
    with torch.no_grad():
        for layer in lora_layers(model):
            adapters = [a for a in layer.active_adapters if a in layer.lora_A]
            if not adapters:
                continue
            base = layer.get_base_layer()
            weight = base.weight.data
            originals[layer] = weight
            base.weight.data = folded_weight(layer).to(weight.dtype)
            layer.merged_adapters = adapters  # peft's forward then skips the LoRA branch
    return originals


def restore(originals: Dict[nn.Module, torch.Tensor]) -> None:
    """Undo `merge_copies`: the original base weights, the LoRA branch live again."""
    for layer, weight in originals.items():
        layer.get_base_layer().weight.data = weight
        layer.merged_adapters = []
