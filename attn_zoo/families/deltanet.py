"""DeltaNet (Schlag et al. 2021; Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule over
Sequence Length") and Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025) as sequence mixers.

The recurrence (per batch and head; state ``S (Dk, Dv)`` fp32; ``q, k`` L2-normalized; ``beta_t`` in (0, 1);
``alpha_t = exp(g_t)`` in (0, 1], 1 for DeltaNet)::

    S_t = alpha_t * S_{t-1} + beta_t * k_t (v_t - alpha_t * S_{t-1}^T k_t)^T        o_t = scale * S_t^T q_t

Backends (:func:`delta_rule`): ``fla``: flash-linear-attention's chunked Triton kernels
(``fla.ops.delta_rule.chunk_delta_rule``, ``fla.ops.gated_delta_rule.chunk_gated_delta_rule``; an optional
dependency, ``pip install flash-linear-attention``); ``chunk``: :func:`delta_rule_chunk`, our chunked PyTorch form
(WY / UT transform, autograd, fp32 accumulation); ``naive``: :func:`delta_rule_naive`, the reference (step by step).
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..mixers import register_mixer

__all__ = ["delta_rule_naive", "delta_rule_chunk", "delta_rule", "pick_backend", "DeltaNet", "GatedDeltaNet",
           "DeltaState", "DELTA_BACKENDS", "CHUNK_MIN_T", "MIXER_GATED"]

DELTA_BACKENDS = ("auto", "fla", "chunk", "naive")
MIXER_GATED = {"deltanet": False, "gated_deltanet": True}
"""This family's mixer names and whether each is the gated rule (for tools that take a name, e.g. eval.bench_delta)."""
# auto (without fla): the chunked form from this many positions on, the step-by-step loop below it (decode steps).
# Measured on CPU (1 thread, B=2, H=4, gated; median ms naive / chunk): fwd+bwd D=32 T=4 1.25/0.99, T=8 2.3/1.1,
# T=64 23/2.8, T=1024 735/37; fwd only D=64 T=1 0.09/0.31, T=2 0.18/0.42, T=4 0.34/0.36.
CHUNK_MIN_T = 8


