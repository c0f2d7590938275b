"""`quantize = "int8"` (`quantize.py`): int8 weights, per-piece activation scales, masks
still on every layer, full-precision weights saved, training refused."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import spacy
import torch
from spacy.training import Example
from thinc.api import Adam

from spacy_unmask import cpu, get_backbone, quantize
from spacy_unmask.quantize import Int8Linear
from test_saving import read_backbone
from tiny_models import make_pipeline, train_pipeline

TRAIN = [
    ("Peter Blackburn visited Brussels .", [("Peter Blackburn", "PER"), ("Brussels", "LOC")]),
    ("EU rejects German call to boycott British lamb .", [("EU", "ORG")]),
    ("The capital of Germany is Berlin .", [("Germany", "LOC"), ("Berlin", "LOC")]),
]
TEXTS = [t for t, _ in TRAIN] + ["Peter visited Berlin and the EU .", "Brussels rejects Peter Blackburn ."]
QUANTIZE = {"components": {"ner": {"model": {"tok2vec": {"quantize": "int8"}}}}}


@pytest.fixture(scope="module")
def saved(tiny_dirs, tmp_path_factory):
    nlp = make_pipeline(tiny_dirs("gemma3_text", "metaspace"), lora_r=4, lora_dropout=0.0,
                        lora_targets=["attention", "mlp"])
    train_pipeline(nlp, 60, learn_rate=0.005, data=TRAIN)
    path = tmp_path_factory.mktemp("quantize") / "pipeline"
    nlp.to_disk(path)
    return path


def ents(doc):
    return [(e.start, e.end, e.label_) for e in doc.ents]


needs_exact_int8 = pytest.mark.skipif(
    not cpu.int8_products_exact(),
    reason="int8 is refused on this CPU (its int8 products are not exact): "
           "test_int8_is_refused_where_products_are_not_exact covers it",
)


def exact_arithmetic(monkeypatch):
    """From here on, int8 products are computed exactly in float64 (integer sums this small
    are exact there): the scheme's own arithmetic, free of any kernel."""
    monkeypatch.setattr(quantize, "int_product", lambda a, b: (a.double() @ b.double()).to(torch.int32))


def entity_f1(found, reference):
    found, reference = set(found), set(reference)
    return 2 * len(found & reference) / (len(found) + len(reference)) if found or reference else 1.0


@needs_exact_int8
def test_int8_pipeline_has_int8_weights_and_computes_the_scheme_exactly(saved, monkeypatch):
    full = spacy.load(saved)
    int8 = spacy.load(saved, config=QUANTIZE)
    docs_full, docs_int8 = list(full.pipe(TEXTS)), list(int8.pipe(TEXTS))
    backbone = get_backbone(int8)
    linears = [m for m in backbone.model.modules() if isinstance(m, Int8Linear)]
    assert len(linears) == 7 * backbone.num_layers  # q k v o gate up down, LoRA folded in
    assert all(m.weight.dtype == torch.int8 for m in linears)
    assert not [m for m in backbone.model.layers.modules() if isinstance(m, torch.nn.Linear)]
    # The kernel's integer products are exact, so the pipeline gives what the scheme's
    # arithmetic gives: the same entities, and scores equal up to float32 rounding.
    exact_arithmetic(monkeypatch)
    docs_exact = list(spacy.load(saved, config=QUANTIZE).pipe(TEXTS))
    assert [ents(d) for d in docs_int8] == [ents(d) for d in docs_exact]
    for a, b in zip(docs_int8, docs_exact):
        np.testing.assert_allclose(a.spans["ner"].attrs["scores"], b.spans["ner"].attrs["scores"], atol=1e-4)
    # Against full precision only the quantisation's own error is left: nearly every entity stays.
    assert sum(len(d.ents) for d in docs_full) >= 4
    found = [(i, *e) for i, d in enumerate(docs_int8) for e in ents(d)]
    assert entity_f1(found, [(i, *e) for i, d in enumerate(docs_full) for e in ents(d)]) >= 0.8


