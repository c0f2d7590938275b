"""`Backbone`: the one torch module behind `spacy_unmask.DecoderTok2Vec.v1`.

It owns the decoder (loaded by `loading.py`, with LoRA from `lora.py`), one
attention mask per layer (installed as forward pre-hooks, built per batch by
`masks.build_layer_masks`), the state of the LoRA merge used for prediction,
and the way docs become decoder inputs and vectors come back
(`windows.py` plans the windows, `pooling.py` pools pieces to
tokens). Its settings are the pipeline's `BackboneSettings` object itself.
"""
import os
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import List, Optional, Tuple

import torch
import transformers
from torch import nn

from .base_quantization import install_quantized, is_quantized, quantize_base, quantized_shells
from .base_model import base_record
from .compact import as_model_dtypes
from . import cpu
from .pooling import pool_pieces
from .windows import PieceBatch, plan_batch
from .fused import fuse_rms_norms
from .families import decoder_layers
from .loading import decoder_from_config, load_config, load_decoder
from .lora import apply_finetuning, merge_copies, restore
from .quantize import quantize_linears, restore_linears
from .masks import build_layer_masks, layer_windows, parse_unmask, segment_positions
from .settings import BackboneSettings

# Keyword that carries the per-layer masks through the model's forward to the layer hooks.
MASKS_KWARG = "unmask_layer_masks"


def _one_thread_in_forked_child() -> None:
    # A child forked after torch's OpenMP pool has started (nlp.pipe(n_process=2))
    # hangs in its first parallel op with GNU OpenMP; with one thread it never enters
    # the pool. The workers share the cores anyway. (torch's DataLoader does the same.)
    torch.set_num_threads(1)


os.register_at_fork(after_in_child=_one_thread_in_forked_child)


def resolve_dtypes(dtype: str, finetune: str) -> Tuple[torch.dtype, Optional[torch.dtype]]:
    """(dtype of the stored weights, autocast dtype or None) for a `dtype` setting."""
    if dtype == "auto":
        dtype = "bfloat16" if cpu.bf16_supported() else "float32"
    compute = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    # Trainable weights must stay float32: the optimizer works on numpy copies.
    weights = torch.float32 if compute is None or finetune == "full" else compute
    return weights, compute


