"""A plugin variant without an ``element_fraction`` of its own gets its kept fraction from its mask. Above
N = 4096 the fallback used the visited-tile fraction at ``spec.block_size`` tiles -- the ``block_size`` field of
``AttentionSpec`` that such a kind does not read (default 64) -- so a chunked-local plugin (chunks of 8) jumped from
0.0011 at N = 4096 to 0.0154 at N = 4097 (14x the FLOPs in ``spec_cost`` and the sweep's columns)."""

from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch

from attn_zoo import AttentionSpec, make_spec
from attn_zoo.cost_model import mask_fractions, spec_cost
from attn_zoo.variants import element_fraction, register_variant, unregister_variant


@dataclass(frozen=True)
class _ChunkSpec(AttentionSpec):
    chunk: int = 8


@contextmanager
def registered(kind, mask, **kw):
    """``kind`` registered as a softmax plugin with ``mask`` (chunk specs unless ``kw`` says otherwise) while the
    block runs."""
    kw = {"spec_class": _ChunkSpec, "fields": ("chunk",), "subquadratic": True, **kw}
    register_variant(kind, "softmax", mask=mask, **kw)
    try:
        yield kind
    finally:
        unregister_variant(kind)


def _mask(spec, Nq, Nk):
    nb = max(-(-Nk // spec.chunk), 1)
    return {"layout": torch.eye(nb, dtype=torch.bool), "block_size": spec.chunk}


@pytest.fixture
def chunk_kind():
    with registered("chunk_cost_probe", _mask) as kind:
        yield kind


@pytest.mark.parametrize("causal", [True, False])
def test_a_layout_plugin_keeps_its_exact_fraction_above_4096(chunk_kind, causal):
    spec = make_spec(chunk_kind, chunk=8, causal=causal)
    N = 4097
    exact = mask_fractions(spec, N, 64, 64)["element_fraction"]  # the element rule, counted
    assert element_fraction(spec, N) == pytest.approx(exact, rel=1e-9)
    assert element_fraction(spec, 4096) == pytest.approx(element_fraction(spec, N), rel=0.01)  # no jump at 4096


def _band_mask(spec, Nq, Nk):  # a symmetric block band (the block before, its own, the block after)
    nb = max(-(-Nk // spec.chunk), 1)
    i = torch.arange(nb)
    return {"layout": (i[:, None] - i[None, :]).abs() <= 1, "block_size": spec.chunk}


@pytest.mark.parametrize("causal", [True, False])
def test_a_layout_with_blocks_above_the_diagonal_is_counted_exactly(causal):
    """A layout with blocks above the diagonal under ``causal=True``: the causal rule removes those blocks whole
    (they were counted as kept)."""
    with registered("band_cost_probe", _band_mask):
        spec = make_spec("band_cost_probe", chunk=8, causal=causal)
        N = 4097
        assert element_fraction(spec, N) == pytest.approx(mask_fractions(spec, N, 64, 64)["element_fraction"],
                                                          rel=1e-9)


def test_the_cost_model_does_not_jump_at_4096(chunk_kind):
    spec = make_spec(chunk_kind, chunk=8)
    a, b = (spec_cost(spec, 1, 8, N, 64, mode="fwd").flops for N in (4096, 4097))
    assert b == pytest.approx(a, rel=0.01)


def test_sparse_keeps_its_own_formula():
    spec = make_spec("sparse", block_size=16)
    N = 4097
    assert element_fraction(spec, N) == pytest.approx(mask_fractions(spec, N, 64, 64)["element_fraction"], rel=1e-9)


def _band_right0_mask(spec, Nq, Nk):  # the band layout and no key to the right of the query, without causal=True
    return dict(_band_mask(spec, Nq, Nk), window_right=0)


def test_a_layout_with_a_right_window_edge_is_not_counted_as_the_layout_alone():
    """``window_right=0`` on a non-causal spec keeps the lower half of each block: counted as the whole layout
    (the fast path took any ``window_right`` of 0 as the causal clip)."""
    with registered("band_right0_probe", _band_right0_mask), registered("band_cost_probe_free", _band_mask):
        spec = make_spec("band_right0_probe", chunk=8, causal=False)
        N = 4097
        exact = mask_fractions(spec, N, 64, 64)["element_fraction"]
        layout_alone = mask_fractions(make_spec("band_cost_probe_free", chunk=8, causal=False), N, 64, 64)
        assert element_fraction(spec, N) == pytest.approx(exact, rel=1e-9)  # not the layout alone (~2x)
        assert 1.5 * exact < layout_alone["element_fraction"]


@pytest.mark.parametrize("terms", [
    {"window_right": 0},                      # causal by its window, on a spec that says causal=False
    {"window_left": 10},                      # a layout with a window
    {"dilation": 3},                          # a layout with a dilation
    {"window_left": 50, "dilation": 3, "window_right": 7},
])
@pytest.mark.parametrize("causal", [True, False])
def test_a_layout_with_other_terms_is_counted_exactly(terms, causal):
    """Above N = 4096 a layout with a window / dilation got the visited-tile fraction at its block size (up to 18x
    the kept elements, a jump in spec_cost at 4097), and a non-causal spec whose mask says window_right=0 was counted
    without the causal triangle (2x)."""
    with registered("band_terms_probe", lambda s, Nq, Nk: {**_band_mask(s, Nq, Nk), **terms}):
        spec = make_spec("band_terms_probe", chunk=100, causal=causal)
        for N in (4097, 5000):
            exact = mask_fractions(spec, N, 64, 64)["element_fraction"]
            assert element_fraction(spec, N) == pytest.approx(exact, rel=1e-9)


@pytest.mark.parametrize("causal", [True, False])
def test_a_layout_smaller_than_the_blocks_reads_its_last_block(causal):
    """A layout of fixed size (fewer blocks than N / block_size): the element rule clamps block indices to its last
    row / column; element_fraction raised a RuntimeError (shape mismatch) above N = 4096."""
    def small(s, Nq, Nk):
        i = torch.arange(16)
        return {"layout": (i[:, None] - i[None, :]).abs() <= 1, "block_size": s.chunk}

    with registered("small_layout_probe", small, subquadratic=False):
        spec = make_spec("small_layout_probe", chunk=100, causal=causal)
        N = 5000
        assert element_fraction(spec, N) == pytest.approx(mask_fractions(spec, N, 64, 64)["element_fraction"],
                                                          rel=1e-9)


@pytest.mark.parametrize("causal", [True, False])
def test_a_window_plugin_is_counted_exactly(causal):
    """A plugin whose mask is a window (+ dilation) without a layout: the 64-token visited tiles gave 11x the kept
    elements of a window of 10 above N = 4096."""
    with registered("win_frac_probe", lambda s, Nq, Nk: {"window_left": 10, "dilation": 2},
                    spec_class=None, fields=(), subquadratic=False):
        spec = make_spec("win_frac_probe", causal=causal)
        N = 4097
        assert element_fraction(spec, N) == pytest.approx(mask_fractions(spec, N, 64, 64)["element_fraction"],
                                                          rel=1e-9)
