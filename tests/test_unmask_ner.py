"""The unmask_ner component and the shipped configs, trained on tiny models; training on
odd and long documents, `spacy train`, training that goes wrong, determinism; entity scores
(doc.spans, threshold, candidates, temperature) and the entity bias of its decoding."""
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import spacy
import torch
from spacy.tokens import DocBin
from spacy.training import Example, biluo_tags_to_spans
from thinc.api import Adam, Config, fix_random_seed

from spacy_unmask import get_backbone
from spacy_unmask.pipeline.marginals import SpanLattice
from spacy_unmask.pipeline.unmask_ner import log_softmax
from spacy_unmask.pipeline.viterbi import transition_rules, viterbi
from test_marginals import brute_force
from tiny_models import (
    ODD_TEXTS,
    STRIDE,
    STYLES,
    TRAIN,
    WINDOW,
    check_doc,
    gold_examples,
    make_pipeline,
   
    train_pipeline,
    vectors,
)

ROOT = Path(__file__).parent.parent
# every config with a decoder (the baselines have none)
CONFIGS = sorted(p for p in (ROOT / "configs").glob("*.cfg") if "DecoderTok2Vec" in p.read_text())
NER_CONFIG = ROOT / "configs" / "ner.cfg"
TEMPLATES = [
    ("Yesterday Peter Blackburn visited Brussels .", [("Peter Blackburn", "PER"), ("Brussels", "LOC")]),
    ("EU rejects German call to boycott lamb .", [("EU", "ORG")]),
    ("Peter Blackburn said nothing .", [("Peter Blackburn", "PER")]),
    ("The talks in Brussels ended .", [("Brussels", "LOC")]),
]
CHUNKS = {  # chunks of each template: doc.spans["chunks"]
    TEMPLATES[0][0]: [("Yesterday", "NP"), ("Peter Blackburn", "NP"), ("visited", "VP"), ("Brussels", "NP")],
    TEMPLATES[1][0]: [("EU", "NP"), ("rejects", "VP"), ("German call", "NP"), ("to boycott", "VP"), ("lamb", "NP")],
    TEMPLATES[2][0]: [("Peter Blackburn", "NP"), ("said", "VP"), ("nothing", "NP")],
    TEMPLATES[3][0]: [("The talks", "NP"), ("in", "PP"), ("Brussels", "NP"), ("ended", "VP")],
}
TAGS = {"Peter": "NNP", "Blackburn": "NNP", "Brussels": "NNP", "EU": "NNP", ".": "."}


def make_examples(nlp, n=16, seed=0):
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        text, ents = rng.choice(TEMPLATES)
        doc = nlp.make_doc(text)
        spans = [(text.index(t), text.index(t) + len(t), label) for t, label in ents]
        tags = [TAGS.get(tok.text, "XX") for tok in doc]
        chunks = [(text.index(t), text.index(t) + len(t), label) for t, label in CHUNKS[text]]
        examples.append(Example.from_dict(doc, {"entities": spans, "tags": tags, "spans": {"chunks": chunks}}))
    return examples


def tiny_nlp(config_path, model_dir, **overrides):
    """A shipped config on a tiny random model. LoRA's alpha/r scaling of 2 suits real
    weights; on random weights of std 0.02 it makes each step rewrite the layers, so
    the tiny tests scale LoRA down. The 4-layer tiny models keep all their layers (the
    default config cuts Gemma 3's top six)."""
    overrides = {"lora_alpha": 2, "num_layers": 0, **overrides}
    config = spacy.util.load_config(config_path, interpolate=True)

    def fit(node):
        if isinstance(node, dict):
            if node.get("@architectures") == "spacy_unmask.DecoderTok2Vec.v1":
                node.update({"name": model_dir, "dtype": "float32", **overrides})
            if node.get("@architectures") in ("spacy.Tok2VecListener.v1", "spacy_unmask.Tok2VecListener.v1"):
                node["width"] = 32  # the tiny models' hidden size
            for value in node.values():
                fit(value)

    fit(config["components"])
    return spacy.util.load_model_from_config(config, auto_fill=True)


def train(nlp, examples, steps, learn_rate=0.01):
    """A few steps at a constant rate (the shipped configs warm up over 100 steps)."""
    fix_random_seed(0)
    nlp.initialize(lambda: examples)
    optimizer = Adam(learn_rate)
    history = []
    for _ in range(steps):
        losses = {}
        nlp.update(examples, sgd=optimizer, losses=losses)
        history.append(sum(losses.values()))
    return history


