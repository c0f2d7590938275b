"""The supported decoder families (`families.py`): which are accepted, how their blocks are
reached, and which attention each one runs with."""
import pytest
import torch
import transformers

from spacy_unmask.families import SUPPORTED_MODEL_TYPES, check_supported, choose_attention, decoder_layers
from spacy_unmask.layers.decoder_tok2vec import DecoderTok2Vec
from tiny_models import FAMILIES, tiny_config, tiny_decoder


def test_every_supported_family_has_a_tiny_model_in_the_tests():
    """A family added to the supported list without a tiny model would go untested."""
    assert sorted(FAMILIES) == sorted(SUPPORTED_MODEL_TYPES)
    for family in FAMILIES:
        check_supported(tiny_config(family), family)  # accepted


def test_an_unsupported_family_is_refused_listing_the_supported_ones():
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64)
    with pytest.raises(ValueError) as err:
        check_supported(config, "openai-community/gpt2")
    message = str(err.value)
    assert "model 'openai-community/gpt2' has architecture 'gpt2'" in message
    assert message.endswith(f"Supported: {', '.join(SUPPORTED_MODEL_TYPES)}.")


def test_unsupported_architecture_is_named(tmp_path):
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    model = DecoderTok2Vec(name=str(tmp_path), unmask="all", dtype="float32")
    with pytest.raises(ValueError, match="gpt2.*Supported: llama, mistral"):
        model.initialize()


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_decoder_layers_are_the_models_own_blocks(family):
    decoder = tiny_decoder(family, num_layers=3)
    layers = decoder_layers(decoder)
    assert len(layers) == 3 and layers is decoder.layers


def test_a_model_without_layers_cannot_take_masks():
    with pytest.raises(ValueError, match="^Linear has no .layers; cannot install masks$"):
        decoder_layers(torch.nn.Linear(2, 2))


@pytest.mark.parametrize(
    "family,expected",
    [("llama", "sdpa"), ("gemma", "sdpa"), ("gemma3_text", "sdpa"), ("gemma2", "eager")],
)
def test_auto_attention_is_eager_only_where_sdpa_lacks_soft_capping(family, expected):
    config = tiny_config(family)
    assert bool(getattr(config, "attn_logit_softcapping", None)) == (family == "gemma2")
    assert choose_attention(config, "auto") == expected
    for chosen in ("sdpa", "eager"):  # an explicit setting is kept
        assert choose_attention(config, chosen) == chosen
