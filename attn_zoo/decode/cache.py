"""KV caches for decoding: contiguous ``(B, Hkv, N_max, D)`` or paged ``(num_pages, Hkv, page_size, D)``.

Conventions of FlashAttention's ``flash_attn_with_kvcache`` in the ``(B, H, N, D)`` layout; the paged layout
(a pool of fixed-size pages plus a per-sequence page table ``block_table (B, max_pages)`` int32) is vLLM's
PagedAttention (Kwon et al. 2023, "Efficient Memory Management for Large Language Model Serving with
PagedAttention"). Sequence ``b`` holds ``cache_seqlens[b]`` valid tokens (ragged); token ``t`` of sequence ``b``
lives at ``k_cache[b, :, t]`` (contiguous) or at ``k_cache[block_table[b, t // page_size], :, t % page_size]``
(paged).

* :func:`append_kv` writes new keys / values after each sequence's valid tokens (either layout) and returns
  the new lengths.
* :func:`gather_kv` reads a paged (or contiguous) cache back as contiguous ``(B, Hkv, L, D)`` tensors.
* :class:`KVCache` owns the tensors of one layer: lengths mirrored on the host (no device sync per step),
  pages handed out on demand from a free list (in shuffled order when asked, to test page-table lookups),
  and an optional ``keep_last`` window (contiguous only) for sliding-window layers.
"""

from __future__ import annotations

import random
from typing import List, Optional, Tuple

import torch


_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ``a`` by positive ``b``."""
    return -(-a // b)


def cache_capacity(k_cache: torch.Tensor, block_table: Optional[torch.Tensor] = None) -> int:
    """Tokens one sequence can hold: ``N_max`` (contiguous) or ``max_pages * page_size`` (paged)."""
    if block_table is None:
        return int(k_cache.shape[2])
    return int(block_table.shape[1]) * int(k_cache.shape[2])


def check_cache_layout(k_cache, v_cache, block_table, batch: int, n_kv_heads: Optional[int] = None,
                       head_dim: Optional[int] = None, dtype: Optional[torch.dtype] = None, of: str = "q",
                       allow_dv: bool = False) -> None:
    """Shape / dtype / device checks of a cache; raises ``ValueError`` / ``TypeError`` naming the argument
    (``of``: the argument ``batch`` / ``n_kv_heads`` / ``head_dim`` / ``dtype`` come from, e.g. ``q`` or ``k_new``).
    ``allow_dv``: ``v_cache``'s last dim (the value head dim ``Dv``) may differ from ``k_cache``'s."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D: (B, Hkv, N_max, D) contiguous or (num_pages, Hkv, page_size, D) "
                             f"paged, got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}.dtype={t.dtype} is not supported; allowed values: float16, bfloat16, float32, float64")
        if dtype is not None and t.dtype != dtype:
            raise TypeError(f"{name}.dtype={t.dtype} must match {of}'s dtype {dtype}")
        if min(t.shape) < 1:
            raise ValueError(f"{name} must have every dimension >= 1, got shape {tuple(t.shape)}")
    if (k_cache.shape[:3] != v_cache.shape[:3]) if allow_dv else (k_cache.shape != v_cache.shape):
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must have the same shape")
    if k_cache.device != v_cache.device:
        raise ValueError(f"k_cache and v_cache must be on one device, got {k_cache.device} and {v_cache.device}")
    if n_kv_heads is not None and k_cache.shape[1] != n_kv_heads:
        raise ValueError(f"k_cache has {k_cache.shape[1]} K/V heads (shape[1]), {of} has {n_kv_heads}")
    if head_dim is not None and k_cache.shape[3] != head_dim:
        raise ValueError(f"head dims differ: {of} D={head_dim}, k_cache D={k_cache.shape[3]}")
    if block_table is None:
        if k_cache.shape[0] != batch:
            raise ValueError(f"contiguous k_cache batch k_cache.shape[0]={k_cache.shape[0]} != B={batch} "
                             f"({of}.shape[0]; a paged cache needs block_table)")
        return
    if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32:
        raise TypeError(f"block_table must be an int32 tensor (B, max_pages), got "
                        f"{getattr(block_table, 'dtype', type(block_table).__name__)}")
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"block_table must have shape (B={batch}, max_pages) ({of}.shape[0]), got {tuple(block_table.shape)}")
    if block_table.device != k_cache.device:
        raise ValueError(f"block_table is on {block_table.device}, the cache on {k_cache.device}")


