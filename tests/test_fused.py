"""Fused RMSNorm: the same numbers as each family's stock norm, forward and backward."""
import pytest
import torch
from torch import nn
from tiny_models import FAMILIES, tiny_decoder

from spacy_unmask.fused import FUSED_FORWARDS, fuse_rms_norms


def norms(model):
    return [m for m in model.modules() if type(m).__name__ in FUSED_FORWARDS]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_norms_match_the_stock_norms(family, dtype):
    attention = "eager" if family == "gemma2" else "sdpa"  # Gemma 2 soft-caps its attention scores
    stock = tiny_decoder(family, attn_implementation=attention).to(dtype)
    fused = tiny_decoder(family, attn_implementation=attention).to(dtype)
    for model in (stock, fused):  # non-trivial norm weights (Gemma's start at zero)
        torch.manual_seed(1)
        for norm in norms(model):
            norm.weight.data.normal_(0, 0.5)
    assert fuse_rms_norms(fused) == len(norms(fused)) > 0
    assert all("forward" in vars(m) for m in norms(fused))
    ids = torch.randint(3, 300, (2, 9))
    outputs, grads = [], []
    for model in (stock, fused):
        model.zero_grad()
        out = model(input_ids=ids).last_hidden_state
        out.float().square().sum().backward()
        outputs.append(out.detach().float())
        grads.append(torch.cat([m.weight.grad.float().flatten() for m in norms(model)]))
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(outputs[1], outputs[0], **tolerance)
    torch.testing.assert_close(grads[1], grads[0], **tolerance)


def test_a_norm_with_other_semantics_keeps_its_stock_forward():
    class LlamaRMSNorm(nn.Module):  # the known name, but mean-centred (a LayerNorm)
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(8))
            self.variance_epsilon = 1e-6

        def forward(self, x):
            x = x - x.mean(-1, keepdim=True)
            return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)

    model = nn.Sequential(LlamaRMSNorm())
    before = model[0].weight.detach().clone()
    assert fuse_rms_norms(model) == 0
    assert "forward" not in vars(model[0])
    assert torch.equal(model[0].weight, before)  # the probe put the weight back


def test_fusing_twice_changes_nothing():
    model = tiny_decoder("llama")
    first = fuse_rms_norms(model)
    assert first > 0 and fuse_rms_norms(model) == 0


def test_a_fused_model_pickles_and_deep_copies():
    import copy
    import pickle

    model = tiny_decoder("gemma3_text")
    fuse_rms_norms(model)
    ids = torch.randint(3, 300, (1, 7))
    expected = model(input_ids=ids).last_hidden_state
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        norm = norms(clone)[0]
        assert norm.forward.module is norm  # the copy's norms run on their own weights
        torch.testing.assert_close(clone(input_ids=ids).last_hidden_state, expected, rtol=0, atol=0)
