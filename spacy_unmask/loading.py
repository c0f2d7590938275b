"""Find and load a decoder's config, weights and fast tokenizer.

A model is a Hugging Face id, a local `save_pretrained` directory, a `.gguf`
file, or the name of a registry-carried model (`download.py`). Only the
supported architectures load; code from a model repository never runs unless
asked for.
"""
import contextlib
import re
import warnings
from pathlib import Path
from typing import Optional, Tuple

import torch
import transformers
from packaging.version import Version

from .families import SUPPORTED_MODEL_TYPES, check_supported, choose_attention
from .opt_ins import require_remote_code_opt_in

_TRANSFORMERS_5 = Version(transformers.__version__) >= Version("5.0.0")
_DTYPE_KWARG = "dtype" if _TRANSFORMERS_5 else "torch_dtype"


def resolve_source(name: str) -> Tuple[str, Optional[str]]:
    """Where to load `name` from: (directory or hub id, gguf file name or None)."""
    from .download import REGISTRY_MODELS, model_dir

    if name in REGISTRY_MODELS:
        return str(model_dir(name)), None
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ValueError(f"model {name!r}: no such GGUF file")
        return str(path.parent), path.name
    if path.exists():
        if not (path / "config.json").is_file():
            raise ValueError(
                f"model {name!r}: the directory has no config.json; expected a "
                "save_pretrained directory, a .gguf file, a Hugging Face id or one of "
                f"{sorted(REGISTRY_MODELS)}"
            )
        return str(path), None
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ValueError(
            f"model {name!r}: no such file or directory (a model is a Hugging Face id, a "
            f"save_pretrained directory, a .gguf file, or one of {sorted(REGISTRY_MODELS)})"
        )
    return name, None


def load_config(name: str, *, trust_remote_code: bool = False, num_layers: int = 0):
    """The model's config, checked to be a supported architecture, cut to `num_layers`
    (0: all; N: the first N; -N: all but the last N)."""
    require_remote_code_opt_in(trust_remote_code)
    source, gguf_file = resolve_source(name)
    try:
        config = transformers.AutoConfig.from_pretrained(
            source, gguf_file=gguf_file, trust_remote_code=trust_remote_code
        )
    except Exception as err:  # transformers raises many kinds (struct.error on a cut GGUF)
        from .download import REGISTRY_MODELS

        raise ValueError(
            f"model {name!r} could not be loaded ({type(err).__name__}: {err}). Give a Hugging Face "
            "id that is in the local cache (or reachable), a save_pretrained directory, a .gguf "
            f"file, or a registry model: {', '.join(sorted(REGISTRY_MODELS))}. Supported "
            f"architectures: {', '.join(SUPPORTED_MODEL_TYPES)}."
        ) from err
    check_supported(config, name)
    if num_layers:
        truncate_config(config, num_layers, name)
    return config


def truncate_config(config, num_layers: int, name: str) -> None:
    """Keep the first `num_layers` decoder layers (-N: all but the last N): later ones are
    neither loaded nor run."""
    total = config.num_hidden_layers
    keep = num_layers if num_layers > 0 else total + num_layers
    if not 1 <= keep <= total:
        raise ValueError(
            f"num_layers {num_layers}: model {name!r} has only {total} decoder layers "
            f"(accepted: 1 to {total} keeps the first N, -1 to -{total - 1} all but the last N, 0 all)"
        )
    config.num_hidden_layers = keep
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types)[:keep]
    if getattr(config, "max_window_layers", None) is not None:  # Qwen2: layers below it are full attention
        config.max_window_layers = min(config.max_window_layers, keep)


def load_decoder(
    name: str,
    config=None,
    *,
    attn_implementation: str = "auto",
    dtype: torch.dtype = torch.float32,
    trust_remote_code: bool = False,
):
    """The base decoder (without LM head) of `name` and its fast tokenizer; `config`
    (from `load_config`, default: the model's own) may cut the layers."""
    require_remote_code_opt_in(trust_remote_code)
    if config is None:
        config = load_config(name, trust_remote_code=trust_remote_code)
    source, gguf_file = resolve_source(name)
    # Load through the causal-LM class: AutoModel on a checkpoint saved from
    # *ForCausalLM can silently re-initialise the weights (transformers 4.53, Gemma 3).
    # transformers' own load report would list every weight of the layers that
    # `num_layers` cut off as unused; the report is made here instead, without them.
    with _transformers_quiet():
        lm, info = transformers.AutoModelForCausalLM.from_pretrained(
            source,
            config=config,
            gguf_file=gguf_file,
            attn_implementation=choose_attention(config, attn_implementation),
            trust_remote_code=trust_remote_code,
            output_loading_info=True,
            **{_DTYPE_KWARG: dtype},
        )
    warn_about_loading(info, name, config.num_hidden_layers)
    model = lm.get_decoder()
    del lm
    return model, load_tokenizer(source, gguf_file=gguf_file, trust_remote_code=trust_remote_code)


_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def warn_about_loading(info: dict, name: str, num_layers: int) -> None:
    """A warning for what `from_pretrained(output_loading_info=True)` found amiss: weights
    the model expected but the checkpoint lacks (left at random), weights of another
    shape, and unused checkpoint weights other than those of layers `num_layers` and up
    (cut off on purpose)."""

    def cut_off(key: str) -> bool:
        match = _LAYER_INDEX.search(key)
        return match is not None and int(match.group(1)) >= num_layers

    problems = {
        "missing from the checkpoint (left randomly initialised)": sorted(map(str, info.get("missing_keys", ()))),
        "of another shape in the checkpoint": sorted(map(str, info.get("mismatched_keys", ()))),
        "in the checkpoint but not used": sorted(k for k in info.get("unexpected_keys", ()) if not cut_off(k)),
    }
    found = [f"{what}: {', '.join(keys)}" for what, keys in problems.items() if keys]
    if found:
        warnings.warn(f"model {name!r}: weights " + "; weights ".join(found), stacklevel=3)


@contextlib.contextmanager
def _transformers_quiet():
    """transformers logs errors only, inside the block."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(verbosity)


def decoder_from_config(config, *, attn_implementation: str, dtype: torch.dtype):
    """A decoder with the architecture of `config`, its weights left uninitialised: every
    one is loaded into it next (drawing Gemma 3's random weights first took 5 of the 21 s
    that `spacy.load` of a pipeline took).

    It is built in `dtype`, as `from_pretrained` builds the decoder a pipeline is trained
    on; casting a built one (`.to(dtype)`) would also round the buffers a family computes
    in float32 on purpose (the rotary frequencies), moving every position's rotation."""
    if _TRANSFORMERS_5:
        from transformers.initialization import no_init_weights
    else:
        from transformers.modeling_utils import no_init_weights

    impl = choose_attention(config, attn_implementation)
    with no_init_weights():
        return transformers.AutoModel.from_config(config, attn_implementation=impl, **{_DTYPE_KWARG: dtype})


def load_tokenizer(source: str, *, gguf_file: Optional[str] = None, trust_remote_code: bool = False):
    require_remote_code_opt_in(trust_remote_code)
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        source, gguf_file=gguf_file, trust_remote_code=trust_remote_code
    )
    if not tokenizer.is_fast:
        raise ValueError(
            f"model {source!r}: spacy-unmask needs a fast tokenizer (with character "
            "offsets) and this model only has a slow one"
        )
    return tokenizer


