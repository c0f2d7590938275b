"""A 7B-shaped decoder with an NF4 base: weight memory from its shapes, and a device check.

    python -m scripts.gpu_check shapes --output metrics/bench/nf4-7b-weights.json
    python -m scripts.gpu_check run --model /tmp/models/8b --output $OUT/nf4-7b.json

`shapes` needs no GPU: for each decoder (the GPU kit's random 7.4B Llama, Llama-2-7B,
Mistral-7B) it quantises one linear layer of every distinct shape with bitsandbytes
on the CPU, counts the bytes it holds (packed weights, block scales, quant state),
and adds them up over the model's layers, with the embedding and norms in bfloat16;
the same for int8 and bfloat16 bases.

`run` is the device check, for the GPU machine with the kit of ../shared/gpu/ carried
as .gpu (its README: the bitsandbytes wheel fetched once into .gpu/wheels):

    source .gpu/setup.sh && pip install -q --no-deps --target /tmp/site .gpu/wheels/*.whl \
      && python3 .gpu/make_models.py .gpu/tok /tmp/models 8b \
      && python3 -m scripts.gpu_check run --model /tmp/models/8b --output $OUT/nf4-7b.json

For each base (bfloat16 and NF4, alternated) it builds a
fresh pipeline on `--model`, records GPU memory after loading, times `--steps`
training steps (LoRA r=16 on attention, unmask all) after one warm-up, records
the peak GPU memory of training, and times `nlp.pipe` over the same texts.
"""
import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import List, Optional

# (hidden, layers, attention heads, key-value heads, intermediate, vocabulary)
DECODERS = {
    "gpu-kit-8b (random Llama, .gpu/make_models.py)": (4096, 32, 32, 8, 14336, 49152),
    "Llama-2-7B": (4096, 32, 32, 32, 11008, 32000),
    "Mistral-7B": (4096, 32, 32, 8, 14336, 32000),
}
TEXTS = [
    "Peter Blackburn visited the European Commission in Brussels on Monday .",
    "German officials said the ban would last until scientists found a cure .",
    "EU rejects German call to boycott British lamb .",
    "The capital of Germany is Berlin , and Paris is the capital of France .",
]


def layer_bytes(out_features: int, in_features: int, mode: str) -> int:
    """Bytes one linear layer's weight takes with the base held in `mode` (measured on a real layer)."""
    import torch

    from spacy_unmask.base_quantization import quantize_base

    if mode == "bfloat16":
        return out_features * in_features * 2
    holder = torch.nn.Module()
    holder.layers = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(in_features, out_features, bias=False))])
    holder.layers[0][0].weight.data = torch.randn(out_features, in_features, dtype=torch.bfloat16)
    quantize_base(holder, mode, torch.bfloat16)
    return sum(v.nbytes for v in holder.layers[0][0].state_dict().values())


def shapes(args) -> int:
    from spacy_unmask.cpu import cpu_flags

    results = {"command": "python -m scripts.gpu_check shapes", "decoders": {}, "cpu_flags": cpu_flags()}
    for name, (hidden, layers, heads, kv_heads, intermediate, vocab) in DECODERS.items():
        head_dim = hidden // heads
        block = [  # (out, in) of q, k, v, o, gate, up, down
            (hidden, hidden), (kv_heads * head_dim, hidden), (kv_heads * head_dim, hidden), (hidden, hidden),
            (intermediate, hidden), (intermediate, hidden), (hidden, intermediate),
        ]
        other = (vocab * hidden + (2 * layers + 1) * hidden) * 2  # embedding and norms, bfloat16
        entry = {"params": sum(o * i for o, i in block) * layers + vocab * hidden + (2 * layers + 1) * hidden}
        for mode in ("bfloat16", "int8", "nf4"):
            linear = sum(layer_bytes(o, i, mode) for o, i in block) * layers
            entry[f"{mode}_gib"] = round((linear + other) / 2**30, 2)
        entry["embedding_and_norms_gib"] = round(other / 2**30, 2)
        results["decoders"][name] = entry
        print(name, entry, flush=True)
    write(args.output, results)
    return 0


