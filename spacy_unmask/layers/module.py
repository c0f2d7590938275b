"""The torch side of DecoderTok2Vec: windows in, one tensor per doc out."""
import os
from typing import List, Optional, Tuple

import torch
from torch import nn

from ..backbone import UnmaskedDecoder
from .pooling import pool_pieces
from .windows import PieceBatch, plan_batch


def _one_thread_in_forked_child() -> None:
    # A child forked after torch's OpenMP pool has started (nlp.pipe(n_process=2))
    # hangs in its first parallel op with GNU OpenMP; with one thread it never enters
    # the pool. The workers share the cores anyway. (torch's DataLoader does the same.)
    torch.set_num_threads(1)


os.register_at_fork(after_in_child=_one_thread_in_forked_child)


def bf16_supported() -> bool:
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def resolve_dtypes(dtype: str, finetune: str) -> Tuple[torch.dtype, Optional[torch.dtype]]:
    """(dtype of the stored weights, autocast dtype or None) for a `dtype` setting."""
    if dtype == "auto":
        dtype = "bfloat16" if bf16_supported() else "float32"
    compute = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    # Trainable weights must stay float32: the optimizer works on numpy copies.
    weights = torch.float32 if compute is None or finetune == "full" else compute
    return weights, compute


class DecoderTok2VecModule(nn.Module):
    def __init__(self, base, tokenizer, settings, compute_dtype: Optional[torch.dtype]):
        super().__init__()
        self.decoder = UnmaskedDecoder(base, settings.unmask, autocast_dtype=compute_dtype)
        self.tokenizer = tokenizer
        self.settings = settings
        # Decoders trained with a BOS piece (Llama, Gemma) expect it at the start of each window.
        probe = tokenizer("a", add_special_tokens=True)["input_ids"]
        self.bos_id = probe[0] if tokenizer.bos_token_id is not None and probe[0] == tokenizer.bos_token_id else None
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        # Loaded pipelines fold LoRA into the base weights for prediction (one matmul per
        # projection instead of three); any training step unfolds them first.
        self.merge_for_inference = False
        self.merged = False

    def set_merged(self, merged: bool) -> None:
        if merged == self.merged:
            return
        from peft.tuners.lora import LoraLayer

        for layer in self.decoder.model.modules():
            if isinstance(layer, LoraLayer):
                layer.merge() if merged else layer.unmerge()
        self.merged = merged

    def predict(self, batch: PieceBatch) -> List[torch.Tensor]:
        self.set_merged(self.merge_for_inference)
        self.eval()
        with torch.inference_mode():
            return self(batch)

    @property
    def hidden_size(self) -> int:
        return self.decoder.hidden_size

    def plan(self, docs) -> PieceBatch:
        s = self.settings
        return plan_batch(
            docs,
            self.tokenizer,
            window=s.window,
            stride=s.stride,
            bos_id=self.bos_id,
            max_batch_pieces=s.max_batch_pieces,
            pad_id=self.pad_id,
        )

    def forward(self, batch: PieceBatch) -> List[torch.Tensor]:
        device = next(self.parameters()).device
        tables = []
        for ids, segments in batch.sub_batches:
            hidden = self.decoder(torch.from_numpy(ids).to(device), torch.from_numpy(segments).to(device))
            tables.append(hidden.reshape(-1, hidden.shape[-1]))
        if not tables:
            width = self.hidden_size
            return [torch.zeros(n, width, device=device) for n in batch.lengths]
        return pool_pieces(torch.cat(tables), batch, self.settings.pooling)