@pytest.mark.parametrize("config_path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_trains_and_the_loss_falls(tiny_dirs, config_path):
    nlp = tiny_nlp(config_path, tiny_dirs("llama", "metaspace"))
    history = train(nlp, make_examples(nlp), steps=12)
    assert history[-1] < 0.75 * history[0]


@pytest.fixture(scope="module")
def trained(tiny_dirs):
    nlp = tiny_nlp(NER_CONFIG, tiny_dirs("llama", "metaspace"))
    examples = make_examples(nlp, n=20)
    train(nlp, examples, steps=25)
    return nlp, examples


def test_learns_to_tag_a_repeated_entity(trained):
    nlp, examples = trained
    doc = nlp("The talks in Brussels ended .")
    assert [(e.text, e.label_) for e in doc.ents] == [("Brussels", "LOC")]
    assert nlp.evaluate(examples)["ents_f"] > 0.8


def test_lora_and_head_weights_move(tiny_dirs):
    nlp = tiny_nlp(NER_CONFIG, tiny_dirs("llama", "metaspace"))
    examples = make_examples(nlp)
    nlp.initialize(lambda: examples)
    optimizer = Adam(0.01)
    decoder = get_backbone(nlp).model
    before = {n: p.detach().clone() for n, p in decoder.named_parameters()}
    nlp.update(examples, sgd=optimizer)
    nlp.update(examples, sgd=optimizer)
    moved = {n for n, p in decoder.named_parameters() if not np.allclose(before[n].numpy(), p.detach().numpy())}
    assert moved and all("lora_" in n for n in moved)
    assert any("lora_B" in n for n in moved)


def test_missing_gold_tags_are_left_out_of_the_loss(trained):
    nlp, _ = trained
    ner = nlp.get_pipe("ner")
    doc = nlp.make_doc("Peter Blackburn visited Brussels .")
    partial = Example.from_dict(doc, {"entities": ["U-PER", "-", "-", "-", "O"]})
    full = Example.from_dict(doc, {"entities": ["B-PER", "L-PER", "O", "U-LOC", "O"]})
    scores, _ = ner.model.begin_update([doc])
    _, d_partial = ner.get_loss([partial], scores)
    _, d_full = ner.get_loss([full], scores)
    assert np.all(d_partial[0][1:4] == 0) and np.any(d_full[0][1:4] != 0)


def test_bio_scheme_trains_and_decodes_valid_spans(tiny_dirs):
    config = {
        "model": {"tok2vec": {"name": tiny_dirs("llama", "metaspace"), "dtype": "float32", "lora_alpha": 2}},
        "scheme": "BIO",
    }
    nlp = spacy.blank("en")
    nlp.add_pipe("unmask_ner", name="ner", config=config)
    examples = make_examples(nlp, n=20)
    history = train(nlp, examples, steps=25)
    assert history[-1] < 0.5 * history[0]
    assert [(e.text, e.label_) for e in nlp("Peter Blackburn said nothing .").ents] == [("Peter Blackburn", "PER")]


def test_bad_scheme_is_rejected():
    nlp = spacy.blank("en")
    with pytest.raises(ValueError, match="scheme 'IOBES'.*BILUO, BIO"):
        nlp.add_pipe("unmask_ner", config={"scheme": "IOBES"})


def entities(nlp, texts):
    return [[(e.start_char, e.end_char, e.label_) for e in doc.ents] for doc in nlp.pipe(texts)]


TEXTS = [t for t, _ in TEMPLATES] + ["Nothing here .", ""]


@pytest.mark.parametrize("save_mode", ["full", "adapter"])
def test_round_trip_in_a_fresh_offline_process(tmp_path, tiny_dirs, save_mode):
    import shutil

    model_dir = tmp_path / "base-model"
    shutil.copytree(tiny_dirs("llama", "metaspace"), model_dir)
    nlp = tiny_nlp(NER_CONFIG, str(model_dir), save_mode=save_mode)
    train(nlp, make_examples(nlp), steps=15)
    expected = entities(nlp, TEXTS)
    assert any(expected)
    nlp.to_disk(tmp_path / "pipeline")
    if save_mode == "full":
        shutil.rmtree(model_dir)  # self-contained: the base model is no longer needed
    script = (
        "import json, sys, spacy\n"
        f"nlp = spacy.load({str(tmp_path / 'pipeline')!r})\n"
        f"print(json.dumps([[list(e) for e in d] for d in [[(x.start_char, x.end_char, x.label_) for x in doc.ents] for doc in nlp.pipe({TEXTS!r})]]))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SPACY_UNMASK_CACHE": str(tmp_path / "empty-cache")}
    if save_mode == "adapter":  # its base is a local path, read only with the caller's opt-in
        env["SPACY_UNMASK_FETCH_BASE"] = "1"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [[list(e) for e in d] for d in expected]


def test_to_bytes_from_bytes_and_adapter_mode_is_small(tmp_path, tiny_dirs):
    name = tiny_dirs("llama", "metaspace")
    # rank 4: at the shipped rank 16 on every projection, LoRA is as large as a tiny model's
    # base (on a real model it is about 1% of it)
    nlp = tiny_nlp(NER_CONFIG, name, lora_r=4)
    train(nlp, make_examples(nlp), steps=15)
    data = nlp.to_bytes()
    copy = tiny_nlp(NER_CONFIG, name, lora_r=4).from_bytes(data)
    assert entities(copy, TEXTS) == entities(nlp, TEXTS)
    adapter = tiny_nlp(NER_CONFIG, name, save_mode="adapter", lora_r=4)
    train(adapter, make_examples(adapter), steps=2)
    adapter_size = len(adapter.get_pipe("ner").model.to_bytes())
    assert adapter_size < 0.5 * len(nlp.get_pipe("ner").model.to_bytes())


def test_built_in_ner_on_the_decoder_backbone(tiny_dirs):
    nlp = spacy.blank("en")
    nlp.add_pipe(
        "ner",
        config={
            "model": {
                "@architectures": "spacy.TransitionBasedParser.v2",
                "state_type": "ner",
                "hidden_width": 32,
                "maxout_pieces": 2,
                "use_upper": True,
                "tok2vec": {
                    "@architectures": "spacy_unmask.DecoderTok2Vec.v1",
                    "name": tiny_dirs("llama", "metaspace"),
                    "dtype": "float32",
                    "lora_alpha": 2,
                },
            }
        },
    )
    examples = make_examples(nlp, n=20)
    history = train(nlp, examples, steps=30, learn_rate=0.005)
    assert history[-1] < 0.5 * history[0]
    assert nlp.evaluate(examples)["ents_f"] > 0.5


def test_one_decoder_pass_feeds_ner_chunks_and_tags(tiny_dirs, tmp_path):
    nlp = tiny_nlp(ROOT / "configs" / "multitask.cfg", tiny_dirs("llama", "metaspace"))
    examples = make_examples(nlp, n=20)
    train(nlp, examples, steps=30, learn_rate=0.005)
    scores = nlp.evaluate(examples)
    assert scores["tag_acc"] > 0.8 and scores["ents_f"] > 0.5 and scores["spans_chunks_f"] > 0.5
    assert set(scores["spans_chunks_per_type"]) == {"NP", "VP", "PP"}
    nlp.to_disk(tmp_path / "pipeline")
    loaded = spacy.load(tmp_path / "pipeline")
    backbone = get_backbone(loaded)
    calls = []
    backbone.model.register_forward_hook(lambda *_: calls.append(1))
    texts = [eg.reference.text for eg in examples[:6]]
    docs = list(loaded.pipe(texts, batch_size=3))
    assert len(calls) == 2  # the decoder ran once per batch of three, not once per component

    def annotations(doc):
        return ([(e.text, e.label_) for e in doc.ents], [(s.text, s.label_) for s in doc.spans["chunks"]],
                [t.tag_ for t in doc])

    assert [annotations(d) for d in docs] == [annotations(d) for d in nlp.pipe(texts)]  # saved and loaded whole
    assert all(len(d.spans["chunks"].attrs["scores"]) == len(d.spans["chunks"]) > 0 for d in docs)


def test_grad_factor_weights_what_a_listener_sends_to_the_shared_decoder(tiny_dirs):
    # the tok2vec component's loss is the sum of squares of what each listener sends back,
    # so with NER's factor at 0, 1 and 2 it is b, b + a and b + 4a (a: NER's share)
    nlp = tiny_nlp(ROOT / "configs" / "multitask.cfg", tiny_dirs("llama", "metaspace"), lora_dropout=0.0)
    examples = make_examples(nlp, n=8)
    train(nlp, examples, steps=3)  # the heads start at zero, and send nothing back before a step
    listener = nlp.get_pipe("ner").model.get_ref("tok2vec")
    sent = {}
    for factor in (0.0, 1.0, 2.0):
        listener.attrs["grad_factor"] = factor
        losses = {}
        nlp.update(examples, sgd=False, drop=0.0, losses=losses)  # no step: the same weights each time
        sent[factor] = losses["tok2vec"]
    ner_share = sent[1.0] - sent[0.0]
    assert ner_share > 0.01 * sent[0.0]
    assert sent[2.0] == pytest.approx(sent[0.0] + 4 * ner_share, rel=1e-4)


def test_grad_factor_must_be_a_finite_number_at_least_0():
    config = {"model": {"@architectures": "spacy.Tagger.v2", "tok2vec": {
        "@architectures": "spacy_unmask.Tok2VecListener.v1", "width": 32, "grad_factor": -1.0}}}
    with pytest.raises(ValueError, match="grad_factor -1.0: must be a finite number, at least 0"):
        spacy.blank("en").add_pipe("tagger", config=config)


def test_span_target_learns_chunks_and_leaves_the_entities_alone(tiny_dirs):
    nlp = tiny_nlp(ROOT / "configs" / "chunk.cfg", tiny_dirs("llama", "metaspace"))
    examples = make_examples(nlp, n=20)
    train(nlp, examples, steps=25)
    chunker = nlp.get_pipe("chunker")
    assert set(chunker.labels) == {"NP", "VP", "PP"}  # from doc.spans["chunks"], not doc.ents
    doc = nlp.make_doc("The talks in Brussels ended .")
    doc.ents = [doc.char_span(13, 21, label="LOC")]
    doc = chunker(doc)
    assert [(e.text, e.label_) for e in doc.ents] == [("Brussels", "LOC")]  # untouched
    assert [(s.text, s.label_) for s in doc.spans["chunks"]] == [
        ("The talks", "NP"), ("in", "PP"), ("Brussels", "NP"), ("ended", "VP")]
    scores = nlp.evaluate(examples)
    assert scores["spans_chunks_f"] > 0.9 and "ents_f" not in scores


def test_span_target_refuses_candidates(tiny_dirs):
    nlp = spacy.blank("en")
    with pytest.raises(ValueError, match="candidates_min_score needs target = 'ents'"):
        nlp.add_pipe("unmask_ner", config={"target": "spans", "candidates_min_score": 0.1,
                                           "model": {"tok2vec": {"name": tiny_dirs("llama")}}})
    with pytest.raises(ValueError, match="target .*accepted"):
        spacy.blank("en").add_pipe("unmask_ner", config={"target": "chunks",
                                                          "model": {"tok2vec": {"name": tiny_dirs("llama")}}})


def test_spacy_evaluate_reports_ents_f(tmp_path, trained):
    nlp, examples = trained
    nlp.to_disk(tmp_path / "pipeline")
    DocBin(docs=[eg.reference for eg in examples]).to_disk(tmp_path / "test.spacy")
    subprocess.run(
        [sys.executable, "-m", "spacy", "evaluate", str(tmp_path / "pipeline"), str(tmp_path / "test.spacy"),
         "--output", str(tmp_path / "metrics.json")],
        check=True, capture_output=True,
    )
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["ents_f"] > 0.8 and set(metrics["ents_per_type"]) == {"PER", "LOC", "ORG"}


def test_merged_lora_gives_the_same_entities(tmp_path, trained):
    nlp, _ = trained
    nlp.to_disk(tmp_path / "pipeline")
    loaded = spacy.load(tmp_path / "pipeline")
    module = get_backbone(loaded)
    assert module.merge_for_inference
    merged = entities(loaded, TEXTS)
    assert module.merged
    docs = [loaded.make_doc(t) for t in TEXTS[:3]]
    t2v = loaded.get_pipe("ner").model.get_ref("tok2vec")
    merged_vectors = t2v.predict(docs)
    module.merge_for_inference = False
    unmerged_vectors = t2v.predict(docs)
    assert not module.merged
    assert entities(loaded, TEXTS) == merged == entities(nlp, TEXTS)
    for a, b in zip(merged_vectors, unmerged_vectors):
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_spacy_package_depends_on_spacy_unmask(tmp_path, trained):
    nlp, _ = trained
    nlp.to_disk(tmp_path / "pipeline")
    (tmp_path / "out").mkdir()
    subprocess.run([sys.executable, "-m", "spacy", "package", str(tmp_path / "pipeline"), str(tmp_path / "out"),
                    "--name", "unmask_test", "--version", "0.0.1"], check=True, capture_output=True)
    package = tmp_path / "out" / "en_unmask_test-0.0.1"
    assert any(r.startswith("spacy-unmask") for r in json.loads((package / "meta.json").read_text())["requirements"])
    assert list((package / "dist").glob("*.tar.gz"))


def test_update_honours_drop(tiny_dirs):
    """`[training] dropout` reaches the head (as in spaCy's own components); drop=0 is deterministic."""
    def one_update(drop, seed):
        fix_random_seed(0)
        nlp = tiny_nlp(NER_CONFIG, tiny_dirs("llama"), lora_dropout=0.0)
        examples = make_examples(nlp, n=8)
        nlp.initialize(lambda: examples)
        fix_random_seed(seed)
        optimizer = Adam(0.01)
        nlp.update(examples, drop=drop, sgd=optimizer)  # the softmax layer starts at zero: any input gives the same loss
        return nlp.update(examples, drop=drop, sgd=optimizer)["ner"]

    assert one_update(0.0, 1) == one_update(0.0, 2)  # no dropout: the seed cannot matter
    assert one_update(0.5, 1) != one_update(0.5, 2)  # dropout on: different masks, different loss
    assert one_update(0.5, 1) != one_update(0.0, 1)


# --- training on odd and long documents --------------------------------------------


@pytest.mark.parametrize("style", STYLES)
def test_training_on_odd_text(normalizer_dirs, style):
    """update() on odd docs (no pieces, huge tokens, all empty) runs and gives a finite loss."""
    nlp = make_pipeline(normalizer_dirs[style], lora_r=4)
    data = [(text, []) for text in ODD_TEXTS.values()] + [
        ("😀 Peter visited 東京 \u200b", [("Peter", "PER")]),
        ("\u200b \x07", []),
    ]
    nlp.initialize(lambda: gold_examples(nlp, TRAIN))
    optimizer = Adam(0.01)
    for batch in (gold_examples(nlp, data), gold_examples(nlp, [("", []), ("\u200b", [])]), gold_examples(nlp, [("", [])])):
        losses = nlp.update(batch, sgd=optimizer)
        assert math.isfinite(losses["ner"])
    for doc in nlp.pipe(ODD_TEXTS.values()):
        check_doc(nlp, doc)


@pytest.mark.parametrize("style", STYLES)
def test_training_on_long_doc(normalizer_dirs, style):
    nlp = make_pipeline(normalizer_dirs[style], lora_r=4)
    text = " ".join(t for t, _ in TRAIN[:1] + TRAIN[2:]) + " "
    repeats = 3000 // len(nlp.make_doc(text)) + 1
    long = text * repeats
    doc = nlp.make_doc(long)
    assert len(doc) >= 3000
    labels = {s: label for _, ents_ in TRAIN for s, label in ents_}
    spans, start = [], 0
    for sentence, sentence_ents in (TRAIN[0], TRAIN[2], TRAIN[3]) * repeats:
        for s, label in sentence_ents:
            at = long.index(s, start)
            spans.append((at, at + len(s), labels[s]))
        start = long.index(sentence, start) + len(sentence)
    eg = Example.from_dict(doc, {"entities": spans})
    nlp.initialize(lambda: [eg])
    lora_before = {k: v.detach().clone() for k, v in get_backbone(nlp).named_parameters() if "lora_B" in k}
    optimizer = Adam(0.01)
    for _ in range(2):
        losses = nlp.update([eg], sgd=optimizer)
        assert math.isfinite(losses["ner"]) and losses["ner"] > 0
    after = dict(get_backbone(nlp).named_parameters())
    assert all(torch.isfinite(after[k]).all() for k in lora_before)
    assert any(not torch.equal(after[k], v) for k, v in lora_before.items())
    check_doc(nlp, nlp(long))


# --- spacy train, and training that goes wrong -------------------------------------


def write_train_config(root: Path, model_dir: str) -> Path:
    nlp = spacy.blank("en")
    docs = []
    for eg in gold_examples(nlp):
        docs.append(eg.reference)
    DocBin(docs=docs).to_disk(root / "train.spacy")
    DocBin(docs=docs[:2]).to_disk(root / "dev.spacy")
    config = Config().from_disk(ROOT / "configs" / "ner.cfg", interpolate=False)
    config["components"]["ner"]["model"]["tok2vec"].update(
        name=model_dir, dtype="float32", window=WINDOW, stride=STRIDE, lora_r=4, max_batch_pieces=256, num_layers=0
    )
    config["paths"]["train"] = str(root / "train.spacy")
    config["paths"]["dev"] = str(root / "dev.spacy")
    config["training"]["max_steps"] = 6
    config["training"]["eval_frequency"] = 3
    config["training"]["optimizer"]["learn_rate"]["warmup_steps"] = 1
    config["training"]["logger"]["progress_bar"] = None
    config.to_disk(root / "tiny.cfg")
    return root / "tiny.cfg"


def spacy_train(config_path: Path, output_path: Path, overrides=None):
    """What `python -m spacy train` does, in this process, returning the trained pipeline."""
    from spacy.training.initialize import init_nlp
    from spacy.training.loop import train as train_nlp

    config = spacy.util.load_config(config_path, overrides=overrides or {}, interpolate=False)
    nlp = init_nlp(config, use_gpu=-1)
    output_path.mkdir(parents=True, exist_ok=True)
    return train_nlp(nlp, output_path, use_gpu=-1)


def test_spacy_train_writes_loadable_models(normalizer_dirs, tmp_path):
    config_path = write_train_config(tmp_path, normalizer_dirs["bytelevel"])
    trained, last = spacy_train(config_path, tmp_path / "out")
    assert last == tmp_path / "out" / "model-last"
    for name in ("model-best", "model-last"):
        nlp = spacy.load(tmp_path / "out" / name)
        assert nlp.pipe_names == ["ner"]
        for text in [t for t, _ in TRAIN] + ["", ODD_TEXTS["emoji"]]:
            check_doc(nlp, nlp(text))
        assert "ents_f" in nlp.meta["performance"]
    loaded = spacy.load(last)
    docs = [loaded.make_doc(t) for t, _ in TRAIN]
    for a, b in zip(vectors(loaded, docs), vectors(trained, docs)):
        # Loaded pipelines fold LoRA into the base weights: same vectors up to rounding.
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_nan_loss_stops_update(normalizer_dirs):
    nlp = make_pipeline(normalizer_dirs["metaspace"], lora_r=4)
    train_pipeline(nlp, 1)
    output = nlp.get_pipe("ner").model.get_ref("output_layer")
    W = output.get_param("W").copy()
    W[0, 0] = np.nan
    output.set_param("W", W)
    lora = {k: v.detach().clone() for k, v in get_backbone(nlp).named_parameters() if "lora_" in k}
    with pytest.raises(ValueError, match=r"\[ner\] the loss is nan"):
        nlp.update(gold_examples(nlp), sgd=Adam(0.01))
    # It stops before the step: the backbone is untouched.
    after = dict(get_backbone(nlp).named_parameters())
    assert all(torch.equal(after[k], v) for k, v in lora.items())


@pytest.fixture(scope="module")
def diverged(normalizer_dirs, tmp_path_factory):
    """`spacy train` with a learning rate so large that the weights overflow."""
    root = tmp_path_factory.mktemp("diverged")
    config_path = write_train_config(root, normalizer_dirs["bytelevel"])
    overrides = {"training.optimizer.learn_rate.initial_rate": 1e12, "training.optimizer.grad_clip": 0.0}
    with np.errstate(all="ignore"):
        try:
            spacy_train(config_path, root / "out", overrides=overrides)
        except Exception as err:
            return root / "out", err
    return root / "out", None


def test_diverging_spacy_train_stops_naming_the_loss(diverged):
    _, err = diverged
    assert isinstance(err, ValueError), repr(err)
    assert "loss" in str(err) and "learning rate" in str(err)


def test_diverging_spacy_train_saves_no_broken_model(diverged):
    out, _ = diverged
    for name in ("model-best", "model-last"):
        if not (out / name).exists():
            continue
        nlp = spacy.load(out / name)
        W = nlp.get_pipe("ner").model.get_ref("output_layer").get_param("W")
        assert np.isfinite(W).all(), f"{name}: the saved head has non-finite weights"
        assert np.isfinite(vectors(nlp, [nlp.make_doc(TRAIN[0][0])])[0]).all(), name


# --- determinism -------------------------------------------------------------------


def seeded_run(model_dir, seed):
    fix_random_seed(seed)
    nlp = make_pipeline(model_dir, lora_r=4, lora_dropout=0.2)
    egs = gold_examples(nlp)
    optimizer = nlp.initialize(lambda: egs)
    for _ in range(3):
        nlp.update(egs, sgd=optimizer, drop=0.2)
    lora = {k: v.detach().clone() for k, v in get_backbone(nlp).named_parameters() if "lora_" in k}
    output = nlp.get_pipe("ner").model.get_ref("output_layer")
    head = {name: output.get_param(name).copy() for name in ("W", "b")}
    return lora, head


def test_training_is_deterministic_with_a_fixed_seed(normalizer_dirs):
    model_dir = normalizer_dirs["bytelevel"]
    (lora_a, head_a), (lora_b, head_b) = seeded_run(model_dir, 0), seeded_run(model_dir, 0)
    assert lora_a and set(lora_a) == set(lora_b)
    for key in lora_a:
        assert torch.equal(lora_a[key], lora_b[key]), key
    for key in head_a:
        np.testing.assert_array_equal(head_a[key], head_b[key])
    assert any(lora_a[k].abs().sum() > 0 for k in lora_a if "lora_B" in k)  # training moved LoRA
    lora_c, _ = seeded_run(model_dir, 1)
    assert any(not torch.equal(lora_a[k], lora_c[k]) for k in lora_a)  # the seed matters


# --- entity scores, threshold, candidates, temperature, entity bias -------------------


HOSTILE = [
    "", " ", "\n\n", "x", "Brussels", "😀 👨\u200d👩\u200d👧 🇩🇪 Peter visited Berlin😀",
    "東京は日本の首都です。 Brussels", "مرحبا \u200fPeter\u202e Brussels\u202c", "e\u0301 a\u0300\u0301 Z\u0351",
    "Peter\x00Blackburn \x07 \x1b[31mred\x1b[0m \ufeff end\x7f", "x" * 300, "Brussels . " * 150,
]
DEFAULTS = {"threshold": 0.0, "candidates_min_score": None, "temperature": 1.0, "entity_bias": 0.0, "spans_key": "ner"}


@pytest.fixture
def nlp(trained):
    """The trained pipeline, its ner settings back at their defaults after each test."""
    pipeline, _ = trained
    yield pipeline
    for setting, value in DEFAULTS.items():
        setattr(pipeline.get_pipe("ner"), setting, value)


def group_of(doc, key="ner"):
    group = doc.spans[key]
    return [(s.start, s.end, s.label_) for s in group], np.asarray(group.attrs["scores"])


def ents_of(doc):
    return [(e.start, e.end, e.label_) for e in doc.ents]


def test_the_span_group_holds_the_entities_with_their_probabilities(nlp):
    docs = list(nlp.pipe(TEXTS))
    assert sum(len(doc.ents) for doc in docs) >= 4
    for doc in docs:
        spans, scores = group_of(doc)
        assert spans == ents_of(doc) and len(scores) == len(spans)
        assert ((scores > 0) & (scores <= 1)).all()


@pytest.mark.parametrize("text", ["EU rejects German call", "Peter Blackburn said"])
def test_scores_and_candidates_are_the_probabilities_over_every_valid_tag_sequence(nlp, text):
    ner = nlp.get_pipe("ner")
    ner.candidates_min_score = 0.01
    doc = nlp.make_doc(text)
    log_probs = log_softmax(ner.logits([doc])[0].astype(np.float64))
    lattice = SpanLattice(ner.tags, "BILUO")
    expected = {(s, e, lattice.labels[x]): p for (s, e, x), p in brute_force(lattice, log_probs).items()}
    doc = nlp(text)
    spans, scores = group_of(doc)
    assert len(spans) > len(doc.ents)  # candidates came with the entities
    for span, score in zip(spans, scores):
        assert score == pytest.approx(expected.get(span, 0.0), rel=1e-6, abs=1e-12)
    assert {s for s, p in zip(spans, scores) if p >= 0.01} == {s for s, p in expected.items() if p >= 0.01}


def test_a_bio_pipeline_scores_its_spans_over_the_bio_lattice(tiny_dirs):
    nlp = spacy.blank("en")
    config = {"model": {"tok2vec": {"name": tiny_dirs("llama", "metaspace"), "dtype": "float32"}},
              "scheme": "BIO", "candidates_min_score": 0.02}
    ner = nlp.add_pipe("unmask_ner", name="ner", config=config)
    examples = make_examples(nlp, n=8)
    nlp.initialize(lambda: examples)
    text = "EU rejects German call"
    log_probs = log_softmax(ner.logits([nlp.make_doc(text)])[0].astype(np.float64))
    lattice = SpanLattice(ner.tags, "BIO")
    expected = {(s, e, lattice.labels[x]): p for (s, e, x), p in brute_force(lattice, log_probs).items()}
    spans, scores = group_of(nlp(text))
    assert spans and {s for s, p in expected.items() if p >= 0.02} <= set(spans)
    for span, score in zip(spans, scores):
        assert score == pytest.approx(expected.get(span, 0.0), rel=1e-6, abs=1e-12)


def old_decoding(nlp, texts):
    """doc.ents as unmask_ner set them before entities had scores: Viterbi, then the tags' spans."""
    ner = nlp.get_pipe("ner")
    docs = [nlp.make_doc(t) for t in texts]
    rules = transition_rules(ner.tags, "BILUO")
    out = []
    for doc, logits in zip(docs, ner.logits(docs)):
        tags = [ner.tags[i] for i in viterbi(log_softmax(logits), *rules)]
        doc.ents = biluo_tags_to_spans(doc, tags)
        out.append([(t.ent_iob_, t.ent_type_) for t in doc])
    return out


def test_threshold_0_changes_nothing_even_with_candidates_and_a_temperature(nlp):
    texts = TEXTS + HOSTILE
    expected = old_decoding(nlp, texts)
    assert any(tag != ("O", "") for doc in expected for tag in doc)
    assert [[(t.ent_iob_, t.ent_type_) for t in doc] for doc in nlp.pipe(texts)] == expected
    ner = nlp.get_pipe("ner")
    ner.candidates_min_score, ner.temperature = 0.01, 2.5
    assert [[(t.ent_iob_, t.ent_type_) for t in doc] for doc in nlp.pipe(texts)] == expected


def test_the_threshold_leaves_low_scores_out_of_doc_ents_but_in_the_group(nlp):
    ner = nlp.get_pipe("ner")
    before = [group_of(doc) for doc in nlp.pipe(TEXTS)]
    ner.threshold = 1.0
    docs = list(nlp.pipe(TEXTS))
    assert all(doc.ents == () for doc in docs)
    for doc, (spans, scores) in zip(docs, before):
        assert group_of(doc)[0] == spans and np.array_equal(group_of(doc)[1], scores)
    all_scores = np.concatenate([scores for _, scores in before])
    ner.threshold = float(np.median(all_scores))
    for doc, (spans, scores) in zip(nlp.pipe(TEXTS), before):
        assert ents_of(doc) == [s for s, p in zip(spans, scores) if p >= ner.threshold]
    assert 0 < sum(len(doc.ents) for doc in nlp.pipe(TEXTS)) < len(all_scores)


def test_a_temperature_moves_the_scores_and_never_the_entities(nlp):
    ner = nlp.get_pipe("ner")
    before = [(ents_of(doc), group_of(doc)[1]) for doc in nlp.pipe(TEXTS)]
    ner.temperature = 3.0
    after = [(ents_of(doc), group_of(doc)[1]) for doc in nlp.pipe(TEXTS)]
    assert [e for e, _ in after] == [e for e, _ in before]
    assert not np.allclose(np.concatenate([s for _, s in after]), np.concatenate([s for _, s in before]))


def test_an_entity_bias_moves_the_entities_and_never_the_scores(nlp):
    ner = nlp.get_pipe("ner")
    texts = TEXTS + HOSTILE
    plain = [dict(zip(*group_of(doc))) for doc in nlp.pipe(texts)]
    ner.entity_bias = 50.0  # every token's entity tags far above O: every token in an entity
    docs = list(nlp.pipe(texts))
    assert all(token.ent_iob_ in ("B", "I") for doc in docs for token in doc)
    moved = 0
    for before, doc in zip(plain, docs):
        spans, scores = group_of(doc)
        assert set(ents_of(doc)) == set(spans)
        for span, score in zip(spans, scores):
            if span in before:  # the same span scores the same: the bias is not in the scores
                assert score == pytest.approx(before[span], abs=1e-12)
            else:
                moved += 1
    assert moved > 0
    ner.entity_bias = -50.0
    assert all(doc.ents == () for doc in nlp.pipe(texts))
    ner.entity_bias = 0.0
    assert [dict(zip(*group_of(doc))) for doc in nlp.pipe(texts)] == plain


def test_empty_one_token_and_hostile_texts_get_a_group(nlp):
    nlp.get_pipe("ner").candidates_min_score = 0.05
    docs = list(nlp.pipe(HOSTILE, batch_size=4))
    assert sum(len(doc.spans["ner"]) for doc in docs) > 0
    for doc in docs:
        spans, scores = group_of(doc)
        assert len(scores) == len(spans) and np.isfinite(scores).all()
        assert ((scores >= 0) & (scores <= 1)).all()
        assert set(ents_of(doc)) <= set(spans)
        assert all(p >= 0.05 for s, p in zip(spans, scores) if s not in ents_of(doc))
    copies = list(DocBin(docs=docs).from_bytes(DocBin(docs=docs).to_bytes()).get_docs(nlp.vocab))
    for doc, copy in zip(docs, copies):
        assert group_of(copy)[0] == group_of(doc)[0] and np.array_equal(group_of(copy)[1], group_of(doc)[1])


@pytest.mark.parametrize("setting,value,accepted", [
    ("threshold", 1.5, "a number from 0 to 1"),
    ("threshold", -0.1, "a number from 0 to 1"),
    ("candidates_min_score", 0.0, "null .off. or a number above 0, at most 1"),
    ("temperature", 0.0, "a positive finite number"),
    ("temperature", -2.0, "a positive finite number"),
    ("spans_key", "", "a non-empty string"),
    ("entity_bias", "inf", "a finite number"),
])
def test_bad_settings_are_refused_by_name(setting, value, accepted):
    with pytest.raises(ValueError, match=rf"\[unmask_ner\] {setting} .*: must be {accepted}"):
        spacy.blank("en").add_pipe("unmask_ner", config={setting: value})


def test_spacy_evaluate_scores_are_unchanged_by_the_new_settings(nlp):
    examples = make_examples(nlp, n=12, seed=3)
    plain = nlp.evaluate(examples)
    ner = nlp.get_pipe("ner")
    ner.candidates_min_score, ner.temperature, ner.spans_key = 0.01, 2.0, "sc"
    scored = nlp.evaluate(examples)
    plain.pop("speed"), scored.pop("speed")
    assert scored == plain and plain["ents_f"] > 0.5


SETTINGS = {"threshold": 0.3, "candidates_min_score": 0.05, "temperature": 1.5, "entity_bias": 0.5, "spans_key": "conf"}


def test_settings_are_saved_and_overridden_at_load_time(tmp_path, nlp):
    nlp.to_disk(tmp_path / "plain")
    configured = spacy.load(tmp_path / "plain", config={"components": {"ner": SETTINGS}})
    configured.to_disk(tmp_path / "configured")
    loaded = spacy.load(tmp_path / "configured")
    assert {k: getattr(loaded.get_pipe("ner"), k) for k in SETTINGS} == SETTINGS
    expected = [(ents_of(doc), *group_of(doc, "conf")) for doc in configured.pipe(TEXTS)]
    got = [(ents_of(doc), *group_of(doc, "conf")) for doc in loaded.pipe(TEXTS)]
    for (e1, s1, p1), (e2, s2, p2) in zip(expected, got):
        assert e1 == e2 and s1 == s2 and np.array_equal(p1, p2)
    strict = spacy.load(tmp_path / "configured", config={"components": {"ner": {"threshold": 1.0}}})
    docs = list(strict.pipe(TEXTS))
    assert all(doc.ents == () for doc in docs) and sum(len(doc.spans["conf"]) for doc in docs) > 0


def test_a_pipeline_saved_before_the_settings_existed_loads_with_the_defaults(tmp_path, nlp):
    nlp.to_disk(tmp_path / "old")
    config = spacy.util.load_config(tmp_path / "old" / "config.cfg")
    for setting in DEFAULTS:
        del config["components"]["ner"][setting]
    config.to_disk(tmp_path / "old" / "config.cfg")
    ner = spacy.load(tmp_path / "old").get_pipe("ner")
    assert {k: getattr(ner, k) for k in DEFAULTS} == DEFAULTS


def test_scores_survive_a_fresh_process(tmp_path, nlp):
    nlp.to_disk(tmp_path / "plain")
    spacy.load(tmp_path / "plain", config={"components": {"ner": SETTINGS}}).to_disk(tmp_path / "pipeline")
    expected = [[[list(s) for s in spans], scores.tolist()]
                for spans, scores in (group_of(doc, "conf") for doc in spacy.load(tmp_path / "pipeline").pipe(TEXTS))]
    assert any(scores for _, scores in expected)
    script = (
        "import json, spacy\n"
        f"nlp = spacy.load({str(tmp_path / 'pipeline')!r})\n"
        "out = [[[[s.start, s.end, s.label_] for s in d.spans['conf']], list(map(float, d.spans['conf'].attrs['scores']))]"
        f" for d in nlp.pipe({TEXTS!r})]\n"
        "print(json.dumps(out))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert [spans for spans, _ in got] == [spans for spans, _ in expected]
    np.testing.assert_allclose(sum((s for _, s in got), []), sum((s for _, s in expected), []), rtol=1e-6)


def test_the_component_defaults_are_written_once():
    """The factory's default config, the factory function and the class take them from DEFAULTS."""
    import inspect

    from spacy_unmask.pipeline.unmask_ner import DEFAULTS, UnmaskNER, make_unmask_ner

    config = spacy.blank("en").get_factory_meta("unmask_ner").default_config
    assert {k: config[k] for k in DEFAULTS} == DEFAULTS
    init = inspect.signature(UnmaskNER.__init__).parameters
    assert {k: init[k].default for k in DEFAULTS} == DEFAULTS
    factory = inspect.signature(make_unmask_ner).parameters
    assert all(factory[k].default is inspect.Parameter.empty for k in DEFAULTS)
    ner = spacy.blank("en").add_pipe("unmask_ner")
    assert (ner.spans_key, ner.threshold, ner.temperature, ner.loss) == (
        DEFAULTS["spans_key"], DEFAULTS["threshold"], DEFAULTS["temperature"], DEFAULTS["loss"])
