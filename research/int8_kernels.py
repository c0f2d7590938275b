"""One decoder block's seven products, bfloat16 or float32 against int8 (docs/speed.md).

    python -m research.int8_kernels [--pieces 2048] [--threads 2] [--dtype bfloat16] [--no-compile] [--rejected onednn weight-only]

Shapes are Gemma 3 270M's (hidden 640, q 1024, k/v 256, MLP 2048) for --pieces rows.
For each product: `F.linear` in --dtype (bfloat16, or float32 as on CPUs without
bfloat16); `Int8Linear` as it ships (eager: quantise, `_int_mm`, rescale, and its outlier
channels in --dtype) and without outlier channels; the same per-piece scheme written as
one function and compiled by
`torch.compile` (inductor fuses the quantise and rescale passes around the product; needs
a C++ compiler; the compile time is printed); and `_int_mm` alone. Medians of 15 calls
after two warm-ups, in ms. Pause other work on the machine first.

--rejected adds products tried for `Int8Linear` and not kept (docs/speed.md),
each alone: `onednn`, oneDNN's packed int8 product (`onednn::qlinear_pointwise` on a weight
packed once by `onednn::qlinear_prepack`, weight scales in its epilogue, output in
--dtype; faster than bfloat16 on AMX, but seconds a product, a reference kernel, on
AVX-512 BF16 CPUs without AMX, so there take --pieces 64) and `weight-only`, weight-only int8
(`torch._weight_int8pack_mm`: activations stay in --dtype, the weight is widened in the
kernel). oneDNN's instruction set can be capped to stand for other CPU kinds, e.g.
ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 or AVX2.
"""
import argparse
import statistics
import time

import torch

from spacy_unmask.quantize import Int8Linear

# (in, out, how many per block): q, k, v, o, gate + up, down
SHAPES = [(640, 1024, 1), (640, 256, 2), (1024, 640, 1), (640, 2048, 2), (2048, 640, 1)]


def median_ms(call, n=15):
    call(), call()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def fused(rows, weight_t, weight_scale):
    top = rows.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12)
    q = (rows.float() * (127.0 / top)).round().clamp(-127, 127).to(torch.int8)
    return (torch._int_mm(q, weight_t).float() * (top / 127.0) * weight_scale).to(rows.dtype)


def onednn_product(weight: torch.Tensor, weight_scale: torch.Tensor, dtype):
    """q -> (q @ W^T) * weight_scale in `dtype`, W (out, in) int8 packed once by oneDNN."""
    packed = torch.ops.onednn.qlinear_prepack(weight, None)
    zero_points = torch.zeros(weight_scale.shape[0], dtype=torch.int64)
    return lambda q: torch.ops.onednn.qlinear_pointwise(
        q, 1.0, 0, packed, weight_scale, zero_points, None, 1.0, 0, dtype, "none", [], ""
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pieces", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--rejected", nargs="+", default=[], choices=["onednn", "weight-only"],
                        help="also time these int8 products, tried and not kept")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    compiled = None if args.no_compile else torch.compile(fused, dynamic=True)
    cases = []
    for n_in, n_out, count in SHAPES:
        x = torch.randn(args.pieces, n_in).to(dtype)
        weight = torch.randn(n_out, n_in) / n_in ** 0.5
        int8 = Int8Linear(weight)
        if compiled is not None:
            start = time.perf_counter()
            compiled(x, int8.weight_t, int8.weight_scale)
            print(f"compiled {n_in} -> {n_out} in {time.perf_counter() - start:.1f} s")
        cases.append((n_in, n_out, count, x, weight.to(dtype), int8, Int8Linear(weight, outliers=0)))
    totals = {}
    for n_in, n_out, count, x, weight, int8, no_outliers in cases:
        row = {
            args.dtype: median_ms(lambda: torch.nn.functional.linear(x, weight)),
            "int8 eager": median_ms(lambda: int8(x)),
            "int8 eager, no outlier channels": median_ms(lambda: no_outliers(x)),
            "_int_mm alone": median_ms(lambda: torch._int_mm(x.to(torch.int8), int8.weight_t)),
        }
        if "onednn" in args.rejected:
            product = onednn_product(int8.weight.contiguous(), int8.weight_scale, dtype)
            row["oneDNN packed alone"] = median_ms(lambda: product(x.to(torch.int8)))
        if "weight-only" in args.rejected:
            weight_only = (int8.weight.contiguous(), int8.weight_scale.to(dtype))
            row["weight-only int8"] = median_ms(lambda: torch._weight_int8pack_mm(x, *weight_only))
        if compiled is not None:
            row["int8 compiled"] = median_ms(lambda: compiled(x, int8.weight_t, int8.weight_scale))
        print(f"{args.pieces} x {n_in} -> {n_out} (x{count}):", {k: round(v, 2) for k, v in row.items()})
        for key, value in row.items():
            totals[key] = totals.get(key, 0.0) + count * value
    print("one block's seven products, ms:", {k: round(v, 1) for k, v in totals.items()})
    for key in totals:
        if key != args.dtype:
            print(f"{args.dtype} / {key}: {totals[args.dtype] / totals[key]:.2f}x")


if __name__ == "__main__":
    main()
