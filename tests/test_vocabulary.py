"""Vocabulary trimming (`vocabulary.py`, `python -m spacy_unmask trim-vocabulary`): a
pipeline keeps only the pieces of a corpus, reads that corpus exactly as before, still
reads any text, and saves smaller."""
import json
import re

import numpy as np
import pytest
import spacy
from spacy.tokens import DocBin

from spacy_unmask import get_backbone
from spacy_unmask.__main__ import main
from spacy_unmask.vocabulary import kept_pieces, trim_backbone
from tiny_models import ODD_TEXTS, STYLES, TRAIN, check_doc, make_pipeline, train_pipeline, vectors

CORPUS = [text for text, _ in TRAIN[:2]]
VOCAB = 640  # room for merges beside the byte pieces and characters


def rows(nlp) -> int:
    return get_backbone(nlp).model.get_input_embeddings().num_embeddings


@pytest.fixture(scope="module", params=STYLES)
def trained(request, tiny_dirs):
    nlp = make_pipeline(tiny_dirs("llama", request.param, vocab_size=VOCAB), lora_r=4)
    train_pipeline(nlp, 10)
    return nlp


def test_a_trimmed_pipeline_reads_its_corpus_as_before_and_every_other_text(trained, tmp_path):
    trained.to_disk(tmp_path / "full")
    nlp = spacy.load(tmp_path / "full")
    corpus = [nlp.make_doc(text) for text in CORPUS]
    others = [nlp.make_doc(text) for text in [TRAIN[3][0], *ODD_TEXTS.values()]]
    before, old_tokenizer = vectors(nlp, corpus), get_backbone(nlp).tokenizer
    had_piece = [check_doc(nlp, doc).any(axis=1) for doc in others]
    report = trim_backbone(get_backbone(nlp), corpus)
    assert report.rows_after == rows(nlp) < report.rows_before == rows(trained)
    for old, new in zip(before, vectors(nlp, corpus)):
        np.testing.assert_allclose(new, old, rtol=0, atol=1e-6)
    tokenizer = get_backbone(nlp).tokenizer
    for doc, had in zip(others, had_piece):
        # every token that had a piece still has one, and the pieces still spell the text
        np.testing.assert_array_equal(check_doc(nlp, doc).any(axis=1), had)
        ids = tokenizer(doc.text, add_special_tokens=False)["input_ids"]
        assert max(ids, default=0) < rows(nlp)
        assert tokenizer.decode(ids) == old_tokenizer.decode(old_tokenizer(doc.text, add_special_tokens=False)["input_ids"])
    nlp.to_disk(tmp_path / "trimmed")
    loaded = spacy.load(tmp_path / "trimmed")
    assert rows(loaded) == report.rows_after
    for old, new in zip(vectors(nlp, others), vectors(loaded, others)):
        np.testing.assert_allclose(new, old, rtol=0, atol=1e-6)
    # the decoder's files (spaCy's string store grew with the texts read)
    size = lambda path: sum(p.stat().st_size for p in (path / "ner").iterdir())  # noqa: E731
    assert size(tmp_path / "trimmed") < size(tmp_path / "full")


def test_trimming_keeps_what_the_pieces_are_merged_from_and_the_special_pieces(trained):
    backbone = get_backbone(trained)
    data = json.loads(backbone.tokenizer.backend_tokenizer.to_str())
    ids = backbone.tokenizer("Blackburn", add_special_tokens=False)["input_ids"]
    keep = kept_pieces(data, set(ids), {"<pad>", "<s>", "</s>"})
    vocab = data["model"]["vocab"]
    assert {"<pad>", "<s>", "</s>"} <= keep
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in data["model"]["merges"]]
    for a, b in merges:
        if a + b in keep:
            assert a in keep and b in keep
    # the fallback: every byte has a piece (byte pieces, or the byte-level alphabet)
    assert sum(1 for p in keep if p.startswith("<0x") or len(p) == 1) >= 256
    assert len(keep) < len(vocab)


