"""The unmask spec grammar and the per-layer attention masks.

A spec string says which decoder layers attend in both directions; every other
layer keeps the model's own causal mask. Padding stays masked in every layer.
"""
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

SPEC_HELP = (
    "'none', 'all', 'middle', index lists and inclusive 0-based ranges such as "
    "'16-29' or '0-3,10', or 'groups:' followed by a pattern of 0s and 1s such as "
    "'groups:0011'"
)
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


@dataclass(frozen=True)
class UnmaskSpec:
    """A parsed unmask spec: which layers attend both ways, before the layer count is known.

    `kind` is "none", "all", "middle", "groups" (with `pattern`) or "layers"
    (with `ranges`, inclusive 0-based). `layers(num_layers)` resolves it.
    """

    text: str
    kind: str
    pattern: str = ""
    ranges: Tuple[Tuple[int, int], ...] = ()

    def layers(self, num_layers: int) -> List[bool]:
        """One flag per layer, input side first: True attends both ways, False stays causal."""
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers must be a positive integer, got {num_layers!r}")

        def fail(why: str) -> ValueError:
            return ValueError(
                f"Invalid unmask spec {self.text!r} for a model with {num_layers} layers: {why}. Accepted: {SPEC_HELP}."
            )

        if self.kind in ("none", "all"):
            return [self.kind == "all"] * num_layers
        if self.kind == "middle":
            # The band of Kukic et al. 2026 (28 -> 9-18, 32 -> 10-21, 36 -> 11-24),
            # symmetric about the centre; never empty on small models.
            start = min(num_layers // 4 + 2, (num_layers - 1) // 2)
            end = num_layers - 1 - start
            return [start <= i <= end for i in range(num_layers)]
        if self.kind == "groups":
            if len(self.pattern) > num_layers:
                raise fail(f"{len(self.pattern)} groups cannot split {num_layers} layers")
            flags: List[bool] = []
            for group, bit in enumerate(self.pattern):
                size = num_layers // len(self.pattern) + (1 if group < num_layers % len(self.pattern) else 0)
                flags.extend([bit == "1"] * size)
            return flags
        last = max(end for _, end in self.ranges)
        if last >= num_layers:
            raise fail(f"layer {last} is outside the model (layers 0-{num_layers - 1})")
        return [any(first <= i <= end for first, end in self.ranges) for i in range(num_layers)]


def parse_unmask(spec: str) -> UnmaskSpec:
    """Read an unmask spec; a grammar error names the spec and what is accepted."""
    if not isinstance(spec, str):
        raise ValueError(f"unmask spec must be a string ({SPEC_HELP}), got {spec!r}")
    text = spec.strip().lower()

    def fail(why: str) -> ValueError:
        return ValueError(f"Invalid unmask spec {spec!r}: {why}. Accepted: {SPEC_HELP}.")

    if text in ("none", "all", "middle"):
        return UnmaskSpec(spec, text)
    if text.startswith("groups:"):
        pattern = text[len("groups:"):]
        if not pattern or set(pattern) - {"0", "1"}:
            raise fail("a groups pattern is made of 0s and 1s only")
        return UnmaskSpec(spec, "groups", pattern=pattern)
    ranges = []
    for part in text.split(","):
        match = _RANGE.match(part.strip())
        if match is None:
            raise fail(f"cannot read {part.strip()!r}")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if first > last:
            raise fail(f"range {part.strip()!r} runs backwards")
        ranges.append((first, last))
    return UnmaskSpec(spec, "layers", ranges=tuple(ranges))


def unmasked_layers(spec: str, num_layers: int) -> List[bool]:
    """Parse an unmask spec into one flag per layer, input side first.

    True means that layer attends in both directions; False keeps it causal.
    """
    return parse_unmask(spec).layers(num_layers)


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
    lookahead: int = 0,
    additive_dtype=None,
) -> list:
    """One 4D attention mask (batch, 1, query, key) per layer.

    `segments` is (batch, length): pieces with the same positive id form one
    sequence (several short docs can share a row), 0 marks padding; a 0/1
    padding mask is the case of one sequence per row. A piece attends only to
    pieces of its own sequence and, in every layer, to every piece on its left;
    in an unmasked layer also to the pieces on its right, at most `lookahead` of
    them (0: all). A sliding layer hides keys at distance >=
    window (on both sides when unmasked). Each query may always see itself, so no
    row is empty (an empty row gives NaN in SDPA). Masks are boolean (True =
    attend) unless `additive_dtype` is given, for eager attention, which adds
    0 / dtype-min.
    """
    import torch

    length = segments.shape[1]
    device = segments.device
    pos = torch.arange(length, device=device)
    offset = pos[:, None] - pos[None, :]  # query - key; sequences are contiguous
    same = (segments[:, None, :, None] == segments[:, None, None, :]) & (segments[:, None, None, :] > 0)
    left = offset >= 0
    seen_both_ways = same
    if lookahead:
        seen_both_ways = seen_both_ways & (offset >= -lookahead)
    diagonal = torch.eye(length, dtype=torch.bool, device=device)
    cache: Dict[Tuple[bool, Optional[int]], object] = {}
    masks = []
    for both_ways, window in zip(unmasked, windows):
        key = (bool(both_ways), window)
        if key not in cache:
            mask = seen_both_ways if both_ways else same & left
            if window is not None:
                mask = mask & (offset.abs() < window)
            mask = mask | diagonal
            if additive_dtype is not None:
                zeros = torch.zeros((), dtype=additive_dtype, device=device)
                mask = torch.where(mask, zeros, torch.finfo(additive_dtype).min)
            cache[key] = mask
        masks.append(cache[key])
    return masks
