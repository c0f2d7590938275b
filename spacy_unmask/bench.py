"""`python -m spacy_unmask bench`: how close the pipeline runs to the raw decoder and the machine.

In one process and on the same texts it measures (a) the raw Hugging Face forward
pass of a clean copy of the decoder (its tokenizer with padding, same dtype, same
batch size), (b) `nlp.pipe` (a saved pipeline with `--pipeline`, else one built
from `--model`), (c) training words/s with and without unmasking, each setting
warmed up and the two alternated, and (d) peak resident memory after inference
(taken before the raw copy loads) and after training. It prints the ratio
(b)/(a), with (a) both in the given order and sorted by length; the machine's
matrix-multiply rate in the compute dtype (one large `torch.matmul`), and the
pipeline's achieved rate (2 x non-embedding parameters x pieces/s) as a share
of it.
"""
import json
import resource
import time
from pathlib import Path

from .cpu import machine


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="smollm2-135m", help="backbone name (registry model, id, directory)")
    parser.add_argument("--pipeline", type=Path, help="a saved pipeline to time instead of one built from --model (its backbone is the raw pass's model)")
    parser.add_argument("--gpu-id", type=int, default=-1, help="GPU to run on (-1: CPU)")
    parser.add_argument("--data", required=True, type=Path, help="a .spacy file with gold entities (e.g. corpus/wnut17/test.spacy)")
    parser.add_argument("--n-docs", type=int, default=400, help="documents to time (default 400)")
    parser.add_argument("--batch-size", type=int, default=32, help="documents per batch for both (a) and (b)")
    parser.add_argument("--dtype", default=None, help="auto | float32 | bfloat16 (default: the pipeline's own; auto for --model)")
    parser.add_argument("--quantize", default=None, help="auto | none | int8 (default: the pipeline's own); the raw copy is quantised alike")
    parser.add_argument("--unmask", default="all")
    parser.add_argument("--lora-dropout", type=float, default=0.1, help="LoRA dropout while training (about 13%% of a CPU step at 0.1)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--train-steps", type=int, default=8, help="training steps to time per unmask setting, alternating the settings (0: skip)")
    parser.add_argument("--train-batch", type=int, default=24, help="documents per training step")
    parser.add_argument("--profile", type=int, default=0, help="print the N costliest torch ops of two training steps")
    parser.add_argument("--output", type=Path, help="write the figures as JSON here")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def matmul_rate(dtype, device, size: int = 2048, repeats: int = 3) -> float:
    """The machine's matrix-multiply rate (GFLOP/s) for `dtype`: one large square matmul, timed."""
    import torch

    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    torch.matmul(a, b)  # warm-up
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.matmul(a, b)
    _sync(device)
    return round(2 * size**3 * repeats / (time.perf_counter() - start) / 1e9, 1)


def _sync(device) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def raw_copy(backbone):
    """(model, tokenizer): a copy of the backbone's decoder as a plain Hugging Face model,
    its LoRA layers replaced by their base layers and its per-layer mask hooks removed."""
    import copy

    from peft.tuners.lora import LoraLayer

    backbone.set_quantized(False)
    backbone.set_merged(False)
    model = copy.deepcopy(backbone.model)
    for module in list(model.modules()):
        module._forward_pre_hooks.clear()
        module._forward_pre_hooks_with_kwargs.clear()
        for name, child in list(module.named_children()):
            if isinstance(child, LoraLayer):
                setattr(module, name, child.get_base_layer())
    return model, copy.deepcopy(backbone.tokenizer)


