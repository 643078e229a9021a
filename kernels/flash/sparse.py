"""Block-sparse mode: the tiles its tables are built at and the tables themselves (full tiles first per row)."""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

from .._host import cdiv
from .common import INTERPRET, _cfg
from .config import FlashConfig, resolve_config

Tiles = Tuple[Tuple[int, int], Tuple[int, int]]


def sparse_tiles(head_dim: int, config: Optional[FlashConfig] = None) -> Tiles:
    """Tiles of the block-sparse mode: ``((BLOCK_M, BLOCK_N) of forward and dQ, (BLOCK_M, BLOCK_N) of dK/dV)``.

    The caller builds the block tables at these tiles (a table depends on the tile, so the sparse mode autotunes
    warps / stages only). ``config`` (default: the current settings) may force them (``sparse_fwd`` /
    ``sparse_dkdv``).
    """
    if INTERPRET:
        f, b = (32, 16), (16, 32)
    elif head_dim <= 128:  # H200 BigBird sweep (lab/probe_flash.py --sparse-sweep): 64x64 everywhere beat
        f, b = (64, 64), (64, 64)  # 128x64 / 64x128 by 23-26% fwd+bwd (short table rows: 2+ programs per SM)
    else:
        f, b = (64, 32), (32, 64)
    cfg = resolve_config(config)
    if cfg.sparse_fwd is not None:
        f = (cfg.sparse_fwd.block_m, cfg.sparse_fwd.block_n)
    if cfg.sparse_dkdv is not None:
        b = (cfg.sparse_dkdv.block_m, cfg.sparse_dkdv.block_n)
    return f, b


def _sparse_configs(kind: str, config: FlashConfig, fallback):
    """Heuristic configs of the sparse mode in preference order (``fallback``: the interpreter's list)."""
    if INTERPRET:
        return fallback
    res = []
    for d in (64, 256):
        f, b = sparse_tiles(d, config)
        bm, bn = b if kind == "dkdv" else f
        # warps / stages in preference order (H200 sparse sweep: 4 warps, fwd 3 stages, dq / dkdv 2)
        ws = {"fwd": ((4, 3), (4, 2), (8, 3), (8, 2)), "dq": ((4, 2), (4, 3), (8, 3), (8, 2))}.get(
            kind, ((4, 2), (4, 3), (8, 3), (8, 2)))
        res += [_cfg(bm, bn, w, st) for w, st in ws]
    return res


def sparse_mode(layout, layout_bs: int, tile, Nq: int, Nk: int, config: FlashConfig) -> int:
    """The ``SPARSE`` constexpr of a kernel with tiles ``tile = (BLOCK_M, BLOCK_N)``: 0 without a layout, 2 when
    every tile lies inside one layout block and ``config.sparse_aligned_no_gather`` is on, else 1."""
    if layout is None:
        return 0
    bm, bn = tile
    if config.sparse_aligned_no_gather and layout_bs % bm == 0 and layout_bs % bn == 0 and (Nk - Nq) % bm == 0:
        return 2
    return 1


