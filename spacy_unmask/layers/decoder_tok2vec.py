"""`spacy_unmask.DecoderTok2Vec.v1`: a decoder LLM as a spaCy tok2vec layer.

The Thinc model tokenizes docs (`windows.plan_batch`), runs the decoder with
its per-layer masks inside a PyTorch shim, pools pieces to tokens
(`pooling.pool_pieces`) and hands one float32 row per token to the next layer.
The decoder is loaded when the pipeline is initialised, never when it is built,
so `spacy.load` rebuilds it from the saved bytes without touching a hub.
"""
import hashlib
import tempfile
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Dict, List, Optional

from spacy.tokens import Doc
from spacy.util import registry
from thinc.api import ArgsKwargs, Model
from thinc.types import Floats2d

from ..masks import check_unmask_spec, unmasked_layers
from .pooling import check_pooling

SAVE_MODES = ("full", "adapter")
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class DecoderSettings:
    """Everything needed to rebuild the backbone; saved with the pipeline."""

    name: str
    unmask: str = "all"
    pooling: str = "first"
    finetune: str = "lora"
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.1
    lora_targets: List[str] = field(default_factory=lambda: ["attention"])
    window: int = 256
    stride: int = 192
    max_batch_pieces: int = 4096
    dtype: str = "auto"
    attn_implementation: str = "auto"
    gradient_checkpointing: bool = False
    save_mode: str = "full"
    trust_remote_code: bool = False

    def validate(self) -> None:
        """Check every setting that can be checked without loading the model."""
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name {self.name!r}: give a Hugging Face id, a directory or a .gguf file")
        check_unmask_spec(self.unmask)  # the layer count is checked when the model loads
        check_pooling(self.pooling)
        if self.save_mode not in SAVE_MODES:
            raise ValueError(f"save_mode {self.save_mode!r} is not supported; accepted: {', '.join(SAVE_MODES)}")
        if self.save_mode == "adapter" and self.finetune == "full":
            raise ValueError("save_mode 'adapter' stores LoRA weights only; with finetune 'full' use save_mode 'full'")
        if self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"dtype {self.dtype!r} is not supported; accepted: {', '.join(DTYPE_CHOICES)}")
        if not (isinstance(self.window, int) and self.window >= 2):
            raise ValueError(f"window {self.window!r}: must be an integer of at least 2 pieces")
        if not (isinstance(self.stride, int) and 1 <= self.stride <= self.window):
            raise ValueError(
                f"stride {self.stride!r}: must be between 1 and the window ({self.window}), "
                "so that consecutive windows overlap or touch and no piece is skipped"
            )
        if not (isinstance(self.max_batch_pieces, int) and self.max_batch_pieces >= 1):
            raise ValueError(f"max_batch_pieces {self.max_batch_pieces!r}: must be a positive integer")
        from ..backbone import ATTENTION_IMPLEMENTATIONS, FINETUNE_MODES

        if self.finetune not in FINETUNE_MODES:
            raise ValueError(f"finetune {self.finetune!r} is not supported; accepted: {', '.join(FINETUNE_MODES)}")
        if self.attn_implementation not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(
                f"attn_implementation {self.attn_implementation!r} is not supported; accepted: "
                f"{', '.join(ATTENTION_IMPLEMENTATIONS)}"
            )


