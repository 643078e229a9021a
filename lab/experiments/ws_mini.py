"""Single-loop exact-attention kernels used by ``probe_ws.py`` (an experiment, not used by the library).

``mini_fwd``: non-causal forward (``CAUSAL`` keeps only the full tiles below the diagonal); ``mini_dkdv``:
non-causal dK/dV. K/V (and Q, dO) are read through device-side TMA descriptors (``tl.make_tensor_descriptor``,
needs ``triton.set_allocator``); ``WS`` turns on Triton's automatic warp specialisation of the loop
(``tl.range(..., warp_specialize=True)``). q, k, v: ``(B*H, N, D)`` rows, ``N`` a multiple of the tiles.
H200 result (``results/h200/probe/probe_ws.json``, docs/kernels.md): warp specialisation compiled only at 4 warps
and gave wrong results (NaN) in several configs with triton 3.6; the TMA loads alone were faster than our
pointer loads, which led to the TMA path of ``kernels/flash/``.
"""
import triton, triton.language as tl
@triton.jit
def mini_fwd(Q, K, V, Out, Lse, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_on,
             N, qk_scale, HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr,
             CAUSAL: tl.constexpr):
    mblk = tl.num_programs(0) - 1 - tl.program_id(0)
    h = tl.program_id(1)
    start_m = mblk * BLOCK_M
    Qb = Q + h.to(tl.int64) * stride_qh
    Kb = K + h.to(tl.int64) * stride_kh
    Vb = V + h.to(tl.int64) * stride_vh
    desc_q = tl.make_tensor_descriptor(Qb, shape=[N, HEAD_D], strides=[stride_qn, 1], block_shape=[BLOCK_M, HEAD_D])
    desc_k = tl.make_tensor_descriptor(Kb, shape=[N, HEAD_D], strides=[stride_kn, 1], block_shape=[BLOCK_N, HEAD_D])
    desc_v = tl.make_tensor_descriptor(Vb, shape=[N, HEAD_D], strides=[stride_vn, 1], block_shape=[BLOCK_N, HEAD_D])
    q = desc_q.load([start_m, 0])
    acc = tl.zeros([BLOCK_M, HEAD_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    if CAUSAL:
        hi = start_m  # full tiles only below diagonal (BLOCK_M multiple of BLOCK_N)
    else:
        hi = N
    for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=WS):
        k = desc_k.load([start_n, 0]).T
        v = desc_v.load([start_n, 0])
        qk = tl.dot(q, k)
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    acc = acc / l_i[:, None]
    offs_m = start_m + tl.arange(0, BLOCK_M)
    tl.store(Lse + h.to(tl.int64) * N + offs_m, m_i + tl.math.log2(l_i))
    desc_o = tl.make_tensor_descriptor(Out + h.to(tl.int64) * stride_oh, shape=[N, HEAD_D], strides=[stride_on, 1], block_shape=[BLOCK_M, HEAD_D])
    desc_o.store([start_m, 0], acc.to(Out.dtype.element_ty))


@triton.jit
def mini_dkdv(Q, K, V, DO, Lse2, Delta, DK, DV, stride_h, stride_n, N, qk_scale, sm_scale,
              HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr):
    # non-causal dK/dV for one key tile; Lse2 is lse * log2(e) per row; all of q,k,v,do,dk,dv share strides
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    off = bh.to(tl.int64) * stride_h
    desc_q = tl.make_tensor_descriptor(Q + off, shape=[N, HEAD_D], strides=[stride_n, 1], block_shape=[BLOCK_M, HEAD_D])
    desc_do = tl.make_tensor_descriptor(DO + off, shape=[N, HEAD_D], strides=[stride_n, 1], block_shape=[BLOCK_M, HEAD_D])
    desc_k = tl.make_tensor_descriptor(K + off, shape=[N, HEAD_D], strides=[stride_n, 1], block_shape=[BLOCK_N, HEAD_D])
    desc_v = tl.make_tensor_descriptor(V + off, shape=[N, HEAD_D], strides=[stride_n, 1], block_shape=[BLOCK_N, HEAD_D])
    desc_l = tl.make_tensor_descriptor(Lse2 + bh.to(tl.int64) * N, shape=[N], strides=[1], block_shape=[BLOCK_M])
    desc_d = tl.make_tensor_descriptor(Delta + bh.to(tl.int64) * N, shape=[N], strides=[1], block_shape=[BLOCK_M])
    k = desc_k.load([start_n, 0])
    v = desc_v.load([start_n, 0])
    dk = tl.zeros([BLOCK_N, HEAD_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_D], dtype=tl.float32)
    for start_m in tl.range(0, N, BLOCK_M, warp_specialize=WS):
        q = desc_q.load([start_m, 0])
        do = desc_do.load([start_m, 0])
        lse2 = desc_l.load([start_m])
        delta = desc_d.load([start_m])
        qkT = tl.dot(k, q.T)
        pT = tl.math.exp2(qkT * qk_scale - lse2[None, :])
        dv = tl.dot(pT.to(do.dtype), do, dv)
        dpT = tl.dot(v, do.T)
        dsT = pT * (dpT - delta[None, :])
        dk = tl.dot(dsT.to(q.dtype), q, dk)
    dk = dk * sm_scale
    tl.make_tensor_descriptor(DK + off, shape=[N, HEAD_D], strides=[stride_n, 1], block_shape=[BLOCK_N, HEAD_D]).store(
        [start_n, 0], dk.to(DK.dtype.element_ty))
    tl.make_tensor_descriptor(DV + off, shape=[N, HEAD_D], strides=[stride_n, 1], block_shape=[BLOCK_N, HEAD_D]).store(
        [start_n, 0], dv.to(DV.dtype.element_ty))
