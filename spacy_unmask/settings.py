"""The backbone's settings: one typed object, validated in one place.

`BackboneSettings` is what `[components.ner.model.tok2vec]` in a config holds.
The registered architecture `spacy_unmask.DecoderTok2Vec.v1` takes exactly its
fields (its signature is made from them, so no default is written twice), and
the thinc layer, the torch module and the saved pipeline all share the one
instance. Everything that can be checked without loading the model is checked
when the object is made; the `unmask` spec is parsed here and resolved against
the model's layer count once, when the model loads.
"""
import inspect
import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import List

from .masks import UnmaskSpec, parse_unmask

POOLING = ("first", "last", "mean")
FINETUNE_MODES = ("lora", "frozen", "full")
SAVE_MODES = ("full", "adapter")
DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION_IMPLEMENTATIONS = ("auto", "sdpa", "eager")
QUANTIZE_MODES = ("auto", "none", "int8")
BASE_QUANTIZATION_MODES = ("none", "nf4", "int8")
SAVE_EMBEDDING_MODES = ("int8", "exact")


@dataclass
class BackboneSettings:
    """Everything needed to build (and rebuild) the decoder backbone."""

    name: str
    """Hugging Face id, save_pretrained directory, .gguf file, or a registry model
    ("smollm2-135m", "gemma3-270m")."""
    unmask: str = "all"
    """Which layers attend both ways: "none", "all", "middle", "16-29", "0-3,10", "groups:0011"."""
    lookahead: int = 16
    """At most this many pieces an unmasked layer sees on the right (within its window); 0: no
    cap. It holds per layer (the layers on top see further: L layers reach L x lookahead). A model fine-tuned on sentences has only seen short right contexts: uncapped, it
    falls apart on whole documents (CoNLL-2003 dev, Gemma 3 270M: 92.3 F1 on sentences,
    60.4 on articles); capped at 16 pieces it keeps 91.4 on articles and 92.5 on sentences."""
    pooling: str = "first"
    """How a token's pieces become one vector: "first", "last", "mean"."""
    finetune: str = "lora"
    """"lora", "frozen" (backbone fixed) or "full"."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA scale (the update is scaled by lora_alpha / lora_r)."""
    lora_dropout: float = 0.1
    """Dropout on the LoRA branch's input while training ([training] dropout is the head's)."""
    lora_targets: List[str] = field(default_factory=lambda: ["attention"])
    """"attention" (the model's attention projections: q/k/v/o_proj, Phi-3's qkv/o), or
    names of linear layers of the decoder blocks (gate_proj, up_proj, ...)."""
    num_layers: int = 0
    """Keep only the first N decoder layers (the rest are never loaded or run); 0: all;
    -N: all but the last N (the same cut of the top for models of any depth)."""
    sentence_windows: bool = False
    """Where the Doc has sentence boundaries (a `sentencizer` or `senter` before the
    component, or the corpus), read each sentence in a window of its own, with
    `sentence_context` pieces of the text around it; its tokens take their vectors
    from it. Docs without boundaries are cut by `window` and `stride`."""
    sentence_context: int = 0
    """Pieces of the neighbouring text read on each side of a sentence window
    (FLERT's document context; only the sentence's own tokens take vectors from it)."""
    repeat: int = 0
    """Sequence repetition (Kukic et al. 2026): each window is read `repeat` + 1 times in a
    row, BOS included, positions counting on across the copies, and the vectors come from
    the last copy, so even a causal layer there has seen the whole window. The copies count
    against `window`: a window holds window // (repeat + 1) pieces of text, read every
    stride // (repeat + 1) pieces."""
    window: int = 256
    """Long docs (and sentences) are cut into windows of this many pieces (all copies of
    `repeat` together)..."""
    stride: int = 192
    """...starting every `stride` pieces; each piece takes its vector from the window
    where it is furthest from an edge."""
    max_batch_pieces: int = 4096
    """Pieces per forward pass, padding included (bounds memory)."""
    quantize: str = "auto"
    """"int8": at prediction, the decoder blocks' linear layers (LoRA folded in) run as int8 x
    int8 matrix multiplies, activations quantised per piece (`quantize.py`; CPU and
    prediction only: training with it set is refused; refused too where the CPU's int8
    products are not exact: no VNNI, `cpu.int8_products_exact`); "none": never; "auto": int8
    where `dtype = "auto"` found no bfloat16 on the CPU and its int8 products are exact,
    else none (docs/speed.md). Saved weights stay full precision; set it at load time
    with spacy.load(path, config=...)."""
    dtype: str = "auto"
    """"auto" (bfloat16 where the CPU or GPU supports it), "float32", "bfloat16",
    "float16". Frozen weights are stored in it; LoRA weights stay float32."""
    base_quantization: str = "none"
    """"nf4" or "int8": the frozen base held in 4 or 8 bits through bitsandbytes (QLoRA; docs/quantized-base.md); "none"."""
    attn_implementation: str = "auto"
    """"auto" (SDPA; eager for Gemma 2's soft-capping), "sdpa" or "eager"."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (large models)."""
    save_mode: str = "full"
    """"full": base weights saved inside the pipeline; "adapter": LoRA weights only,
    the base is reloaded from `name`."""
    save_embedding: str = "exact"
    """How a saved full pipeline stores the frozen input embedding: "exact" (as it is used)
    or "int8" (8 bits, a power-of-two scale per row, dequantised on load: Gemma 3 270M's
    pipeline about a third smaller; `compact.py`; its effect on F1 is not yet measured)."""
    trust_remote_code: bool = False
    """Allow code from the model repository (off by default). Wherever a base model is loaded
    (nlp.initialize(), spacy.load), it takes effect only where the loading process sets
    SPACY_UNMASK_TRUST_REMOTE_CODE=1 (opt_ins.py, docs/sharing.md)."""

    def __post_init__(self) -> None:
        self.lora_targets = list(self.lora_targets)
        self.unmask_spec  # parses the spec: a grammar error names the spec
        require("name", self.name, isinstance(self.name, str) and self.name,
                "a Hugging Face id, a directory or a .gguf file")
        one_of("pooling", self.pooling, POOLING)
        one_of("finetune", self.finetune, FINETUNE_MODES)
        one_of("save_mode", self.save_mode, SAVE_MODES)
        one_of("dtype", self.dtype, DTYPES)
        one_of("quantize", self.quantize, QUANTIZE_MODES)
        one_of("base_quantization", self.base_quantization, BASE_QUANTIZATION_MODES)
        one_of("save_embedding", self.save_embedding, SAVE_EMBEDDING_MODES)
        if self.base_quantization != "none" and self.finetune == "full":
            raise ValueError(
                f"base_quantization {self.base_quantization!r} holds the base weights in "
                f"{self.base_quantization}, which cannot be trained: with finetune 'full' set "
                "base_quantization 'none', or train LoRA (finetune 'lora') on the quantised base"
            )
        if self.base_quantization != "none" and self.quantize == "int8":
            raise ValueError(
                f"quantize 'int8' would quantise a base that base_quantization {self.base_quantization!r} "
                "already holds quantised: set one of them (quantize 'auto' or 'none' with a quantised base)"
            )
        require("attn_implementation", self.attn_implementation, self.attn_implementation in ATTENTION_IMPLEMENTATIONS,
                f"one of {', '.join(ATTENTION_IMPLEMENTATIONS)} (FlashAttention ignores per-layer masks)")
        if self.save_mode == "adapter" and self.finetune == "full":
            raise ValueError("save_mode 'adapter' stores LoRA weights only; with finetune 'full' use save_mode 'full'")
        _integer("lora_r", self.lora_r, 1, "a positive integer")
        require("lora_alpha", self.lora_alpha, is_number(self.lora_alpha) and self.lora_alpha > 0, "a positive number")
        require("lora_dropout", self.lora_dropout, is_number(self.lora_dropout) and 0.0 <= self.lora_dropout < 1.0,
                "in [0, 1)")
        require("lora_targets", self.lora_targets, self.lora_targets and all(isinstance(t, str) and t for t in self.lora_targets),
                "'attention', 'mlp' or names of linear layers")
        _integer("num_layers", self.num_layers, -math.inf,
                 "an integer: 0 (all layers), N (the first N) or -N (all but the last N)")
        _integer("lookahead", self.lookahead, 0, "0 (no cap) or a positive number of pieces")
        _integer("window", self.window, 2, "an integer of at least 2 pieces")
        _integer("repeat", self.repeat, 0, "0 (read each window once) or the number of extra copies")
        require("repeat", self.repeat, self.window // (self.repeat + 1) >= 2,
                f"small enough to leave 2 pieces of text per copy in the window of {self.window} pieces "
                f"(a window of at least {2 * (self.repeat + 1)} pieces, or a smaller repeat)")
        _integer("sentence_context", self.sentence_context, 0, "0 or a positive number of pieces")
        require("sentence_windows", self.sentence_windows, isinstance(self.sentence_windows, bool), "true or false")
        require("stride", self.stride, is_int(self.stride) and 1 <= self.stride <= self.window,
                f"between 1 and the window ({self.window}), so that consecutive windows overlap or touch "
                "and no piece is skipped")
        _integer("max_batch_pieces", self.max_batch_pieces, 1, "a positive integer")

    @property
    def unmask_spec(self) -> UnmaskSpec:
        return parse_unmask(self.unmask)

    def to_dict(self) -> dict:
        return asdict(self)


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


# The one way a setting is checked, here and in the components: the error names the
# setting, the value and what is accepted ("[ner] " in front, for a component's own).
def require(setting: str, value, ok, accepted: str, where: str = ""):
    """`value`, if `ok`; else a ValueError: "<where><setting> <value>: must be <accepted>"."""
    if not ok:
        raise ValueError(f"{where}{setting} {value!r}: must be {accepted}")
    return value


def one_of(setting: str, value, accepted, where: str = ""):
    """`value`, if it is one of `accepted`; else a ValueError listing them."""
    if value not in accepted:
        raise ValueError(f"{where}{setting} {value!r} is not supported; accepted: {', '.join(accepted)}")
    return value


def _integer(setting: str, value, minimum: int, accepted: str) -> None:
    require(setting, value, is_int(value) and value >= minimum, accepted)


def settings_signature(return_annotation) -> inspect.Signature:
    """The signature of a function taking the settings as keyword arguments, defaults included.

    spaCy's config system reads it to fill and check `[...tok2vec]` blocks.
    """
    parameters = []
    for f in fields(BackboneSettings):
        if f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            default = inspect.Parameter.empty
        parameters.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=f.type))
    return inspect.Signature(parameters, return_annotation=return_annotation)
