"""Load a decoder LLM, install per-layer attention masks, add LoRA.

`load_decoder` accepts a Hugging Face id, a local `save_pretrained` directory,
a `.gguf` file, or the name of a registry-carried model (`smollm2-135m`).
`UnmaskedDecoder` is the torch module the Thinc layer wraps: it runs the base
model with one attention mask per layer, built by `masks.build_layer_masks`.
"""
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch
import transformers
from packaging.version import Version
from torch import nn

from .masks import build_layer_masks, layer_windows, segment_positions, unmasked_layers

SUPPORTED_MODEL_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
)
ATTENTION_IMPLEMENTATIONS = ("auto", "sdpa", "eager")
FINETUNE_MODES = ("lora", "frozen", "full")
# Keyword that carries the per-layer masks through the model's forward to the layer hooks.
_MASKS_KWARG = "unmask_layer_masks"
_TRANSFORMERS_5 = Version(transformers.__version__) >= Version("5.0.0")


def resolve_source(name: str) -> Tuple[str, Optional[str]]:
    """Where to load `name` from: (directory or hub id, gguf file name or None)."""
    from .download import REGISTRY_MODELS, model_dir

    if name in REGISTRY_MODELS:
        return str(model_dir(name)), None
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ValueError(f"model {name!r}: no such GGUF file")
        return str(path.parent), path.name
    if path.exists():
        if not (path / "config.json").is_file():
            raise ValueError(
                f"model {name!r}: the directory has no config.json; expected a "
                "save_pretrained directory, a .gguf file, a Hugging Face id or one of "
                f"{sorted(REGISTRY_MODELS)}"
            )
        return str(path), None
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ValueError(
            f"model {name!r}: no such file or directory (a model is a Hugging Face id, a "
            f"save_pretrained directory, a .gguf file, or one of {sorted(REGISTRY_MODELS)})"
        )
    return name, None


def load_config(name: str, *, trust_remote_code: bool = False):
    source, gguf_file = resolve_source(name)
    try:
        config = transformers.AutoConfig.from_pretrained(
            source, gguf_file=gguf_file, trust_remote_code=trust_remote_code
        )
    except Exception as err:  # transformers raises many kinds (struct.error on a cut GGUF)
        from .download import REGISTRY_MODELS

        raise ValueError(
            f"model {name!r} could not be loaded ({type(err).__name__}: {err}). Give a Hugging Face "
            "id that is in the local cache (or reachable), a save_pretrained directory, a .gguf "
            f"file, or a registry model: {', '.join(sorted(REGISTRY_MODELS))}. Supported "
            f"architectures: {', '.join(SUPPORTED_MODEL_TYPES)}."
        ) from err
    check_supported(config, name)
    return config


def check_supported(config, name: str) -> None:
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model {name!r} has architecture {config.model_type!r}, which spacy-unmask "
            f"does not support. Supported: {', '.join(SUPPORTED_MODEL_TYPES)}."
        )


def choose_attention(config, attn_implementation: str) -> str:
    if attn_implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation {attn_implementation!r} is not supported; accepted: "
            f"{', '.join(ATTENTION_IMPLEMENTATIONS)} (FlashAttention ignores per-layer masks)"
        )
    if attn_implementation == "auto":
        # SDPA has no logit soft-capping (Gemma 2): use eager there.
        softcap = getattr(config, "attn_logit_softcapping", None)
        return "eager" if softcap else "sdpa"
    return attn_implementation


def load_decoder(
    name: str,
    *,
    attn_implementation: str = "auto",
    dtype: torch.dtype = torch.float32,
    trust_remote_code: bool = False,
):
    """Load the base decoder (without LM head) and its fast tokenizer."""
    config = load_config(name, trust_remote_code=trust_remote_code)
    source, gguf_file = resolve_source(name)
    impl = choose_attention(config, attn_implementation)
    dtype_kwarg = "dtype" if _TRANSFORMERS_5 else "torch_dtype"
    # Load through the causal-LM class: AutoModel on a checkpoint saved from
    # *ForCausalLM can silently re-initialise the weights (transformers 4.53, Gemma 3).
    lm = transformers.AutoModelForCausalLM.from_pretrained(
        source,
        gguf_file=gguf_file,
        attn_implementation=impl,
        trust_remote_code=trust_remote_code,
        **{dtype_kwarg: dtype},
    )
    model = lm.get_decoder()
    del lm
    tokenizer = load_tokenizer(source, gguf_file=gguf_file, trust_remote_code=trust_remote_code)
    return model, tokenizer


def load_tokenizer(source: str, *, gguf_file: Optional[str] = None, trust_remote_code: bool = False):
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        source, gguf_file=gguf_file, trust_remote_code=trust_remote_code
    )
    if not tokenizer.is_fast:
        raise ValueError(
            f"model {source!r}: spacy-unmask needs a fast tokenizer (with character "
            "offsets) and this model only has a slow one"
        )
    return tokenizer