@registry.architectures("spacy_unmask.DecoderTok2Vec.v1")
def DecoderTok2Vec(
    name: str,
    unmask: str = "all",
    pooling: str = "first",
    finetune: str = "lora",
    lora_r: int = 16,
    lora_alpha: int = 32,
    lora_dropout: float = 0.1,
    lora_targets: List[str] = ["attention"],
    window: int = 256,
    stride: int = 192,
    max_batch_pieces: int = 4096,
    dtype: str = "auto",
    attn_implementation: str = "auto",
    gradient_checkpointing: bool = False,
    save_mode: str = "full",
    trust_remote_code: bool = False,
) -> Model[List[Doc], List[Floats2d]]:
    """A decoder LLM with a per-layer causal mask, as a tok2vec layer.

    name (str): Hugging Face id, save_pretrained directory, .gguf file, or a
        registry model ("smollm2-135m", "gemma3-270m").
    unmask (str): which layers attend both ways: "none", "all", "middle",
        "16-29", "0-3,10", "groups:0011".
    pooling (str): how a token's pieces become one vector: "first", "last", "mean".
    finetune (str): "lora" (default), "frozen" (backbone fixed) or "full".
    lora_r, lora_alpha, lora_dropout, lora_targets: the LoRA adapter; the target
        "attention" means the model's attention projections (q/k/v/o_proj, or
        Phi-3's qkv_proj/o_proj); other names are linear layers of the decoder blocks.
    window, stride (int): long docs are cut into windows of `window` pieces
        starting every `stride` pieces; each piece takes its vector from the
        window where it is furthest from an edge.
    max_batch_pieces (int): padded pieces per forward pass (memory bound).
    dtype (str): "auto" (bfloat16 where the CPU or GPU supports it), "float32",
        "bfloat16", "float16". Frozen weights are stored in it; LoRA weights stay float32.
    attn_implementation (str): "auto", "sdpa" or "eager".
    gradient_checkpointing (bool): recompute activations in the backward pass.
    save_mode (str): "full" saves the base weights inside the pipeline;
        "adapter" saves LoRA weights only and reloads the base from `name`.
    trust_remote_code (bool): allow code from the model repository (off by default).
    """
    settings = DecoderSettings(**locals())
    settings.lora_targets = list(settings.lora_targets)
    settings.validate()
    from thinc.api import PyTorchShim

    shim = PyTorchShim(
        None,
        serialize_model=partial(serialize_backbone, settings=settings),
        deserialize_model=partial(_deserialize_into, settings=settings),
    )
    return Model(
        "decoder_tok2vec",
        forward,
        init=init,
        shims=[shim],
        dims={"nO": None},
        attrs={"settings": asdict(settings)},
    )


def init(model: Model, X=None, Y=None) -> None:
    settings = DecoderSettings(**model.attrs["settings"])
    shim = model.shims[0]
    if shim._model is None:
        from thinc.util import get_torch_default_device

        shim._model = build_backbone(settings).to(get_torch_default_device())
    model.set_dim("nO", shim._model.hidden_size)


def forward(model: Model, docs: List[Doc], is_train: bool):
    shim = model.shims[0]
    module = shim._model
    if module is None:
        raise ValueError(
            "The decoder backbone is not loaded: call nlp.initialize() before training, "
            "or load a saved pipeline with spacy.load()"
        )
    from thinc.util import torch2xp, xp2torch

    batch = module.plan(docs)
    if not is_train:
        return [model.ops.asarray2f(torch2xp(t.float())) for t in module.predict(batch)], lambda d: []
    module.set_merged(False)
    outputs, torch_backprop = shim(ArgsKwargs(args=(batch,), kwargs={}), is_train)
    vectors = [model.ops.asarray2f(torch2xp(t.detach().float())) for t in outputs]

    def backprop(d_vectors: List[Floats2d]) -> List[Doc]:
        grads = [xp2torch(d, device=t.device).to(t.dtype) for d, t in zip(d_vectors, outputs)]
        keep = [i for i, t in enumerate(outputs) if t.requires_grad and t.numel()]
        if keep:
            torch_backprop(
                ArgsKwargs(
                    args=([outputs[i] for i in keep],),
                    kwargs={"grad_tensors": [grads[i] for i in keep]},
                )
            )
        return []

    return vectors, backprop


