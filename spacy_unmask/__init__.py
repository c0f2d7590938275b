"""spacy-unmask: decoder-only LLMs with per-layer causal masks as spaCy sequence labelers.

Importing this package is cheap: spaCy imports every installed plugin, so
torch, transformers and peft load only when a model is built.
"""
from .masks import unmasked_layers

__all__ = ["unmasked_layers", "DecoderTok2Vec", "UnmaskNER"]
__version__ = "0.1.0"


def __getattr__(name):
    if name == "DecoderTok2Vec":
        from .layers.decoder_tok2vec import DecoderTok2Vec

        return DecoderTok2Vec
    if name == "UnmaskNER":
        from .pipeline.unmask_ner import UnmaskNER

        return UnmaskNER
    raise AttributeError(name)