def decoder_layers(model) -> nn.ModuleList:
    layers = getattr(model, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no .layers; cannot install masks")
    return layers


def linear_module_names(model) -> List[str]:
    """The short names of the linear layers inside the decoder blocks (LoRA targets)."""
    names = set()
    for full_name, module in decoder_layers(model).named_modules():
        if isinstance(module, nn.Linear):
            names.add(full_name.rsplit(".", 1)[-1])
    return sorted(names)


def apply_finetuning(
    model,
    finetune: str,
    *,
    lora_r: int = 16,
    lora_alpha: int = 32,
    lora_dropout: float = 0.1,
    lora_targets: Sequence[str] = ("attention",),
):
    """Make only the weights of the chosen fine-tuning mode trainable."""
    if finetune not in FINETUNE_MODES:
        raise ValueError(
            f"finetune {finetune!r} is not supported; accepted: {', '.join(FINETUNE_MODES)}"
        )
    if finetune == "full":
        model.requires_grad_(True)
        return model
    model.requires_grad_(False)
    if finetune == "frozen":
        return model
    available = linear_module_names(model)
    lora_targets = expand_targets(model, lora_targets)
    missing = [t for t in lora_targets if t not in available]
    if missing or not lora_targets:
        raise ValueError(
            f"lora_targets {list(lora_targets)!r}: {missing or 'empty'} not found in the "
            f"model; its linear layers are {available}"
        )
    if lora_r < 1:
        raise ValueError(f"lora_r must be a positive integer, got {lora_r!r}")
    if not 0.0 <= lora_dropout < 1.0:
        raise ValueError(f"lora_dropout must be in [0, 1), got {lora_dropout!r}")
    import peft

    config = peft.LoraConfig(
        r=lora_r,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        target_modules=list(lora_targets),
    )
    model = peft.inject_adapter_in_model(config, model)
    from peft.tuners.lora import LoraLayer

    from .dropout import use_cheap_dropout

    for module in model.modules():
        if isinstance(module, LoraLayer):
            # peft casts each input to float32 for the LoRA branch, which autocast then
            # casts back: two copies of every projection input, about 15% of a CPU step.
            module.cast_input_dtype_enabled = False
            use_cheap_dropout(module.lora_dropout)
    for param_name, param in model.named_parameters():
        is_lora = "lora_" in param_name
        param.requires_grad_(is_lora)
        if is_lora:  # float32, so that the optimizer sees full-precision values
            param.data = param.data.float()
    return model


def expand_targets(model, targets: Sequence[str]) -> List[str]:
    """Replace "attention" by the model's attention projections (q/k/v/o, or Phi-3's qkv/o)."""
    expanded: List[str] = []
    for target in targets:
        if target == "attention":
            attention = decoder_layers(model)[0].self_attn
            expanded.extend(n for n, m in attention.named_children() if isinstance(m, nn.Linear))
        else:
            expanded.append(target)
    return expanded


class UnmaskedDecoder(nn.Module):
    """A decoder whose layers each get their own attention mask.

    Padding is masked in every layer; a layer listed as unmasked attends to both
    sides (within its sliding window, if it has one); other layers stay causal.
    """

    def __init__(self, model, unmask: str, *, autocast_dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.model = model
        config = model.config
        impl = getattr(config, "_attn_implementation", "sdpa")
        if impl not in ("sdpa", "eager"):
            raise ValueError(
                f"attention implementation {impl!r} cannot take per-layer masks; use 'sdpa' or 'eager'"
            )
        self.additive = impl == "eager"
        self.set_unmask(unmask)
        self.windows = layer_windows(config)
        self.autocast_dtype = autocast_dtype
        for index, layer in enumerate(decoder_layers(model)):
            layer.register_forward_pre_hook(partial(_use_layer_mask, index), with_kwargs=True)

    def set_unmask(self, unmask: str) -> None:
        self.unmask = unmask
        self.unmasked = unmasked_layers(unmask, self.model.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    def forward(self, input_ids: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
        """Last hidden states (batch, length, width).

        `segments` (batch, length) says which pieces form one sequence: equal
        positive ids, contiguous; 0 is padding (see `masks.build_layer_masks`).
        Each sequence gets positions from 0 and sees only itself.
        """
        dtype = self.model.get_input_embeddings().weight.dtype
        masks = build_layer_masks(
            segments,
            self.unmasked,
            self.windows,
            additive_dtype=(self.autocast_dtype or dtype) if self.additive else None,
        )
        device_type = input_ids.device.type
        with torch.autocast(
            device_type, dtype=self.autocast_dtype or dtype, enabled=self.autocast_dtype is not None
        ), _training_attention(device_type):
            output = self.model(
                input_ids=input_ids,
                attention_mask=(segments > 0).long(),
                position_ids=segment_positions(segments),
                use_cache=False,
                **{_MASKS_KWARG: masks},
            )
        return output.last_hidden_state


def _training_attention(device_type: str):
    """On CPU, train through SDPA's math kernel: the fused CPU kernel's backward
    takes about seven times its forward with a mask (measured: 1.9 vs 2.6 s a step)."""
    if device_type == "cpu" and torch.is_grad_enabled():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(SDPBackend.MATH)
    return nullcontext()


def _use_layer_mask(index: int, module, args, kwargs):
    masks = kwargs.pop(_MASKS_KWARG, None)
    if masks is not None:
        kwargs["attention_mask"] = masks[index]
    return args, kwargs