def check_cache_values(cache_seqlens: torch.Tensor, capacity: int, block_table: Optional[torch.Tensor],
                       num_pages: int, page_size: int, min_len: int = 0) -> None:
    """Value checks (one host sync): ``min_len <= cache_seqlens[b] <= capacity`` and every page that holds a
    valid token is in ``[0, num_pages)``. Raises ``ValueError`` naming the sequence and the bad value."""
    lens = cache_seqlens.tolist()
    for b, n in enumerate(lens):
        if n > capacity:
            raise ValueError(f"cache_seqlens[{b}]={n} is past the cache capacity of {capacity} tokens")
        if n < min_len:
            raise ValueError(f"cache_seqlens[{b}]={n} < Nq={min_len}: the Nq new tokens must already be in the cache "
                             f"(append them with append_kv first)" if min_len > 0 else
                             f"cache_seqlens[{b}]={n} must be >= 0")
    if block_table is not None:
        used = torch.arange(block_table.shape[1], device=block_table.device).view(1, -1) < \
            (cache_seqlens.to(torch.int64).view(-1, 1) + page_size - 1) // page_size
        bad = used & ((block_table < 0) | (block_table >= num_pages))
        if bool(bad.any()):
            b, p = (int(x) for x in bad.nonzero()[0])
            raise ValueError(f"block_table[{b}, {p}]={int(block_table[b, p])} is out of range: page indices must be in "
                             f"[0, num_pages={num_pages})")


def _slots(cache_seqlens: torch.Tensor, n_new: int, block_table: Optional[torch.Tensor], page_size: int):
    """``(row, col)`` index tensors ``(B, n_new)`` of the cache slots of the next ``n_new`` tokens."""
    B = cache_seqlens.shape[0]
    pos = cache_seqlens.to(torch.int64).view(B, 1) + torch.arange(n_new, device=cache_seqlens.device).view(1, -1)
    if block_table is None:
        return torch.arange(B, device=pos.device).view(B, 1).expand(B, n_new), pos
    page = torch.gather(block_table.to(torch.int64), 1, pos // page_size)
    return page, pos % page_size


def check_new_kv(k_cache, v_cache, k_new, v_new, block_table: Optional[torch.Tensor] = None) -> None:
    """Checks of the keys / values :func:`append_kv` would write (shape ``(B, Hkv, N_new, D)`` matching the cache,
    the cache's dtype and device); raises ``ValueError`` / ``TypeError`` naming the argument. Writes nothing."""
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (B, Hkv, N_new, D), got {getattr(t, 'shape', type(t).__name__)}")
    if k_new.shape != v_new.shape:
        raise ValueError(f"k_new {tuple(k_new.shape)} and v_new {tuple(v_new.shape)} must have the same shape")
    if k_new.dtype != v_new.dtype:
        raise TypeError(f"k_new.dtype={k_new.dtype} and v_new.dtype={v_new.dtype} must be the same")
    B, Hkv, n_new, D = k_new.shape
    check_cache_layout(k_cache, v_cache, block_table, B, Hkv, D, k_new.dtype, of="k_new")
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        if t.device != k_cache.device:
            raise ValueError(f"{name} is on {t.device}, the cache on {k_cache.device}")


def append_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
    cache_seqlens: torch.Tensor, block_table: Optional[torch.Tensor] = None, check_values: bool = True,
) -> torch.Tensor:
    """Write ``k_new`` / ``v_new`` after each sequence's valid tokens, in place; return the new lengths.

    Args:
        k_cache, v_cache: contiguous ``(B, Hkv, N_max, D)`` or paged ``(num_pages, Hkv, page_size, D)``.
        k_new, v_new: ``(B, Hkv, N_new, D)``, the cache's dtype; token ``t`` goes to position
            ``cache_seqlens[b] + t`` of sequence ``b``.
        cache_seqlens: int32 ``(B,)`` lengths *before* the append.
        block_table: int32 ``(B, max_pages)`` for a paged cache (the pages must already be assigned).
        check_values: check lengths (``0 <= cache_seqlens[b]``, ``cache_seqlens[b] + N_new <= capacity``) and
            page indices on the host (device syncs; without it a negative length writes from the end).

    Returns:
        int32 ``(B,)``: ``cache_seqlens + N_new`` (pass it to :func:`attn_zoo.decode_attention`).

    Raises:
        ValueError / TypeError: shapes, dtypes, devices, a negative ``cache_seqlens``, a write past the capacity,
        a page index out of range.
    """
    check_new_kv(k_cache, v_cache, k_new, v_new, block_table)
    B, n_new = k_new.shape[0], k_new.shape[2]
    _check_seqlens(cache_seqlens, B, k_cache.device)
    if check_values:
        for b, n in enumerate(cache_seqlens.tolist()):  # a negative length would index from the end (-1: last slot)
            if n < 0:
                raise ValueError(f"cache_seqlens[{b}]={n} must be >= 0 (the tokens sequence {b} holds before the append)")
        end = cache_seqlens.to(torch.int64) + n_new
        check_cache_values(end, cache_capacity(k_cache, block_table), block_table, k_cache.shape[0], k_cache.shape[2])
    rows, cols = _slots(cache_seqlens, n_new, block_table, k_cache.shape[2])
    # (B, Hkv, N, D) -> (B, N, Hkv, D) views, so that one advanced-index assignment writes every token
    k_cache.transpose(1, 2)[rows, cols] = k_new.transpose(1, 2)
    v_cache.transpose(1, 2)[rows, cols] = v_new.transpose(1, 2)
    return (cache_seqlens + n_new).to(torch.int32)


