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
