"""How far int8 moves the decoder's last hidden states, scheme by scheme (docs/speed.md).

    python -m research.quantize_error --model gemma3-270m --num-layers -6 --data corpus/conll03/dev.spacy

On the first 48 docs of --data, against float32: relative error (Frobenius) and the
cosine of each token's vector, min and mean, for
  - per-piece activation scales with per-channel weights, no outlier channels (`Int8Linear`
    with outliers=0, the first scheme shipped);
  - the same with the 8, 16 (what ships) or 32 largest input channels of each call taken
    out of the int8 product;
  - the first scheme with one kind of projection left in float (q/k/v, o, gate/up, down);
  - the first scheme with SmoothQuant (alpha 0.5), scales calibrated on docs 1000-1063 of --data;
  - the same with SmoothQuant scales guessed from the weights (Gemma's norm weights, the
    v rows for o_proj, the gate x up row norms for down_proj);
  - int8 in one decoder layer only, each in turn.
"""
import argparse
import sys
import warnings

import torch
from torch import nn


class SmoothInt8(nn.Module):
    """x W^T as Int8Linear((W * s), x / s): SmoothQuant's migration of activation scale."""

    def __init__(self, linear: nn.Linear, smooth: torch.Tensor):
        from spacy_unmask.quantize import Int8Linear

        super().__init__()
        self.inner = Int8Linear(linear.weight.float() * smooth[None, :], linear.bias, outliers=0)
        self.register_buffer("inverse", 1.0 / smooth, persistent=False)

    def forward(self, x):
        return self.inner(x * self.inverse.to(x.dtype))


def guessed_scales(layer, config) -> dict:
    """Per-input-channel activation scales guessed from the weights of a Gemma 3 block."""
    attn, mlp = layer.self_attn, layer.mlp
    into_attn = (1 + layer.input_layernorm.weight.float()).abs()
    into_mlp = (1 + layer.pre_feedforward_layernorm.weight.float()).abs()
    v = (attn.v_proj.weight.float() * into_attn[None]).norm(dim=1)
    heads = config.num_attention_heads // config.num_key_value_heads
    v = v.reshape(config.num_key_value_heads, config.head_dim).repeat_interleave(heads, 0).reshape(-1)
    gate = (mlp.gate_proj.weight.float() * into_mlp[None]).norm(dim=1)
    up = (mlp.up_proj.weight.float() * into_mlp[None]).norm(dim=1)
    return {"self_attn.q_proj": into_attn, "self_attn.k_proj": into_attn, "self_attn.v_proj": into_attn,
            "self_attn.o_proj": v, "mlp.gate_proj": into_mlp, "mlp.up_proj": into_mlp, "mlp.down_proj": gate * up}


def main(argv=None) -> int:
    import spacy
    from spacy.tokens import DocBin

    from spacy_unmask.backbone import Backbone
    from spacy_unmask.quantize import quantize_linears, restore_linears
    from spacy_unmask.settings import BackboneSettings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--num-layers", type=int, default=-6)
    parser.add_argument("--data", default="corpus/conll03/dev.spacy")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    docs = list(DocBin().from_disk(args.data).get_docs(spacy.blank("en").vocab))
    settings = BackboneSettings(name=args.model, num_layers=args.num_layers, finetune="frozen", dtype="float32")
    backbone = Backbone.load(settings).eval()
    batch = backbone.plan(docs[:48])
    layers = backbone.model.layers
    modules = dict(layers.named_modules())
    with torch.inference_mode():
        reference = torch.cat(backbone(batch))

        def report(label: str) -> None:
            out = torch.cat(backbone(batch))
            cosine = nn.functional.cosine_similarity(out, reference, dim=-1)
            error = (out - reference).norm() / reference.norm()
            print(f"{label:34} relative error {error:.3f}  cosine min {cosine.min():.3f} mean {cosine.mean():.4f}", flush=True)

        for outliers in (0, 8, 16, 32):
            originals = quantize_linears(backbone.model, outliers)
            report(f"per-piece int8, {outliers} outlier channels")
            restore_linears(originals)
        for kind in ("q_proj k_proj v_proj", "o_proj", "gate_proj up_proj", "down_proj"):
            originals = quantize_linears(backbone.model, 0)
            restore_linears({key: module for key, module in originals.items() if key[1] in kind.split()})
            report(f"the same, but {kind} in float")
            restore_linears({key: module for key, module in originals.items() if key[1] not in kind.split()})

        calibrated = {}
        hooks = [module.register_forward_pre_hook(
            lambda mod, inputs, name=name: calibrated.__setitem__(name, torch.maximum(
                calibrated.get(name, torch.zeros(inputs[0].shape[-1])),
                inputs[0].abs().reshape(-1, inputs[0].shape[-1]).amax(0))))
            for name, module in layers.named_modules() if isinstance(module, nn.Linear)]
        backbone(backbone.plan(docs[1000:1064]))
        for hook in hooks:
            hook.remove()
        guessed = {f"{i}.{k}": v for i, layer in enumerate(layers)
                   for k, v in guessed_scales(layer, backbone.model.config).items()}
        for label, scales in (("SmoothQuant, calibrated", calibrated), ("SmoothQuant, scales from weights", guessed)):
            swapped = {}
            for name, activation in scales.items():
                linear = modules[name]
                parent_name, _, child = name.rpartition(".")
                weight = linear.weight.abs().amax(0).clamp(min=1e-5)
                smooth = (activation.clamp(min=1e-5) ** 0.5 / weight ** 0.5).clamp(min=1e-5)
                setattr(modules[parent_name], child, SmoothInt8(linear, smooth))
                swapped[(modules[parent_name], child)] = linear
            report(label)
            restore_linears(swapped)

        for i, layer in enumerate(layers):
            originals = quantize_linears(backbone.model, 0)
            inside = {id(m) for m in layer.modules()}
            restore_linears({key: module for key, module in originals.items() if id(key[0]) not in inside})
            report(f"int8 in layer {i} only")
            restore_linears({key: module for key, module in originals.items() if id(key[0]) in inside})
    return 0


if __name__ == "__main__":
    sys.exit(main())
