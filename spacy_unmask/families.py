"""The decoder families spacy-unmask supports, and how to reach their parts.

Shared by `loading` (which checks a model before loading it) and `lora` and
`backbone` (which walk its decoder blocks); it imports nothing of the project.
"""
from torch import nn

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


def check_supported(config, name: str) -> None:
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model {name!r} has architecture {config.model_type!r}, which spacy-unmask "
            f"does not support. Supported: {', '.join(SUPPORTED_MODEL_TYPES)}."
        )


def choose_attention(config, attn_implementation: str) -> str:
    """The attention implementation for a setting: "auto" is SDPA, or eager where SDPA lacks soft-capping."""
    if attn_implementation == "auto":
        softcap = getattr(config, "attn_logit_softcapping", None)
        return "eager" if softcap else "sdpa"
    return attn_implementation


def decoder_layers(model) -> nn.ModuleList:
    layers = getattr(model, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no .layers; cannot install masks")
    return layers
