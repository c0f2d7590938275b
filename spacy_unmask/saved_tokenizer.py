"""A saved pipeline's tokenizer, as data both ways.

Saved as two files: `tokenizer.json` (the `tokenizers` library's own serialisation)
and `tokenizer_config.json` holding only the keys of `DATA_KEYS`. Read back through one
explicit class, `PreTrainedTokenizerFast`, from the parsed JSON: nothing is written to
disk, no key may name a file, a class or code (any key outside `DATA_KEYS` is ignored,
so `tokenizer_class`, `auto_map`, `fast_tokenizer_files` or `tokenizer_file` do
nothing), and every special token must be a piece the tokenizer already has, with an id
the decoder's embedding holds. Pipelines saved with `save_pretrained`'s files (a
`special_tokens_map.json` beside them) read the same way.
"""
import json
from typing import Dict

from .opt_ins import UnsafePipelineError

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"  # written by save_pretrained under transformers 4
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
SIDES = ("left", "right")
DATA_KEYS = SPECIAL_TOKENS + ("model_max_length", "padding_side", "truncation_side")


def tokenizer_data(tokenizer) -> Dict[str, bytes]:
    """The files a pipeline stores for `tokenizer`: its tokenizer.json and the data keys."""
    special = tokenizer.special_tokens_map
    config = {key: str(special[key]) for key in SPECIAL_TOKENS if special.get(key) is not None}
    config["model_max_length"] = int(tokenizer.model_max_length)
    config["padding_side"] = tokenizer.padding_side
    config["truncation_side"] = tokenizer.truncation_side
    return {
        CONFIG_FILE: (json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8"),
        TOKENIZER_FILE: tokenizer.backend_tokenizer.to_str().encode("utf-8"),
    }


def tokenizer_from_data(files: Dict[str, bytes]):
    """The fast tokenizer of the saved files, read from memory."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    if TOKENIZER_FILE not in files:
        raise refused(f"there is no {TOKENIZER_FILE!r}")
    try:
        backend = Tokenizer.from_str(files[TOKENIZER_FILE].decode("utf-8"))
    except Exception:  # the tokenizers library's own parser: damaged, forged or too deep
        raise refused(f"{TOKENIZER_FILE!r} is not a tokenizer the tokenizers library can read") from None
    settings = {}
    for name in (SPECIAL_TOKENS_FILE, CONFIG_FILE):  # the config's own keys win
        if name in files:
            settings.update(data_settings(name, files[name]))
    for key in SPECIAL_TOKENS:
        if key in settings and backend.token_to_id(settings[key]) is None:
            raise refused(f"{key!r} in {CONFIG_FILE!r} is not a piece of the tokenizer")
    return PreTrainedTokenizerFast(tokenizer_object=_Handover(backend), **settings)


class _Handover:
    """The parsed backend, handed over as it is: `PreTrainedTokenizerFast` deep-copies
    a `tokenizer_object` (a round trip through its whole JSON, as long as parsing it again),
    and this one is used by nothing else."""

    def __init__(self, backend):
        self.backend = backend

    def __deepcopy__(self, memo):
        return self.backend


def check_fits(tokenizer, rows: int) -> None:
    """Refuse a tokenizer with piece ids beyond the `rows` of the decoder's embedding."""
    top = max(tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
    if top >= rows:
        raise refused(f"{TOKENIZER_FILE!r} has piece ids up to {top}, beyond the {rows} rows of the decoder's embedding")


def data_settings(name: str, content: bytes) -> dict:
    """The keys of DATA_KEYS in a saved JSON file, each checked for its type."""
    try:
        data = json.loads(content.decode("utf-8"))
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested too deeply
        raise refused(f"{name!r} is not JSON (or is nested too deeply)") from None
    if not isinstance(data, dict):
        raise refused(f"{name!r} is not a JSON object")
    settings = {}
    for key in DATA_KEYS:
        if key not in data or data[key] is None:
            continue
        value = data[key]
        if key in SPECIAL_TOKENS:
            if isinstance(value, dict):  # an AddedToken as save_pretrained writes it
                value = value.get("content")
            ok = isinstance(value, str) and value != ""
        elif key == "model_max_length":
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        else:
            ok = value in SIDES
        if not ok:
            raise refused(f"the key {key!r} of {name!r} is not {_accepted(key)}")
        settings[key] = value
    return settings


def _accepted(key: str) -> str:
    if key in SPECIAL_TOKENS:
        return "a non-empty string"
    if key == "model_max_length":
        return "a positive integer"
    return "'left' or 'right'"


def refused(why: str) -> UnsafePipelineError:
    return UnsafePipelineError(f"the saved tokenizer (field 'tokenizer') is damaged or hostile: {why}")