def test_trimmed_to_a_script_every_text_in_it_reads_as_before(trained, tmp_path):
    trained.to_disk(tmp_path / "full")
    nlp = spacy.load(tmp_path / "full")
    old = get_backbone(nlp).tokenizer
    texts = [TRAIN[3][0], "Zebras quietly jumped over 42 xylophones , said Dr. Quux !", ODD_TEXTS["cjk"]]
    before = [old(t, add_special_tokens=False)["input_ids"] for t in texts]
    report = trim_backbone(get_backbone(nlp), script="ascii")  # no corpus at all
    assert report.rows_after < report.rows_before and report.texts == 0
    new = get_backbone(nlp).tokenizer
    pieces = lambda tok, ids: [tok.convert_ids_to_tokens(i) for i in ids]  # noqa: E731
    for text, ids in zip(texts[:2], before):  # ASCII, never seen: the same pieces
        assert pieces(new, new(text, add_special_tokens=False)["input_ids"]) == pieces(old, ids)
    cjk = new(texts[2], add_special_tokens=False)["input_ids"]  # not ASCII: smaller pieces, the same text
    assert len(cjk) > len(before[2]) and spelled(new.decode(cjk)) == spelled(old.decode(before[2]))


def spelled(decoded: str) -> str:
    """A decoded text with its byte pieces (`<0xE6>`, where the decoder leaves them) as the
    characters they spell."""
    runs = re.compile(r"(?:<0x[0-9A-F]{2}>)+")
    return runs.sub(lambda m: bytes(int(b, 16) for b in re.findall(r"<0x([0-9A-F]{2})>", m.group())).decode("utf-8"), decoded)


def test_settings_and_tokenizers_trimming_cannot_serve_are_refused(tiny_dirs):
    nlp = make_pipeline(tiny_dirs("llama", "metaspace"), save_mode="adapter")
    nlp.get_pipe("ner").add_label("PER")
    nlp.initialize()
    with pytest.raises(ValueError, match="save_mode"):
        trim_backbone(get_backbone(nlp), [nlp.make_doc(CORPUS[0])])
    nlp = make_pipeline(tiny_dirs("llama", "metaspace"))
    nlp.get_pipe("ner").add_label("PER")
    nlp.initialize()
    with pytest.raises(ValueError, match="script must be one of ascii, latin"):
        trim_backbone(get_backbone(nlp), script="greek")
    with pytest.raises(ValueError, match="nothing to keep"):
        trim_backbone(get_backbone(nlp), [])
    with pytest.raises(ValueError, match="BPE tokenizers.*'Unigram'"):
        kept_pieces({"model": {"type": "Unigram", "vocab": []}}, set(), set())


def test_the_command_line_trims_a_saved_pipeline_to_spacy_and_text_files(trained, tmp_path):
    trained.to_disk(tmp_path / "full")
    DocBin(docs=[trained.make_doc(CORPUS[0])]).to_disk(tmp_path / "train.spacy")
    (tmp_path / "more.txt").write_text(CORPUS[1] + "\n\n", encoding="utf8")
    out = tmp_path / "trimmed"
    corpus = ["--corpus", str(tmp_path / "train.spacy"), str(tmp_path / "more.txt")]
    assert main(["trim-vocabulary", str(tmp_path / "full"), str(out), *corpus, "--save-embedding", "int8"]) == 0
    loaded = spacy.load(out)
    assert rows(loaded) < rows(trained) and get_backbone(loaded).settings.save_embedding == "int8"
    with pytest.raises(SystemExit, match="not empty"):
        main(["trim-vocabulary", str(tmp_path / "full"), str(out), *corpus])
    assert main(["trim-vocabulary", str(tmp_path / "full"), str(out), *corpus, "--overwrite"]) == 0
    assert get_backbone(spacy.load(out)).settings.save_embedding == "exact"  # as the pipeline had it
    with pytest.raises(SystemExit, match="cannot replace"):
        main(["trim-vocabulary", str(tmp_path / "full"), str(tmp_path / "full"), *corpus, "--overwrite"])
    with pytest.raises(SystemExit, match="nothing to keep"):
        main(["trim-vocabulary", str(tmp_path / "full"), str(tmp_path / "none")])
    with pytest.raises(ValueError, match=r"--corpus .*\.spacy or \.txt"):
        main(["trim-vocabulary", str(tmp_path / "full"), str(tmp_path / "other"), "--corpus", str(tmp_path / "x.json")])
