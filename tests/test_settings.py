"""BackboneSettings: one typed object, validated once, the registered function's signature."""
import inspect

import pytest
from thinc.api import Config

from spacy_unmask.layers.decoder_tok2vec import DecoderTok2Vec
from spacy_unmask.settings import BackboneSettings


def test_the_registered_function_takes_exactly_the_settings_with_their_defaults():
    signature = inspect.signature(DecoderTok2Vec)
    defaults = BackboneSettings(name="x").to_dict()
    assert list(signature.parameters) == list(defaults)
    for name, parameter in signature.parameters.items():
        if name != "name":
            assert parameter.default == defaults[name], name
    assert signature.parameters["name"].default is inspect.Parameter.empty


def test_config_fills_defaults_from_the_settings():
    from spacy.util import registry

    config = Config().from_str('[model]\n@architectures = "spacy_unmask.DecoderTok2Vec.v1"\nname = "x"\n')
    filled = registry.fill(config)["model"]
    assert {k: v for k, v in filled.items() if k != "@architectures"} == BackboneSettings(name="x").to_dict()


@pytest.mark.parametrize(
    "setting,value,fragment",
    [
        ("unmask", "sideways", "Invalid unmask spec 'sideways'"),
        ("lookahead", -1, "lookahead -1"),
        ("sentence_windows", "yes", "sentence_windows 'yes': must be true or false"),
        ("pooling", "max", "pooling 'max' is not supported; accepted: first, last, mean"),
        ("finetune", "qlora", "finetune 'qlora' is not supported"),
        ("lora_r", 0, "lora_r 0: must be a positive integer"),
        ("lora_dropout", 1.0, "lora_dropout 1.0: must be in [0, 1)"),
        ("lora_targets", [], "lora_targets []"),
        ("num_layers", 2.5, "num_layers 2.5: must be an integer"),
        ("window", 1, "window 1: must be an integer of at least 2"),
        ("stride", 300, "stride 300: must be between 1 and the window (256)"),
        ("max_batch_pieces", 0, "max_batch_pieces 0"),
        ("dtype", "int8", "dtype 'int8' is not supported"),
        ("attn_implementation", "flash_attention_2", "FlashAttention ignores per-layer masks"),
        ("save_mode", "lora", "save_mode 'lora' is not supported"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(setting, value, fragment):
    with pytest.raises(ValueError) as err:
        BackboneSettings(name="x", **{setting: value})
    assert fragment in str(err.value)
