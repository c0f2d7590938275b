"""Pool the decoder's piece vectors to one vector per spaCy token (torch, vectorised)."""
from typing import List

import numpy as np
import torch

from .windows import PieceBatch

def pool_pieces(table: torch.Tensor, batch: PieceBatch, pooling: str) -> List[torch.Tensor]:
    """Split the piece table (rows, width) into per-doc (tokens, width) tensors.

    A token without pieces (e.g. whitespace the tokenizer drops) gets zeros.
    """
    lengths = batch.lengths
    width = table.shape[1]
    if pooling == "mean":
        total = sum(lengths)
        tokens = torch.from_numpy(batch.pairs_token).to(table.device)
        rows = torch.from_numpy(batch.pairs_row).to(table.device)
        summed = table.new_zeros(total, width).index_add(0, tokens, table[rows])
        counts = torch.bincount(tokens, minlength=total).clamp(min=1).to(table.dtype)
        pooled = summed / counts[:, None]
    else:
        chosen = batch.token_first if pooling == "first" else batch.token_last
        rows = np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64)
        # Row -1 points at an appended zero row.
        padded = torch.cat([table, table.new_zeros(1, width)])
        pooled = padded[torch.from_numpy(rows).to(table.device)]
    return list(torch.split(pooled, lengths))
