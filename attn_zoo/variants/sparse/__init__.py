"""``sparse``: block-sparse softmax attention over a block layout of ``block_size`` tokens.

Patterns (``sparse_pattern``):

* ``bigbird`` (Zaheer et al. 2020, sec. 2): ``|a - b| <= num_local_blocks`` or ``a < g`` or ``b < g``
  (``g = num_global_blocks``) or one of ``num_random_blocks`` random blocks of row ``a`` (among blocks ``<= a``
  when causal), drawn from a hash of ``(seed, a, b)``: deterministic and prefix-consistent;
* ``strided`` (Child et al. 2019, "fixed"): ``a // s == b // s`` or ``b % s == s - 1`` (``s = stride_blocks``).

Mask terms: ``layout`` (bool ``(nb, nb)`` over absolute-position blocks, ``nb = ceil(Nk / block_size)``) and
``block_size``; rows with ``i' < 0`` see nothing. Cost: exact kept fraction from the layout
(:func:`_element_fraction`); subquadratic (a constant number of blocks per row).
"""

from functools import lru_cache

import torch

from .. import register_variant

FIELDS = ("sparse_pattern", "block_size", "num_local_blocks", "num_global_blocks", "num_random_blocks",
          "stride_blocks", "seed")


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A small integer hash (xorshift-multiply) on int64 tensors; deterministic on every device."""
    x = x & 0xFFFFFFFF
    x = ((x >> 16) ^ x) * 0x45D9F3B & 0xFFFFFFFF
    x = ((x >> 16) ^ x) * 0x45D9F3B & 0xFFFFFFFF
    return (x >> 16) ^ x


@lru_cache(maxsize=64)
def _layout_cached(pattern: str, nb: int, causal: bool, local: int, glob: int, rand: int, stride: int, seed: int):
    qb = torch.arange(nb).view(-1, 1)
    kb = torch.arange(nb).view(1, -1)
    if pattern == "strided":
        # Child et al. 2019 ("fixed" pattern): own stride window, plus the summary (last) block of every window.
        layout = (qb // stride == kb // stride) | (kb % stride == stride - 1)
    else:  # bigbird, Zaheer et al. 2020 section 2: window + global + random blocks
        layout = ((qb - kb).abs() <= local) | (qb < glob) | (kb < glob)
        if rand > 0:
            # Random blocks drawn per query block from a hash of (seed, qb, kb): deterministic and
            # prefix-consistent (block row qb's choice does not depend on the sequence length when causal).
            cand = ~layout
            if causal:
                cand &= kb <= qb
            score = _mix(qb * 1_000_003 + kb * 7919 + seed * 104_729 + 1).to(torch.float64)
            score = torch.where(cand, score, torch.full_like(score, -1.0))
            k = min(rand, nb)
            top = score.topk(k, dim=1)
            pick = torch.zeros(nb, nb, dtype=torch.bool)
            pick.scatter_(1, top.indices, top.values >= 0)
            layout |= pick
    if causal:
        layout &= kb <= qb
    return layout


def sparse_layout(spec, n_blocks: int) -> torch.Tensor:
    """Block layout ``(n_blocks, n_blocks)`` bool, over absolute-position blocks of ``spec.block_size``
    (``layout[a, b]``: query positions in block ``a`` may attend keys in block ``b``; see the module docstring).
    Causal layouts are lower-triangular."""
    return _layout_cached(
        spec.sparse_pattern, int(n_blocks), spec.causal, spec.num_local_blocks, spec.num_global_blocks,
        spec.num_random_blocks, spec.stride_blocks, spec.seed,
    ).clone()


def _validate(spec):
    from ...spec import SPARSE_PATTERNS, _choice, _nonneg_int

    _choice("sparse_pattern", spec.sparse_pattern, SPARSE_PATTERNS)
    _nonneg_int("block_size", spec.block_size, 1)
    _nonneg_int("num_local_blocks", spec.num_local_blocks)
    _nonneg_int("num_global_blocks", spec.num_global_blocks)
    _nonneg_int("num_random_blocks", spec.num_random_blocks)
    _nonneg_int("stride_blocks", spec.stride_blocks, 1)


def _mask(spec, Nq, Nk):
    nb = max(-(-Nk // spec.block_size), 1)
    return {"layout": sparse_layout(spec, nb), "block_size": spec.block_size}


def _element_fraction(spec, N):
    """Exact kept fraction at ``Nq = Nk = N`` from the layout, O(nb^2): a block pair of the layout keeps all its
    elements, except the diagonal blocks of a causal layout (lower triangles); the last block may be ragged."""
    bs = spec.block_size
    nb = max(-(-N // bs), 1)
    lay = sparse_layout(spec, nb).to(torch.float64)
    sizes = torch.full((nb,), float(bs), dtype=torch.float64)
    sizes[-1] = N - bs * (nb - 1)
    kept = float((lay * sizes.view(-1, 1) * sizes.view(1, -1)).sum())
    if spec.causal:
        kept -= float((lay.diagonal() * (sizes * sizes - sizes * (sizes + 1) / 2)).sum())
    return kept / (N * N)


def _decode_mask(spec, Nq, capacity):
    """Causal layouts are prefix-consistent (a block row's choice does not depend on the block count): the
    capacity's layout serves every cache length. Non-causal ones are not (``None``: one layout per sequence)."""
    return _mask(spec, Nq, capacity) if spec.causal else None


register_variant("sparse", "softmax", fields=FIELDS, validate=_validate, mask=_mask, decode_mask=_decode_mask,
                 element_fraction=_element_fraction, subquadratic=True, doc="block-sparse softmax (BigBird / strided)")
