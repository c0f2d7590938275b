"""From spaCy docs to padded piece batches, and back to one row per spaCy token.

Docs are tokenized as running text (so the decoder sees text as it was trained
on it), pieces are aligned to spaCy tokens by character offsets, long docs are
cut into overlapping windows, and windows are packed several to a row, each
its own sequence, so that almost no compute goes to padding. All of it is numpy;
nothing here loops over tokens in Python.
"""
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import numpy as np
from spacy.attrs import IDX, LENGTH
from spacy.tokens import Doc



@dataclass
class PieceBatch:
    """The decoder inputs for a list of docs, and where each token's pieces land.

    `sub_batches` holds (ids, segments) int64 arrays of shape (rows, length):
    each row packs one or more windows, told apart by `segments` (see
    `masks.build_layer_masks`; 0 is padding). Rows of all sub-batches,
    flattened and concatenated, form one table
    of piece positions; `token_first[d]` / `token_last[d]` give, for each token
    of doc d, the table rows of its first and last piece (-1: no piece).
    `pairs_token` / `pairs_row` list every (token, piece row) pair, for mean pooling.
    """

    sub_batches: List[tuple] = field(default_factory=list)
    token_first: List[np.ndarray] = field(default_factory=list)
    token_last: List[np.ndarray] = field(default_factory=list)
    pairs_token: Optional[np.ndarray] = None
    pairs_row: Optional[np.ndarray] = None

    @property
    def lengths(self) -> List[int]:
        return [len(first) for first in self.token_first]


def token_spans(doc: Doc):
    """(start, end) character offsets of each token, as int64 arrays.

    Read from the Doc's arrays: making a Token object per token to ask it took 6% of
    `nlp.pipe`."""
    starts, lengths = doc.to_array([IDX, LENGTH]).astype(np.int64).reshape(-1, 2).T
    return starts, starts + lengths


def align_pieces(token_starts, token_ends, piece_starts, piece_ends):
    """First and last piece overlapping each token's characters; -1 where none does."""
    real = np.flatnonzero(piece_ends > piece_starts)  # an empty span covers no character
    if len(real) == 0:
        none = np.full(len(token_starts), -1, dtype=np.int64)
        return none, none.copy()
    starts = piece_starts[real]
    ends = np.maximum.accumulate(piece_ends[real])
    first = np.searchsorted(ends, token_starts, side="right")  # first piece ending after the token starts
    last = np.searchsorted(starts, token_ends, side="left") - 1  # last piece starting before it ends
    valid = first <= last
    first_out = np.where(valid, real[np.minimum(first, len(real) - 1)], -1)
    last_out = np.where(valid, real[np.maximum(last, 0)], -1)
    return first_out.astype(np.int64), last_out.astype(np.int64)


def window_starts(num_pieces: int, window: int, stride: int) -> np.ndarray:
    """Start offsets of overlapping windows that together cover every piece."""
    if num_pieces <= window:
        return np.zeros(1, dtype=np.int64)
    starts = list(range(0, num_pieces - window + 1, stride))
    if starts[-1] + window < num_pieces:
        starts.append(num_pieces - window)
    return np.asarray(starts, dtype=np.int64)


def assign_windows(num_pieces: int, starts: np.ndarray, window: int) -> np.ndarray:
    """For each piece, the window in which it sits furthest from either edge.

    Ties go to the earlier window. A piece's margin in the window starting at s,
    min(p - s, s + window - 1 - p), rises with s up to s = p - (window - 1) / 2 and
    falls after it, and `starts` is sorted, so the best window is one of the two
    starts on either side of that peak: O(pieces * log(windows)) time and O(pieces)
    memory (a pieces x windows table took gigabytes on a 20,000-token doc).
    """
    starts = np.asarray(starts, dtype=np.int64)
    pieces = np.arange(num_pieces, dtype=np.int64)
    if num_pieces == 0 or len(starts) <= 1:
        return np.zeros(num_pieces, dtype=np.int64)
    # In doubled coordinates, to stay in integers: the peak is a half-integer for even windows.
    after = np.searchsorted(2 * starts, 2 * pieces - (window - 1), side="left")
    before = np.maximum(after - 1, 0)
    after = np.minimum(after, len(starts) - 1)

    def margin(w):
        s = starts[w]
        return np.minimum(pieces - s, s + window - 1 - pieces)

    return np.where(margin(before) >= margin(after), before, after).astype(np.int64)