def _check_seqlens(cache_seqlens, batch: int, device) -> None:
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32:
        raise TypeError(f"cache_seqlens must be an int32 tensor of shape (B,), got "
                        f"{getattr(cache_seqlens, 'dtype', type(cache_seqlens).__name__)}")
    if cache_seqlens.shape != (batch,):
        raise ValueError(f"cache_seqlens must have shape (B={batch},), got {tuple(cache_seqlens.shape)}")
    if cache_seqlens.device != torch.device(device) and not (
            cache_seqlens.device.type == torch.device(device).type == "cuda"):
        raise ValueError(f"cache_seqlens is on {cache_seqlens.device}, the cache on {device}")


def gather_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: Optional[torch.Tensor],
              length: int, cache_seqlens: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The first ``length`` positions of every sequence as contiguous ``(B, Hkv, length, D)`` K and V.

    Paged: pages are gathered through ``block_table``; table entries of pages past ``cache_seqlens[b]`` (when
    given) are not read (index 0 is read instead; those positions are not valid tokens).
    """
    if block_table is None:
        return k_cache[:, :, :length], v_cache[:, :, :length]
    ps = k_cache.shape[2]
    n_pages = cdiv(length, ps)
    bt = block_table[:, :n_pages].to(torch.int64)
    if cache_seqlens is not None:
        used = torch.arange(n_pages, device=bt.device).view(1, -1) < (cache_seqlens.to(torch.int64).view(-1, 1) + ps - 1) // ps
        bt = torch.where(used, bt, torch.zeros_like(bt))
    B, Hkv = bt.shape[0], k_cache.shape[1]

    def one(c):
        return c[bt].permute(0, 2, 1, 3, 4).reshape(B, Hkv, n_pages * ps, c.shape[3])[:, :, :length]

    return one(k_cache), one(v_cache)


class KVCache:
    """The KV cache of one attention layer for a batch of ``B`` sequences.

    Args:
        batch, n_kv_heads, head_dim: ``B``, ``Hkv``, ``D``.
        capacity: tokens per sequence (``N_max``; paged: rounded up to whole pages).
        dtype, device: of the K/V tensors.
        page_size: ``None`` = contiguous ``(B, Hkv, capacity, D)``; else paged ``(num_pages, Hkv, page_size, D)``
            with pages handed out on demand from a free list.
        num_pages: pool size (default ``B * cdiv(capacity, page_size)``).
        shuffle_pages: hand out pages in a random (seeded) order, as a long-running server would.
        keep_last: contiguous only; keep just the last ``keep_last`` tokens of each sequence (a sliding-window
            layer's cache). When an append would overflow, the last ``min(len, keep_last, capacity - N_new)``
            tokens move to the front (amortised O(1) per token for ``capacity >= 2 * keep_last``). Attention
            on it is exact for causal windows whose left extent is ``< keep_last`` when
            ``capacity >= keep_last + Nq`` (a window is translation invariant); :meth:`attend` refuses
            (``ValueError``) when a smaller capacity has dropped tokens the first query's window needs.
        keep_first: with ``keep_last`` only; the first ``keep_first`` tokens of each sequence are never dropped
            (attention sinks, StreamingLLM): a compaction keeps them in place and moves the last tokens behind
            them, so the cache holds ``sinks + a contiguous tail`` and a mask whose keys ``j < keep_first`` are the
            sinks (``MaskInfo.sink_size``) reads them at their own positions. ``keep_first + keep_last <=
            capacity``.

    Attributes: ``k``, ``v`` (the cache tensors), ``seqlens`` (int32 ``(B,)`` on ``device``), ``block_table``
    (int32 ``(B, max_pages)`` or ``None``), ``lengths`` (host list), ``dropped`` (host list: tokens dropped from
    the front by ``keep_last``), ``keep_first``.
    """

    def __init__(self, batch: int, n_kv_heads: int, head_dim: int, capacity: int, *, dtype=torch.float32,
                 device=None, page_size: Optional[int] = None, num_pages: Optional[int] = None,
                 shuffle_pages: bool = False, seed: int = 0, keep_last: Optional[int] = None,
                 keep_first: Optional[int] = None):
        for name, x in (("batch", batch), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim), ("capacity", capacity)):
            if not isinstance(x, int) or isinstance(x, bool) or x < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {x!r}")
        if keep_last is not None:
            if page_size is not None:
                raise ValueError("keep_last (a sliding-window cache) needs a contiguous cache (page_size=None)")
            if not isinstance(keep_last, int) or not 1 <= keep_last <= capacity:
                raise ValueError(f"keep_last={keep_last!r} must be an integer in [1, capacity={capacity}]")
        if keep_first is not None:
            if keep_last is None:
                raise ValueError("keep_first (the sinks of a sliding-window cache) needs keep_last")
            if not isinstance(keep_first, int) or isinstance(keep_first, bool) or not 1 <= keep_first \
                    or keep_first + keep_last > capacity:
                raise ValueError(f"keep_first={keep_first!r} must be an integer >= 1 with keep_first + keep_last "
                                 f"(={keep_last}) <= capacity={capacity}")
        self.batch, self.n_kv_heads, self.head_dim = batch, n_kv_heads, head_dim
        self.keep_last = keep_last
        self.keep_first = keep_first or 0
        self.page_size = page_size
        self.lengths: List[int] = [0] * batch
        self.dropped: List[int] = [0] * batch
        device = torch.device(device) if device is not None else torch.device("cpu")
        if page_size is None:
            self.k = torch.zeros(batch, n_kv_heads, capacity, head_dim, dtype=dtype, device=device)
            self.block_table = None
            self.capacity = capacity
        else:
            if not isinstance(page_size, int) or page_size < 1:
                raise ValueError(f"page_size must be an integer >= 1, got {page_size!r}")
            max_pages = cdiv(capacity, page_size)
            num_pages = batch * max_pages if num_pages is None else int(num_pages)
            if num_pages < 1:
                raise ValueError(f"num_pages must be >= 1, got {num_pages}")
            self.k = torch.zeros(num_pages, n_kv_heads, page_size, head_dim, dtype=dtype, device=device)
            self.capacity = max_pages * page_size
            self._free = list(range(num_pages))[::-1]
            if shuffle_pages:
                random.Random(seed).shuffle(self._free)
            self._table = torch.zeros(batch, max_pages, dtype=torch.int32)  # host copy
            self._n_pages = [0] * batch
            self.block_table = self._table.to(device)
        self.v = torch.zeros_like(self.k)
        self.seqlens = torch.zeros(batch, dtype=torch.int32, device=device)

    # ------------------------------------------------------------------ bookkeeping
    def tokens_seen(self) -> List[int]:
        """Tokens appended so far per row: those held plus those a ``keep_last`` cache dropped (host ints)."""
        return [n + d for n, d in zip(self.lengths, self.dropped)]

    @property
    def nbytes(self) -> int:
        """Bytes of the K and V tensors (allocated, not only the valid tokens)."""
        return 2 * self.k.numel() * self.k.element_size()

    @property
    def num_free_pages(self) -> int:
        return len(self._free) if self.page_size is not None else 0

    def _sync_lengths(self) -> None:
        self.seqlens = torch.tensor(self.lengths, dtype=torch.int32, device=self.k.device)

    def _ensure_pages(self, new_lengths: List[int]) -> None:
        """Hand out the pages ``new_lengths`` need; all or none (``RuntimeError`` before taking any)."""
        short = sum(max(cdiv(n, self.page_size) - self._n_pages[b], 0) for b, n in enumerate(new_lengths))
        if short > len(self._free):
            raise RuntimeError(f"paged KV cache is out of pages (num_pages={self.k.shape[0]}): the append needs "
                               f"{short} more, {len(self._free)} are free; release sequences or allocate a larger pool")
        changed = False
        for b, n in enumerate(new_lengths):
            need = cdiv(n, self.page_size)
            while self._n_pages[b] < need:
                self._table[b, self._n_pages[b]] = self._free.pop()
                self._n_pages[b] += 1
                changed = True
        if changed:
            self.block_table = self._table.to(self.k.device)

    def release(self, b: int) -> None:
        """Forget sequence ``b`` (its pages go back to the pool)."""
        if not isinstance(b, int) or isinstance(b, bool) or not 0 <= b < self.batch:
            raise ValueError(f"b={b!r} must be a sequence index in [0, batch={self.batch})")
        if self.page_size is not None:
            self._free.extend(int(p) for p in self._table[b, : self._n_pages[b]].tolist())
            self._n_pages[b] = 0
        self.lengths[b] = 0
        self.dropped[b] = 0
        self._sync_lengths()

    def _compact(self, n_new: int) -> None:
        """Sliding-window cache: move the last tokens of every sequence that would overflow to the front."""
        if all(n + n_new <= self.capacity for n in self.lengths):
            return
        for b, n in enumerate(self.lengths):
            if n + n_new <= self.capacity:
                continue
            first = min(self.keep_first, n)  # the sinks stay where they are
            keep = max(min(n - first, self.keep_last, self.capacity - n_new - first), 0)
            if keep:
                self.k[b, :, first:first + keep] = self.k[b, :, n - keep: n].clone()
                self.v[b, :, first:first + keep] = self.v[b, :, n - keep: n].clone()
            self.dropped[b] += n - first - keep
            self.lengths[b] = first + keep
        self._sync_lengths()

    # ------------------------------------------------------------------ append / attend
    def append(self, k_new: torch.Tensor, v_new: torch.Tensor) -> torch.Tensor:
        """Append ``(B, Hkv, N_new, D)`` keys / values to every sequence; returns the new ``seqlens``.

        Raises ``ValueError`` / ``TypeError`` for a wrong shape, dtype or device of ``k_new`` / ``v_new`` and when a
        sequence would exceed ``capacity`` (except with ``keep_last``, which drops the oldest tokens instead),
        ``RuntimeError`` when the page pool is exhausted. Atomic: everything is checked before the cache changes,
        so a failed append leaves tokens, lengths and the page pool as they were.
        """
        check_new_kv(self.k, self.v, k_new, v_new, self.block_table)  # before anything changes
        n_new = k_new.shape[2]
        step = self.capacity - self.keep_first
        if self.keep_first and n_new > step:  # in pieces that fit beside the sinks (a long prompt's prefill)
            for s in range(0, n_new, step):
                self.append(k_new[:, :, s:s + step], v_new[:, :, s:s + step])
            return self.seqlens
        if self.keep_last is not None:
            self._compact(n_new)
            if n_new > self.capacity:  # only the last `capacity` tokens can be kept
                for b in range(self.batch):
                    self.dropped[b] += n_new - self.capacity
                k_new, v_new, n_new = k_new[:, :, -self.capacity:], v_new[:, :, -self.capacity:], self.capacity
        new_lengths = [n + n_new for n in self.lengths]
        for b, n in enumerate(new_lengths):
            if n > self.capacity:
                raise ValueError(f"appending {n_new} tokens to sequence {b} of length {self.lengths[b]} exceeds the "
                                 f"cache capacity of {self.capacity} tokens")
        if self.page_size is not None:
            self._ensure_pages(new_lengths)
        self.seqlens = append_kv(self.k, self.v, k_new, v_new, self.seqlens, self.block_table, check_values=False)
        self.lengths = new_lengths
        return self.seqlens

    def append_attend(self, k_new: torch.Tensor, v_new: torch.Tensor, q: torch.Tensor, spec,
                      backend: str = "auto") -> torch.Tensor:
        """:meth:`append` then :meth:`attend` for ``Nq`` new tokens (``k_new`` / ``v_new`` ``(B, Hkv, Nq, D)``, ``q
        (B, Hq, Nq, D)``). A ``keep_last`` cache takes the chunk in pieces of at most ``capacity - keep_last``
        tokens, each appended then attended: every piece's queries find the last ``keep_last`` tokens before it
        in the cache, which is exact for a window of at most ``keep_last + 1`` tokens (a window's cache policy keeps
        ``W``), so a chunk of any length continues a window cache sized for one token at a time. Returns ``(B, Hq,
        Nq, Dv)``; raises as :meth:`append` / :meth:`attend`."""
        n = k_new.shape[2]
        step = n if self.keep_last is None else max(self.capacity - self.keep_last - self.keep_first, 1)
        if n <= step:
            self.append(k_new, v_new)
            return self.attend(q, spec, backend)
        outs = []
        for s in range(0, n, step):
            self.append(k_new[:, :, s:s + step], v_new[:, :, s:s + step])
            outs.append(self.attend(q[:, :, s:s + step], spec, backend))
        return torch.cat(outs, dim=2)

    def attend(self, q: torch.Tensor, spec, backend: str = "auto") -> torch.Tensor:
        """:func:`attn_zoo.decode_attention` of ``q (B, Hq, Nq, D)`` over this cache (the ``Nq`` new tokens must
        have been appended). A ``keep_last`` cache that dropped tokens only serves a spec whose variant's cache
        policy is a window of at most ``keep_last`` tokens, and only while it still holds each sequence's last
        ``window - 1 + Nq`` tokens (always when ``capacity >= keep_last + Nq``); ``ValueError`` otherwise, never a
        wrong result."""
        from .attention import decode_attention

        nq = q.shape[2] if isinstance(q, torch.Tensor) and q.dim() == 4 else None
        if nq is not None and min(self.lengths) < nq:  # host lengths: no device sync
            b = min(range(self.batch), key=lambda i: self.lengths[i])
            raise ValueError(f"q has Nq={nq} new tokens but sequence {b} of the cache holds {self.lengths[b]}: "
                             f"append the new keys / values (KVCache.append) before attend")
        if self.keep_last is not None and any(self.dropped):
            from ..variants import get_variant

            pol = get_variant(spec.kind).cache_policy(spec) if spec.is_softmax else None
            kept = f"the first {self.keep_first} and " if self.keep_first else ""
            if pol is None or pol.window is None or pol.sink != self.keep_first:
                raise ValueError(f"this cache keeps only {kept}the last {self.keep_last} tokens; kind={spec.kind!r} "
                                 f"(cache policy {pol}) needs others (its sinks must be the cache's keep_first)")
            if pol.window > self.keep_last:
                raise ValueError(f"this cache keeps only {kept}the last {self.keep_last} tokens (capacity="
                                 f"{self.capacity}); kind={spec.kind!r} reads a window of the last {pol.window}: "
                                 f"size it with keep_last >= {pol.window} (capacity >= {pol.window + self.keep_first})")
            need = pol.window - 1 + (nq or 1)  # the first query's window: its left extent + the Nq new tokens
            for b in range(self.batch):
                if self.dropped[b] and self.lengths[b] - self.keep_first < need:
                    raise ValueError(
                        f"this keep_last={self.keep_last} cache (capacity={self.capacity}) holds the last "
                        f"{self.lengths[b]} tokens of sequence {b}, but Nq={nq} queries with a window of "
                        f"{pol.window} tokens need the last {need}: size it with capacity >= keep_last + Nq "
                        f"({self.keep_last + (nq or 1)})")
        return decode_attention(q, self.k, self.v, spec, self.seqlens, self.block_table, backend=backend,
                                check_values=False)
