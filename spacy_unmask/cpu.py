"""What this machine's CPU does, as torch and oneDNN will use it: the one place that
decides bfloat16 (`dtype = "auto"`), whether int8 products can be trusted
(`quantize`), and what is recorded beside every speed figure (`machine`).

Both answers follow the kernels, not just /proc/cpuinfo: torch can be held to a lower
CPU capability (`ATEN_CPU_CAPABILITY=avx2`) and oneDNN to a lower instruction set
(`ONEDNN_MAX_CPU_ISA` / `DNNL_MAX_CPU_ISA`), which is how an AVX2-only CPU is seen on
a newer one.

int8: on CPUs without VNNI (AVX2-only, and AVX-512 without VNNI) oneDNN multiplies
int8 matrices with instructions that add pairs of u8 x s8 products into saturating
16-bit sums, so large values come out wrong (a 64-long row of 127s against 127s:
8,160 instead of 1,032,256). `int8_products_exact` runs exactly that product once and
compares it with the exact integer result.

Memory: in bfloat16, torch's products go through oneDNN, which keeps a compiled kernel
for every input shape in two caches of 1,024 entries; a long stream of documents of many
lengths fills them and resident memory climbs. `bound_kernel_caches` makes them smaller
for a process that streams (docs/speed.md has the measurements).
"""
import os
import platform
from functools import lru_cache
from pathlib import Path
from typing import List

import torch

# The CPU features that decide which kernels run (bfloat16, int8 dot products, tiles).
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
# oneDNN instruction-set caps under which it has no bfloat16 arithmetic
# torch's oneDNN kernel caches (ideep's and oneDNN's own), and the entries a streaming process keeps
KERNEL_CACHE_VARIABLES = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")
STREAMING_KERNEL_CACHE = 64
_NO_BF16_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


def _cpuinfo() -> dict:
    """{"model name": ..., "flags": set} of the first CPU in /proc/cpuinfo (empty elsewhere)."""
    model, flags = None, None
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model is None:
            model = value.strip()
        elif key.strip() == "flags" and flags is None:
            flags = set(value.split())
    return {"model name": model or platform.processor() or platform.machine(), "flags": flags or set()}


def cpu_flags() -> List[str]:
    """The CPU_FLAGS this machine's CPU has (from /proc/cpuinfo; empty elsewhere)."""
    have = _cpuinfo()["flags"]
    return [flag for flag in CPU_FLAGS if flag in have]


def cpu_kind(flags) -> str:
    """A short name for the CPU class: amx, avx512bf16, avx512, avx2 or other."""
    if "amx_tile" in flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512bf16"
    if "avx512f" in flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "other"


def onednn_isa_cap() -> str:
    """The instruction set oneDNN is held to by the environment ("" where it is not)."""
    return (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").upper()


def bf16_supported() -> bool:
    """bfloat16 arithmetic in hardware: the GPU's, or on the CPU AVX-512 BF16 or AMX tiles
    that neither torch's CPU capability nor oneDNN's instruction-set cap rules out."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    capped = torch.backends.cpu.get_cpu_capability() in ("DEFAULT", "AVX2") or onednn_isa_cap() in _NO_BF16_ISAS
    return bool(native) and not capped


@lru_cache(maxsize=None)
def int8_products_exact() -> bool:
    """Does torch's int8 matrix multiply (`torch._int_mm`, oneDNN on the CPU) give the
    exact integer product here? False where its sums saturate (no VNNI), or where it
    does not run at all."""
    a = torch.full((32, 64), 127, dtype=torch.int8)
    a[1::2] = -127
    b = torch.full((64, 32), 127, dtype=torch.int8)
    b[:, 1::2] = torch.arange(-64, 64, 8, dtype=torch.int8)
    try:
        got = torch._int_mm(a, b)
    except RuntimeError:
        return False
    return bool(torch.equal(got.long(), a.long() @ b.long()))


def machine() -> dict:
    """What to record beside a speed figure: CPU model, cores, flags, class, the kernels'
    caps, and the two choices this module makes."""
    info = _cpuinfo()
    flags = [flag for flag in CPU_FLAGS if flag in info["flags"]]
    return {
        "cpu": info["model name"],
        "cores": os.cpu_count(),
        "cpu_flags": flags,
        "cpu_kind": cpu_kind(flags),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn_max_cpu_isa": onednn_isa_cap() or None,
        "cpu_bf16": bf16_supported() if not torch.cuda.is_available() else None,
        "int8_exact": int8_products_exact(),
    }


def bound_kernel_caches(entries: int = STREAMING_KERNEL_CACHE) -> None:
    """Hold torch's oneDNN kernel caches to `entries` each, unless the environment sets
    them. The caches read the variables when the first oneDNN product runs, so call this
    before anything is predicted."""
    for variable in KERNEL_CACHE_VARIABLES:
        os.environ.setdefault(variable, str(entries))
