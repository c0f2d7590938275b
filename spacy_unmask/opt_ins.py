"""What a pipeline from someone else may never switch on by itself, and the caller's opt-ins.

A pipeline folder is data. Two things it may ask for go beyond its own files, and each
needs the loading process's own, explicit choice, an environment variable set to "1"
(docs/sharing.md):

- `SPACY_UNMASK_TRUST_REMOTE_CODE`: `trust_remote_code = true`, which runs Python from
  the model repository. Checked wherever a base model is loaded: `nlp.initialize()`,
  `spacy.load` of an adapter pipeline, and the saved backbone's bytes;
- `SPACY_UNMASK_FETCH_BASE`: an adapter pipeline's base model read from where its `name`
  says: a path, a Hugging Face id fetched over the network, or a registry model
  downloaded with pip. Without it, only a base already in the local Hugging Face or
  registry cache is used; either way its content must match the digest saved with it.
"""
import os

TRUST_REMOTE_CODE_ENV = "SPACY_UNMASK_TRUST_REMOTE_CODE"
FETCH_BASE_ENV = "SPACY_UNMASK_FETCH_BASE"


class UnsafePipelineError(ValueError):
    """A pipeline that is damaged or hostile, or that asks for what only the caller may
    allow: refused before anything outside it is read, written or run."""


def opted_in(env: str) -> bool:
    return os.environ.get(env) == "1"


def require_remote_code_opt_in(trust_remote_code: bool) -> None:
    """The one gate before transformers may run a model repository's code."""
    if trust_remote_code and not opted_in(TRUST_REMOTE_CODE_ENV):
        raise UnsafePipelineError(
            "the setting trust_remote_code = true would run Python code from the model repository named "
            "by the setting `name` while loading it. A config cannot switch this on by itself: if you "
            f"trust its source, set the environment variable {TRUST_REMOTE_CODE_ENV}=1 in the process "
            "that loads it"
        )
