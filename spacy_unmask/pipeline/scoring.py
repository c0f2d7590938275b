"""`spacy_unmask.span_scorer.v1`: the scores of `unmask_ner`, wherever its spans go."""
from typing import Dict, Iterable

from spacy.training import Example
from spacy.util import registry


@registry.scorers("spacy_unmask.span_scorer.v1")
def make_span_scorer():
    return score_spans


def score_spans(examples: Iterable[Example], *, target: str = "ents", spans_key: str = "ner", **kwargs) -> Dict:
    """Exact-match P/R/F of the labelled spans, overall and per label: spaCy's NER scores
    (`ents_f`, ...) for target "ents", its span-group scores (`spans_<key>_f`, ...) for "spans"."""
    from spacy.pipeline.spancat import spancat_score
    from spacy.scorer import get_ner_prf

    if target == "ents":
        return get_ner_prf(examples)
    return spancat_score(examples, spans_key=spans_key, allow_overlap=False)
