"""Gemma 3 270M from the package registry, held small: an NF4 base (QLoRA) and a
vocabulary trimmed to a text. Cut to its first two layers and computed in float32,
so that what is compared is the quantisation or the trimming, not a CPU's kernels.
They skip, saying so, only when the package registry cannot be reached (see
tests/test_gemma3.py)."""
import json

import pytest
import torch

from test_gguf_tokenizer import EDGE_CASES, PARAGRAPH

MODEL = "gemma3-270m"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_path(registry_model):
    return registry_model(MODEL)


def backbone(**settings):
    from spacy_unmask.backbone import Backbone
    from spacy_unmask.settings import BackboneSettings

    return Backbone.load(BackboneSettings(name=MODEL, num_layers=2, dtype="float32", lora_r=4, **settings))


def hidden(model, text: str) -> torch.Tensor:
    ids = torch.tensor([model.tokenizer(text, add_special_tokens=True)["input_ids"]])
    model.eval()
    with torch.no_grad():
        return model.hidden_states(ids, torch.ones_like(ids))[0]


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_an_nf4_base_moves_the_vectors_less_than_its_weights_and_trains(model_path):
    pytest.importorskip("bitsandbytes")
    import bitsandbytes.functional as F

    full, nf4 = backbone(), backbone(base_quantization="nf4")
    # the weights' own error: NF4 in blocks of 64, as the base holds them
    weight = next(m for n, m in full.model.named_modules() if n.endswith("layers.0.mlp.up_proj")).weight.detach()
    packed, state = F.quantize_4bit(weight, blocksize=64, quant_type="nf4")
    weight_error = relative(F.dequantize_4bit(packed, state), weight)
    assert 0.01 < weight_error < 0.2  # 4 bits a weight: neither exact nor broken
    # each of the two blocks adds at most about its weights' error to the residual stream
    moved = relative(hidden(nf4, PARAGRAPH), hidden(full, PARAGRAPH))
    assert moved < 2 * weight_error
    # LoRA beside the 4-bit base learns: a few steps pull the vectors toward a target
    nf4.train()
    target = torch.zeros(nf4.hidden_size)
    params = [p for p in nf4.parameters() if p.requires_grad]
    assert params and all(p.dtype == torch.float32 for p in params)
    optimizer = torch.optim.Adam(params, lr=1e-3)
    ids = torch.tensor([nf4.tokenizer(PARAGRAPH)["input_ids"]])
    losses = []
    for _ in range(4):
        loss = (nf4.hidden_states(ids, torch.ones_like(ids)) - target).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_a_vocabulary_trimmed_to_ascii_reads_ascii_text_as_before_and_spells_any_text(model_path):
    from spacy.lang.en import English

    from spacy_unmask.vocabulary import trim_backbone

    model = backbone(finetune="frozen")
    old_tokenizer = model.tokenizer
    before = hidden(model, PARAGRAPH)
    report = trim_backbone(model, [English().make_doc("Zürich")], script="ascii")
    # every ASCII text piece of Gemma 3 (not its special pieces), and little else: the
    # corpus's pieces, the special pieces it uses and the byte pieces
    old_data = json.loads(old_tokenizer.backend_tokenizer.to_str())
    control = {a["content"] for a in old_data["added_tokens"] if a["special"]}
    ascii_text = {p for p in old_data["model"]["vocab"] if p not in control and p.replace("\u2581", " ").isascii()}
    kept = set(json.loads(model.tokenizer.backend_tokenizer.to_str())["model"]["vocab"])
    assert report.rows_before == 262144 and ascii_text <= kept
    assert len(ascii_text) < report.rows_after < len(ascii_text) + 300 < 150000
    assert torch.equal(hidden(model, PARAGRAPH), before)
    ids = model.tokenizer("The capital of Germany is Berlin.", add_special_tokens=True)["input_ids"]
    assert ids[0] == model.bos_id == model.tokenizer.bos_token_id
    for text in EDGE_CASES:
        old = old_tokenizer.convert_ids_to_tokens(old_tokenizer(text, add_special_tokens=False)["input_ids"])
        new = model.tokenizer.convert_ids_to_tokens(model.tokenizer(text, add_special_tokens=False)["input_ids"])
        assert model.tokenizer.convert_tokens_to_string(new) == old_tokenizer.convert_tokens_to_string(old)
        if text.isascii():
            assert new == old
    data = json.loads(model.tokenizer.backend_tokenizer.to_str())
    added = [a for a in data["added_tokens"] if a["content"] not in data["model"]["vocab"]]
    assert len(data["model"]["vocab"]) + len(added) == model.model.get_input_embeddings().num_embeddings \
        == model.model.config.vocab_size
