"""`spacy_unmask.CorpusWithSentences.v1` (`readers.py`): the corpus's sentence boundaries on the
input Docs, so that `sentence_windows` training reads documents as prediction will."""
import spacy
from spacy.tokens import Doc, DocBin
from spacy.util import registry

from spacy_unmask import get_backbone
from tiny_models import make_pipeline

WORDS = ["Peter", "Blackburn", "visited", "Brussels", ".", "EU", "rejects", "German", "lamb", "."]
STARTS = [True, False, False, False, False, True, False, False, False, False]


def corpus_file(tmp_path):
    nlp = spacy.blank("en")
    doc = Doc(nlp.vocab, words=WORDS, sent_starts=STARTS, ents=["B-PER", "I-PER", "O", "B-LOC", "O", "B-ORG"] + ["O"] * 4)
    path = tmp_path / "docs.spacy"
    DocBin(docs=[doc], attrs=["ORTH", "ENT_IOB", "ENT_TYPE", "SENT_START"]).to_disk(path)
    return nlp, path


def test_input_docs_get_the_corpus_sentences(tmp_path):
    nlp, path = corpus_file(tmp_path)
    (plain,) = registry.readers.get("spacy.Corpus.v1")(path, gold_preproc=False)(nlp)
    (example,) = registry.readers.get("spacy_unmask.CorpusWithSentences.v1")(path)(nlp)
    assert not plain.predicted.has_annotation("SENT_START")  # what spaCy's own reader gives
    assert [t.is_sent_start for t in example.predicted] == STARTS
    assert [e.text for e in example.reference.ents] == ["Peter Blackburn", "Brussels", "EU"]


def test_sentence_windows_then_read_one_window_per_sentence_in_training(tmp_path, tiny_dirs):
    nlp, path = corpus_file(tmp_path)
    pipeline = make_pipeline(tiny_dirs("llama", "metaspace"), sentence_windows=True, sentence_context=2, window=64)
    examples = list(registry.readers.get("spacy_unmask.CorpusWithSentences.v1")(path)(pipeline))
    pipeline.initialize(lambda: examples)
    batch = get_backbone(pipeline).plan([eg.predicted for eg in examples])
    windows = sum(len(set(seg[seg > 0].tolist())) for _, segments in batch.sub_batches for seg in segments)
    assert windows == 2  # one per sentence, each with its context
