"""scripts/convert_corpus.py: corpora to DocBin files (sentences, documents, their mix)."""
import dataclasses

import pytest

from scripts import convert_corpus


def read_docs(path):
    import spacy
    from spacy.tokens import DocBin

    return list(DocBin().from_disk(path).get_docs(spacy.blank("en").vocab))


def iob2(doc):
    return [t.ent_iob_ + ("-" + t.ent_type_ if t.ent_type_ else "") for t in doc]


WNUT_LIKE = (
    "@user\tO\nloves\tO\nNew\tB-location\nYork\tI-location\n\t\n"  # a lone tab separates, as in WNUT-17 train
    "Star\tB-creative-work\nWars\tI-creative-work\nrocks\tO\n\n"
    "nothing\tO\n\n\n"
    "Bob\tB-person\n"
)
CONLL_LIKE = (
    "-DOCSTART- -X- -X- O\n\n"
    "EU NNP B-NP B-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP B-MISC\n\n"
    "Peter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n\n"
    "-DOCSTART- -X- -X- O\n\n"
    "BRUSSELS NNP B-NP B-LOC\n"
)


def test_convert_tab_file(tmp_path, capsys):
    src = tmp_path / "train.conll"
    src.write_text(WNUT_LIKE, encoding="utf8")
    stats = convert_corpus.convert_file(src, tmp_path / "out.spacy", token_col=0, tag_col=1, sep="tab")
    assert stats["docs"] == 4 and stats["tokens"] == 9 and stats["entities"] == 3
    assert stats["per_type"] == {"creative-work": 1, "location": 1, "person": 1}
    assert "4 docs" in capsys.readouterr().out
    docs = read_docs(tmp_path / "out.spacy")
    assert [t.text for t in docs[0]] == ["@user", "loves", "New", "York"]
    assert iob2(docs[0]) == ["O", "O", "B-location", "I-location"]
    assert [(e.text, e.label_) for e in docs[1].ents] == [("Star Wars", "creative-work")]
    assert docs[2].ents == () and iob2(docs[2]) == ["O"]


def test_convert_limit_and_docstart(tmp_path):
    src = tmp_path / "train.txt"
    src.write_text(CONLL_LIKE, encoding="utf8")
    stats = convert_corpus.convert_file(
        src, tmp_path / "all.spacy", token_col=0, tag_col=3, sep="whitespace", docstart=True, quiet=True
    )
    assert stats["docs"] == 3 and stats["per_type"] == {"LOC": 1, "MISC": 1, "ORG": 1, "PER": 1}
    stats = convert_corpus.convert_file(
        src, tmp_path / "two.spacy", token_col=0, tag_col=3, sep="whitespace", docstart=True, limit=2, quiet=True
    )
    assert stats["docs"] == 2
    docs = read_docs(tmp_path / "two.spacy")
    assert [e.text for e in docs[1].ents] == ["Peter Blackburn"]
    assert "-DOCSTART-" not in [t.text for d in docs for t in d]