def _starts(doc_ids: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` bool: ``t`` starts a document (``t == 0`` or ``doc_ids[:, t] != doc_ids[:, t - 1]``)."""
    d = doc_ids.long()
    st = torch.ones_like(d, dtype=torch.bool)
    st[:, 1:] = d[:, 1:] != d[:, :-1]
    return st


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_scale(fn: str, scale) -> None:
    """``scale`` is ``None`` (``Dk ** -0.5``) or a positive finite real, as ``AttentionSpec.softmax_scale``."""
    if scale is not None and not (isinstance(scale, (int, float)) and not isinstance(scale, bool)
                                  and math.isfinite(scale) and scale > 0):
        raise ValueError(f"{fn}: scale must be a positive finite float or None (Dk ** -0.5), got {scale!r}")


def _check_inputs(fn: str, q, k, v, beta, g, initial_state, doc_ids, check_g: bool = True) -> None:
    """Shapes, dtypes and devices of the delta rule's arguments (see :func:`delta_rule_naive`); raises
    ``ValueError`` naming the argument, its expected shape / allowed values and ``fn``. ``check_g``: also refuse
    ``g > 0``, NaN or ``-inf`` (one host sync; the mixers skip it: their ``g`` is ``<= 0`` and finite by
    construction). ``doc_ids`` goes through :func:`attn_zoo.documents.check_doc_ids` (int32 / int64, ``(B, T)``,
    q's device, nondecreasing; the sync of the last check runs once per tensor)."""
    for name, t in (("q", q), ("k", k), ("v", v), ("beta", beta)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4:
        raise ValueError(f"{fn}: q must have shape (B, T, H, Dk), got {tuple(q.shape)}")
    Bsz, T, H, Dk = q.shape
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in _FLOATS:
            raise ValueError(f"{fn}: {name}.dtype={t.dtype} is not supported; allowed values: float16, bfloat16, "
                             f"float32, float64")
    if tuple(k.shape) != (Bsz, T, H, Dk):
        raise ValueError(f"{fn}: k must have q's shape (B, T, H, Dk) = {(Bsz, T, H, Dk)}, got {tuple(k.shape)}")
    if v.dim() != 4 or tuple(v.shape[:3]) != (Bsz, T, H):
        raise ValueError(f"{fn}: v must have shape (B, T, H, Dv) = ({Bsz}, {T}, {H}, Dv), got {tuple(v.shape)}")
    for name, t in (("beta", beta), ("g", g)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype not in _FLOATS:
            raise ValueError(f"{fn}: {name} must be a float tensor (float16, bfloat16, float32, float64) of shape "
                             f"(B, T, H) = {(Bsz, T, H)}, got {getattr(t, 'dtype', type(t).__name__)}")
        if tuple(t.shape) != (Bsz, T, H):
            raise ValueError(f"{fn}: {name} must have shape (B, T, H) = {(Bsz, T, H)}, got {tuple(t.shape)}")
    if initial_state is not None:
        if not isinstance(initial_state, torch.Tensor) or initial_state.dtype not in _FLOATS:
            raise ValueError(f"{fn}: initial_state must be a float tensor of shape (B, H, Dk, Dv) or None, got "
                             f"{getattr(initial_state, 'dtype', type(initial_state).__name__)}")
        want = (Bsz, H, Dk, v.shape[3])
        if tuple(initial_state.shape) != want:
            raise ValueError(f"{fn}: initial_state must have shape (B, H, Dk, Dv) = {want}, got "
                             f"{tuple(initial_state.shape)}")
    for name, t in (("k", k), ("v", v), ("beta", beta), ("g", g), ("initial_state", initial_state)):
        if t is not None and t.device != q.device:
            raise ValueError(f"{fn}: {name} must be on q's device {q.device}, got {t.device}")
    if doc_ids is not None:
        from ..documents import check_doc_ids

        check_doc_ids(doc_ids, q.transpose(1, 2), k.transpose(1, 2))  # (B, H, T, D) views: doc_ids (B, T)
    if check_g and g is not None and g.numel() and not torch.compiler.is_compiling():
        bad = ~(g <= 0) | torch.isneginf(g)  # > 0, NaN or -inf
        if bool(bad.any()):  # the one host sync
            bad = g[bad].flatten()[0].item()
            raise ValueError(f"{fn}: g is a log-decay (alpha = exp(g) in (0, 1]): every value must be finite and "
                             f"<= 0, got {bad}; a state reset is a document start (doc_ids)")


def _empty(q, v, initial_state):
    """``T = 0``: an empty output and the state unchanged (fp32, fp64 for fp64 inputs)."""
    Bsz, _, H, Dk = q.shape
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    S = (initial_state.to(acc).clone() if initial_state is not None
         else q.new_zeros(Bsz, H, Dk, v.shape[-1], dtype=acc))
    return q.new_zeros(Bsz, 0, H, v.shape[-1]), S


def delta_rule_naive(q, k, v, beta, g=None, scale: Optional[float] = None, initial_state=None, doc_ids=None
                     ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The (gated) delta rule step by step.

    ``q, k (B, T, H, Dk)``, ``v (B, T, H, Dv)``, ``beta (B, T, H)``, ``g (B, T, H)`` log-decay (``<= 0``) or None,
    ``scale`` (default ``Dk ** -0.5``), ``initial_state (B, H, Dk, Dv)`` or None. Returns ``o (B, T, H, Dv)`` in
    ``q.dtype`` and the final state ``(B, H, Dk, Dv)`` fp32 (fp64 for fp64 inputs).
    ``doc_ids (B, T)`` int or None: the state restarts from zero at each document start after position 0
    (``initial_state`` belongs to the document at position 0). ``T = 0`` returns an empty ``o`` and the state
    unchanged.

    Raises ``ValueError`` naming the argument for a shape other than the above, a non-float ``q, k, v``
    dtype, tensors on different devices, bad ``doc_ids`` (int32 / int64, nondecreasing), a ``g`` that is not
    finite and ``<= 0`` or a ``scale`` that is not a positive finite number (or None)."""
    _check_inputs("delta_rule_naive", q, k, v, beta, g, initial_state, doc_ids)
    _check_scale("delta_rule_naive", scale)
    return _delta_rule_naive(q, k, v, beta, g, scale, initial_state, doc_ids)


def _delta_rule_naive(q, k, v, beta, g, scale, initial_state, doc_ids):
    Bsz, T, H, Dk = q.shape
    if T == 0:
        return _empty(q, v, initial_state)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = Dk ** -0.5 if scale is None else scale
    S = initial_state.to(acc) if initial_state is not None else q.new_zeros(Bsz, H, Dk, v.shape[-1], dtype=acc)
    qa, ka, va, ba = q.to(acc), k.to(acc), v.to(acc), beta.to(acc)
    st = _starts(doc_ids) if doc_ids is not None else None
    os_ = []
    for t in range(T):
        if st is not None and t > 0:
            S = S * (~st[:, t]).to(acc)[:, None, None, None]
        if g is not None:
            S = torch.exp(g[:, t].to(acc))[..., None, None] * S
        kt = ka[:, t]
        v_old = torch.einsum("bhk,bhkv->bhv", kt, S)
        S = S + ba[:, t, :, None, None] * kt[..., :, None] * (va[:, t] - v_old)[..., None, :]
        os_.append(scale * torch.einsum("bhk,bhkv->bhv", qa[:, t], S))
    return torch.stack(os_, 1).to(q.dtype), S


def delta_rule_chunk(q, k, v, beta, g=None, scale: Optional[float] = None, initial_state=None, doc_ids=None,
                     chunk_size: int = 64) -> Tuple[torch.Tensor, torch.Tensor]:
    """The (gated) delta rule in chunks of ``chunk_size`` positions (WY / UT-transform form), plain PyTorch.

    Arguments and results as :func:`delta_rule_naive` (``q, k (B, T, H, Dk)``, ``v (B, T, H, Dv)``, ``beta (B,
    T, H)``, ``g (B, T, H)`` log-decay or None, ``initial_state (B, H, Dk, Dv)``, ``doc_ids (B, T)``; returns ``o``
    in ``q.dtype`` and the final state fp32, fp64 for fp64 inputs); differentiable by autograd; every product in
    fp32 (fp64), autocast off inside. ``T`` need not be a multiple of ``chunk_size`` (the last chunk is
    zero-padded: ``beta = k = 0`` leaves the state unchanged); ``T < chunk_size`` uses one chunk of ``T``.
    Raises ``ValueError`` naming ``chunk_size`` unless it is a positive int, and as :func:`delta_rule_naive` for
    bad arguments.

    Source: Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence Length", sec.
    3-4 (the UT transform); Gated DeltaNet, Yang, Kautz & Hatamizadeh 2025, sec. 3 (the decay). In a chunk with
    entering state ``S0``, ``G_i = sum_{j <= i} g_j`` (within the chunk), ``gamma_i = exp(G_i)``::

        S_i = gamma_i S0 + sum_{j <= i} exp(G_i - G_j) k_j d_j^T,  d_j = beta_j (v_j - sum_{m < j} exp(G_j - G_m)
              (k_j . k_m) d_m - gamma_j S0^T k_j)
        (I + A) D = diag(beta) V - diag(beta gamma) K S0,  A_jm = beta_j exp(G_j - G_m) k_j . k_m  (m < j)
        D = U - W S0,  U = T diag(beta) V,  W = T diag(beta gamma) K,  T = (I + A)^-1 (solve_triangular)
        O = scale ((Q K^T * decay, j <= i) D + diag(gamma) Q S0),  S_next = gamma_C S0 + (K * exp(G_C - G))^T D

    The chunk-to-chunk recurrence ``S_next = (gamma_C I - Kd^T W) S0 + Kd^T U`` is a Python loop over chunks (one
    ``(Dk, Dk) @ (Dk, Dv)`` product each); everything else is batched over chunks.

    ``doc_ids``: a document start at position ``t > 0`` zeroes the carried state (as the naive loop does). In a
    chunk, ``seg_i`` counts the document starts at or before ``i`` (inside the chunk); the intra-chunk terms keep
    only ``seg_i == seg_j`` and the entering state reaches only positions with ``seg_i == 0`` (a zero decay, as a
    mask: no ``-inf`` enters the cumulative sum of ``g``)."""
    _check_chunk_size(chunk_size)
    _check_inputs("delta_rule_chunk", q, k, v, beta, g, initial_state, doc_ids)
    _check_scale("delta_rule_chunk", scale)
    return _delta_rule_chunk_checked(q, k, v, beta, g, scale, initial_state, doc_ids, chunk_size)


def _check_chunk_size(chunk_size) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int (e.g. 64), got {chunk_size!r}")


def _delta_rule_chunk_checked(q, k, v, beta, g, scale, initial_state, doc_ids, chunk_size):
    if q.shape[1] == 0:
        return _empty(q, v, initial_state)
    if not torch.amp.is_autocast_available(q.device.type):  # meta (shapes only): torch.autocast refuses the device
        return _delta_rule_chunk(q, k, v, beta, g, scale, initial_state, doc_ids, chunk_size)
    with torch.autocast(device_type=q.device.type, enabled=False):  # fp32 products under bf16-mixed too
        return _delta_rule_chunk(q, k, v, beta, g, scale, initial_state, doc_ids, chunk_size)


def _delta_rule_chunk(q, k, v, beta, g, scale, initial_state, doc_ids, chunk_size):
    Bsz, T, H, Dk = q.shape
    Dv = v.shape[-1]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = Dk ** -0.5 if scale is None else scale
    C = min(chunk_size, T)
    n = math.ceil(T / C)
    pad = n * C - T

    def chunks(x):  # (B, T, H, ...) -> (B, H, n, C, ...) in acc, zero-padded
        x = x.to(acc).movedim(1, 2)
        if pad:
            x = F.pad(x, (0, 0) * (x.dim() - 3) + (0, pad))
        return x.reshape(Bsz, H, n, C, *x.shape[3:])

    qc, kc, vc, bc = chunks(q), chunks(k), chunks(v), chunks(beta)
    dev = qc.device
    lower = torch.ones(C, C, dtype=torch.bool, device=dev).tril()
    strict = lower.clone().fill_diagonal_(False)
    if doc_ids is not None:
        st = _starts(doc_ids)
        st[:, 0] = False  # the initial state belongs to the document at position 0
        st = F.pad(st, (0, pad)).view(Bsz, 1, n, C)
        seg = st.long().cumsum(-1)  # (B, 1, n, C): document starts inside the chunk at or before i
        same = seg[..., :, None] == seg[..., None, :]
        lower, strict = lower & same, strict & same
        first = seg == 0  # reached by the entering state
        to_last = seg == seg[..., -1:]  # in the chunk's last document (reaches the next chunk)
    if g is not None:
        G = chunks(g).cumsum(-1)  # (B, H, n, C)
        diff = G[..., :, None] - G[..., None, :]
        ninf = diff.new_tensor(float("-inf"))
        dec_strict = torch.exp(torch.where(strict, diff, ninf))
        dec_lower = torch.exp(torch.where(lower, diff, ninf))
        gam = torch.exp(G)
        r_last = torch.exp(G[..., -1:] - G)
    else:
        dec_strict, dec_lower = strict.to(acc), lower.to(acc)
        gam = r_last = qc.new_ones(1, 1, 1, C)
    if doc_ids is not None:
        gam = gam * first
        r_last = r_last * to_last
    kb = kc * bc[..., None]
    A = (kb @ kc.transpose(-1, -2)) * dec_strict  # strictly lower
    rhs = torch.cat([vc * bc[..., None], kb * gam[..., None]], -1)
    UW = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)  # (I + A)^-1 rhs
    U, W = UW[..., :Dv], UW[..., Dv:]
    P = (qc @ kc.transpose(-1, -2)) * dec_lower
    Kd = (kc * r_last[..., None]).transpose(-1, -2)  # (B, H, n, Dk, C)
    M, R = Kd @ W, Kd @ U  # (B, H, n, Dk, Dk), (B, H, n, Dk, Dv)
    g_last = gam[..., -1].expand(Bsz, H, n)
    S = initial_state.to(acc) if initial_state is not None else qc.new_zeros(Bsz, H, Dk, Dv)
    states = []
    for c in range(n):
        states.append(S)
        S = g_last[:, :, c, None, None] * S - M[:, :, c] @ S + R[:, :, c]
    S_in = torch.stack(states, 2)  # (B, H, n, Dk, Dv): the state entering each chunk
    o = scale * (P @ U + (qc * gam[..., None] - P @ W) @ S_in)
    o = o.reshape(Bsz, H, n * C, Dv)[:, :, :T].movedim(1, 2)
    return o.to(q.dtype), S


def _fla(gated: bool):
    name = "fla.ops.gated_delta_rule" if gated else "fla.ops.delta_rule"
    fn = "chunk_gated_delta_rule" if gated else "chunk_delta_rule"
    try:
        return getattr(importlib.import_module(name), fn)
    except ImportError as e:
        raise ImportError(f"kernel='fla' of the {'gated_deltanet' if gated else 'deltanet'} mixer needs the "
                          f"flash-linear-attention package ({name}.{fn}): pip install flash-linear-attention "
                          f"(or use kernel='chunk' or 'naive')") from e


def _flatten_docs(doc_ids: torch.Tensor):
    """Packed rows -> fla's varlen form: ``cu_seqlens`` int32 over the flattened ``B * T`` tokens (each row's
    start is a boundary), and the indices of each row's first and last sequence."""
    Bsz, T = doc_ids.shape
    st = _starts(doc_ids).reshape(-1)
    starts = st.nonzero().flatten()
    n_seq = starts.numel()
    cu = torch.cat([starts, starts.new_tensor([Bsz * T])]).to(torch.int32)
    seq_of = st.long().cumsum(0).view(Bsz, T) - 1
    return cu, seq_of[:, 0], seq_of[:, -1], n_seq


def _fla_gated_bwd_broken() -> bool:
    """True when fla's gated backward would refuse to run (or be wrong) here: fla raises in ``chunk_bwd_dqkwg`` on
    Hopper with ``3.4.0 <= triton < 3.7.1`` (fla issue #640). Read from fla's own flags (``fla.utils.IS_NVIDIA_HOPPER``,
    ``TRITON_ABOVE_3_4_0``, ``TRITON_ABOVE_3_7_1``) when present, else from the device's compute capability and
    triton's version; no GPU kernel runs. fla's optional tilelang backend is not trusted here (fla checks an
    ``nvcc`` binary at call time): a broken combination is reported as broken."""
    try:
        import fla.utils as fu
    except ImportError:
        return True
    hopper = getattr(fu, "IS_NVIDIA_HOPPER", None)
    if hopper is None:
        hopper = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
    a34, a371 = getattr(fu, "TRITON_ABOVE_3_4_0", None), getattr(fu, "TRITON_ABOVE_3_7_1", None)
    if a34 is None or a371 is None:
        try:
            import triton
            from packaging.version import Version
            tv = Version(triton.__version__.split("+")[0])
            a34, a371 = tv >= Version("3.4.0"), tv >= Version("3.7.1")
        except Exception:  # noqa: BLE001  (no triton / unparsable version: treat as affected)
            return bool(hopper)
    return bool(hopper and a34 and not a371)


def pick_backend(q: torch.Tensor, gated: bool) -> str:
    """What ``backend="auto"`` resolves to for ``q (B, T, H, Dk)`` (see :func:`delta_rule`)."""
    if q.is_cuda:
        if q.dtype in (torch.float16, torch.bfloat16):
            try:
                _fla(gated)
                if not (gated and _fla_gated_bwd_broken()):
                    return "fla"
            except ImportError:
                pass
    return "chunk" if q.shape[1] >= CHUNK_MIN_T else "naive"


def delta_rule(q, k, v, beta, g=None, scale=None, initial_state=None, backend: str = "auto", doc_ids=None,
               chunk_size: int = 64):
    """:func:`delta_rule_naive`'s arguments and results; ``backend``:

    * ``fla``: fla's chunked Triton kernels (CUDA, float16 / bfloat16 only);
    * ``chunk``: :func:`delta_rule_chunk` (chunked PyTorch, ``chunk_size`` positions a chunk, any device / dtype);
    * ``naive``: :func:`delta_rule_naive` (the step-by-step loop);
    * ``auto``: on CUDA, ``fla`` for float16 / bfloat16 when fla imports and, for the gated rule, fla's gated
      backward is usable here (not Hopper with triton in [3.4.0, 3.7.1): fla refuses that backward, issue #640;
      see :func:`_fla_gated_bwd_broken`); otherwise (CPU, fp32, no fla, or the broken gated backward) ``chunk``
      from ``T >= CHUNK_MIN_T`` (8) positions and ``naive`` below (decode steps). Measured on CPU (fwd+bwd): the
      loop wins only below about 4 positions (a single step costs less than the chunk set-up), the chunked form
      is 2x faster at T = 8, 8x at 64, 20x at 1024.

    Raises ``ImportError`` naming the package for ``fla`` without it, ``ValueError`` naming ``backend`` for an
    unknown one or for ``fla`` with float32 inputs (fla's kernels refuse them). ``doc_ids (B, T)``: the state
    restarts at each document start; ``fla`` receives the batch flattened to one row with ``cu_seqlens`` (fla's
    varlen form). Bad arguments raise as in :func:`delta_rule_naive` (``ValueError`` naming the argument),
    ``chunk_size`` as in :func:`delta_rule_chunk` whatever the backend."""
    _check_chunk_size(chunk_size)
    _check_inputs("delta_rule", q, k, v, beta, g, initial_state, doc_ids)
    _check_scale("delta_rule", scale)
    return _delta_rule(q, k, v, beta, g, scale, initial_state, backend, doc_ids, chunk_size)


def _delta_rule(q, k, v, beta, g, scale, initial_state, backend, doc_ids, chunk_size):
    """:func:`delta_rule` on checked arguments."""
    if backend not in DELTA_BACKENDS:
        raise ValueError(f"backend={backend!r} is not supported; allowed values: {', '.join(DELTA_BACKENDS)}")
    if backend == "fla" and q.dtype not in (torch.float16, torch.bfloat16):
        _fla(g is not None)  # a missing package first (ImportError naming it)
        raise ValueError(f"backend='fla' (fla's chunked delta-rule kernels) needs float16 / bfloat16 q, k, v, got "
                         f"{q.dtype}; use backend='chunk' or 'naive' for {q.dtype}, or train with trainer=gpu "
                         f"(bf16-mixed)")
    if backend == "auto":
        backend = pick_backend(q, g is not None)
    if backend == "naive":
        return _delta_rule_naive(q, k, v, beta, g, scale, initial_state, doc_ids)
    if backend == "chunk":
        return _delta_rule_chunk_checked(q, k, v, beta, g, scale, initial_state, doc_ids, chunk_size)
    if q.shape[1] == 0:
        return _empty(q, v, initial_state)
    fn = _fla(g is not None)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"backend='fla' needs q, k, v of one dtype (float16 or bfloat16), got q {q.dtype}, "
                         f"k {k.dtype}, v {v.dtype}")
    s0 = initial_state.float() if initial_state is not None else None
    if doc_ids is not None:
        Bsz, T, H = q.shape[:3]
        cu, first, last, n_seq = _flatten_docs(doc_ids)
        if s0 is not None:  # each row's initial state goes to its first sequence
            full = s0.new_zeros(n_seq, *s0.shape[1:])
            full[first] = s0
            s0 = full
        flat = lambda t: None if t is None else t.reshape(1, Bsz * T, *t.shape[2:])  # noqa: E731
        gf = flat(g.float()) if g is not None else None
        args = (flat(q), flat(k), flat(v), flat(beta)) if g is None else (flat(q), flat(k), flat(v), gf, flat(beta))
        o, S = fn(*args, scale=scale, initial_state=s0, output_final_state=True, cu_seqlens=cu)
        return o.reshape(Bsz, T, *o.shape[2:]), S[last]
    if g is None:
        o, S = fn(q, k, v, beta, scale=scale, initial_state=s0, output_final_state=True)
    else:
        o, S = fn(q, k, v, g.float(), beta, scale=scale, initial_state=s0, output_final_state=True)
    return o, S


@dataclass
class DeltaState:
    """Decode state of one DeltaNet layer: ``S (B, H, Dk, Dv)`` fp32 and ``n`` tokens seen (host int)."""

    S: torch.Tensor
    n: int = 0

    def tokens_seen(self) -> list:
        """Tokens seen so far, per row (all ``n``)."""
        return [self.n] * self.S.shape[0]

    @property
    def nbytes(self) -> int:
        return self.S.numel() * self.S.element_size()


class _DeltaBase(nn.Module):
    gated = False

    def __init__(self, d_model: int, n_head: int, head_dim: int, kernel: str = "auto", bias: bool = False):
        super().__init__()
        if kernel not in DELTA_BACKENDS:
            raise ValueError(f"{self.mixer_name} kernel={kernel!r} is not supported; allowed values: "
                             f"{', '.join(DELTA_BACKENDS)}")
        for name, value, what in (("n_head", n_head, "the heads of the delta rule"),
                                  ("head_dim", head_dim, "the key / value width of each head")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{self.mixer_name} {name}={value!r} must be an integer >= 1 ({what})")
        if kernel == "fla":
            _fla(self.gated)  # a missing package is named when the model is built, not at its first forward
        self.n_head, self.head_dim, self.kernel = n_head, head_dim, kernel
        inner = n_head * head_dim
        self.q_proj = nn.Linear(d_model, inner, bias=bias)
        self.k_proj = nn.Linear(d_model, inner, bias=bias)
        self.v_proj = nn.Linear(d_model, inner, bias=bias)
        self.b_proj = nn.Linear(d_model, n_head, bias=True)
        self.o_norm_weight = nn.Parameter(torch.ones(head_dim))
        self.out_proj = nn.Linear(inner, d_model, bias=bias)
        if self.gated:
            # Mamba-2's gate init (Dao & Gu 2024; Gated DeltaNet, Yang et al. 2025, reuses it): dt log-uniform in
            # [1e-3, 1e-1] through softplus^-1 in dt_bias, so alpha = exp(-A dt) starts near 1 (a memory of ~10-1000
            # positions). Without dt_bias, softplus(W_a x) ~ 0.69 gave alpha ~ exp(-0.69 A) ~ 3e-3 for A ~ 8: a state
            # that forgot every token at once, and no recall was learned (MQAR 0.000 at d 128 / 256 on the H200).
            self.a_proj = nn.Linear(d_model, n_head, bias=False)
            dt = torch.exp(torch.rand(n_head) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
            self.A_log = nn.Parameter(torch.log(torch.empty(n_head).uniform_(1, 16)))
            self.g_proj = nn.Linear(d_model, inner, bias=bias)  # output gate

    @property
    def mixer_name(self) -> str:
        return next(name for name, gated in MIXER_GATED.items() if gated == self.gated)

    def new_cache(self, batch_size: int, capacity: int, dtype: torch.dtype, device, page_size=None,
                  shuffle_pages: bool = False) -> DeltaState:
        """An empty decode state (fixed size; ``capacity`` / paging do not apply)."""
        return DeltaState(torch.zeros(batch_size, self.n_head, self.head_dim, self.head_dim, dtype=torch.float32,
                                      device=device), 0)

    def forward(self, x: torch.Tensor, cache: Optional[DeltaState] = None, pos: int = 0,
                doc_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x (B, T, d_model)``; ``doc_ids (B, T)`` int or None: packed documents, the state restarts at each
        document start (with a cache, the cached state belongs to the document at position 0 of ``x``)."""
        Bsz, T, _ = x.shape
        if doc_ids is not None and tuple(doc_ids.shape) != (Bsz, T):
            raise ValueError(f"{self.mixer_name} doc_ids must have shape (B, T) = {(Bsz, T)}, "
                             f"got {tuple(doc_ids.shape)}")
        shp = (Bsz, T, self.n_head, self.head_dim)
        q = F.normalize(F.silu(self.q_proj(x)).view(shp), dim=-1)
        k = F.normalize(F.silu(self.k_proj(x)).view(shp), dim=-1)
        v = F.silu(self.v_proj(x)).view(shp)
        # CUDA autocast runs normalize in float32 (torch.amp's float32 list) while v keeps the autocast dtype:
        # q, k back to v's dtype, so that auto sees bf16 under bf16-mixed (fla, as documented) and kernel='fla' runs
        q, k = q.to(v.dtype), k.to(v.dtype)
        beta = torch.sigmoid(self.b_proj(x).float())
        g = (-torch.exp(self.A_log.float()) * F.softplus(self.a_proj(x).float() + self.dt_bias.float())
             if self.gated else None)
        s0 = cache.S if cache is not None and cache.n > 0 else None
        beta = beta.to(q.dtype)
        _check_inputs(self.mixer_name, q, k, v, beta, g, s0, doc_ids, check_g=False)  # g <= 0 by construction
        o, S = _delta_rule(q, k, v, beta, g, None, s0, self.kernel, doc_ids, 64)
        if cache is not None:
            cache.S, cache.n = S.detach().float(), cache.n + T
        of = o.float()
        o = (of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.o_norm_weight
        if self.gated:
            o = o * F.silu(self.g_proj(x)).view(shp)
        return self.out_proj(o.reshape(Bsz, T, -1))


@register_mixer("deltanet", causal=True)
class DeltaNet(_DeltaBase):
    """DeltaNet mixer ``(B, N, d_model) -> (B, N, d_model)``: ``n_head`` heads of ``head_dim`` (the model's);
    SiLU + L2-normalized ``q, k``, ``beta = sigmoid(W_b x)``, per-head RMSNorm of the output; ``kernel``
    ``auto`` | ``fla`` | ``chunk`` | ``naive`` (:func:`delta_rule`'s ``backend``; the model's attention backend does not
    apply). Decodes from an O(1) :class:`DeltaState`."""


@register_mixer("gated_deltanet", causal=True)
class GatedDeltaNet(_DeltaBase):
    """Gated DeltaNet mixer: DeltaNet plus the decay ``alpha_t = exp(-exp(A_log) * softplus(W_a x + dt_bias))`` per
    head (Mamba-2's gate and its init: ``dt_bias = softplus^-1(dt)``, ``dt`` log-uniform in [1e-3, 1e-1], ``A`` in
    [1, 16]) and a SiLU output gate."""

    gated = True

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # checkpoints from before 2026-12-04 hold the gate's offset as a_proj.bias (softplus(W_a x + b)); it is
        # dt_bias now (a_proj has no bias), the same function: move it, so old runs resume and evaluate unchanged
        old, new = prefix + "a_proj.bias", prefix + "dt_bias"
        if old in state_dict and new not in state_dict:
            state_dict[new] = state_dict.pop(old)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
