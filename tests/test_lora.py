"""LoRA: only adapter weights train, and the frozen base weights never change (spacy_unmask/lora.py)."""
import numpy as np
import pytest
import spacy
import torch
from spacy.training import Example

from spacy_unmask import get_backbone

TEXT = "Peter Blackburn visited Brussels ."


def pipeline(model_dir: str, dtype: str):
    nlp = spacy.blank("en")
    nlp.add_pipe("unmask_ner", name="ner", config={"model": {"tok2vec": {"name": model_dir, "dtype": dtype, "lora_alpha": 2}}})
    return nlp


def example(nlp):
    ref = nlp.make_doc(TEXT)
    ref.ents = [ref.char_span(0, 15, label="PER"), ref.char_span(24, 32, label="LOC")]
    return Example(nlp.make_doc(TEXT), ref)


def base_weights(nlp):
    return {k: v.detach().clone() for k, v in get_backbone(nlp).model.state_dict().items() if "lora_" not in k}


def assert_bit_identical(before, after):
    assert before.keys() == after.keys()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert not changed, f"{len(changed)} base tensors changed, e.g. {changed[:3]}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_base_weights_stay_bit_identical_through_predict_save_load_and_training(tiny_dirs, tmp_path, dtype):
    nlp = pipeline(tiny_dirs("llama", "metaspace"), dtype)
    nlp.initialize(lambda: [example(nlp)])
    nlp.update([example(nlp)], sgd=nlp.create_optimizer())  # a LoRA update that is not zero
    nlp.to_disk(tmp_path / "p0")
    loaded = spacy.load(tmp_path / "p0")
    backbone = get_backbone(loaded)
    assert backbone.merge_for_inference
    loaded_weights = base_weights(loaded)
    with_merge = None
    for round_ in range(5):
        docs = list(loaded.pipe([TEXT] * 3))
        assert backbone.merged  # prediction runs on merged copies...
        with_merge = with_merge or [(e.text, e.label_) for e in docs[0].ents]
        assert [(e.text, e.label_) for e in docs[0].ents] == with_merge
        loaded.evaluate([example(loaded)])
        loaded.to_disk(tmp_path / f"p{round_ + 1}")
        assert not backbone.merged  # ...and saving puts the originals back
        assert_bit_identical(loaded_weights, base_weights(loaded))
    again = spacy.load(tmp_path / "p5")
    assert_bit_identical(loaded_weights, base_weights(again))
    lora_before = {k: v.clone() for k, v in get_backbone(again).model.state_dict().items() if "lora_" in k}
    optimizer = again.create_optimizer()
    for _ in range(3):
        list(again.pipe([TEXT]))
        again.update([example(again)], sgd=optimizer)
    assert_bit_identical(loaded_weights, base_weights(again))
    lora_after = get_backbone(again).model.state_dict()
    assert any(not torch.equal(v, lora_after[k]) for k, v in lora_before.items())  # the adapter did train


def test_merged_prediction_uses_the_current_adapter(tiny_dirs, tmp_path):
    """After training a loaded pipeline, prediction merges the new LoRA weights, not stale ones."""
    nlp = pipeline(tiny_dirs("llama"), "float32")
    nlp.initialize(lambda: [example(nlp)])
    nlp.to_disk(tmp_path / "p")
    loaded = spacy.load(tmp_path / "p")
    t2v = loaded.get_pipe("ner").model.get_ref("tok2vec")
    doc = loaded.make_doc(TEXT)
    before = t2v.predict([doc])[0]
    optimizer = loaded.create_optimizer()
    for _ in range(3):
        loaded.update([example(loaded)], sgd=optimizer)
    merged = t2v.predict([doc])[0]
    get_backbone(loaded).merge_for_inference = False
    unmerged = t2v.predict([doc])[0]
    assert not np.allclose(before, merged, atol=1e-6)
    np.testing.assert_allclose(merged, unmerged, atol=1e-4)


def test_attention_and_mlp_targets(tiny_dirs):
    nlp = spacy.blank("en")
    config = {"model": {"tok2vec": {"name": tiny_dirs("llama"), "lora_targets": ["attention", "mlp"], "dtype": "float32"}}}
    nlp.add_pipe("unmask_ner", name="ner", config=config)
    nlp.initialize(lambda: [example(nlp)])
    trained = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, p in get_backbone(nlp).model.named_parameters() if p.requires_grad}
    assert trained == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