def test_convert_rejects_bad_input_and_counts_iob2_errors(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("word\tB-PER\nnext\tX-PER\n", encoding="utf8")
    with pytest.raises(ValueError, match="not an IOB tag"):
        convert_corpus.convert_file(bad, tmp_path / "bad.spacy", sep="tab", quiet=True)
    short = tmp_path / "short.tsv"
    short.write_text("word\n", encoding="utf8")
    with pytest.raises(ValueError, match="column"):
        convert_corpus.convert_file(short, tmp_path / "short.spacy", tag_col=1, sep="tab", quiet=True)
    loose = tmp_path / "loose.tsv"
    loose.write_text("a\tO\nb\tI-PER\nc\tI-LOC\n", encoding="utf8")
    stats = convert_corpus.convert_file(loose, tmp_path / "loose.spacy", sep="tab", quiet=True)
    assert stats["invalid_iob2"] == 2 and stats["entities"] == 2  # read as starts, like spaCy's converters


def write_preset_files(root, corpus, text):
    """The three split files of a preset corpus under root/assets, each holding `text`."""
    preset = convert_corpus.PRESETS[corpus]
    folder = root / preset.directory
    folder.mkdir(parents=True)
    for name in preset.splits.values():
        (folder / name).write_text(text, encoding="utf8")
    return root / "corpus"


def test_convert_preset_and_cli(tmp_path):
    out = write_preset_files(tmp_path, "wnut17", WNUT_LIKE)
    code = convert_corpus.main(["preset", "wnut17", str(out), "--limit", "1", "--dev-limit", "2", "--root", str(tmp_path)])
    assert code == 0
    assert [len(read_docs(out / f"{s}.spacy")) for s in ("train", "dev", "test")] == [1, 2, 4]
    with pytest.raises(SystemExit, match="copy-conll"):
        convert_corpus.convert_preset("conll03", out, root=tmp_path, quiet=True)
    assert not (out / "train.mix.spacy").exists()  # tweets: the documents are the sentences


def test_convert_preset_writes_sentences_documents_and_their_mix(tmp_path):
    out = write_preset_files(tmp_path, "conll03", CONLL_LIKE)
    convert_corpus.convert_preset("conll03", out, root=tmp_path, quiet=True)
    sentences, articles = read_docs(out / "train.spacy"), read_docs(out / "train.doc.spacy")
    assert (len(sentences), len(articles)) == (3, 2)
    mix = read_docs(out / "train.mix.spacy")
    assert [d.text for d in mix] == [d.text for d in sentences + articles]
    assert [[(e.text, e.label_) for e in d.ents] for d in mix] == [
        [(e.text, e.label_) for e in d.ents] for d in sentences + articles
    ]
    assert [t.is_sent_start for t in mix[3]] == [True, False, False, True, False]


def test_convert_groups_sentences_into_documents_keeping_sentence_starts(tmp_path):
    from spacy.tokens import DocBin
    from spacy.vocab import Vocab

    source = tmp_path / "c.txt"
    source.write_text(
        "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\nPeter NNP B-NP B-PER\n"
        "Blackburn NNP I-NP I-PER\n\n-DOCSTART- -X- -X- O\n\nBRUSSELS NNP B-NP B-LOC\n\n"
    )
    common = dict(token_col=0, tag_col=3, sep="whitespace", docstart=True, quiet=True)
    stats = convert_corpus.convert_file(source, tmp_path / "docs.spacy", group="docs", **common)
    assert (stats["docs"], stats["sentences"]) == (2, 3)
    first, second = DocBin().from_disk(tmp_path / "docs.spacy").get_docs(Vocab())
    assert [t.text for t in first] == ["EU", "rejects", "Peter", "Blackburn"]
    assert [s.text for s in first.sents] == ["EU rejects", "Peter Blackburn"]
    assert [(e.text, e.label_) for e in first.ents] == [("EU", "ORG"), ("Peter Blackburn", "PER")]
    assert [t.text for t in second] == ["BRUSSELS"]
    assert convert_corpus.convert_file(source, tmp_path / "two.spacy", group="2", **common)["docs"] == 2
    assert convert_corpus.convert_file(source, tmp_path / "one.spacy", **common)["docs"] == 3
    with pytest.raises(ValueError, match="group 'articles'"):
        convert_corpus.convert_file(source, tmp_path / "bad.spacy", group="articles", **common)


def test_conll03_preset_keeps_chunks_and_part_of_speech_beside_the_entities(tmp_path):
    (tmp_path / "assets" / "conll2003").mkdir(parents=True)
    for name in ("train.txt", "valid.txt", "test.txt"):
        (tmp_path / "assets" / "conll2003" / name).write_text(CONLL_LIKE, encoding="utf8")
    convert_corpus.convert_preset("conll03", tmp_path / "out", root=tmp_path, quiet=True)
    first = read_docs(tmp_path / "out" / "dev.spacy")[0]
    assert [(e.text, e.label_) for e in first.ents] == [("EU", "ORG"), ("German", "MISC")]
    assert [(s.text, s.label_) for s in first.spans["chunks"]] == [("EU", "NP"), ("rejects", "VP"), ("German", "NP")]
    assert [t.tag_ for t in first] == ["NNP", "VBZ", "JJ"]
    article = read_docs(tmp_path / "out" / "test.doc.spacy")[0]  # chunks never cross a sentence
    assert [s.text for s in article.spans["chunks"]] == ["EU", "rejects", "German", "Peter Blackburn"]


def test_conll2000_preset_holds_out_the_end_of_train_as_dev(tmp_path, monkeypatch):
    folder = tmp_path / "assets" / "conll2000"
    folder.mkdir(parents=True)
    sentences = [f"Word{i} NN B-NP\nruns VBZ B-VP\n. . O\n" for i in range(12)]
    (folder / "train.txt").write_text("\n".join(sentences), encoding="utf8")
    (folder / "test.txt").write_text(sentences[0], encoding="utf8")
    monkeypatch.setitem(convert_corpus.PRESETS, "conll2000",
                        dataclasses.replace(convert_corpus.PRESETS["conll2000"], dev_from_train=4))
    stats = convert_corpus.convert_preset("conll2000", tmp_path / "out", root=tmp_path, quiet=True)
    train, dev = read_docs(tmp_path / "out" / "train.spacy"), read_docs(tmp_path / "out" / "dev.spacy")
    assert [d[0].text for d in train] == [f"Word{i}" for i in range(8)]
    assert [d[0].text for d in dev] == [f"Word{i}" for i in range(8, 12)]  # disjoint from train
    assert stats["dev"]["chunks"] == 8 and not dev[0].ents
    assert [t.tag_ for t in dev[0]] == ["NN", "VBZ", "."]
    monkeypatch.setitem(convert_corpus.PRESETS, "conll2000",
                        dataclasses.replace(convert_corpus.PRESETS["conll2000"], dev_from_train=12))
    with pytest.raises(SystemExit, match="too few to hold out 12"):
        convert_corpus.convert_preset("conll2000", tmp_path / "out", root=tmp_path, quiet=True)


def test_a_bad_chunk_tag_names_its_line(tmp_path):
    source = tmp_path / "c.txt"
    source.write_text("EU NNP NP B-ORG\n", encoding="utf8")
    with pytest.raises(ValueError, match=r"c.txt:1: not an IOB tag: 'NP'"):
        convert_corpus.convert_file(source, tmp_path / "o.spacy", tag_col=3, chunk_col=2, sep="whitespace")