@needs_exact_int8
def test_int8_vectors_are_the_schemes_and_near_full_precision(saved, monkeypatch):
    full, int8 = spacy.load(saved), spacy.load(saved, config=QUANTIZE)
    docs = [full.make_doc(t) for t in TEXTS]

    def vectors(nlp):
        return nlp.get_pipe("ner").model.get_ref("tok2vec").predict(docs)

    got, want = vectors(int8), vectors(full)
    exact_arithmetic(monkeypatch)
    exact = vectors(spacy.load(saved, config=QUANTIZE))
    for a, b, c in zip(got, exact, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b).max())
        cosine = (a * c).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(c, axis=1)
        # int8 weights and per-piece activations on a random 4-layer model: a few per cent
        # of each vector's norm, never a different direction
        assert cosine.min() > 0.9


def test_int8_is_refused_where_products_are_not_exact(saved, monkeypatch):
    monkeypatch.setattr(cpu, "int8_products_exact", lambda: False)
    int8 = spacy.load(saved, config=QUANTIZE)
    with pytest.raises(ValueError, match="quantize = .int8. needs int8 matrix products that are exact"):
        int8("Peter Blackburn visited Brussels .")
    monkeypatch.setattr(cpu, "bf16_supported", lambda: False)
    auto = spacy.load(saved, config={"components": {"ner": {"model": {"tok2vec": {"quantize": "auto", "dtype": "auto"}}}}})
    doc = auto("Peter Blackburn visited Brussels .")  # auto: float32 here, not int8
    assert not get_backbone(auto).predicts_in_int8 and len(doc.ents) >= 1
    assert not any(isinstance(m, Int8Linear) for m in get_backbone(auto).model.modules())


CHILD = """
import json, torch
from spacy_unmask import cpu
from spacy_unmask.quantize import int_product
torch.manual_seed(0)
a = torch.randint(-127, 128, (64, 640), dtype=torch.int8)
b = torch.randint(-127, 128, (640, 1024), dtype=torch.int8)
print(json.dumps({"probe": cpu.int8_products_exact(), "bf16": cpu.bf16_supported(),
                  "exact": bool(torch.equal(int_product(a, b).long(), a.long() @ b.long()))}))
"""


