"""The unmask spec grammar and the per-layer attention masks.

A spec string says which decoder layers attend in both directions; every other
layer keeps the model's own causal mask. Padding stays masked in every layer.
"""
import re
from typing import Dict, List, Optional, Sequence, Tuple

SPEC_HELP = (
    "'none', 'all', 'middle', index lists and inclusive 0-based ranges such as "
    "'16-29' or '0-3,10', or 'groups:' followed by a pattern of 0s and 1s such as "
    "'groups:0011'"
)
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def check_unmask_spec(spec: str) -> None:
    """Check the grammar of an unmask spec before any model is loaded."""
    _parse(spec, None)


def unmasked_layers(spec: str, num_layers: int) -> List[bool]:
    """Parse an unmask spec into one flag per layer, input side first.

    True means that layer attends in both directions; False keeps it causal.
    """
    if not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers must be a positive integer, got {num_layers!r}")
    return _parse(spec, num_layers)


def _parse(spec: str, num_layers: Optional[int]) -> List[bool]:
    """The flags for `num_layers` layers; with None, only the grammar is checked."""
    if not isinstance(spec, str):
        raise ValueError(f"unmask spec must be a string ({SPEC_HELP}), got {spec!r}")
    text = spec.strip().lower()
    model = f" for a model with {num_layers} layers" if num_layers is not None else ""

    def fail(why: str) -> ValueError:
        return ValueError(f"Invalid unmask spec {spec!r}{model}: {why}. Accepted: {SPEC_HELP}.")

    grammar_only = num_layers is None
    num_layers = num_layers or 10**6

    if text == "none":
        return [False] * num_layers
    if text == "all":
        return [True] * num_layers
    if text == "middle":
        # The band of Kukic et al. 2026 (28 -> 9-18, 32 -> 10-21, 36 -> 11-24),
        # symmetric about the centre; never empty on small models.
        start = min(num_layers // 4 + 2, (num_layers - 1) // 2)
        end = num_layers - 1 - start
        return [start <= i <= end for i in range(num_layers)]
    if text.startswith("groups:"):
        pattern = text[len("groups:"):]
        if not pattern or set(pattern) - {"0", "1"}:
            raise fail("a groups pattern is made of 0s and 1s only")
        if grammar_only:
            return []
        if len(pattern) > num_layers:
            raise fail(f"{len(pattern)} groups cannot split {num_layers} layers")
        flags: List[bool] = []
        for group, bit in enumerate(pattern):
            size = num_layers // len(pattern) + (1 if group < num_layers % len(pattern) else 0)
            flags.extend([bit == "1"] * size)
        return flags
    flags = [False] * (0 if grammar_only else num_layers)
    for part in text.split(","):
        match = _RANGE.match(part.strip())
        if match is None:
            raise fail(f"cannot read {part.strip()!r}")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if first > last:
            raise fail(f"range {part.strip()!r} runs backwards")
        if last >= num_layers and not grammar_only:
            raise fail(f"layer {last} is outside the model (layers 0-{num_layers - 1})")
        for i in range(first, min(last + 1, len(flags))):
            flags[i] = True
    return flags


def layer_windows(config) -> List[Optional[int]]:
    """The sliding-window size of each layer, None where the layer attends globally.

    Follows the model's own rules: `layer_types` where the config has them
    (Gemma 2/3, Qwen2/3), otherwise one `sliding_window` for every layer
    (Mistral, Phi-3), honouring Qwen2's `use_sliding_window` switch.
    """
    num_layers = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return [window if kind == "sliding_attention" else None for kind in layer_types]
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return [None] * num_layers
    return [window] * num_layers


def segment_positions(segments):
    """Position of each piece within its own sequence: 0 where a segment starts.

    `segments` is (batch, length); equal positive ids that are adjacent form one
    sequence, 0 is padding. A 0/1 padding mask is a valid `segments` tensor.
    """
    import torch

    length = segments.shape[1]
    index = torch.arange(length, device=segments.device).expand_as(segments)
    starts = torch.ones_like(segments, dtype=torch.bool)
    starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
    return index - torch.where(starts, index, 0).cummax(dim=1).values


def build_layer_masks(
    segments,
    unmasked: Sequence[bool],
    windows: Sequence[Optional[int]],
    *,
    additive_dtype=None,
) -> list:
    """One 4D attention mask (batch, 1, query, key) per layer.

    `segments` is (batch, length): pieces with the same positive id form one
    sequence (several short docs can share a row), 0 marks padding; a 0/1
    padding mask is the case of one sequence per row. A piece attends only to
    pieces of its own sequence; a causal layer also hides keys to the right; a
    sliding layer hides keys at distance >= window (on both sides when
    unmasked). Each query may always see itself, so no row is empty (an empty
    row gives NaN in SDPA). Masks are boolean (True = attend) unless
    `additive_dtype` is given, for eager attention, which adds 0 / dtype-min.
    """
    import torch

    length = segments.shape[1]
    device = segments.device
    pos = torch.arange(length, device=device)
    offset = pos[:, None] - pos[None, :]  # query - key; sequences are contiguous
    same = (segments[:, None, :, None] == segments[:, None, None, :]) & (segments[:, None, None, :] > 0)
    diagonal = torch.eye(length, dtype=torch.bool, device=device)
    cache: Dict[Tuple[bool, Optional[int]], object] = {}
    masks = []
    for both_ways, window in zip(unmasked, windows):
        key = (bool(both_ways), window)
        if key not in cache:
            allowed = torch.ones(length, length, dtype=torch.bool, device=device)
            if not both_ways:
                allowed &= offset >= 0
            if window is not None:
                allowed &= offset.abs() < window
            mask = (allowed[None, None] & same) | diagonal
            if additive_dtype is not None:
                zeros = torch.zeros((), dtype=additive_dtype, device=device)
                mask = torch.where(mask, zeros, torch.finfo(additive_dtype).min)
            cache[key] = mask
        masks.append(cache[key])
    return masks
