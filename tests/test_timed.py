"""scripts/timed.py: a training's time, memory and machine, beside its metrics."""
import json
import sys

from scripts import timed


def test_timed_writes_sidecar(tmp_path):
    sidecar = tmp_path / "run.train.json"
    assert timed.main(["--output", str(sidecar), "--", "python", "-c", "x = bytearray(10_000_000)"]) == 0
    info = json.loads(sidecar.read_text())
    assert info["returncode"] == 0 and info["wall_s"] > 0 and info["peak_rss_mib"] > 5
    assert info["command"][0] == sys.executable
    # The sidecar says whether dtype "auto" trained in bfloat16 on this machine.
    import torch

    from spacy_unmask.cpu import bf16_supported, cpu_flags

    if not torch.cuda.is_available():
        assert info["machine"]["cpu_bf16"] == bf16_supported() and info["machine"]["cores"] >= 1
    assert info["machine"]["cpu_flags"] == cpu_flags()  # beside every time, the CPU that made it
    failed = tmp_path / "failed.train.json"
    assert timed.main(["--output", str(failed), "--", "python", "-c", "raise SystemExit(3)"]) == 3
    assert not failed.exists()