@pytest.mark.parametrize("caps", [
    {},
    {"ATEN_CPU_CAPABILITY": "avx2", "DNNL_MAX_CPU_ISA": "AVX2"},  # an AVX2-only CPU
    {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},  # AVX-512 without VNNI
    {"DNNL_MAX_CPU_ISA": "AVX512_CORE_VNNI"},
    {"ATEN_CPU_CAPABILITY": "avx512"},
], ids=lambda caps: "+".join(f"{k}={v}" for k, v in caps.items()) or "this-cpu")
def test_int8_is_used_only_where_a_real_product_is_exact(caps):
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA")}
    out = subprocess.run([sys.executable, "-c", CHILD], env={**env, **caps}, capture_output=True, text=True, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    # where the check lets int8 run, a 64 x 640 by 640 x 1,024 product is exact
    assert found["exact"] or not found["probe"]
    if caps.get("DNNL_MAX_CPU_ISA", caps.get("ONEDNN_MAX_CPU_ISA")) in ("AVX2", "AVX512_CORE"):
        assert not found["probe"] and not found["bf16"]  # no VNNI, no bfloat16: float32, never int8


@needs_exact_int8
def test_masks_still_reach_every_layer(saved):
    int8 = spacy.load(saved, config=QUANTIZE)
    backbone = get_backbone(int8)
    int8("Peter visited Berlin .")  # quantised now
    backbone.model.layers[2]._forward_pre_hooks.clear()
    with pytest.raises(RuntimeError, match=r"decoder layers \[2\] did not take"):
        int8("Peter visited Berlin .")


@needs_exact_int8
def test_saved_with_int8_keeps_full_weights_and_loads_quantised(saved, tmp_path):
    int8 = spacy.load(saved, config=QUANTIZE)
    expected = [ents(d) for d in int8.pipe(TEXTS)]
    int8.to_disk(tmp_path / "again")
    # the same full-precision weights (the settings copy beside them says int8)
    assert read_backbone(tmp_path / "again" / "ner" / "model") == read_backbone(saved / "ner" / "model")
    again = spacy.load(tmp_path / "again")
    assert again.config["components"]["ner"]["model"]["tok2vec"]["quantize"] == "int8"
    assert [ents(d) for d in again.pipe(TEXTS)] == expected
    assert any(isinstance(m, Int8Linear) for m in get_backbone(again).model.modules())


def test_training_with_int8_is_refused(saved):
    int8 = spacy.load(saved, config=QUANTIZE)
    text, spans = TRAIN[0]
    eg = Example.from_dict(int8.make_doc(text), {"entities": [(0, 15, "PER")]})
    with pytest.raises(ValueError, match="quantize = 'int8' is for prediction only"):
        int8.update([eg], sgd=Adam(0.001))


def test_unknown_quantize_value_names_the_accepted_ones(tiny_dirs):
    nlp = spacy.blank("en")
    with pytest.raises(ValueError, match="quantize .int4. is not supported; accepted: auto, none, int8"):
        nlp.add_pipe("unmask_ner", config={"model": {"tok2vec": {"name": tiny_dirs("llama"), "quantize": "int4"}}})


def test_int8_linear_matches_a_float_linear_closely(monkeypatch):
    exact_arithmetic(monkeypatch)
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    x = torch.randn(5, 7, 64) * torch.logspace(-2, 2, 7)[None, :, None]  # rows of very different sizes
    got = Int8Linear(linear.weight, linear.bias)(x)
    want = linear(x)
    rel = (got - want).norm(dim=-1) / want.norm(dim=-1)
    assert rel.max() < 0.02  # per-row scales: small rows keep their precision


def test_int8_linear_keeps_a_few_huge_input_channels_from_crushing_the_rest(monkeypatch):
    exact_arithmetic(monkeypatch)
    # Gemma-style activations: a few channels ~100x the others. Per-row scales alone
    # spend the int8 range on them; taking the largest channels out of the int8 product
    # keeps the others' precision.
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 32)
    x = torch.randn(4, 5, 256)
    x[..., [3, 100, 200]] *= 100
    want = linear(x)

    def error(module):
        return ((module(x) - want).norm(dim=-1) / want.norm(dim=-1)).max()

    assert error(Int8Linear(linear.weight, linear.bias, outliers=16)) < 0.01
    assert error(Int8Linear(linear.weight, linear.bias, outliers=0)) > 0.02  # what it guards against


def test_int8_linear_takes_one_piece_and_inputs_narrower_than_its_outlier_budget(monkeypatch):
    exact_arithmetic(monkeypatch)
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 4)  # all 8 channels fit in the outlier budget
    x = torch.randn(1, 8)
    assert torch.allclose(Int8Linear(linear.weight, linear.bias, outliers=16)(x), linear(x), rtol=0.02, atol=0.02)


@pytest.mark.parametrize("dtype, has_bfloat16, int8", [
    ("auto", False, True),  # a CPU without bfloat16: int8 rather than float32
    ("auto", True, False),  # bfloat16 is there: it is used
    ("float32", False, False),  # float32 asked for: float32
])
def test_quantize_auto_predicts_in_int8_where_dtype_auto_finds_no_bfloat16(saved, monkeypatch, dtype, has_bfloat16, int8):
    monkeypatch.setattr(cpu, "bf16_supported", lambda: has_bfloat16)
    monkeypatch.setattr(cpu, "int8_products_exact", lambda: True)
    exact_arithmetic(monkeypatch)
    nlp = spacy.load(saved, config={"components": {"ner": {"model": {"tok2vec": {"quantize": "auto", "dtype": dtype}}}}})
    nlp("Peter Blackburn visited Brussels .")
    backbone = get_backbone(nlp)
    assert backbone.predicts_in_int8 == int8
    assert any(isinstance(m, Int8Linear) for m in backbone.model.modules()) == int8
    text, _ = TRAIN[0]
    nlp.update([Example.from_dict(nlp.make_doc(text), {"entities": [(0, 15, "PER")]})], sgd=Adam(0.001))  # trains