class Backbone(nn.Module):
    """A decoder whose layers each get their own attention mask, as a tok2vec.

    Padding is masked in every layer; a layer listed in `settings.unmask` attends
    to both sides (within its sliding window, if it has one; to the right only
    up to `lookahead` pieces to the right); other layers
    stay causal. `forward` takes a `PieceBatch` (see `plan`) and returns one
    (tokens, hidden size) tensor per doc.
    """

    def __init__(self, model, tokenizer, settings: BackboneSettings, compute_dtype: Optional[torch.dtype]):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings
        self.compute_dtype = compute_dtype
        config = model.config
        impl = getattr(config, "_attn_implementation", "sdpa")
        if impl not in ("sdpa", "eager"):
            raise ValueError(
                f"attention implementation {impl!r} cannot take per-layer masks; use 'sdpa' or 'eager'"
            )
        self.additive = impl == "eager"
        # A 4- or 8-bit base (base_quantization) runs LoRA beside it, never folded in.
        self.quantized_base = is_quantized(model)
        self.unmasked = settings.unmask_spec.layers(config.num_hidden_layers)
        self.windows = layer_windows(config)
        for index, layer in enumerate(decoder_layers(model)):
            layer.register_forward_pre_hook(partial(_use_layer_mask, index), with_kwargs=True)
        fuse_rms_norms(model)
        # Decoders trained with a BOS piece (Llama, Gemma) expect it at the start of each window.
        probe = tokenizer("a", add_special_tokens=True)["input_ids"]
        self.bos_id = probe[0] if tokenizer.bos_token_id is not None and probe[0] == tokenizer.bos_token_id else None
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        # Loaded pipelines fold LoRA into copies of the base weights for prediction;
        # any training step, save or device move puts the originals back first.
        self.merge_for_inference = False
        self._unmerged = None
        # With `quantize` set, prediction swaps the linear layers for int8 ones (from the
        # unmerged weights); the originals come back the same way.
        self._unquantized = None
        # Adapter mode: the digest (and hub revision) of the base, saved with the LoRA weights.
        self.base_record: Optional[dict] = None

    @classmethod
    def load(cls, settings: BackboneSettings) -> "Backbone":
        """Load the decoder named in the settings and add LoRA (a fresh adapter)."""
        model, tokenizer = _load_base(settings)
        backbone = cls._make(apply_finetuning(model, settings), tokenizer, settings)
        if settings.save_mode == "adapter":
            backbone.base_record = base_record(settings.name)
        return backbone

    @classmethod
    def rebuild(cls, settings: BackboneSettings, config, tokenizer, state: dict, base: Optional[Path] = None) -> "Backbone":
        """A saved backbone: the architecture from `config` (or, in adapter mode, the base
        model from the directory `base`, found and checked by `base_model.verified_base`)
        and the saved weights in `state`."""
        if settings.save_mode == "full":
            weights_dtype, compute_dtype = resolve_dtypes(settings.dtype, settings.finetune)
            model = decoder_from_config(config, attn_implementation=settings.attn_implementation, dtype=weights_dtype)
            if settings.base_quantization != "none":
                model = quantized_shells(model, settings.base_quantization, compute_dtype)
        else:
            model, _ = _load_base(settings, str(base))
        model = apply_finetuning(model, settings)
        installed = install_quantized(model, state) if settings.save_mode == "full" else set()
        # the read tensors become the weights (no copy), each in the dtype it is used in
        missing, unexpected = model.load_state_dict(as_model_dtypes(model, state), strict=False, assign=True)
        missing = [k for k in missing if k not in installed]
        if settings.save_mode == "adapter":
            missing = [k for k in missing if "lora_" in k]  # the base weights came from `name`
        if unexpected or missing:
            raise ValueError(
                f"the saved backbone weights do not fit the model {settings.name!r}: "
                f"missing {list(missing)[:5]}, unexpected {list(unexpected)[:5]}"
            )
        backbone = cls._make(model, tokenizer, settings)
        backbone.merge_for_inference = settings.finetune == "lora" and not backbone.quantized_base
        return backbone

    @classmethod
    def _make(cls, model, tokenizer, settings: BackboneSettings) -> "Backbone":
        if settings.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return cls(model, tokenizer, settings, resolve_dtypes(settings.dtype, settings.finetune)[1])

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def num_layers(self) -> int:
        return self.model.config.num_hidden_layers

    def set_unmask(self, unmask: str) -> None:
        """Change which layers attend both ways (the settings and the masks together)."""
        self.unmasked = parse_unmask(unmask).layers(self.num_layers)
        self.settings.unmask = unmask

    # --- docs in, vectors out -----------------------------------------------------

    def plan(self, docs) -> PieceBatch:
        """Tokenize, align, window and pack docs for `forward`."""
        s = self.settings
        copies = s.repeat + 1  # the copies share the window's budget
        return plan_batch(
            docs,
            self.tokenizer,
            window=s.window // copies,
            stride=max(1, s.stride // copies),
            bos_id=self.bos_id,
            max_batch_pieces=s.max_batch_pieces,
            pad_id=self.pad_id,
            by_sentence=s.sentence_windows,
            context=s.sentence_context,
            repeat=s.repeat,
        )

    def forward(self, batch: PieceBatch) -> List[torch.Tensor]:
        device = self.device
        tables = []
        for ids, segments in batch.sub_batches:
            hidden = self.hidden_states(torch.from_numpy(ids).to(device), torch.from_numpy(segments).to(device))
            tables.append(hidden.reshape(-1, hidden.shape[-1]))
        if not tables:
            return [torch.zeros(n, self.hidden_size, device=device) for n in batch.lengths]
        return pool_pieces(torch.cat(tables), batch, self.settings.pooling)

    def predict(self, batch: PieceBatch) -> List[torch.Tensor]:
        quantized = self.predicts_in_int8
        self.set_merged(self.merge_for_inference and not quantized and not self.quantized_base)
        self.set_quantized(quantized)
        if self.training or self.model.training:
            # only after a training step: eval() walks every submodule (~1% of nlp.pipe)
            self.eval()
        with torch.inference_mode():
            return self(batch)

    def hidden_states(
        self, input_ids: torch.Tensor, segments: torch.Tensor
    ) -> torch.Tensor:
        """Last hidden states (batch, length, width) of the masked decoder.

        `segments` (batch, length) says which pieces form one sequence: equal
        positive ids, contiguous; 0 is padding (see `masks.build_layer_masks`).
        Each sequence gets positions from 0 and sees only itself.
        """
        dtype = self.model.get_input_embeddings().weight.dtype
        masks = build_layer_masks(
            segments,
            self.unmasked,
            self.windows,
            lookahead=self.settings.lookahead,
            additive_dtype=(self.compute_dtype or dtype) if self.additive else None,
        )
        device_type = input_ids.device.type
        delivery = MaskDelivery(masks)
        with torch.autocast(
            device_type, dtype=self.compute_dtype or dtype, enabled=self.compute_dtype is not None
        ), _training_attention(device_type):
            output = self.model(
                input_ids=input_ids,
                attention_mask=(segments > 0).long(),
                position_ids=segment_positions(segments),
                use_cache=False,
                **{MASKS_KWARG: delivery},
            )
        delivery.check()
        return output.last_hidden_state

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    # --- LoRA merge ---------------------------------------------------------------

    @property
    def merged(self) -> bool:
        return self._unmerged is not None

    def set_merged(self, merged: bool) -> None:
        """Fold LoRA into copies of the base weights (True) or put the originals back."""
        if merged == self.merged:
            return
        self.set_quantized(False)
        if merged:
            self._unmerged = merge_copies(self.model)
        else:
            restore(self._unmerged)
            self._unmerged = None

    def prepare_training(self) -> None:
        """Before a training step: the stored weights in place (not merged, not int8)."""
        if self.settings.quantize == "int8":
            raise ValueError(
                f"quantize = {self.settings.quantize!r} is for prediction only: train with quantize = "
                "\"auto\" (the default) or \"none\" and set it when loading the trained pipeline, e.g. spacy.load(path, "
                "config={\"components\": {\"ner\": {\"model\": {\"tok2vec\": {\"quantize\": \"int8\"}}}}})"
            )
        self.set_merged(False)

    @property
    def predicts_in_int8(self) -> bool:
        """quantize "int8", or "auto" where dtype "auto" found no bfloat16 on a CPU whose int8
        products are exact (`cpu.int8_products_exact`)."""
        quantize = self.settings.quantize
        no_bfloat16 = self.settings.dtype == "auto" and self.compute_dtype is None and self.device.type == "cpu"
        auto = quantize == "auto" and no_bfloat16 and cpu.int8_products_exact()
        return not self.quantized_base and (quantize == "int8" or auto)

    @property
    def quantized(self) -> bool:
        return self._unquantized is not None

    def set_quantized(self, quantized: bool) -> None:
        """Swap the decoder blocks' linear layers for int8 ones (True) or put them back."""
        if quantized == self.quantized:
            return
        if quantized:
            if self.device.type != "cpu":
                raise ValueError(
                    f"quantize = \"int8\" runs on the CPU only (torch's int8 matrix multiply); on {self.device} "
                    "use quantize = \"none\" with dtype = \"bfloat16\""
                )
            if not cpu.int8_products_exact():
                raise ValueError(
                    "quantize = \"int8\" needs int8 matrix products that are exact, and this CPU's are not "
                    "(without VNNI, oneDNN adds int8 products in saturating 16-bit sums, or it is held to such an "
                    "instruction set by ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA): use quantize = \"none\" "
                    "(or \"auto\", which predicts in int8 only where that is exact)"
                )
            self.set_merged(False)
            self._unquantized = quantize_linears(self.model)
        else:
            restore_linears(self._unquantized)
            self._unquantized = None

    def saved_state(self) -> dict:
        """The weights to save (all, or LoRA only in adapter mode), never merged or int8."""
        self.set_merged(False)
        self.set_quantized(False)
        state = self.model.state_dict()
        if self.settings.save_mode == "adapter":
            state = {k: v for k, v in state.items() if "lora_" in k}
        return {k: v.detach().contiguous().cpu() for k, v in state.items()}

    def _apply(self, fn, *args, **kwargs):
        self.set_merged(False)  # .to() / .half() must move the original weights
        self.set_quantized(False)
        return super()._apply(fn, *args, **kwargs)


def _load_base(settings: BackboneSettings, name: Optional[str] = None):
    """The base decoder `name` (default: the one named in the settings), cut to
    `num_layers`, and its tokenizer."""
    name = name or settings.name
    weights_dtype, compute_dtype = resolve_dtypes(settings.dtype, settings.finetune)
    config = load_config(name, trust_remote_code=settings.trust_remote_code, num_layers=settings.num_layers)
    model, tokenizer = load_decoder(
        name,
        config,
        attn_implementation=settings.attn_implementation,
        dtype=weights_dtype,
        trust_remote_code=settings.trust_remote_code,
    )
    if settings.base_quantization != "none":
        model = quantize_base(model, settings.base_quantization, compute_dtype)
    return model, tokenizer


def _training_attention(device_type: str):
    """On CPU, train through SDPA's math kernel: the fused CPU kernel's backward
    takes about seven times its forward with a mask (measured: 1.9 vs 2.6 s a step)."""
    if device_type == "cpu" and torch.is_grad_enabled():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(SDPBackend.MATH)
    return nullcontext()


class MaskDelivery:
    """The per-layer masks of one forward pass, and which layers took theirs: a layer
    whose hook was removed (or never ran) would silently use the model's causal mask."""

    def __init__(self, masks: list):
        self.masks = masks
        self.taken = [False] * len(masks)

    def take(self, index: int):
        self.taken[index] = True
        return self.masks[index]

    def check(self) -> None:
        missing = [i for i, taken in enumerate(self.taken) if not taken]
        if missing:
            raise RuntimeError(
                f"decoder layers {missing} did not take their per-layer attention mask (their mask "
                "hook is gone, or the model skipped them), so they would silently have used the "
                "model's own causal mask; rebuild the backbone rather than editing its hooks"
            )


def _use_layer_mask(index: int, module, args, kwargs):
    masks = kwargs.pop(MASKS_KWARG, None)
    if masks is None:
        raise RuntimeError(
            f"decoder layer {index} ({type(module).__name__}) received no per-layer attention mask: "
            f"the model's forward (transformers {transformers.__version__}) did not pass the "
            f"{MASKS_KWARG!r} keyword on to its layers, so this layer would silently use the model's "
            "own causal mask. Run the decoder through Backbone.hidden_states, and report this "
            "transformers version to spacy-unmask."
        )
    kwargs["attention_mask"] = masks.take(index)
    return args, kwargs