def _full_first_table(visited: torch.Tensor, full: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(idx, cnt, nfull)`` of a bool ``(rows, cols)`` visited / full matrix, in schedule order.

    Rows (one per program) are sorted by decreasing visit count (stable), so the heaviest tiles start first
    (BigBird's global rows visit every tile; launched last they would run alone at the end). Row ``r``:
    ``idx[r, 0]`` is the tile it computes, ``idx[r, 1:1 + cnt[r]]`` its visited tiles, the ``nfull[r]`` full ones
    first, then the partial ones (each group in increasing order), padded with 0 to the longest row."""
    visited = visited.cpu().bool()
    full = full.cpu().bool() & visited
    rank = torch.where(full, 0, torch.where(visited, 1, 2)).to(torch.int8)
    cnt = visited.sum(1).to(torch.int32)
    nfull = full.sum(1).to(torch.int32)
    mv = max(int(cnt.max()) if cnt.numel() else 0, 1)
    order = torch.sort(rank, dim=1, stable=True).indices[:, :mv]
    valid = torch.arange(mv).view(1, -1) < cnt.view(-1, 1)
    idx = torch.where(valid, order, 0).to(torch.int32)
    sched = torch.sort(-cnt.to(torch.int64), stable=True).indices
    idx = torch.cat([sched.view(-1, 1).to(torch.int32), idx[sched]], 1)
    return idx, cnt[sched], nfull[sched]


def build_sparse_tables(table_fn: Callable, D: int, device, config: Optional[FlashConfig] = None,
                        tiles: Optional[Tiles] = None) -> Tuple[torch.Tensor, ...]:
    """Block tables of the sparse mode at :func:`sparse_tiles` (of ``config``, default: the current settings; or at
    ``tiles``, a :func:`sparse_tiles` result): ``(kv_idx, kv_cnt, kv_nfull, q_idx, q_cnt, q_nfull)``, int32 on
    ``device``.

    ``table_fn(block_m, block_n)`` returns ``(kv_idx, kv_count, kv_full, visited, full)`` per query tile (e.g.
    ``MaskInfo.block_table``; only ``visited`` / ``full`` bool ``(n_q_tiles, n_k_tiles)`` are read). Per query
    tile (forward, dQ): row ``r`` of ``kv_idx`` ``(n_q_tiles, 1 + max_visits)`` is run by program ``r``; its column 0
    is the query tile, then the visited key tiles, the ``kv_nfull[r]`` full ones first (no element mask
    needed), then the partial ones (``kv_cnt[r]`` in all). Rows are sorted by decreasing ``kv_cnt`` (heaviest
    tiles start first: load balance for global rows). Per key tile (dK/dV): the same for the transposed
    matrices at the dK/dV tiles. Full-first rows let the kernels run two branch-free loops. Cache the result when
    the same mask is used many times (the adapter does); pass the same ``config`` to the calls that use them.
    """
    (fm, fn), (bm, bn) = tiles if tiles is not None else sparse_tiles(D, config)
    t = table_fn(fm, fn)
    kv = _full_first_table(t[3], t[4])
    tb = table_fn(bm, bn)
    qt = _full_first_table(tb[3].t(), tb[4].t())  # (n_k_tiles, n_q_tiles)
    return tuple(x.to(device).contiguous() for x in kv + qt)


def check_tables(tables, Nq: int, Nk: int, D: int, config: FlashConfig):
    """Types and shapes of user-given tables against the sparse tiles of ``config`` (shape-only: no device sync)."""
    if len(tables) != 6:
        raise ValueError(f"block_tables must be the 6 tensors of build_sparse_tables, got {len(tables)}")
    for name, t in zip(("kv_idx", "kv_cnt", "kv_nfull", "q_idx", "q_cnt", "q_nfull"), tables):
        want = 2 if name.endswith("idx") else 1
        if not isinstance(t, torch.Tensor) or t.dim() != want or t.dtype != torch.int32:
            raise ValueError(f"block_tables {name} must be an int32 {want}-D tensor (see build_sparse_tables), got "
                             f"{getattr(t, 'dtype', type(t))} of shape {tuple(getattr(t, 'shape', ()))}")
    tiles = sparse_tiles(D, config)
    (fm, _), (_, bn) = tiles
    for side, (idx, cnt, nfull), rows in (("query", tables[:3], cdiv(Nq, fm)),
                                          ("key", tables[3:], cdiv(Nk, bn))):
        if idx.shape[0] != rows or cnt.numel() != rows or nfull.numel() != rows or idx.shape[1] < 2:
            raise ValueError(f"block_tables do not fit this call: {rows} {side} tiles at the sparse tiles "
                             f"{tiles} (Nq={Nq}, Nk={Nk}, D={D}) need {rows} rows of >= 2 columns, got "
                             f"{tuple(idx.shape)}; rebuild them with build_sparse_tables")


def tiles_whole(layout_bs: int, Nq: int, Nk: int, block_m: int, block_n: int) -> bool:
    """Whether every ``block_m x block_n`` tile lies inside one layout block of ``layout_bs`` tokens (bottom-right
    aligned: query ``i`` at absolute position ``i + Nk - Nq``): ``layout_bs`` a multiple of both tile sides and
    ``Nk - Nq`` a multiple of ``block_m``. The Gluon block-sparse forward needs it (its element rule is the band
    mask alone)."""
    return layout_bs > 0 and layout_bs % block_m == 0 and layout_bs % block_n == 0 and (Nk - Nq) % block_m == 0


def layout_tables(layout: torch.Tensor, layout_bs: int, Nq: int, Nk: int, win_left: int, win_right: int,
                  block_m: int, block_n: int, keys: bool = False) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query-tile block table ``(kv_idx, kv_cnt, kv_nfull)`` (int32, on ``layout``'s device; the format of
    :func:`build_sparse_tables`' first three: rows in schedule order, column 0 the query tile, full tiles first;
    ``keys=True``: the key-tile table ``(q_idx, q_cnt, q_nfull)``, one row per key tile listing its query tiles) of
    a block-sparse ``layout`` (bool / int ``(nb, nb)`` at ``layout_bs`` tokens, queries at absolute positions ``i +
    Nk - Nq``, keys past the layout in its last block, rows at negative positions see nothing: ``MaskInfo``'s rule)
    under the band ``win_left`` / ``win_right`` (< 0: no edge; causal is ``win_right = 0``), at tiles ``block_m x
    block_n`` that lie inside one layout block each (:func:`tiles_whole`), so that a tile is visited iff its layout
    block is on and the band reaches it, and full iff also the band covers it and it is not ragged. Reads the layout
    on the host (one device sync: cache the result). Raises ``ValueError`` when the tiles are not whole."""
    if not tiles_whole(layout_bs, Nq, Nk, block_m, block_n):
        raise ValueError(f"layout_tables needs tiles inside one layout block: block_size={layout_bs} a multiple of "
                         f"{block_m} and {block_n}, and Nk - Nq = {Nk - Nq} a multiple of {block_m}")
    lay = layout.detach().to("cpu").bool()
    nb = lay.shape[0]
    offset = Nk - Nq
    r0 = torch.arange(cdiv(Nq, block_m)).view(-1, 1) * block_m
    r1 = torch.clamp(r0 + block_m, max=Nq) - 1
    c0 = torch.arange(cdiv(Nk, block_n)).view(1, -1) * block_n
    c1 = torch.clamp(c0 + block_n, max=Nk) - 1
    a0, a1 = r0 + offset, r1 + offset
    qb = torch.clamp(torch.clamp(a0, min=0) // layout_bs, max=nb - 1)
    kb = torch.clamp(c0 // layout_bs, max=nb - 1)
    visited = lay[qb, kb] & (a0 >= 0)  # (n_q_tiles, n_k_tiles)
    full = (r1 - r0 + 1 == block_m) & (c1 - c0 + 1 == block_n)
    if win_right >= 0:
        visited = visited & (c0 <= a1 + win_right)
        full = full & (c1 <= a0 + win_right)
    if win_left >= 0:
        visited = visited & (c1 >= a0 - win_left)
        full = full & (c0 >= a1 - win_left)
    idx, cnt, nfull = _full_first_table(visited.t(), full.t()) if keys else _full_first_table(visited, full)
    return tuple(x.to(layout.device).contiguous() for x in (idx, cnt, nfull))
