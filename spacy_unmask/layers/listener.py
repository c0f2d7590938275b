"""spaCy's Tok2VecListener with a weight on the gradient it sends to the shared decoder.

Components that listen to one `tok2vec` component (configs/multitask.cfg) send it the sum
of their gradients, and the decoder's update follows that sum. Tasks do not pull equally:
a task that is mostly easy (NER, where most tokens are outside any entity) sends smaller
gradients than chunking or tagging. `grad_factor` multiplies what one listener sends
back, as spacy-transformers' TransformerListener does (0 keeps the decoder from learning
from the component); the component's own layer learns from its full gradient either way.
What doubling the entities' factor does on CoNLL-2003 is in docs/tasks.md.
"""
import math
from typing import List

from spacy.ml.models.tok2vec import Tok2VecListener
from spacy.tokens import Doc
from spacy.util import registry
from thinc.api import Model
from thinc.types import Floats2d

from ..settings import is_number, require


@registry.architectures("spacy_unmask.Tok2VecListener.v1")
def tok2vec_listener(width: int, upstream: str = "*", grad_factor: float = 1.0) -> Model[List[Doc], List[Floats2d]]:
    """spacy.Tok2VecListener.v1 (`width`, `upstream`), whose gradient to the upstream
    component is multiplied by `grad_factor` (a finite number, at least 0)."""
    require("grad_factor", grad_factor, is_number(grad_factor) and 0.0 <= grad_factor < math.inf,
            "a finite number, at least 0 (1: the gradient as it is; 0: the decoder does not learn from this "
            "component)")
    listener = WeightedListener(upstream_name=upstream, width=width)
    listener.attrs["grad_factor"] = float(grad_factor)
    return listener


class WeightedListener(Tok2VecListener):
    """A Tok2VecListener (spaCy's tok2vec component finds it, and `nlp.replace_listeners`
    replaces it, as spaCy's own) that weights the gradient it sends upstream."""

    def receive(self, batch_id: int, outputs, backprop) -> None:
        factor = self.attrs["grad_factor"]
        if factor != 1.0:
            upstream_backprop = backprop

            def backprop(d_vectors: List[Floats2d]):
                return upstream_backprop([d * factor for d in d_vectors])

        super().receive(batch_id, outputs, backprop)
