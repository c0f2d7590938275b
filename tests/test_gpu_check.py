"""scripts/gpu_check.py: the device check runs (here on the CPU, on a tiny model) and
the weight memory of a quantised layer is what bitsandbytes holds."""
import json

import pytest

from scripts import gpu_check

pytest.importorskip("bitsandbytes")


def test_layer_bytes_count_packed_weights_and_scales():
    assert gpu_check.layer_bytes(128, 64, "bfloat16") == 128 * 64 * 2
    assert gpu_check.layer_bytes(128, 64, "int8") == 128 * 64 + 128 * 4 + 1  # int8 weights, a scale per row
    nf4 = gpu_check.layer_bytes(128, 64, "nf4")
    assert 128 * 64 // 2 + 128 < nf4 < 128 * 64 // 2 + 2048  # 4 bits a weight, block scales, quant state


def test_run_alternates_the_bases_in_fresh_pipelines(tiny_dirs, tmp_path):
    output = tmp_path / "check.json"
    args = ["run", "--model", tiny_dirs("llama", "metaspace"), "--rounds", "1", "--steps", "1", "--batch", "4",
            "--output", str(output)]
    assert gpu_check.main(args) == 0
    runs = json.loads(output.read_text())["runs"]
    assert [r["base_quantization"] for r in runs] == ["none", "nf4"]
    assert all(r["step_s"] > 0 and r["predict_words_per_s"] > 0 for r in runs)
