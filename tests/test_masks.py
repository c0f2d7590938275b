import pytest
import torch

from spacy_unmask import unmasked_layers
from spacy_unmask.masks import build_layer_masks, layer_windows, parse_unmask, segment_positions
from tiny_models import tiny_config


def layers_of(flags):
    return [i for i, flag in enumerate(flags) if flag]


def test_none_and_all():
    assert unmasked_layers("none", 4) == [False] * 4
    assert unmasked_layers("all", 4) == [True] * 4
    assert unmasked_layers(" ALL ", 3) == [True] * 3


def test_index_lists_and_ranges():
    assert layers_of(unmasked_layers("16-29", 30)) == list(range(16, 30))
    assert layers_of(unmasked_layers("0-3,10", 12)) == [0, 1, 2, 3, 10]
    assert layers_of(unmasked_layers("5", 6)) == [5]


@pytest.mark.parametrize(
    "pattern,num_layers,expected",
    [
        ("0011", 32, list(range(16, 32))),
        ("1000", 32, list(range(0, 8))),
        ("0001", 30, list(range(23, 30))),  # SmolLM2: groups of 8, 8, 7, 7
        ("1000", 30, list(range(0, 8))),
        ("0100", 30, list(range(8, 16))),
        ("0010", 30, list(range(16, 23))),
        ("01", 5, [3, 4]),
    ],
)
def test_groups(pattern, num_layers, expected):
    assert layers_of(unmasked_layers(f"groups:{pattern}", num_layers)) == expected


def test_all_sixteen_group_patterns_partition_the_layers():
    for bits in range(16):
        pattern = format(bits, "04b")
        flags = unmasked_layers(f"groups:{pattern}", 32)
        for group, bit in enumerate(pattern):
            assert flags[group * 8 : group * 8 + 8] == [bit == "1"] * 8


@pytest.mark.parametrize("num_layers,first,last", [(28, 9, 18), (32, 10, 21), (36, 11, 24)])
def test_middle_band_matches_kukic_et_al(num_layers, first, last):
    assert layers_of(unmasked_layers("middle", num_layers)) == list(range(first, last + 1))


def test_middle_is_never_empty_on_small_models():
    for n in range(1, 10):
        assert any(unmasked_layers("middle", n))


@pytest.mark.parametrize(
    "spec,num_layers,fragment",
    [
        ("bidirectional", 4, "cannot read"),
        ("30", 30, "outside the model"),
        ("16-31", 30, "outside the model"),
        ("5-2", 8, "runs backwards"),
        ("groups:0012", 8, "0s and 1s"),
        ("groups:", 8, "0s and 1s"),
        ("groups:00000", 4, "cannot split"),
        ("1,,2", 4, "cannot read"),
        ("-1", 4, "cannot read"),
    ],
)
def test_bad_specs_name_the_spec_and_layer_count(spec, num_layers, fragment):
    with pytest.raises(ValueError) as err:
        unmasked_layers(spec, num_layers)
    message = str(err.value)
    assert repr(spec) in message and fragment in message
    assert "groups:0011" in message  # says what is accepted
    # a grammar error is found before any model is loaded, and invents no layer count
    grammar_error = fragment in ("cannot read", "runs backwards", "0s and 1s")
    assert ("layers" not in message.split("Accepted")[0]) == grammar_error
    if grammar_error:
        with pytest.raises(ValueError, match=fragment):
            parse_unmask(spec)
    else:
        assert f"{num_layers} layers" in message
        parse_unmask(spec)  # the grammar is fine; only this model is too small


def test_non_string_spec():
    with pytest.raises(ValueError, match="must be a string"):
        unmasked_layers(3, 4)


def test_layer_windows_follow_the_config():
    assert layer_windows(tiny_config("llama")) == [None] * 4
    assert layer_windows(tiny_config("mistral")) == [4] * 4
    assert layer_windows(tiny_config("mistral", sliding=False)) == [None] * 4
    gemma3 = layer_windows(tiny_config("gemma3_text"))
    assert gemma3.count(None) >= 1 and 4 in gemma3


def test_masks_keep_padding_masked_in_every_layer():
    padding = torch.tensor([[1, 1, 1, 0, 0]])
    causal, both = build_layer_masks(padding, [False, True], [None, None])
    for mask in (causal, both):
        # no real query attends to a padding key
        assert not mask[0, 0, :3, 3:].any()
    assert both[0, 0, 0, :3].all()  # the first token sees its right context
    assert not causal[0, 0, 0, 1:].any()


def test_unmasked_sliding_window_is_two_sided():
    padding = torch.ones(1, 8, dtype=torch.long)
    (mask,) = build_layer_masks(padding, [True], [3])
    row = mask[0, 0, 4].tolist()
    assert row == [False, False, True, True, True, True, True, False]


def test_additive_masks_for_eager_attention():
    padding = torch.tensor([[1, 1, 0]])
    (mask,) = build_layer_masks(padding, [True], [None], additive_dtype=torch.float32)
    assert mask.dtype == torch.float32
    assert mask[0, 0, 0, 1] == 0 and mask[0, 0, 0, 2] == torch.finfo(torch.float32).min


def test_packed_sequences_never_see_each_other():
    segments = torch.tensor([[1, 1, 1, 2, 2, 0]])
    for unmask in (False, True):
        (mask,) = build_layer_masks(segments, [unmask], [None])
        assert not mask[0, 0, :3, 3:].any() and not mask[0, 0, 3:5, :3].any()
        assert not mask[0, 0, 3:5, 5].any()  # padding stays hidden
    (both,) = build_layer_masks(segments, [True], [None])
    assert both[0, 0, 3, 3:5].all()  # within a sequence, both directions
    assert segment_positions(segments).tolist() == [[0, 1, 2, 0, 1, 0]]


def test_lookahead_limits_the_right_context_of_unmasked_layers_only():
    segments = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])
    causal, capped = build_layer_masks(segments, [False, True], [None, None], lookahead=2)
    assert capped[0, 0, 1].tolist() == [True, True, True, True, False, False, False]  # 2 to the right
    assert capped[0, 0, 5].tolist() == [True, True, True, True, True, True, False]  # the whole left
    assert causal[0, 0, 1].tolist() == [True, True, False, False, False, False, False]
    (windowed,) = build_layer_masks(segments, [True], [3], lookahead=1)  # and a sliding window
    assert windowed[0, 0, 3].tolist() == [False, True, True, True, True, False, False]