def gpu_memory_gib(kind: str) -> float:
    import torch

    if not torch.cuda.is_available():
        return 0.0
    value = torch.cuda.max_memory_allocated() if kind == "peak" else torch.cuda.memory_allocated()
    return round(value / 2**30, 2)


def run_one(args, base: str) -> dict:
    import spacy
    import torch
    from spacy.training import Example
    from thinc.api import Adam

    from spacy_unmask import get_backbone

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    nlp = spacy.blank("en")
    tok2vec = {"name": args.model, "unmask": "all", "base_quantization": base, "max_batch_pieces": args.max_batch_pieces}
    nlp.add_pipe("unmask_ner", name="ner", config={"model": {"tok2vec": tok2vec}})
    texts = (TEXTS * (args.batch // len(TEXTS) + 1))[: args.batch]
    examples = []
    for text in texts:
        doc = nlp.make_doc(text)
        examples.append(Example.from_dict(doc, {"entities": [(0, len(doc[0].text), "PER")]}))
    start = time.perf_counter()
    nlp.initialize(lambda: examples)
    result = {"load_s": round(time.perf_counter() - start, 1), "gpu_gib_after_load": gpu_memory_gib("now")}
    backbone = get_backbone(nlp)
    result["device"] = str(backbone.device)
    result["weights_gib"] = round(sum(t.nbytes for t in backbone.model.state_dict().values()) / 2**30, 2)
    optimizer = Adam(1e-4)
    nlp.update(examples, sgd=optimizer)  # warm-up
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        nlp.update(examples, sgd=optimizer)
    sync()
    result["step_s"] = round((time.perf_counter() - start) / args.steps, 3)
    result["gpu_gib_peak_training"] = gpu_memory_gib("peak")
    words = sum(len(eg.predicted) for eg in examples)
    list(nlp.pipe(texts, batch_size=args.batch))  # warm-up
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        list(nlp.pipe(texts, batch_size=args.batch))
    sync()
    result["predict_words_per_s"] = round(words * args.steps / (time.perf_counter() - start), 1)
    del nlp, backbone, optimizer
    return result


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run(args) -> int:
    import torch

    from spacy_unmask.cpu import cpu_flags

    if torch.cuda.is_available():
        import spacy

        spacy.require_gpu(0)
    results = {
        "command": "python -m scripts.gpu_check run " + " ".join(sys.argv[2:]),
        "model": args.model,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "machine": platform.machine(),
        "cpu_flags": cpu_flags(),
        "torch": torch.__version__,
        "batch": args.batch,
        "steps": args.steps,
        "runs": [],
    }
    for round_ in range(args.rounds):  # the bases alternated, each in a fresh pipeline
        for base in args.bases:
            entry = {"round": round_, "base_quantization": base, **run_one(args, base)}
            print(json.dumps(entry), flush=True)
            results["runs"].append(entry)
            write(args.output, results)  # what has run comes back even if a later run fails
    return 0


def write(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    shape_parser = commands.add_parser("shapes", help="weight memory of 7B decoders from their shapes (no GPU)")
    shape_parser.add_argument("--output", type=Path, required=True)
    run_parser = commands.add_parser("run", help="memory and step time on the device, bfloat16 against NF4")
    run_parser.add_argument("--model", required=True, help="a save_pretrained directory (e.g. /tmp/models/8b)")
    run_parser.add_argument("--bases", nargs="+", default=["none", "nf4"], choices=("none", "nf4", "int8"))
    run_parser.add_argument("--rounds", type=int, default=2)
    run_parser.add_argument("--steps", type=int, default=5)
    run_parser.add_argument("--batch", type=int, default=64, help="documents per step")
    run_parser.add_argument("--max-batch-pieces", type=int, default=16384)
    run_parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    return shapes(args) if args.command == "shapes" else run(args)


if __name__ == "__main__":
    raise SystemExit(main())
