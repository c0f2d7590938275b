"""`spacy_unmask.CorpusWithSentences.v1`: spaCy's corpus reader, with the corpus's sentence
boundaries on the input Docs.

spaCy's `spacy.Corpus.v1` gives a component input Docs made from the text alone, so a
backbone with `sentence_windows = true` (FLERT's document context: each sentence read
with `sentence_context` pieces of its document around it) would see no sentence
boundaries while training and fall back to windows cut by length. This reader copies the
gold sentence starts onto each input Doc (where both have the same tokens), so training
reads documents exactly as prediction will with a `senter` or `sentencizer` in front, or
with a corpus that gives sentences (as CoNLL-2003 does). It changes nothing else.
"""
from typing import Callable, Iterable, Optional

from spacy.training import Corpus, Example
from spacy.util import registry


@registry.readers("spacy_unmask.CorpusWithSentences.v1")
def corpus_with_sentences(
    path, gold_preproc: bool = False, max_length: int = 0, limit: int = 0, augmenter: Optional[Callable] = None
) -> Callable[..., Iterable[Example]]:
    corpus = Corpus(path, gold_preproc=gold_preproc, max_length=max_length, limit=limit, augmenter=augmenter)

    def read(nlp) -> Iterable[Example]:
        for example in corpus(nlp):
            copy_sentence_starts(example)
            yield example

    return read


def copy_sentence_starts(example: Example) -> None:
    """The reference's sentence starts on the predicted Doc, where both have the same tokens."""
    reference, predicted = example.reference, example.predicted
    if not reference.has_annotation("SENT_START") or predicted.has_annotation("SENT_START"):
        return
    if [t.text for t in reference] != [t.text for t in predicted]:
        return
    for ref, pred in zip(reference, predicted):
        pred.is_sent_start = ref.is_sent_start
