"""Multi-head Latent Attention (MLA, DeepSeek-AI 2024, "DeepSeek-V2", section 2.1, eqs. 9-19) as a sequence mixer.

Per token ``x (d_model)`` (``H`` heads, ``r = kv_lora_rank``, ``D_nope = qk_nope_dim``, ``D_rope = qk_rope_dim``,
``Dv = v_head_dim``):

* KV latent (eq. 9): ``c_kv = RMSNorm(W_DKV x)`` of ``r`` features; keys and values come from it by up-projections
  (eqs. 10-11): ``k_nope = W_UK c_kv`` ``(H, D_nope)``, ``v = W_UV c_kv`` ``(H, Dv)``.
* Decoupled RoPE (eqs. 14-17): ``k_rope = RoPE(W_KR x)`` ``(D_rope)``, one for all heads;
  ``q_rope = RoPE(W_QR c_q)`` ``(H, D_rope)``; ``q = [q_nope ; q_rope]``, ``k = [k_nope ; k_rope]``: the q.k head
  dim is ``D_nope + D_rope`` (48 at the defaults of the tiny model, 192 in DeepSeek-V2), v's is ``Dv`` (32 / 128).
* Queries (eqs. 12-13): through a low-rank latent ``c_q = RMSNorm(W_DQ x)`` of ``q_lora_rank`` features when
  ``q_lora_rank`` is set, else one projection ``W_Q x``.
* Output (eqs. 18-19): ``softmax(q.k * softmax_scale) v`` per head (scale default ``(D_nope + D_rope) ** -0.5``),
  then ``W_O``.

The RMSNorms on the latents are those of the released DeepSeek-V2 model (not written in the paper's equations).

Decoding (:meth:`MLA.new_cache`, :class:`MLACache`): the cache holds only ``c_kv`` and the rotated ``k_rope`` of
each token, ``r + D_rope`` numbers (``4.5 * head_dim`` at DeepSeek's ``r = 4 d_h``, ``D_rope = d_h / 2``, against
``2 * H * head_dim`` for MHA). The prompt is prefilled with the ordinary (non-absorbed) form; each later chunk uses
the absorbed projections (the paper's remark after eq. 19): ``W_UK`` is folded into the query,
``q_lat_h = W_UK_h^T q_nope_h`` (``r`` features), and ``W_UV`` into the output, ``y_h = W_UV_h o_lat_h``, so the
attention itself is multi-query attention over the latent cache: ``q' = [q_lat ; q_rope]`` ``(B, H, Nq, r + D_rope)``,
``k' = [c_kv ; k_rope]`` ``(B, 1, Nk, r + D_rope)``, ``v' = c_kv`` ``(B, 1, Nk, r)`` (a view of the same cache),
through :func:`attn_zoo.decode.decode_attention` over the latent cache in place (``v'`` a strided view of it;
``Dv != D`` on the ``reference``, ``torch`` and ``triton`` decode backends, ``D`` and ``Dv`` up to 1024 on
``triton``, so DeepSeek's ``r + D_rope = 576`` / ``r = 512`` runs on the decode kernel); a prefill-only backend
name (not one of ``auto`` / ``triton`` / ``torch`` / ``reference``) runs it through :func:`attn_zoo.attention`.
``absorb=False`` decodes by rebuilding ``k_nope`` / ``v`` from the latent instead (same result; for tests).

Memory: :func:`mla_cache_bytes_per_token`; :func:`attn_zoo.decode.memory.memory_table` adds an ``mla`` row when
given ``mla_dims``.
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch
import torch.nn as nn

from .functional import attention
from .mixers import register_mixer
from .spec import make_spec


def _int_arg(name: str, value, lo: int, even: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (even and value % 2):
        what = f"an even integer >= {lo}" if even else f"an integer >= {lo}"
        raise ValueError(f"MLA {name} must be {what}, got {value!r}")
    return value


def mla_cache_bytes_per_token(kv_lora_rank: int, qk_rope_dim: int, n_layer: int = 1, dtype_bytes: int = 2) -> int:
    """Latent-cache bytes one token adds per sequence: ``n_layer * (kv_lora_rank + qk_rope_dim) * dtype_bytes``
    (DeepSeek-V2 eq. 9 / section 2.1.4: ``(d_c + d_h^R) l`` elements). Compare MHA ``2 * H * D * dtype_bytes`` per
    layer, GQA ``2 * Hkv * D * dtype_bytes``, MQA ``2 * D * dtype_bytes``. Raises ``ValueError`` naming a bad size."""
    _int_arg("kv_lora_rank", kv_lora_rank, 1)
    _int_arg("qk_rope_dim", qk_rope_dim, 0)
    _int_arg("n_layer", n_layer, 1)
    _int_arg("dtype_bytes", dtype_bytes, 1)
    return n_layer * (kv_lora_rank + qk_rope_dim) * dtype_bytes


class MLACache:
    """The latent cache of one :class:`MLA` layer: ``lat (B, 1, capacity, r + D_rope)``, per token ``c_kv``
    (first ``r`` features) then the rotated ``k_rope``; every sequence of the batch holds ``length`` tokens.
    Contiguous only. ``append`` raises ``ValueError`` past ``capacity`` (naming it) or for a wrong shape."""

    def __init__(self, batch: int, capacity: int, kv_lora_rank: int, qk_rope_dim: int, dtype=torch.float32,
                 device=None):
        _int_arg("batch", batch, 1)
        _int_arg("capacity", capacity, 1)
        self.kv_lora_rank, self.qk_rope_dim = kv_lora_rank, qk_rope_dim
        self.lat = torch.zeros(batch, 1, capacity, kv_lora_rank + qk_rope_dim, dtype=dtype, device=device)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.lat.shape[2]

    @property
    def lengths(self) -> List[int]:
        return [self.length] * self.lat.shape[0]

    def tokens_seen(self) -> List[int]:
        """Tokens appended so far, per row (all equal)."""
        return self.lengths

    @property
    def nbytes(self) -> int:
        """Bytes of the allocated latent cache (every slot, not only the valid tokens)."""
        return self.lat.numel() * self.lat.element_size()

    def append(self, c_kv: torch.Tensor, k_rope: torch.Tensor) -> None:
        """Write ``c_kv (B, N, r)`` and rotated ``k_rope (B, 1, N, D_rope)`` after the cached tokens."""
        B, n = c_kv.shape[0], c_kv.shape[1]
        if c_kv.shape != (self.lat.shape[0], n, self.kv_lora_rank) or k_rope.shape != (B, 1, n, self.qk_rope_dim):
            raise ValueError(f"MLACache.append: c_kv {tuple(c_kv.shape)} / k_rope {tuple(k_rope.shape)} do not match "
                             f"the cache (B={self.lat.shape[0]}, r={self.kv_lora_rank}, D_rope={self.qk_rope_dim})")
        if self.length + n > self.capacity:
            raise ValueError(f"appending {n} tokens to an MLA cache holding {self.length} exceeds its capacity="
                             f"{self.capacity}")
        sl = slice(self.length, self.length + n)
        self.lat[:, 0, sl, : self.kv_lora_rank] = c_kv.to(self.lat.dtype)
        self.lat[:, :, sl, self.kv_lora_rank:] = k_rope.to(self.lat.dtype)
        self.length += n

    def latent(self):
        """``(k', v')``: ``(B, 1, length, r + D_rope)`` and its first ``r`` features ``(B, 1, length, r)`` (views)."""
        kv = self.lat[:, :, : self.length]
        return kv, kv[..., : self.kv_lora_rank]


@register_mixer("mla", causal=True)
class MLA(nn.Module):
    """Multi-head Latent Attention mixer, ``(B, N, d_model) -> (B, N, d_model)`` (see the module docstring).

    Args (options; ``None`` = the default from ``head_dim = d_model / n_head``):
        kv_lora_rank: ``r``, the KV latent width (default ``4 * head_dim``, DeepSeek-V2's ``d_c = 4 d_h``).
        q_lora_rank: width of the query latent ``c_q``; ``None`` / 0 = queries straight from ``x``.
        qk_nope_dim: ``D_nope`` per head (default ``head_dim``).
        qk_rope_dim: ``D_rope``, even (default ``head_dim / 2``, DeepSeek-V2's ``d_h^R = d_h / 2``); 0 = no RoPE.
        v_head_dim: ``Dv`` per head (default ``head_dim``).
        causal: causal mask (``True``; ``False`` is refused by ``GPT.generate(use_cache=True)``).
        softmax_scale: ``None`` = ``(D_nope + D_rope) ** -0.5``.
        absorb: decode with the absorbed projections (default) or by rebuilding K / V from the latent.
    Context (given by the model): ``d_model``, ``n_head``, ``head_dim``, ``max_seq_len``, ``dropout``, ``bias``,
    ``backend``, ``config`` (its ``rope_base``).

    Raises ``ValueError`` naming the option for a bad value.
    """

    def __init__(self, d_model: int, n_head: int, head_dim: int, max_seq_len: int = 256, dropout: float = 0.0,
                 bias: bool = False, backend: str = "auto", config=None, kv_lora_rank: Optional[int] = None,
                 q_lora_rank: Optional[int] = None, qk_nope_dim: Optional[int] = None,
                 qk_rope_dim: Optional[int] = None, v_head_dim: Optional[int] = None, causal: bool = True,
                 softmax_scale: Optional[float] = None, absorb: bool = True):
        super().__init__()
        from .model import RMSNorm, Rotary

        self.n_head = _int_arg("n_head", n_head, 1)
        self.kv_lora_rank = _int_arg("kv_lora_rank", 4 * head_dim if kv_lora_rank is None else kv_lora_rank, 1)
        self.q_lora_rank = _int_arg("q_lora_rank", q_lora_rank or 0, 0)
        self.qk_nope_dim = _int_arg("qk_nope_dim", head_dim if qk_nope_dim is None else qk_nope_dim, 1)
        self.qk_rope_dim = _int_arg("qk_rope_dim", head_dim // 2 if qk_rope_dim is None else qk_rope_dim, 0, even=True)
        self.v_head_dim = _int_arg("v_head_dim", head_dim if v_head_dim is None else v_head_dim, 1)
        for name, val in (("causal", causal), ("absorb", absorb)):
            if not isinstance(val, bool):
                raise ValueError(f"MLA {name} must be true or false, got {val!r}")
        if softmax_scale is not None and (isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float))
                                          or not math.isfinite(softmax_scale) or softmax_scale <= 0):
            raise ValueError(f"MLA softmax_scale must be a number > 0 or null, got {softmax_scale!r}")
        self.causal, self.absorb, self.backend = causal, absorb, backend
        H, r, dn, dr, dv = self.n_head, self.kv_lora_rank, self.qk_nope_dim, self.qk_rope_dim, self.v_head_dim
        self.qk_head_dim = dn + dr
        self.scale = float(softmax_scale) if softmax_scale is not None else self.qk_head_dim ** -0.5
        # the same scale for the (B, H, N, D_nope + D_rope) form and the absorbed (r + D_rope) form
        self.spec = make_spec("flash", causal=causal, softmax_scale=self.scale)
        if self.q_lora_rank:
            self.q_down = nn.Linear(d_model, self.q_lora_rank, bias=bias)  # W_DQ (eq. 12)
            self.q_norm = RMSNorm(self.q_lora_rank)
            self.q_up = nn.Linear(self.q_lora_rank, H * (dn + dr), bias=False)  # W_UQ, W_QR (eqs. 13, 14)
        else:
            self.q_proj = nn.Linear(d_model, H * (dn + dr), bias=bias)
        self.kv_down = nn.Linear(d_model, r + dr, bias=bias)  # W_DKV (eq. 9) and W_KR (eq. 16) in one matrix
        self.kv_norm = RMSNorm(r)
        self.k_up = nn.Linear(r, H * dn, bias=False)  # W_UK (eq. 10); no bias: absorbed at decode
        self.v_up = nn.Linear(r, H * dv, bias=False)  # W_UV (eq. 11)
        self.o_proj = nn.Linear(H * dv, d_model, bias=bias)  # W_O (eq. 19)
        self.o_proj.residual_proj = True
        self.resid_dropout = nn.Dropout(dropout)
        base = float(getattr(config, "rope_base", 10000.0))
        self.rotary_base = base
        self.rotary = Rotary(dr, max_seq_len, base) if dr else None

    # ------------------------------------------------------------------ pieces
    def _rope(self, t: torch.Tensor, pos: int) -> torch.Tensor:
        return self.rotary(t, pos) if self.rotary is not None else t

    def queries(self, x: torch.Tensor, pos: int = 0):
        """``(q_nope (B, H, N, D_nope), q_rope (B, H, N, D_rope) rotated)`` of ``x (B, N, d_model)``."""
        B, N, _ = x.shape
        q = self.q_up(self.q_norm(self.q_down(x))) if self.q_lora_rank else self.q_proj(x)
        q = q.view(B, N, self.n_head, self.qk_head_dim).transpose(1, 2)
        return q[..., : self.qk_nope_dim], self._rope(q[..., self.qk_nope_dim:], pos)

    def latent(self, x: torch.Tensor, pos: int = 0):
        """``(c_kv (B, N, r), k_rope (B, 1, N, D_rope) rotated)``: what the cache keeps per token."""
        B, N, _ = x.shape
        ckv = self.kv_down(x)
        c, kr = self.kv_norm(ckv[..., : self.kv_lora_rank]), ckv[..., self.kv_lora_rank:]
        return c, self._rope(kr.view(B, N, 1, self.qk_rope_dim).transpose(1, 2), pos)

    def expand(self, c: torch.Tensor, k_rope: torch.Tensor):
        """Per-head ``k (B, H, N, D_nope + D_rope)`` and ``v (B, H, N, Dv)`` from the latent (eqs. 10, 11, 17)."""
        B, N, _ = c.shape
        H = self.n_head
        k_nope = self.k_up(c).view(B, N, H, self.qk_nope_dim).transpose(1, 2)
        v = self.v_up(c).view(B, N, H, self.v_head_dim).transpose(1, 2)
        k = torch.cat([k_nope, k_rope.expand(B, H, N, self.qk_rope_dim)], dim=-1)
        return k, v

    def _attend_absorbed(self, q_nope, q_rope, cache: MLACache) -> torch.Tensor:
        """Attention over the latent cache with ``W_UK`` in the query and ``W_UV`` on the output; ``(B, H, Nq, Dv)``."""
        H, r = self.n_head, self.kv_lora_rank
        w_uk = self.k_up.weight.view(H, self.qk_nope_dim, r)  # k_nope_h = w_uk[h] @ c
        w_uv = self.v_up.weight.view(H, self.v_head_dim, r)  # v_h = w_uv[h] @ c
        q_lat = torch.einsum("bhnd,hdr->bhnr", q_nope, w_uk)  # (B, H, Nq, r)
        q_abs = torch.cat([q_lat, q_rope], dim=-1)
        from .decode.attention import DECODE_BACKENDS, decode_attention

        if self.backend in ("auto",) + DECODE_BACKENDS:  # the decode kernel reads the latent cache in place
            lat = cache.lat  # k' = [c_kv ; k_rope] (D = r + D_rope), v' = c_kv (Dv = r): a strided view, no copy
            lens = torch.full((lat.shape[0],), cache.length, dtype=torch.int32, device=lat.device)
            o_lat = decode_attention(q_abs, lat, lat[..., :r], self.spec, lens, backend=self.backend,
                                     check_values=False)  # (B, H, Nq, r)
        else:
            kv, v = cache.latent()  # (B, 1, Nk, r + D_rope), (B, 1, Nk, r)
            o_lat = attention(q_abs, kv, v, self.spec, backend=self.backend)  # (B, H, Nq, r)
        return torch.einsum("bhnr,hdr->bhnd", o_lat, w_uv)

    # ------------------------------------------------------------------ module API
    def new_cache(self, batch_size: int, capacity: int, dtype: torch.dtype, device, page_size: Optional[int] = None,
                  shuffle_pages: bool = False) -> MLACache:
        """An empty :class:`MLACache` of ``capacity`` tokens. ``page_size`` must be ``None`` (contiguous only)."""
        if page_size is not None:
            raise ValueError(f"page_size={page_size!r}: the MLA latent cache is contiguous only; use page_size=None")
        return MLACache(batch_size, capacity, self.kv_lora_rank, self.qk_rope_dim, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, cache: Optional[MLACache] = None, pos: int = 0) -> torch.Tensor:
        B, N, _ = x.shape  # the N tokens sit at positions pos .. pos + N - 1
        q_nope, q_rope = self.queries(x, pos)
        c, k_rope = self.latent(x, pos)
        if cache is None or cache.length == 0:  # training, no-cache inference, prefill: the expanded form
            k, v = self.expand(c, k_rope)
            y = attention(torch.cat([q_nope, q_rope], dim=-1), k, v, self.spec, backend=self.backend)
            if cache is not None:
                cache.append(c, k_rope)
        else:
            cache.append(c, k_rope)
            if self.absorb:
                y = self._attend_absorbed(q_nope, q_rope, cache)
            else:  # rebuild K / V of every cached token from the latent
                kv, _ = cache.latent()
                k, v = self.expand(kv[:, 0, :, : self.kv_lora_rank], kv[..., self.kv_lora_rank:])
                y = attention(torch.cat([q_nope, q_rope], dim=-1), k, v, self.spec, backend=self.backend)
        y = y.transpose(1, 2).reshape(B, N, self.n_head * self.v_head_dim)  # (B, N, H * Dv)
        return self.resid_dropout(self.o_proj(y))


def mla_reference(m: MLA, x: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch MLA of module ``m``'s weights over ``x (B, N, d_model)`` (fp64 math, explicit mask, per-head
    loops; no RMSNorm module, no :func:`attn_zoo.attention`), returned in ``x.dtype``: the test oracle."""
    xd = x.double()
    B, N, _ = x.shape
    H, r, dn, dr, dv = m.n_head, m.kv_lora_rank, m.qk_nope_dim, m.qk_rope_dim, m.v_head_dim

    def lin(layer, t):
        y = t @ layer.weight.double().T
        return y + layer.bias.double() if layer.bias is not None else y

    def rms(norm, t):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight.double()

    def rope(t):  # (N, d), positions 0 .. N-1, rotate-half
        if not dr:
            return t
        inv = 1.0 / (m.rotary_base ** (torch.arange(0, dr, 2, dtype=torch.float64) / dr))
        ang = torch.arange(N, dtype=torch.float64)[:, None] * inv[None, :]
        a, b = t[..., : dr // 2], t[..., dr // 2:]
        return torch.cat([a * ang.cos() - b * ang.sin(), a * ang.sin() + b * ang.cos()], dim=-1)

    q = lin(m.q_up, rms(m.q_norm, lin(m.q_down, xd))) if m.q_lora_rank else lin(m.q_proj, xd)  # (B, N, H*(dn+dr))
    ckv = lin(m.kv_down, xd)
    c, kr = rms(m.kv_norm, ckv[..., :r]), ckv[..., r:]
    kn, v = lin(m.k_up, c), lin(m.v_up, c)
    mask = torch.ones(N, N, dtype=torch.bool).tril() if m.causal else torch.ones(N, N, dtype=torch.bool)
    out = torch.zeros(B, N, H * dv, dtype=torch.float64)
    for b in range(B):
        krb = rope(kr[b])
        for h in range(H):
            qh = q[b, :, h * (dn + dr):(h + 1) * (dn + dr)]
            qh = torch.cat([qh[:, :dn], rope(qh[:, dn:])], dim=-1)
            kh = torch.cat([kn[b, :, h * dn:(h + 1) * dn], krb], dim=-1)
            s = (qh @ kh.T) * m.scale
            p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
            out[b, :, h * dv:(h + 1) * dv] = p @ v[b, :, h * dv:(h + 1) * dv]
    return lin(m.o_proj, out).to(x.dtype)


def mla_memory_row(n_layer: int, n_head: int, head_dim: int, budget_bytes: float, batch: int, dtype_bytes: int,
                   contexts, kv_lora_rank: int, qk_rope_dim: int) -> dict:
    """The ``mla`` row of :func:`attn_zoo.decode.memory.memory_table` (same columns): an MLA model of ``n_layer``
    layers; the cache grows by :func:`mla_cache_bytes_per_token` per token and sequence."""
    per = mla_cache_bytes_per_token(kv_lora_rank, qk_rope_dim, n_layer, dtype_bytes)
    row = {"variant": "mla", "n_layer": n_layer, "n_head": n_head, "head_dim": head_dim, "batch": batch,
           "dtype_bytes": dtype_bytes, "bytes_per_token": per, "max_context": int(budget_bytes // (per * batch))}
    for n in contexts:
        row[f"bytes_at_{n}"] = batch * per * int(n)
    return row
