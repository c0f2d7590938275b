"""spacy_unmask/cpu.py: the kernel-cache bound a streaming process sets."""
import os

from spacy_unmask.cpu import KERNEL_CACHE_VARIABLES, STREAMING_KERNEL_CACHE, bound_kernel_caches


def test_kernel_caches_are_bounded_unless_the_environment_sets_them(monkeypatch):
    first, second = KERNEL_CACHE_VARIABLES
    monkeypatch.delenv(first, raising=False)
    monkeypatch.setenv(second, "512")
    bound_kernel_caches()
    assert os.environ.get(first) == str(STREAMING_KERNEL_CACHE)
    assert os.environ.get(second) == "512"