def build_backbone(settings: DecoderSettings, state: Optional[dict] = None, config=None, tokenizer=None):
    """Load (or, given config and state, rebuild) the decoder with masks and LoRA."""
    from ..backbone import apply_finetuning, choose_attention, load_decoder
    from .module import DecoderTok2VecModule, resolve_dtypes

    weights_dtype, compute_dtype = resolve_dtypes(settings.dtype, settings.finetune)
    if config is None:
        base, tokenizer = load_decoder(
            settings.name,
            attn_implementation=settings.attn_implementation,
            dtype=weights_dtype,
            trust_remote_code=settings.trust_remote_code,
        )
    else:
        import transformers

        impl = choose_attention(config, settings.attn_implementation)
        base = transformers.AutoModel.from_config(config, attn_implementation=impl).to(weights_dtype)
    unmasked_layers(settings.unmask, base.config.num_hidden_layers)  # range check against the model
    base = apply_finetuning(
        base,
        settings.finetune,
        lora_r=settings.lora_r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=settings.lora_dropout,
        lora_targets=settings.lora_targets,
    )
    if state is not None:
        missing, unexpected = base.load_state_dict(state, strict=False)
        if settings.save_mode == "adapter":
            missing = [k for k in missing if "lora_" in k]  # the base weights came from `name`
        if unexpected or missing:
            raise ValueError(
                f"the saved backbone weights do not fit the model {settings.name!r}: "
                f"missing {list(missing)[:5]}, unexpected {list(unexpected)[:5]}"
            )
    if settings.gradient_checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return DecoderTok2VecModule(base, tokenizer, settings, compute_dtype)


def serialize_backbone(module, settings: DecoderSettings) -> bytes:
    import srsly
    import torch
    from safetensors.torch import save as save_tensors

    if module is None:
        raise ValueError("cannot save an uninitialised decoder backbone: call nlp.initialize() first")
    module.set_merged(False)  # save the base and LoRA weights apart
    base = module.decoder.model
    if settings.save_mode == "full":
        state = base.state_dict()
    else:
        state = {k: v for k, v in base.state_dict().items() if "lora_" in k}
    state = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    broken = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if broken:
        raise ValueError(
            f"refusing to save a backbone with non-finite weights ({broken[:3]}): training diverged"
        )
    weights = save_tensors(state)
    if len(weights) >= 2**32 - 2**20:
        raise ValueError(
            f"the backbone weights take {len(weights) / 2**30:.1f} GiB, over the 4 GiB a spaCy "
            "model file can hold; use save_mode = \"adapter\" or dtype = \"bfloat16\""
        )
    msg = {
        "format": 1,
        "config": base.config.to_json_string(use_diff=False),
        "tokenizer": tokenizer_files(module.tokenizer),
        "weights": weights,
        "sha256": hashlib.sha256(weights).hexdigest(),
    }
    return srsly.msgpack_dumps(msg)


def _deserialize_into(_module, data: bytes, device, *, settings: DecoderSettings):
    return deserialize_backbone(data, settings, device)


def deserialize_backbone(data: bytes, settings: DecoderSettings, device):
    import srsly
    import transformers
    from safetensors.torch import load as load_tensors

    try:
        msg = srsly.msgpack_loads(data)
        digest = hashlib.sha256(msg["weights"]).hexdigest()
        if msg.get("sha256", digest) != digest:
            raise ValueError("the weights do not match their SHA-256")
        state = load_tensors(msg["weights"])
        config_text, files = msg["config"], msg["tokenizer"]
    except Exception as err:  # a truncated, damaged or foreign file
        raise ValueError(f"the saved decoder backbone is unreadable (truncated or corrupted?): {err}") from err
    with tempfile.TemporaryDirectory() as tmp:
        for file_name, content in files.items():
            (Path(tmp) / file_name).write_bytes(content)
        from ..backbone import load_tokenizer

        tokenizer = load_tokenizer(tmp)
        (Path(tmp) / "config.json").write_text(config_text)
        config = transformers.AutoConfig.from_pretrained(tmp)
    if settings.save_mode == "full":
        module = build_backbone(settings, state=state, config=config, tokenizer=tokenizer)
    else:
        module = build_backbone(settings, state=state)
    module.merge_for_inference = settings.finetune == "lora"
    return module.to(device)


def tokenizer_files(tokenizer) -> Dict[str, bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        return {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}
