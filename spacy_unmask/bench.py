"""`python -m spacy_unmask bench`: how close the pipeline runs to the raw decoder.

In one process and on the same texts it measures (a) the raw Hugging Face forward
pass of a clean copy of the decoder (its tokenizer with padding, same dtype, same
batch size), (b) `nlp.pipe` with `unmask_ner`, (c) training words/s with and
without unmasking, and (d) peak resident memory after inference (taken before
the raw copy loads) and after training. It prints the ratio (b)/(a), with (a) both
in the given order and sorted by length.
"""
import json
import platform
import resource
import time
from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="smollm2-135m", help="backbone name (registry model, id, directory)")
    parser.add_argument("--data", required=True, type=Path, help="a .spacy file with gold entities (e.g. corpus/wnut17/test.spacy)")
    parser.add_argument("--n-docs", type=int, default=400, help="documents to time (default 400)")
    parser.add_argument("--batch-size", type=int, default=32, help="documents per batch for both (a) and (b)")
    parser.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16")
    parser.add_argument("--unmask", default="all")
    parser.add_argument("--lora-dropout", type=float, default=0.1, help="LoRA dropout while training (about 13%% of a CPU step at 0.1)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--train-steps", type=int, default=8, help="training steps to time per unmask setting (0: skip)")
    parser.add_argument("--train-batch", type=int, default=24, help="documents per training step")
    parser.add_argument("--profile", type=int, default=0, help="print the N costliest torch ops of two training steps")
    parser.add_argument("--output", type=Path, help="write the figures as JSON here")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(args) -> int:
    import spacy
    import torch
    from spacy.tokens import DocBin

    from .layers.module import resolve_dtypes
    from spacy.training import Example

    if args.threads:
        torch.set_num_threads(args.threads)
    nlp = spacy.blank("en")
    gold = [d for d in DocBin().from_disk(args.data).get_docs(nlp.vocab) if len(d)][: args.n_docs]
    texts = [d.text for d in gold]
    words = sum(len(d) for d in gold)

    nlp.add_pipe("unmask_ner", name="ner", config={"model": {"tok2vec": {"name": args.model, "unmask": args.unmask, "dtype": args.dtype, "lora_dropout": args.lora_dropout}}})
    examples = [Example(nlp.make_doc(d.text), d) for d in gold]
    nlp.initialize(lambda: examples[:50])
    module = nlp.get_pipe("ner").model.get_ref("tok2vec").shims[0]._model
    module.merge_for_inference = True  # as in a pipeline loaded with spacy.load
    results = {
        "model": args.model,
        "dtype": args.dtype,
        "unmask": args.unmask,
        "docs": len(texts),
        "words": words,
        "batch_size": args.batch_size,
        "torch_threads": torch.get_num_threads(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "torch": torch.__version__,
    }

    def timed(step) -> float:
        step()  # warm-up
        start = time.perf_counter()
        step()
        return round(words / (time.perf_counter() - start), 1)

    def pipeline_pass():
        for _ in nlp.pipe(texts, batch_size=args.batch_size):
            pass

    results["pipeline_words_per_s"] = timed(pipeline_pass)
    results["peak_rss_mb_inference"] = round(peak_rss_mb())

    # The raw pass: a clean copy of the base decoder (no LoRA), its own tokenizer with
    # padding, the same dtype and batch size, texts in the given order.
    from .backbone import load_decoder

    weights_dtype, compute_dtype = resolve_dtypes(args.dtype, "frozen")
    base, tokenizer = load_decoder(args.model, dtype=weights_dtype)
    base.eval()
    tokenizer.padding_side = "right"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    def raw_pass(ordered):
        def run():
            for start in range(0, len(ordered), args.batch_size):
                enc = tokenizer(ordered[start : start + args.batch_size], padding=True, return_tensors="pt")
                with torch.inference_mode(), torch.autocast("cpu", dtype=compute_dtype or torch.float32, enabled=compute_dtype is not None):
                    base(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], use_cache=False)

        return run

    # In the given order, as a plain loop would run; and sorted by length, the least
    # padding a padded batch can have: the pipeline's own overhead shows against that.
    results["raw_forward_words_per_s"] = timed(raw_pass(texts))
    by_length = sorted(texts, key=lambda t: len(tokenizer(t)["input_ids"]))
    results["raw_sorted_words_per_s"] = timed(raw_pass(by_length))
    for name in ("raw_forward", "raw_sorted"):
        results[f"pipeline_over_{name}"] = round(results["pipeline_words_per_s"] / results[f"{name}_words_per_s"], 3)
    del base

    if args.train_steps:
        from thinc.api import Adam

        optimizer = Adam(1e-4)
        for unmask in ("none", args.unmask):
            module.decoder.set_unmask(unmask)
            batches = [examples[i : i + args.train_batch] for i in range(0, len(examples), args.train_batch)]
            nlp.update(batches[0], sgd=optimizer)  # warm-up
            timed = batches[1 : 1 + args.train_steps]
            start = time.perf_counter()
            for batch in timed:
                nlp.update(batch, sgd=optimizer)
            elapsed = time.perf_counter() - start
            trained_words = sum(len(eg.predicted) for batch in timed for eg in batch)
            texts_trained = [eg.predicted.text for batch in timed for eg in batch]
            pieces = sum(len(ids) for ids in module.tokenizer(texts_trained, add_special_tokens=False)["input_ids"])
            results[f"train_words_per_s_{unmask}"] = round(trained_words / elapsed, 1)
            results[f"train_pieces_per_s_{unmask}"] = round(pieces / elapsed, 1)
        results["peak_rss_mb_training"] = round(peak_rss_mb())
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for batch in batches[1:3]:
                    nlp.update(batch, sgd=optimizer)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile))

    for key, value in results.items():
        print(f"{key:28} {value}")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2) + "\n")
    return 0
