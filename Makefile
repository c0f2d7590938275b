# Two commands for a fresh machine (each makes the virtual environments it needs):
#   make demo   train and evaluate the default pipeline on the shipped WNUT-17 (CPU, < 30 min)
#   make test   the test suite on transformers 5.x, the backbone tests on transformers 4.53.2,
#               and the CPU-sensitive tests as an AVX2-only CPU sees them
PYTHON ?= python3
# torch is installed first and pinned: an unpinned torch pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
VENV := .venv
VENV_T4 := .venv-t4
BACKBONE_TESTS := tests/test_masks.py tests/test_backbone.py tests/test_loading.py tests/test_families.py tests/test_weights_on_disk.py tests/test_gemma3.py \
	tests/test_download.py tests/test_gguf_tokenizer.py tests/test_fused.py tests/test_saving.py tests/test_hostile_pipelines.py
# The tests whose numbers depend on the CPU's kernels (dtype auto, int8, fused norms, the
# 4-bit base), run again as an AVX2-only CPU sees them: torch's CPU capability and oneDNN's
# instruction set capped, so bfloat16 and VNNI are off whatever CPU CI lands on.
CPU_TESTS := tests/test_quantize.py tests/test_backbone.py tests/test_fused.py tests/test_base_quantization.py \
	tests/test_decoder_tok2vec.py
AVX2_ONLY := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2

.PHONY: demo test test-t4 test-avx2 venv venv-t4

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -c "import torch" 2>/dev/null || $(VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(VENV)/bin/python -m pip install -q -e ".[dev,ray,qlora]"
	touch $@

venv-t4: $(VENV_T4)/.installed
$(VENV_T4)/.installed: pyproject.toml scripts/make_baseline_venv.sh
	PYTHON=$(PYTHON) TORCH_SPEC="$(TORCH_SPEC)" bash scripts/make_baseline_venv.sh $(VENV_T4)
	touch $@

demo: venv
	$(VENV)/bin/python -m spacy project run all

# One torch thread: the tiny test models gain nothing from more, and the tests leave the
# other core free. (The n_process test that needs two threads starts its own process.)
test: venv venv-t4
	OMP_NUM_THREADS=1 $(VENV)/bin/python -m pytest -q
	$(MAKE) test-t4
	$(MAKE) test-avx2

test-t4: venv-t4
	OMP_NUM_THREADS=1 $(VENV_T4)/bin/python -m pytest -q $(BACKBONE_TESTS)

test-avx2: venv
	$(AVX2_ONLY) OMP_NUM_THREADS=1 $(VENV)/bin/python -m pytest -q $(CPU_TESTS)
