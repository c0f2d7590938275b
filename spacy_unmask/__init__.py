"""spacy-unmask: decoder-only LLMs with per-layer causal masks as spaCy sequence labelers.

Importing this package is cheap: spaCy imports every installed plugin, so
torch, transformers and peft load only when a model is built.
"""
from .masks import unmasked_layers
from .settings import BackboneSettings

__all__ = ["unmasked_layers", "BackboneSettings", "DecoderTok2Vec", "UnmaskNER", "get_backbone", "load", "save"]
__version__ = "0.1.0"


def __getattr__(name):
    if name in ("DecoderTok2Vec", "get_backbone"):
        from .layers import decoder_tok2vec

        return getattr(decoder_tok2vec, name)
    if name in ("load", "save"):
        from . import sharing

        return getattr(sharing, name)
    if name == "UnmaskNER":
        from .pipeline.unmask_ner import UnmaskNER

        return UnmaskNER
    raise AttributeError(name)
