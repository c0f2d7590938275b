"""CheapDropout behaves as dropout: drop rate, scaling, gradients, eval mode, seeding."""
import pytest
import torch
from torch import nn

from spacy_unmask.dropout import CheapDropout, SharedDropout, use_cheap_dropout


@pytest.mark.parametrize("p", [0.05, 0.1, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_drops_at_rate_p_and_rescales_the_rest(p, dtype):
    torch.manual_seed(0)
    x = torch.ones(400, 501, dtype=dtype)  # odd element count
    y = CheapDropout(p).train()(x)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - p) < 4 * (p * (1 - p) / x.numel()) ** 0.5
    torch.testing.assert_close(y[y != 0].float(), torch.full_like(y[y != 0], 1 / (1 - p)).float(), rtol=1e-2, atol=0)
    assert y.dtype == dtype and y.shape == x.shape


def test_masks_differ_between_calls_but_follow_the_seed():
    layer = CheapDropout(0.3).train()
    x = torch.ones(64, 64)
    torch.manual_seed(1)
    first, second = layer(x), layer(x)
    torch.manual_seed(1)
    again = layer(x)
    assert not torch.equal(first, second)
    assert torch.equal(first, again)


def test_gradient_flows_through_kept_elements_only():
    x = torch.ones(32, 32, requires_grad=True)
    y = CheapDropout(0.25).train()(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, (y != 0).float() / 0.75)


def test_eval_mode_and_p_zero_are_the_identity():
    x = torch.randn(8, 8)
    assert CheapDropout(0.5).eval()(x) is x
    assert CheapDropout(0.0).train()(x) is x


def test_lora_dropout_modules_are_swapped_and_nothing_else():
    model = nn.Sequential(nn.Linear(4, 4), nn.ModuleDict({"default": nn.Dropout(0.1)}), nn.Identity())
    use_cheap_dropout(model)
    assert isinstance(model[1]["default"], CheapDropout) and model[1]["default"].p == 0.1
    assert isinstance(model[0], nn.Linear) and isinstance(model[2], nn.Identity)


def test_lora_layers_of_a_decoder_get_cheap_dropout():
    from peft.tuners.lora import LoraLayer

    from spacy_unmask.lora import apply_finetuning
    from spacy_unmask.settings import BackboneSettings
    from tiny_models import tiny_decoder

    model = apply_finetuning(tiny_decoder("llama"), BackboneSettings(name="tiny", lora_dropout=0.2))
    lora = [m for m in model.modules() if isinstance(m, LoraLayer)]
    assert lora and all(
        isinstance(m.lora_dropout["default"], CheapDropout) and m.lora_dropout["default"].p == 0.2 for m in lora
    )


def test_shared_dropout_gives_one_mask_to_the_readers_of_one_input():
    shared = SharedDropout(0.5, group_size=3).train()
    x, other = torch.ones(32, 32), torch.ones(32, 32)
    q, k, v = shared(x), shared(x), shared(x)
    assert q is k is v
    assert shared._input is None  # forgotten after the group: nothing kept between steps
    assert not torch.equal(shared(x), q)  # the next step draws a new mask
    shared(other)
    assert not torch.equal(shared(x), shared(other))  # a different input never reuses a mask


def test_q_k_v_of_a_block_share_a_mask_and_o_does_not():
    from peft.tuners.lora import LoraLayer

    from spacy_unmask.lora import apply_finetuning
    from spacy_unmask.settings import BackboneSettings
    from tiny_models import tiny_decoder

    model = apply_finetuning(tiny_decoder("llama"), BackboneSettings(name="tiny", lora_targets=["attention", "mlp"]))
    attention, mlp = model.layers[0].self_attn, model.layers[0].mlp
    drop = lambda m: m.lora_dropout["default"]
    assert drop(attention.q_proj) is drop(attention.k_proj) is drop(attention.v_proj)
    assert drop(attention.o_proj) is not drop(attention.q_proj)
    assert drop(mlp.gate_proj) is drop(mlp.up_proj) and drop(mlp.down_proj) is not drop(mlp.up_proj)
    assert drop(attention.q_proj) is not drop(model.layers[1].self_attn.q_proj)
    assert all(isinstance(m, LoraLayer) for m in (attention.q_proj, mlp.down_proj))
