"""How far the 8-bit embedding of a saved pipeline (save_embedding = "int8") moves the
decoder's vectors, beside how far computing in bfloat16 instead of float32 moves them.

    python -m research.embedding_int8 --model gemma3-270m --num-layers -6 \
        --data assets/wnut17/emerging.test.annotated --output FILE

A fresh pipeline on --model (its LoRA adds nothing before training), on the first --docs
sentences of a CoNLL-format file. Against the embedding as it is, for the power-of-two
row scales that ship and for the finest scale (max |row| / 127, which a dequantised copy
cannot reproduce, so saving a loaded pipeline would not give the same bytes): the
relative error (Frobenius) of the embedding rows the sentences use, and of the vectors
(float32 out of a bfloat16 decoder), and the cosine of each token's vector, min and
mean. The reference line is the same decoder computing in float32 against bfloat16.
"""
import argparse
import json
import sys
from pathlib import Path

import torch


def read_sentences(path: Path, limit: int):
    sentences, words = [], []
    for line in path.read_text(encoding="utf8").splitlines():
        if line.strip():
            words.append(line.split("\t")[0])
        elif words:
            sentences.append(words)
            words = []
    return (sentences + ([words] if words else []))[:limit]


def pipeline(model: str, num_layers: int, dtype: str):
    import spacy

    nlp = spacy.blank("en")
    tok2vec = {"name": model, "num_layers": num_layers, "dtype": dtype}
    nlp.add_pipe("unmask_ner", name="ner", config={"model": {"tok2vec": tok2vec}}).add_label("ENT")
    nlp.initialize()
    return nlp


def vectors(nlp, docs) -> torch.Tensor:
    return torch.cat([torch.as_tensor(v) for v in nlp.get_pipe("ner").model.get_ref("tok2vec").predict(docs)])


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    cos = torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)
    return {"relative_error": round(float((a.float() - b.float()).norm() / b.float().norm()), 6),
            "cosine_min": round(float(cos.min()), 6), "cosine_mean": round(float(cos.mean()), 6)}


def main(argv=None) -> int:
    from spacy.tokens import Doc

    from spacy_unmask import get_backbone
    from spacy_unmask.compact import LEVELS, dequantize_rows, quantize_rows
    from spacy_unmask.cpu import machine

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--num-layers", type=int, default=-6)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--docs", type=int, default=300)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)

    nlp = pipeline(args.model, args.num_layers, "bfloat16")
    docs = [Doc(nlp.vocab, words=words) for words in read_sentences(args.data, args.docs)]
    backbone = get_backbone(nlp)
    weight = backbone.model.get_input_embeddings().weight
    used = torch.tensor(sorted({i for doc in docs for i in backbone.tokenizer(doc.text)["input_ids"]}))
    exact, original = vectors(nlp, docs), weight.detach().clone()
    values, scale = quantize_rows(original)
    finest = original.float().abs().amax(dim=1).clamp_min(1e-30) / LEVELS
    rounded = {
        "power_of_two_scale": dequantize_rows(values, scale, weight.dtype),
        "finest_scale": (torch.round(original.float() / finest[:, None]) * finest[:, None]).to(weight.dtype),
    }
    result = {"command": "python -m research.embedding_int8 " + " ".join(argv if argv is not None else sys.argv[1:]),
              "model": args.model, "num_layers": args.num_layers, "docs": len(docs),
              "tokens": sum(len(d) for d in docs), "rows_used": len(used), "embedding_int8": {}}
    with torch.no_grad():
        for name, table in rounded.items():
            weight.copy_(table)
            result["embedding_int8"][name] = {"rows": compare(table[used], original[used])["relative_error"],
                                              "vectors": compare(vectors(nlp, docs), exact)}
        weight.copy_(original)
    result["bfloat16_against_float32"] = compare(exact, vectors(pipeline(args.model, args.num_layers, "float32"), docs))
    result["machine"] = machine()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
