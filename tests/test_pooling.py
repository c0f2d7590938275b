"""Pooling piece vectors to token vectors (`pooling.py`), against a computation by hand."""
import numpy as np
import pytest
import torch

from spacy_unmask.pooling import pool_pieces
from spacy_unmask.windows import PieceBatch

# Six piece rows. Doc 0: token 0 has rows 0-1, token 1 has no piece (say, a zero-width
# space the tokenizer drops), token 2 has row 2. Doc 1 has no tokens. Doc 2: token 0 has
# row 3, token 1 has rows 4-5. Tokens are numbered across docs for mean pooling.
TABLE = torch.tensor(
    [[1.0, 2.0], [3.0, 6.0], [5.0, -1.0], [7.0, 0.5], [-2.0, 4.0], [0.0, 8.0]], requires_grad=True
)
BATCH = PieceBatch(
    token_first=[np.array([0, -1, 2]), np.zeros(0, dtype=np.int64), np.array([3, 4])],
    token_last=[np.array([1, -1, 2]), np.zeros(0, dtype=np.int64), np.array([3, 5])],
    pairs_token=np.array([0, 0, 2, 3, 4, 4]),
    pairs_row=np.array([0, 1, 2, 3, 4, 5]),
)
EXPECTED = {
    "first": [[[1, 2], [0, 0], [5, -1]], [], [[7, 0.5], [-2, 4]]],
    "last": [[[3, 6], [0, 0], [5, -1]], [], [[7, 0.5], [0, 8]]],
    "mean": [[[2, 4], [0, 0], [5, -1]], [], [[7, 0.5], [-1, 6]]],
}


@pytest.mark.parametrize("pooling", ["first", "last", "mean"])
def test_pooling_by_hand(pooling):
    pooled = pool_pieces(TABLE, BATCH, pooling)
    assert [tuple(t.shape) for t in pooled] == [(3, 2), (0, 2), (2, 2)]
    for got, expected in zip(pooled, EXPECTED[pooling]):
        np.testing.assert_array_equal(got.detach().numpy(), np.array(expected, dtype=np.float32).reshape(-1, 2))


@pytest.mark.parametrize("pooling", ["first", "last", "mean"])
def test_the_gradient_reaches_exactly_the_pooled_pieces(pooling):
    """Training moves a piece's vector by what its token's vector is asked to do: first and
    last pass the whole gradient to one piece, mean shares it out; a token without pieces
    passes nothing anywhere."""
    TABLE.grad = None
    pooled = pool_pieces(TABLE, BATCH, pooling)
    torch.cat(pooled).sum().backward()
    per_row = TABLE.grad[:, 0].tolist()
    expected = {
        "first": [1, 0, 1, 1, 1, 0],
        "last": [0, 1, 1, 1, 0, 1],
        "mean": [0.5, 0.5, 1, 1, 0.5, 0.5],
    }[pooling]
    assert per_row == expected