def pack_windows(
    batch: PieceBatch,
    windows: List[np.ndarray],
    bos_id,
    pad_id: int,
    max_batch_pieces: int,
    repeat: int = 0,
) -> np.ndarray:
    """Pack windows into rows as long as the longest window; fill `batch.sub_batches`.

    Longest first, each window goes into the first row with room (first-fit
    decreasing), so a row holds several short docs and almost nothing is
    padding. Each window is its own sequence in the row (its own segment id,
    positions from 0, BOS first where the model uses one). With `repeat` = k the
    sequence is the window (BOS included) k + 1 times in a row, positions counting
    on, and the vectors are read from the last copy. A sub-batch holds at
    most `max_batch_pieces` pieces (at least one row).
    Returns, for each window, the table row of its first content piece (in the last copy).
    """
    extra = 0 if bos_id is None else 1
    copy_lengths = np.array([len(w) + extra for w in windows], dtype=np.int64)
    lengths = copy_lengths * (repeat + 1)
    window_row = np.zeros(len(windows), dtype=np.int64)
    if not len(windows):
        return window_row
    capacity = int(lengths.max())
    row_of = np.zeros(len(windows), dtype=np.int64)
    col_of = np.zeros(len(windows), dtype=np.int64)
    used = np.zeros(len(windows), dtype=np.int64)  # at most one row per window
    num_rows = 0
    for w in np.argsort(-lengths, kind="stable"):
        fits = np.flatnonzero(used[:num_rows] + lengths[w] <= capacity)
        row = int(fits[0]) if len(fits) else num_rows
        num_rows = max(num_rows, row + 1)
        row_of[w], col_of[w] = row, used[row]
        used[row] += lengths[w]
    rows_per_batch = max(1, max_batch_pieces // capacity)
    by_row = np.lexsort((col_of, row_of))
    members = np.split(by_row, np.cumsum(np.bincount(row_of, minlength=num_rows))[:-1])
    offset = 0
    for first in range(0, num_rows, rows_per_batch):
        rows = range(first, min(first + rows_per_batch, num_rows))
        length = int(used[first : rows.stop].max())
        ids = np.full((len(rows), length), pad_id, dtype=np.int64)
        segments = np.zeros((len(rows), length), dtype=np.int64)
        for r, row in enumerate(rows):
            for segment, w in enumerate(members[row], start=1):
                col, step = col_of[w], copy_lengths[w]
                for copy_start in range(col, col + lengths[w], max(step, 1)):
                    if extra:
                        ids[r, copy_start] = bos_id
                    ids[r, copy_start + extra : copy_start + step] = windows[w]
                segments[r, col : col + lengths[w]] = segment
                window_row[w] = offset + r * length + col + lengths[w] - step + extra
        batch.sub_batches.append((ids, segments))
        offset += len(rows) * length
    return window_row


def sentence_texts(doc: Doc) -> List[tuple]:
    """(start character, text) of each sentence; the whole text where the Doc has no sentence boundaries."""
    if not doc.has_annotation("SENT_START") or len(doc) == 0:
        return [(0, doc.text)]
    return [(sent.start_char, sent.text) for sent in doc.sents]


def sentence_windows(sentence: np.ndarray, window: int, stride: int, context: int):
    """Windows of whole sentences: (starts, ends, owner) over a doc's pieces.

    Each sentence gets a window of its own, with up to `context` pieces of the text
    on each side (fewer where the window would pass `window` pieces); its pieces
    take their vectors from it. A sentence longer than `window` is cut into
    windows every `stride` pieces, as any long text is.
    """
    n = len(sentence)
    cuts = np.flatnonzero(np.diff(sentence)) + 1
    starts: List[int] = []
    ends: List[int] = []
    owner = np.zeros(n, dtype=np.int64)
    for a, b in zip(np.r_[0, cuts], np.r_[cuts, n]):
        length = int(b - a)
        if length > window:
            sub = window_starts(length, window, stride)
            owner[a:b] = len(starts) + assign_windows(length, sub, window)
            starts.extend(int(a + s) for s in sub)
            ends.extend(int(min(a + s + window, b)) for s in sub)
        else:
            reach = min(context, (window - length) // 2)
            owner[a:b] = len(starts)
            starts.append(int(max(0, a - reach)))
            ends.append(int(min(n, b + reach)))
    return np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64), owner


def plan_batch(
    docs: Sequence[Doc],
    tokenizer,
    *,
    window: int,
    stride: int,
    bos_id: Optional[int],
    max_batch_pieces: int,
    pad_id: int = 0,
    by_sentence: bool = False,
    context: int = 0,
    repeat: int = 0,
) -> PieceBatch:
    """Tokenize, align, window and pack `docs` for one pass of the decoder.

    With `by_sentence`, a Doc with sentence boundaries is read a sentence per
    window, with `context` pieces on each side (`sentence_windows`); other Docs
    are cut every `stride` pieces into windows of `window`. Each window is read
    `repeat` + 1 times in a row (see `pack_windows`).
    """
    # Read by sentence, a Doc's sentences are tokenized one by one, as each would be
    # alone (a sentence-initial word gets no leading-space piece it never had in
    # training); the whitespace between them is not read.
    pieces_of = [sentence_texts(doc) if by_sentence else [(0, doc.text)] for doc in docs]
    encoded = tokenizer(
        [text for parts in pieces_of for _, text in parts],
        add_special_tokens=False,
        return_offsets_mapping=True,
        return_attention_mask=False,
    )
    windows = []  # the pieces of each window
    doc_piece_window: List[tuple] = []
    text_index = 0
    for doc, parts in zip(docs, pieces_of):
        ids, offsets, part_of = [], [], []
        for number, (start_char, _) in enumerate(parts):
            ids.append(np.asarray(encoded["input_ids"][text_index], dtype=np.int64))
            offsets.append(np.asarray(encoded["offset_mapping"][text_index], dtype=np.int64).reshape(-1, 2) + start_char)
            part_of.append(np.full(len(ids[-1]), number, dtype=np.int64))
            text_index += 1
        ids, offsets, part_of = np.concatenate(ids), np.concatenate(offsets), np.concatenate(part_of)
        first, last = align_pieces(*token_spans(doc), offsets[:, 0], offsets[:, 1])
        if len(parts) > 1:
            starts, ends, owner = sentence_windows(part_of, window, stride, context)
        elif len(ids):
            starts = window_starts(len(ids), window, stride)
            ends = np.minimum(starts + window, len(ids))
            owner = assign_windows(len(ids), starts, window)
        else:
            starts = ends = owner = np.zeros(0, dtype=np.int64)
        first_window = len(windows)
        for start, end in zip(starts, ends):
            windows.append(ids[start:end])
        doc_piece_window.append((first_window, starts, owner, first, last))

    batch = PieceBatch()
    window_row = pack_windows(batch, windows, bos_id, pad_id, max_batch_pieces, repeat)
    pairs_token, pairs_row = [], []
    token_offset = 0
    for doc, (first_window, starts, owner, first, last) in zip(docs, doc_piece_window):
        piece_rows = window_row[first_window + owner] + (np.arange(len(owner)) - starts[owner])
        has = first >= 0
        batch.token_first.append(np.where(has, piece_rows[np.maximum(first, 0)] if len(piece_rows) else -1, -1))
        batch.token_last.append(np.where(has, piece_rows[np.maximum(last, 0)] if len(piece_rows) else -1, -1))
        spans = (last - first + 1) * has
        tokens = np.repeat(np.arange(len(doc)), spans)
        piece_index = np.repeat(first, spans) + (np.arange(spans.sum()) - np.repeat(np.cumsum(spans) - spans, spans))
        pairs_token.append(tokens + token_offset)
        pairs_row.append(piece_rows[piece_index] if len(piece_index) else np.zeros(0, dtype=np.int64))
        token_offset += len(doc)
    batch.pairs_token = np.concatenate(pairs_token) if pairs_token else np.zeros(0, dtype=np.int64)
    batch.pairs_row = np.concatenate(pairs_row) if pairs_row else np.zeros(0, dtype=np.int64)
    return batch