def run(args) -> int:
    import spacy
    import torch
    from spacy.tokens import DocBin
    from spacy.training import Example

    from .layers.decoder_tok2vec import get_backbone
    from .quantize import quantize_linears
    from .sharing import load

    if args.gpu_id >= 0:
        spacy.require_gpu(args.gpu_id)
    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = {k: v for k, v in (("dtype", args.dtype), ("quantize", args.quantize)) if v is not None}
    if args.pipeline:
        nlp = load(args.pipeline, **overrides)
        ner = next(name for name, pipe in nlp.pipeline if hasattr(pipe, "model") and name != "sentencizer")
    else:
        nlp = spacy.blank("en")
        ner = "ner"
        tok2vec = {"name": args.model, "unmask": args.unmask, "lora_dropout": args.lora_dropout, **overrides}
        nlp.add_pipe("unmask_ner", name=ner, config={"model": {"tok2vec": tok2vec}})
    gold = [d for d in DocBin().from_disk(args.data).get_docs(nlp.vocab) if len(d)][: args.n_docs]
    texts = [d.text for d in gold]
    words = sum(len(d) for d in gold)
    examples = [Example(nlp.make_doc(d.text), d) for d in gold]
    if not args.pipeline:
        nlp.initialize(lambda: examples[:50])
    backbone = get_backbone(nlp)
    backbone.merge_for_inference = True  # as in a pipeline loaded with spacy.load
    settings = backbone.settings
    unmask = settings.unmask
    # The raw copy runs as the pipeline does: under autocast to the backbone's compute
    # dtype (None: float32), with the pipeline's own weights.
    compute_dtype = backbone.compute_dtype
    device = backbone.device
    pieces = sum(len(ids) for ids in backbone.tokenizer(texts, add_special_tokens=False)["input_ids"])
    non_embedding = sum(
        p.numel() for n, p in backbone.model.named_parameters() if "lora_" not in n and "embed_tokens" not in n
    )
    results = {
        "command": args.command_line,
        "model": settings.name,
        "pipeline": str(args.pipeline) if args.pipeline else None,
        "dtype": str(compute_dtype or torch.float32).replace("torch.", ""),
        "quantize": settings.quantize,
        "base_quantization": settings.base_quantization,
        "predicts_in_int8": backbone.predicts_in_int8,
        "unmask": unmask,
        "lookahead": settings.lookahead,
        "device": str(device),
        "docs": len(texts),
        "words": words,
        "pieces": pieces,
        "batch_size": args.batch_size,
        "torch_threads": torch.get_num_threads(),
        **machine(),  # CPU model, cores, flags and kernel caps (cpu.py)
        "torch": torch.__version__,
    }
    results["matmul_gflops"] = matmul_rate(compute_dtype or torch.float32, device)

    def timed(step) -> float:
        step()  # warm-up
        start = time.perf_counter()
        step()
        return time.perf_counter() - start

    def pipeline_pass():
        for _ in nlp.pipe(texts, batch_size=args.batch_size):
            pass

    seconds = timed(pipeline_pass)
    results["pipeline_words_per_s"] = round(words / seconds, 1)
    results["pipeline_gflops"] = round(2 * non_embedding * pieces / seconds / 1e9, 1)
    results["pipeline_share_of_matmul_peak"] = round(results["pipeline_gflops"] / results["matmul_gflops"], 3)
    results["peak_rss_mb_inference"] = round(peak_rss_mb())

    # The raw pass: a plain copy of the pipeline's own decoder (no LoRA, no mask hooks, the
    # same layers and weights), its tokenizer with padding, the same dtype and batch size,
    # texts in the given order.
    base, tokenizer = raw_copy(backbone)
    base = base.to(device).eval()
    if backbone.predicts_in_int8:
        quantize_linears(base)
    tokenizer.padding_side = "right"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    def raw_pass(ordered):
        def run_batches():
            for start in range(0, len(ordered), args.batch_size):
                enc = tokenizer(ordered[start : start + args.batch_size], padding=True, return_tensors="pt").to(device)
                with torch.inference_mode(), torch.autocast(
                    device.type, dtype=compute_dtype or torch.float32, enabled=compute_dtype is not None
                ):
                    base(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], use_cache=False)
            _sync(device)

        return run_batches

    # In the given order, as a plain loop would run; and sorted by length, the least
    # padding a padded batch can have: the pipeline's own overhead shows against that.
    results["raw_forward_words_per_s"] = round(words / timed(raw_pass(texts)), 1)
    by_length = sorted(texts, key=lambda t: len(tokenizer(t)["input_ids"]))
    results["raw_sorted_words_per_s"] = round(words / timed(raw_pass(by_length)), 1)
    for name in ("raw_forward", "raw_sorted"):
        results[f"pipeline_over_{name}"] = round(results["pipeline_words_per_s"] / results[f"{name}_words_per_s"], 3)
    del base

    if args.train_steps and settings.quantize == "int8":
        results["training"] = f"not timed: quantize = {settings.quantize!r} is for prediction only"
    elif args.train_steps:
        results.update(time_training(nlp, backbone, examples, args, unmask))
        results["peak_rss_mb_training"] = round(peak_rss_mb())

    for key, value in results.items():
        print(f"{key:32} {value}")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def time_training(nlp, backbone, examples, args, unmask: str) -> dict:
    """Training words/s and pieces/s with every layer causal and with `unmask`.

    Each setting is warmed up first, then the two take turns on the same batches,
    so that neither pays the warm-up or a slower stretch of the machine alone.
    """
    from thinc.api import Adam

    optimizer = Adam(1e-4)
    settings = ["none", unmask] if unmask != "none" else ["none"]
    batches = [examples[i : i + args.train_batch] for i in range(0, len(examples), args.train_batch)]
    steps = batches[1 : 1 + args.train_steps]
    for spec in settings:  # warm-up
        backbone.set_unmask(spec)
        nlp.update(batches[0], sgd=optimizer)
    elapsed = dict.fromkeys(settings, 0.0)
    for batch in steps:
        for spec in settings:
            backbone.set_unmask(spec)
            start = time.perf_counter()
            nlp.update(batch, sgd=optimizer)
            elapsed[spec] += time.perf_counter() - start
    backbone.set_unmask(unmask)
    trained_words = sum(len(eg.predicted) for batch in steps for eg in batch)
    texts = [eg.predicted.text for batch in steps for eg in batch]
    pieces = sum(len(ids) for ids in backbone.tokenizer(texts, add_special_tokens=False)["input_ids"])
    results = {}
    for spec in settings:
        results[f"train_words_per_s_{spec}"] = round(trained_words / elapsed[spec], 1)
        results[f"train_pieces_per_s_{spec}"] = round(pieces / elapsed[spec], 1)
    if len(settings) == 2:
        results["unmask_training_cost"] = round(1 - elapsed["none"] / elapsed[unmask], 3)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for batch in batches[1:3]:
                nlp.update(batch, sgd=optimizer)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile))
    return results
