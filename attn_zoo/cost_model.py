"""Analytic cost model of attention: FLOPs, HBM bytes read / written, on-chip (SRAM) working set, memory
footprint, KV-cache size and a roofline.

Everything here is arithmetic on shapes (no tensors, no device): it answers "how much work and how much
memory traffic does this variant need at this length", so that measured times can be placed on a roofline
and measured crossovers can be compared with the ones the model predicts.

Conventions
    * A multiply-add is 2 FLOPs; an ``(m, k) @ (k, n)`` matmul is ``2 m n k`` FLOPs.
    * Elementwise operations count 1 FLOP each (``exp`` included): see the ``*_FLOPS`` constants.
    * Bytes are HBM (device memory) bytes, split into read and written; ``dtype_bytes`` is the element size of
      q, k, v, o and of materialised score matrices (2 for fp16 / bf16); softmax statistics (``lse``, ``m``,
      ``l``, ``Delta``) are fp32 (4 bytes).
    * Shapes follow the package: q ``(B, Hq, Nq, D)``, k / v ``(B, Hkv, Nk, D)``; ``H`` is ``Hq`` and ``Hkv``
      (default ``H``: MHA) must divide it. The models below count per *query* head, and per *K/V* head what
      exists once per K/V head: K and V themselves and their gradients dK, dV (the compulsory bytes, the
      footprint), the chunked linear form's K / V reads, and the backward's K/V read and dK/dV write of the FA2
      loop order (our dK/dV kernel loops over the query heads of its group: K/V loaded once, dK/dV summed in
      registers). The K/V tiles the loops re-read stay per query head, as the kernels do (a program per query
      head; cross-head reuse through L2 is not modelled). KV cache: :func:`kv_cache_bytes_per_token`.
    * ``mode``: ``"fwd"``, ``"bwd"`` or ``"fwd_bwd"``.

Sources
    [FA1] Dao, Fu, Ermon, Rudra, Re, "FlashAttention: Fast and Memory-Efficient Exact Attention with
        IO-Awareness", NeurIPS 2022. Algorithm 0 (standard attention), Algorithm 1 / 2 (FlashAttention
        forward), Appendix B.2 Algorithm 3 / 4 (standard / FlashAttention backward), Theorem 2
        (``Theta(N^2 d^2 / M)`` HBM accesses for SRAM size ``M``), Figure 2 (GPT-2 medium bill).
    [FA2] Dao, "FlashAttention-2", 2023 (loop order: outer over query blocks in the forward, over key
        blocks in the backward; ``4 N^2 d`` forward, ``2.5 x`` backward FLOP convention).
    [LIN] Katharopoulos et al., "Transformers are RNNs", ICML 2020; chunked form as in Yang et al.,
        "Gated Linear Attention", ICML 2024, section 2.
    [GQA] Ainslie et al. 2023; [MQA] Shazeer 2019: KV cache ``2 * layers * Hkv * d * bytes`` per token.
    [ROOF] Williams, Waterman, Patterson, "Roofline", CACM 2009: attainable = ``min(peak, I * bandwidth)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Dict, Optional, Tuple

MODES = ("fwd", "bwd", "fwd_bwd")
STAT_BYTES = 4  # fp32 softmax statistics (lse, m, l, Delta)

# Elementwise FLOPs per score element.
SOFTMAX_FLOPS = 3  # exp, row-sum add, normalising multiply: the textbook count of softmax arithmetic
SOFTMAX_STABLE_FLOPS = 5  # + row max and the subtraction of the max (what every real kernel does)
SOFTMAX_BWD_FLOPS = 4  # dS = P * (dP - rowsum(P * dP)): multiply, add (row sum), subtract, multiply
FLASH_RECOMPUTE_FLOPS = 3  # backward: P = exp(scale * S - lse): scale, subtract, exp
FLASH_BWD_DS_FLOPS = 2  # dS = P * (dP - Delta): subtract, multiply (Delta = rowsum(dO * O) is O(N d))
DROPOUT_FLOPS = 1  # multiply by mask / (1 - p), forward and backward each
BWD_FACTOR = 2.5  # benchmark convention (FlashAttention papers): backward = 2.5x the forward matmul FLOPs


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not supported; allowed values: {', '.join(MODES)}")


def _pos_int(name: str, x) -> int:
    if not isinstance(x, (int,)) or isinstance(x, bool) or x < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {x!r}")
    return int(x)


def _kv_ratio(H: int, Hkv: Optional[int], name: str = "Hkv") -> float:
    """``Hkv / H``: the share of a query head's K/V terms (1.0 for MHA, ``Hkv=None``). Raises ``ValueError`` naming
    ``name`` and the allowed values (the divisors of ``H``)."""
    if Hkv is None:
        return 1.0
    if isinstance(Hkv, bool) or not isinstance(Hkv, int) or Hkv < 1 or H % Hkv:
        allowed = ", ".join(str(d) for d in range(1, H + 1) if H % d == 0) if isinstance(H, int) and H >= 1 else "-"
        raise ValueError(f"{name}={Hkv!r} is not supported: the K/V heads must divide the query heads H={H!r}; "
                         f"allowed values: {allowed} (or None: H, i.e. MHA)")
    return Hkv / H


# --------------------------------------------------------------------------------------------- Cost
@dataclass(frozen=True)
class Cost:
    """Work and traffic of one operation.

    flops: floating-point operations. hbm_read / hbm_write: bytes moved from / to device memory.
    sram_bytes: on-chip working set of one thread block (shared memory + accumulators), bytes; for a
        sequence of kernels, the largest. min_bytes: compulsory traffic (every input read once, every output
        written once; the floor no kernel beats, and what a kernel with perfect L2 reuse approaches; 0 =
        same as hbm_bytes). footprint_bytes: device memory the operation holds at its peak
        beyond its inputs (materialised score matrices, saved statistics, outputs, gradients).
    detail: free-form breakdown (name -> value) for reports.
    """

    flops: float = 0.0
    hbm_read: float = 0.0
    hbm_write: float = 0.0
    sram_bytes: float = 0.0
    footprint_bytes: float = 0.0
    min_bytes: float = 0.0
    detail: Dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def hbm_bytes(self) -> float:
        """Bytes read plus bytes written."""
        return self.hbm_read + self.hbm_write

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per HBM byte (``inf`` when no bytes move)."""
        return self.flops / self.hbm_bytes if self.hbm_bytes > 0 else math.inf

    def __add__(self, other: "Cost") -> "Cost":
        d = dict(self.detail)
        for k, v in other.detail.items():
            d[k] = d.get(k, 0.0) + v
        return Cost(self.flops + other.flops, self.hbm_read + other.hbm_read, self.hbm_write + other.hbm_write,
                    max(self.sram_bytes, other.sram_bytes), max(self.footprint_bytes, other.footprint_bytes),
                    self.compulsory_bytes + other.compulsory_bytes, d)

    @property
    def compulsory_bytes(self) -> float:
        """Compulsory HBM bytes (``min_bytes``, or ``hbm_bytes`` when not set)."""
        return self.min_bytes if self.min_bytes > 0 else self.hbm_bytes

    def scale(self, factor: float) -> "Cost":
        """Multiply FLOPs, bytes and footprint by ``factor`` (e.g. batch x heads); SRAM is per block."""
        return Cost(self.flops * factor, self.hbm_read * factor, self.hbm_write * factor, self.sram_bytes,
                    self.footprint_bytes * factor, self.min_bytes * factor,
                    {k: v * factor for k, v in self.detail.items()})

    def as_dict(self) -> Dict[str, float]:
        return {"flops": self.flops, "hbm_read": self.hbm_read, "hbm_write": self.hbm_write,
                "hbm_bytes": self.hbm_bytes, "intensity": self.intensity, "sram_bytes": self.sram_bytes,
                "footprint_bytes": self.footprint_bytes, "compulsory_bytes": self.compulsory_bytes}


# --------------------------------------------------------------------------------------------- building blocks
def matmul_cost(m: int, n: int, k: int, in_bytes: int = 2, out_bytes: int = 2, batch: int = 1) -> Cost:
    """``(m, k) @ (k, n)``, each operand read once, the output written once (an ideal GEMM).

    FLOPs ``2 m n k``; read ``(m k + k n) in_bytes``; write ``m n out_bytes``. Example: ``Q K^T`` at
    ``n = d = 4096`` is ``2 * 4096^3 = 1.37e11`` FLOPs; with fp16 operands and an fp32 score matrix it moves
    ``2 * 2 n d + 4 n^2 = 8 n^2`` bytes, intensity ``n / 4 = 1024`` FLOP/byte (``n / 3 = 1365`` with an fp16
    output): compute-bound on every GPU.
    """
    flops = 2.0 * m * n * k * batch
    return Cost(flops, float(m * k + k * n) * in_bytes * batch, float(m * n) * out_bytes * batch,
                detail={"matmul_flops": flops})


def softmax_cost(rows: int, cols: int, in_bytes: int = 2, out_bytes: int = 2,
                 flops_per_element: int = SOFTMAX_FLOPS) -> Cost:
    """Row softmax of a ``(rows, cols)`` matrix that lives in HBM: read once, written once.

    Intensity ``flops_per_element / (in_bytes + out_bytes)``: ``3 / 4 = 0.75`` FLOP/byte for fp16 with the
    textbook 3 FLOPs (exp, sum, divide); ``5 / 4 = 1.25`` counting the stable form's max and subtract.
    Either is two orders of magnitude under any GPU's ridge point: softmax is memory-bound [FA1, sec. 2.1].
    """
    e = float(rows) * cols
    return Cost(flops_per_element * e, e * in_bytes, e * out_bytes)


def score_matrix_bytes(n: int, dtype_bytes: int = 2, n_matrices: int = 2, nk: Optional[int] = None) -> float:
    """Bytes of materialised ``n x nk`` score matrices per (batch, head): S and P by default.

    fp16 S + P = ``4 n^2`` bytes: 4 MiB at n = 1024, 16 MiB at 2048, ..., 4 GiB at n = 32768 -- per head and
    batch element, which is why standard attention runs out of memory at long context.
    """
    nk = n if nk is None else nk
    return float(n_matrices) * n * nk * dtype_bytes


# --------------------------------------------------------------------------------------------- standard
def standard_attention_cost(
    B: int, H: int, N: int, D: int, Nk: Optional[int] = None, Dv: Optional[int] = None, dtype_bytes: int = 2,
    mode: str = "fwd_bwd", causal: bool = False, mask_pass: bool = False, dropout: bool = False,
) -> Cost:
    """Standard attention that materialises S and P in HBM [FA1 Algorithm 0 and Algorithm 3].

    Per (batch, query head), with ``e = dtype_bytes``, ``M = N * Nk`` score elements:

    forward
        ``S = Q K^T`` (read Q, K; write S), ``P = softmax(S)`` (read S, write P), ``O = P V`` (read P, V;
        write O): reads ``2 M + (N + Nk) D + Nk Dv``, writes ``2 M + N Dv`` elements.
        ``mask_pass``: the mask (causal or otherwise) is applied by its own elementwise kernel
        (``masked_fill``): one more read and write of S. ``dropout``: ``P_drop = dropout(P)`` is its own
        kernel: read P, write P_drop and a 1-byte keep mask; ``P V`` then reads ``P_drop``.
        Causal standard attention still computes the full matrices (it masks, it does not skip).
    backward
        ``dV = P^T dO`` (read P, dO), ``dP = dO V^T`` (write dP), [dropout: read dP, mask; write dP],
        ``dS = P * (dP - rowsum(P * dP))`` (read P, dP; write dS), [mask_pass: read dS, write dS],
        ``dQ = dS K``, ``dK = dS^T Q`` (read dS twice): 7 ``M`` element transfers without options.

    FLOPs: forward ``2 N Nk (D + Dv)`` plus ``SOFTMAX_STABLE_FLOPS`` per element; backward ``4 N Nk D +
    4 N Nk Dv``-equivalent (four matmuls) plus ``SOFTMAX_BWD_FLOPS`` per element; dropout 1 per element each
    way. Footprint: forward holds S and P (``2 M e``); training keeps P (and P_drop) for the backward, which
    then holds dP and dS too. SRAM: GEMM tiles only (reported as 0: not a function of N).
    """
    _check_mode(mode)
    Nk = N if Nk is None else Nk
    Dv = D if Dv is None else Dv
    e = float(dtype_bytes)
    M = float(N) * Nk
    fr = fw = fl = 0.0
    if mode in ("fwd", "fwd_bwd"):
        fl += 2.0 * M * (D + Dv) + SOFTMAX_STABLE_FLOPS * M
        fr += (N * D + Nk * D) * e            # S = Q K^T
        fw += M * e
        if mask_pass:
            fr += M * e; fw += M * e
        fr += M * e; fw += M * e              # softmax
        if dropout:
            fr += M * e; fw += M * e + M      # P_drop + 1-byte keep mask
            fl += DROPOUT_FLOPS * M
        fr += M * e + Nk * Dv * e             # O = P V
        fw += N * Dv * e
    if mode in ("bwd", "fwd_bwd"):
        fl += 2.0 * M * Dv * 2 + 2.0 * M * D * 2 + SOFTMAX_BWD_FLOPS * M
        fr += M * e + N * Dv * e; fw += Nk * Dv * e          # dV = P^T dO
        fr += N * Dv * e + Nk * Dv * e; fw += M * e          # dP = dO V^T
        if dropout:
            fr += M * e + M; fw += M * e                     # dP = dP_drop * keep / (1 - p)
            fl += DROPOUT_FLOPS * M
        fr += 2 * M * e; fw += M * e                         # dS = P * (dP - rowsum(P dP))
        if mask_pass:
            fr += M * e; fw += M * e                         # masked_fill backward
        fr += M * e + Nk * D * e; fw += N * D * e            # dQ = dS K
        fr += M * e + N * D * e; fw += Nk * D * e            # dK = dS^T Q
    n_saved = 2 + (1 if dropout else 0)
    footprint = (n_saved + (2 if mode != "fwd" else 0)) * M * e + (N * Dv) * e
    c = Cost(fl, fr, fw, 0.0, footprint, 0.0,
             {"score_elements": M, "matmul_flops": (2.0 * M * (D + Dv) if mode != "bwd" else 0.0)
              + (4.0 * M * (D + Dv) if mode != "fwd" else 0.0)})
    return c.scale(B * H)


# --------------------------------------------------------------------------------------------- flash
def flash_block_sizes(D: int, sram_bytes: float, dtype_bytes: int = 2) -> Tuple[int, int]:
    """``(B_r, B_c)`` of [FA1 Algorithm 1, line 1]: ``B_c = ceil(M / 4d)``, ``B_r = min(ceil(M / 4d), d)``
    with ``M = sram_bytes / dtype_bytes`` elements of SRAM."""
    M = sram_bytes / dtype_bytes
    bc = int(math.ceil(M / (4 * D)))
    return min(bc, D), bc


def flash_attention_cost(
    B: int, H: int, N: int, D: int, Nk: Optional[int] = None, Dv: Optional[int] = None, dtype_bytes: int = 2,
    mode: str = "fwd_bwd", causal: bool = False, visited_fraction: Optional[float] = None,
    sram_bytes: Optional[float] = None, block_m: Optional[int] = None, block_n: Optional[int] = None,
    loop_order: str = "fa2", dropout: bool = False, Hkv: Optional[int] = None,
) -> Cost:
    """Tiled exact attention (FlashAttention): S and P never reach HBM; the backward recomputes them.

    Block sizes: ``block_m = B_r`` (query rows), ``block_n = B_c`` (key columns); given directly, or from the
    SRAM size ``sram_bytes`` by :func:`flash_block_sizes` (FA1's rule). ``T_r = ceil(N / B_r)``,
    ``T_c = ceil(Nk / B_c)``. ``visited_fraction`` (default 1, or ~1/2 when ``causal``) is the fraction of
    (query block, key block) tiles the mask visits: window / block-sparse / causal kernels skip the rest.

    HBM traffic (elements, per (batch, head); f = visited fraction):

    ``loop_order="fa1"`` [FA1 Algorithm 1 / 4, outer loop over K/V blocks]: forward writes the initial
        O, l, m; reads K, V once; per visited tile reads Q_i, O_i, l_i, m_i and writes O_i, l_i, m_i:
        ``N Dv + Nk (D + Dv) + f T_c (N D + 2 N Dv)`` + statistics. Backward: writes zero dQ, dK, dV; reads K,
        V once; per visited tile reads Q_i, O_i, dO_i, dQ_i, l_i, m_i and writes dQ_i; writes dK, dV:
        ``(N D + 2 Nk D) + 2 Nk D + f T_c (N D + 3 N Dv + 2 N D)`` + statistics. With ``T_c = ceil(4 N d / M)``
        this is Theorem 2's ``Theta(N^2 d^2 / M)``.
    ``loop_order="fa2"`` [FA2; the package's Triton kernel]: forward reads each Q block once and, per
        visited key block, that K/V block: ``N D + f T_r Nk (D + Dv) + N Dv`` + lse. Backward: one pass
        ``Delta = rowsum(dO * O)``, then an outer loop over key blocks reading K, V once, and per visited tile
        Q_i, dO_i, lse_i, Delta_i and an fp32 read-modify-write of dQ_i; writes dK, dV once.

    FLOPs: forward ``2 f N Nk (D + Dv)`` + ``SOFTMAX_STABLE_FLOPS`` per visited element (+ the O rescale,
    ``2 Dv`` per row per tile); backward recomputes S: ``2 f N Nk (2 D + 3 Dv)``-equivalent (five matmuls:
    S, dV, dP, dQ, dK) + recompute / dS elementwise. For ``D = Dv`` that is the FA2 convention
    ``4 N^2 d`` / ``10 N^2 d`` (x f) plus O(N^2) elementwise. SRAM: Q, K, V tiles in ``dtype_bytes``, the
    fp32 O accumulator and the fp32 S/P tile. Footprint: O and lse (forward); + dQ, dK, dV (backward).

    ``Hkv`` (GQA / MQA; default ``H``): K, V and dK, dV exist once per K/V head, so the compulsory bytes, the
    footprint's dK, dV and (FA2 order) the backward's K/V-once read and dK/dV write count ``Hkv`` heads; the
    tiles each query head's loop reads stay per query head. ``detail["kv_bytes"]``: the bytes of K and V.
    """
    _check_mode(mode)
    if loop_order not in ("fa1", "fa2"):
        raise ValueError(f"loop_order={loop_order!r} is not supported; allowed values: fa1, fa2")
    g = _kv_ratio(H, Hkv)  # K/V heads per query head: the share of the per-K/V-head terms
    Nk = N if Nk is None else Nk
    Dv = D if Dv is None else Dv
    if block_m is None or block_n is None:
        if sram_bytes is None:
            bm, bn = 128, 64
        else:
            bm, bn = flash_block_sizes(D, sram_bytes, dtype_bytes)
        block_m = bm if block_m is None else block_m
        block_n = bn if block_n is None else block_n
    if visited_fraction is None:
        visited_fraction = causal_visited_fraction(N, Nk, block_m, block_n) if causal else 1.0
    f = float(visited_fraction)
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"visited_fraction must lie in [0, 1], got {visited_fraction!r}")
    e, s = float(dtype_bytes), float(STAT_BYTES)
    Tr, Tc = math.ceil(N / block_m), math.ceil(Nk / block_n)
    M = float(N) * Nk * f
    fr = fw = fl = 0.0
    if mode in ("fwd", "fwd_bwd"):
        fl += 2.0 * M * (D + Dv) + SOFTMAX_STABLE_FLOPS * M + 2.0 * N * Dv * f * Tc
        if dropout:
            fl += DROPOUT_FLOPS * M
        if loop_order == "fa1":
            fw += N * Dv * e + 2 * N * s                          # initialise O, l, m
            fr += Nk * (D + Dv) * e                               # K_j, V_j once
            fr += f * Tc * (N * D * e + N * Dv * e + 2 * N * s)   # Q_i, O_i, l_i, m_i per tile
            fw += f * Tc * (N * Dv * e + 2 * N * s)               # O_i, l_i, m_i per tile
        else:
            fr += N * D * e + f * Tr * Nk * (D + Dv) * e
            fw += N * Dv * e + N * s
    if mode in ("bwd", "fwd_bwd"):
        fl += 2.0 * M * (2 * D + 3 * Dv) + (FLASH_RECOMPUTE_FLOPS + FLASH_BWD_DS_FLOPS) * M + 2.0 * N * Dv
        if dropout:
            fl += 2 * DROPOUT_FLOPS * M
        if loop_order == "fa1":
            fw += (N * D + Nk * D + Nk * Dv) * e                  # initialise dQ, dK, dV
            fr += Nk * (D + Dv) * e                               # K_j, V_j once
            fr += f * Tc * (N * D * e + 2 * N * Dv * e + N * D * e + 2 * N * s)  # Q, O, dO, dQ, l, m
            fw += f * Tc * N * D * e                              # dQ_i
            fw += Nk * (D + Dv) * e                               # dK_j, dV_j
        else:
            fr += 2 * N * Dv * e; fw += N * s                     # Delta = rowsum(dO * O)
            fr += g * Nk * (D + Dv) * e                           # K_j, V_j once (per K/V head)
            fr += f * Tc * (N * D * e + N * Dv * e + 2 * N * s)   # Q_i, dO_i, lse_i, Delta_i per tile
            fr += f * Tc * N * D * s; fw += f * Tc * N * D * s    # fp32 dQ accumulate per tile
            fw += g * Nk * (D + Dv) * e + N * D * e               # dK, dV (per K/V head), final dQ cast
    sram = (block_m * D + block_n * (D + Dv)) * e + block_m * Dv * 4 + block_m * block_n * 4 + 2 * block_m * s
    kv = g * Nk * (D + Dv)  # elements of K and V (or dK and dV) per query head's share
    footprint = N * Dv * e + N * s + ((N * D + kv) * e if mode != "fwd" else 0.0)
    io_fwd = (N * D + kv + N * Dv) * e + N * s  # Q, K, V in; O, lse out
    io_bwd = (N * D + kv + 2 * N * Dv) * e + N * s + (N * D + kv) * e  # + dO in; grads out
    compulsory = (io_fwd if mode != "bwd" else 0.0) + (io_bwd if mode != "fwd" else 0.0)
    c = Cost(fl, fr, fw, sram, footprint, compulsory,
             {"score_elements": M, "Tr": Tr, "Tc": Tc, "block_m": block_m, "block_n": block_n,
              "visited_fraction": f, "kv_bytes": kv * e})
    out = c.scale(B * H)
    # per-block quantities are not batch-scaled
    out.detail.update({"Tr": Tr, "Tc": Tc, "block_m": block_m, "block_n": block_n, "visited_fraction": f})
    return out


def causal_visited_fraction(N: int, Nk: Optional[int] = None, block_m: int = 1, block_n: int = 1) -> float:
    """Fraction of ``(block_m x block_n)`` tiles a bottom-right causal mask visits (-> 1/2 for large N)."""
    Nk = N if Nk is None else Nk
    off = Nk - N
    Tr, Tc = math.ceil(N / block_m), math.ceil(Nk / block_n)
    visited = 0
    for i in range(Tr):
        last_row = min((i + 1) * block_m, N) - 1 + off  # absolute position of the block's last query
        if last_row < 0:
            continue
        visited += min(Tc, last_row // block_n + 1)
    return visited / (Tr * Tc)


def window_visited_fraction(N: int, window: int, causal: bool = True, block_m: int = 1, block_n: int = 1) -> float:
    """Fraction of tiles a sliding window of ``window`` tokens (query and ``window - 1`` before it; both
    sides when not ``causal``) visits, ``Nq = Nk = N``. With 1x1 tiles this is the element fraction:
    ``(W (W + 1) / 2 + (N - W) W) / N^2`` for causal ``N >= W``, i.e. ``~ W / N``."""
    _pos_int("window", window)
    Tr, Tc = math.ceil(N / block_m), math.ceil(N / block_n)
    visited = 0
    for i in range(Tr):
        r0, r1 = i * block_m, min((i + 1) * block_m, N) - 1
        lo = max(0, r0 - (window - 1))
        hi = r1 if causal else min(N - 1, r1 + window - 1)
        visited += hi // block_n - lo // block_n + 1
    return visited / (Tr * Tc)


def window_attention_cost(B: int, H: int, N: int, D: int, window: int, causal: bool = True,
                          block_m: int = 128, block_n: int = 64, **kw) -> Cost:
    """Sliding-window attention [Longformer]: :func:`flash_attention_cost` over the tiles the window visits
    (:func:`window_visited_fraction`): FLOPs and K/V traffic grow as ``N * W`` instead of ``N^2``."""
    f = window_visited_fraction(N, window, causal, block_m, block_n)
    return flash_attention_cost(B, H, N, D, visited_fraction=f, block_m=block_m, block_n=block_n, **kw)


def block_sparse_attention_cost(B: int, H: int, N: int, D: int, visited_fraction: float,
                                block_m: int = 128, block_n: int = 64, **kw) -> Cost:
    """Block-sparse softmax attention (BigBird / strided): :func:`flash_attention_cost` at the layout's
    visited tile fraction (``MaskInfo.block_table(...).visited.float().mean()``, see :func:`mask_fractions`)."""
    return flash_attention_cost(B, H, N, D, visited_fraction=visited_fraction, block_m=block_m,
                                block_n=block_n, **kw)


def mask_fractions(spec, N: int, block_m: int = 128, block_n: int = 64, Nk: Optional[int] = None,
                   elements: bool = True) -> Dict[str, float]:
    """Element fraction and visited-tile fraction of a softmax spec's mask (from :mod:`attn_zoo.masks`).

    Returns ``{"element_fraction", "visited_fraction", "full_fraction"}``. The element fraction evaluates the
    element rule in row chunks of at most 2^24 elements (``elements=False`` skips it: NaN).
    """
    from .masks import mask_info  # local import: the rest of the module needs no torch

    Nk = N if Nk is None else Nk
    mi = mask_info(spec, N, Nk)
    bt = mi.block_table(block_m, block_n)
    import torch

    allowed = 0
    step = max(1, (1 << 24) // max(Nk, 1))
    j = torch.arange(Nk).view(1, -1)
    for r0 in range(0, N if elements else 0, step):
        i = torch.arange(r0, min(N, r0 + step)).view(-1, 1)
        allowed += int(mi.allowed(i, j).sum())
    return {"element_fraction": allowed / (N * Nk) if elements else float("nan"),
            "visited_fraction": float(bt.visited.float().mean()),
            "full_fraction": float(bt.full.float().mean())}


# --------------------------------------------------------------------------------------------- linear
def linear_attention_cost(
    B: int, H: int, N: int, D: int, F: Optional[int] = None, Dv: Optional[int] = None, chunk_size: int = 64,
    causal: bool = True, dtype_bytes: int = 2, mode: str = "fwd_bwd", materialize_states: bool = False,
    Hkv: Optional[int] = None,
) -> Cost:
    """Chunked linear attention [LIN, GLA sec. 2]: ``O = phi(Q) S`` with running state ``S = sum phi(K)^T V``.

    Per chunk of ``C = chunk_size`` tokens (``F`` = feature dim, default ``D``), causal: inter-chunk output
    ``2 C F Dv``, state update ``2 C F Dv``, intra-chunk masked quadratic part ``2 C^2 F + 2 C^2 Dv``,
    normaliser ``2 C F``; non-causal: ``4 N F Dv + 2 N F``. Backward counted as ``2 x`` forward (every
    matmul has two gradient matmuls). HBM: read Q, K, V once, write O once (+ fp32 states per chunk,
    ``N / C * F * Dv * 4`` written and read back, if ``materialize_states``); backward reads Q, K, V, dO and
    writes dQ, dK, dV (+ states). SRAM: the fp32 ``F x Dv`` state, Q/K/V chunk tiles and the ``C x C``
    intra-chunk tile. Everything is linear in ``N``: time per token is constant (``c_lin``). ``Hkv`` (GQA / MQA;
    default ``H``): K, V and dK, dV are read / written and held once per K/V head (``detail["kv_bytes"]``: the bytes
    of K and V).
    """
    _check_mode(mode)
    g = _kv_ratio(H, Hkv)  # K/V heads per query head: the share of the per-K/V-head terms
    F = D if F is None else F
    Dv = D if Dv is None else Dv
    C = _pos_int("chunk_size", chunk_size)
    e = float(dtype_bytes)
    if causal:
        fwd_fl = N * (4.0 * F * Dv + 2.0 * C * F + 2.0 * C * Dv + 2.0 * F)
    else:
        fwd_fl = N * (4.0 * F * Dv + 2.0 * F)
    states = math.ceil(N / C) * F * Dv * 4.0 if materialize_states else 0.0
    fl = fr = fw = 0.0
    kv = g * N * (D + Dv)  # elements of K and V (or dK and dV) per query head's share
    if mode in ("fwd", "fwd_bwd"):
        fl += fwd_fl
        fr += (N * D + kv) * e + states                   # Q; K, V
        fw += N * Dv * e + states
    if mode in ("bwd", "fwd_bwd"):
        fl += 2.0 * fwd_fl
        fr += (N * D + kv + N * Dv) * e + 2 * states      # Q; K, V; dO
        fw += (N * D + kv) * e + states                   # dQ; dK, dV
    sram = F * Dv * 4.0 + C * (F + F + Dv) * e + C * C * 4.0
    footprint = N * Dv * e + states + ((N * D + kv) * e if mode != "fwd" else 0.0)
    out = Cost(fl, fr, fw, sram, footprint, 0.0, {"chunk_size": C, "F": F, "kv_bytes": kv * e}).scale(B * H)
    out.detail.update({"chunk_size": C, "F": F})  # not batch-scaled
    return out


# --------------------------------------------------------------------------------------------- KV cache
# ------------------------------------------------------------------ benchmark FLOP conventions (TFLOP/s)
def flash_flops(B: int, H: int, Nq: int, D: int, Nk: Optional[int] = None, causal: bool = False,
                visited_fraction: Optional[float] = None, mode: str = "fwd", Dv: Optional[int] = None) -> float:
    """Matmul FLOPs of exact attention by the FlashAttention formula.

    Forward: ``2 * B * H * Nq * Nk * (D + Dv)`` (= ``4 * B * H * N^2 * D`` for ``Dv = D``), scaled by the
    fraction of (query, key) pairs the mask keeps: ``visited_fraction`` when given (window / block-sparse:
    e.g. ``mask.sum() / (Nq * Nk)``), else ``1/2`` for ``causal`` (the FlashAttention convention) and 1
    otherwise. ``mode``: ``"fwd"``, ``"bwd"`` (2.5 x fwd) or ``"fwd_bwd"`` (3.5 x fwd).
    """
    Nk = Nq if Nk is None else Nk
    Dv = D if Dv is None else Dv
    f = 2.0 * B * H * Nq * Nk * (D + Dv)
    if visited_fraction is not None:
        f *= float(visited_fraction)
    elif causal:
        f *= 0.5
    mult = {"fwd": 1.0, "bwd": BWD_FACTOR, "fwd_bwd": 1.0 + BWD_FACTOR}
    if mode not in mult:
        raise ValueError(f"mode={mode!r} is not supported; allowed values: {', '.join(mult)}")
    return f * mult[mode]


def linear_flops(B: int, H: int, N: int, D: int, F: Optional[int] = None, chunk_size: int = 64,
                 causal: bool = True, mode: str = "fwd", Dv: Optional[int] = None) -> float:
    """Matmul FLOPs of chunked linear attention (feature dim ``F``, default ``D``).

    Per chunk of ``C`` tokens: state update ``2*C*F*Dv`` (+ normaliser ``2*C*F``), inter-chunk read
    ``2*C*F*Dv``; causal adds the intra-chunk quadratic part ``2*C*C*F + 2*C*C*Dv``. Non-causal is
    ``4*N*F*Dv``. Backward counted as ``2 x`` forward (two matmuls per forward matmul).
    """
    F = D if F is None else F
    Dv = D if Dv is None else Dv
    if causal:
        C = chunk_size
        f = B * H * N * (2 * F * Dv + 2 * F * Dv + 2 * C * F + 2 * C * Dv + 2 * F)
    else:
        f = B * H * N * (4 * F * Dv + 2 * F)
    mult = {"fwd": 1.0, "bwd": 2.0, "fwd_bwd": 3.0}
    if mode not in mult:
        raise ValueError(f"mode={mode!r} is not supported; allowed values: {', '.join(mult)}")
    return float(f) * mult[mode]


def kv_cache_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """KV-cache bytes per token: ``2 (K and V) * n_layers * n_kv_heads * head_dim * dtype_bytes``.

    MHA: ``n_kv_heads = n_heads``; GQA: ``n_heads / group``; MQA: 1 [MQA, GQA]. E.g. a 32-layer, 32-head,
    d = 128 fp16 model: 512 KiB/token (MHA), 128 KiB with 8 KV heads, 16 KiB with MQA.
    """
    for name, x in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim),
                    ("dtype_bytes", dtype_bytes)):
        _pos_int(name, x)
    return 2 * n_layers * n_kv_heads * head_dim * dtype_bytes


def kv_cache_table(n_layers: int, n_heads: int, head_dim: int, dtype_bytes: int = 2,
                   groups: Tuple[int, ...] = ()) -> Dict[str, int]:
    """KV bytes per token for MHA, MQA and GQA with each group size in ``groups`` (must divide n_heads)."""
    out = {"mha": kv_cache_bytes_per_token(n_layers, n_heads, head_dim, dtype_bytes),
           "mqa": kv_cache_bytes_per_token(n_layers, 1, head_dim, dtype_bytes)}
    for g in groups:
        if n_heads % g:
            raise ValueError(f"group size {g} must divide n_heads={n_heads}")
        out[f"gqa{n_heads // g}"] = kv_cache_bytes_per_token(n_layers, n_heads // g, head_dim, dtype_bytes)
    return out


# --------------------------------------------------------------------------------------------- roofline
@dataclass(frozen=True)
class Machine:
    """A roofline: ``peak_flops`` (FLOP/s, dense fp16/bf16 tensor cores), ``bandwidth`` (HBM byte/s),
    ``sram_bytes`` (on-chip shared memory per SM, for FlashAttention's block sizes)."""

    name: str
    peak_flops: float
    bandwidth: float
    sram_bytes: float = 0.0

    @property
    def ridge(self) -> float:
        """Ridge point, FLOP/byte: intensities below it are memory-bound (A100: 312e12 / 2.0e12 = 156)."""
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity: float) -> float:
        """Attainable FLOP/s at arithmetic intensity ``intensity`` [ROOF]: ``min(peak, I * bandwidth)``."""
        return min(self.peak_flops, intensity * self.bandwidth)

    def bound_time(self, cost: Cost, compulsory: bool = False) -> float:
        """Lower bound on the run time of ``cost`` in seconds: ``max(flops / peak, bytes / bandwidth)``, with
        the modelled traffic (default) or the compulsory traffic (``compulsory=True``: perfect cache reuse)."""
        b = cost.compulsory_bytes if compulsory else cost.hbm_bytes
        return max(cost.flops / self.peak_flops, b / self.bandwidth)

    def bound(self, cost: Cost, compulsory: bool = False) -> str:
        """``"memory"`` or ``"compute"``: which roof limits ``cost``."""
        b = cost.compulsory_bytes if compulsory else cost.hbm_bytes
        return "memory" if (cost.flops / b if b > 0 else math.inf) < self.ridge else "compute"

    def with_measured(self, peak_flops: Optional[float] = None, bandwidth: Optional[float] = None) -> "Machine":
        """A copy with measured ceilings replacing the datasheet ones."""
        return replace(self, name=self.name + " (measured)", peak_flops=peak_flops or self.peak_flops,
                       bandwidth=bandwidth or self.bandwidth)


# Datasheet numbers (dense, no sparsity). SRAM: configurable shared memory per SM.
MACHINES: Dict[str, Machine] = {
    "a100": Machine("A100-SXM4", 312e12, 2.0e12, 192 * 1024),  # FA1 sec. 2.1 quotes 1.5-2.0 TB/s, 192 KB
    "h100": Machine("H100-SXM5", 989e12, 3.35e12, 228 * 1024),
    "h200": Machine("H200-SXM", 989e12, 4.8e12, 228 * 1024),
}


def get_machine(name: str) -> Machine:
    """A :class:`Machine` preset by name (``a100``, ``h100``, ``h200``)."""
    key = name.lower().replace("nvidia", "").replace("-", "").replace(" ", "")
    for k, m in MACHINES.items():
        if key.startswith(k):
            return m
    raise ValueError(f"machine={name!r} is not supported; allowed values: {', '.join(MACHINES)}")


# --------------------------------------------------------------------------------------------- dispatch
def resolve_kv_heads(spec, H: int, n_kv_heads: Optional[int] = None) -> int:
    """The K/V heads of a cost at ``H`` query heads: ``n_kv_heads`` when given, else the spec's own
    (``n_kv_heads`` / ``kv_group_size``: :meth:`attn_zoo.AttentionSpec.resolve_kv_heads`), else ``H`` (MHA).
    Raises ``ValueError`` naming ``n_kv_heads`` and the allowed values (the divisors of ``H``), or both counts when
    the argument and the spec disagree."""
    _pos_int("H", H)
    own = None
    if getattr(spec, "n_kv_heads", None) is not None or getattr(spec, "kv_group_size", None) is not None:
        own = spec.resolve_kv_heads(H)  # raises naming the spec's field
    if n_kv_heads is None:
        return H if own is None else own
    _kv_ratio(H, n_kv_heads, "n_kv_heads")
    if own is not None and own != n_kv_heads:
        raise ValueError(f"n_kv_heads={n_kv_heads} disagrees with the spec's K/V heads ({own} at H={H}, from its "
                         f"n_kv_heads / kv_group_size); pass n_kv_heads={own} or None")
    return int(n_kv_heads)


def _takes(fn, name: str) -> bool:
    """Whether ``fn`` accepts the keyword ``name`` (by name or through ``**kwargs``)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: try it
        return True
    return any((p.name == name and p.kind != p.POSITIONAL_ONLY) or p.kind == p.VAR_KEYWORD for p in params)


def spec_cost(spec, B: int, H: int, N: int, D: int, *, mode: str = "fwd_bwd", dtype_bytes: int = 2,
              block_m: Optional[int] = None, block_n: Optional[int] = None,
              n_kv_heads: Optional[int] = None) -> Cost:
    """Cost of one registered variant's spec at ``Nq = Nk = N``, ``H`` query heads and ``n_kv_heads`` K/V heads
    (default: the spec's own, else ``H``; :func:`resolve_kv_heads`): the variant's own cost entry (``cost=`` of
    :func:`attn_zoo.register_variant`, given ``n_kv_heads=`` when it takes it) when it has one, else its family's:
    the exact tiled kernel over the kept fraction of the pairs (:func:`attn_zoo.variants.element_fraction`) for
    softmax kinds, the chunked linear form (:func:`linear_attention_cost`, ``F`` from the feature map) for linear
    ones, both with ``Hkv``. No kind is named here. Raises ``ValueError`` for an unregistered kind, a bad ``mode``
    or ``n_kv_heads``, or GQA / MQA (``n_kv_heads < H``) with a cost entry that does not take ``n_kv_heads``."""
    from .variants import element_fraction, get_variant

    _check_mode(mode)
    v = get_variant(spec.kind)
    hkv = resolve_kv_heads(spec, H, n_kv_heads)
    if v.cost_fn is not None:
        kw = dict(mode=mode, dtype_bytes=dtype_bytes, block_m=block_m, block_n=block_n)
        if _takes(v.cost_fn, "n_kv_heads"):
            kw["n_kv_heads"] = hkv
        elif hkv != H:  # it would model MHA: say so rather than give MHA numbers for a GQA / MQA point
            raise ValueError(f"variant {spec.kind!r}: its cost entry takes no n_kv_heads, so it cannot model "
                             f"n_kv_heads={hkv} < H={H}; give cost(...) an n_kv_heads=None keyword")
        return v.cost_fn(spec, B, H, N, D, **kw)
    if v.family == "softmax":
        return flash_attention_cost(B, H, N, D, dtype_bytes=dtype_bytes, mode=mode, block_m=block_m, block_n=block_n,
                                    visited_fraction=element_fraction(spec, N), Hkv=hkv)
    from .feature_maps import feature_dim

    Fd = feature_dim(spec.feature_map, D, spec.num_features)
    return linear_attention_cost(B, H, N, D, F=Fd, chunk_size=spec.chunk_size, causal=spec.causal,
                                 dtype_bytes=dtype_bytes, mode=mode, Hkv=hkv)


def _formula_flash(B, H, N, D, *, causal, mode, dtype_bytes, window, visited_fraction, chunk_size, F, block_m, block_n):
    return flash_attention_cost(B, H, N, D, dtype_bytes=dtype_bytes, mode=mode, causal=causal, block_m=block_m,
                                block_n=block_n, visited_fraction=visited_fraction)


def _formula_window(B, H, N, D, *, causal, mode, dtype_bytes, window, visited_fraction, chunk_size, F, block_m, block_n):
    if window is None:
        raise ValueError("formula 'sliding_window' needs window=<tokens>")
    return window_attention_cost(B, H, N, D, window, causal=causal, block_m=block_m, block_n=block_n,
                                 dtype_bytes=dtype_bytes, mode=mode)


def _formula_sparse(B, H, N, D, *, causal, mode, dtype_bytes, window, visited_fraction, chunk_size, F, block_m, block_n):
    if visited_fraction is None:
        raise ValueError("formula 'sparse' needs visited_fraction (see mask_fractions)")
    return block_sparse_attention_cost(B, H, N, D, visited_fraction, block_m=block_m, block_n=block_n,
                                       dtype_bytes=dtype_bytes, mode=mode)


def _formula_linear(B, H, N, D, *, causal, mode, dtype_bytes, window, visited_fraction, chunk_size, F, block_m, block_n):
    return linear_attention_cost(B, H, N, D, F=F, chunk_size=chunk_size, causal=causal, dtype_bytes=dtype_bytes,
                                 mode=mode)


def _formula_standard(B, H, N, D, *, causal, mode, dtype_bytes, window, visited_fraction, chunk_size, F, block_m,
                      block_n):
    return standard_attention_cost(B, H, N, D, dtype_bytes=dtype_bytes, mode=mode, causal=causal)


#: The cost formulas by name (the papers' kernels: ``standard`` is S and P materialised, not a variant kind). For
#: a registered variant's spec use :func:`spec_cost`, which asks the variant.
FORMULAS = {"standard": _formula_standard, "flash": _formula_flash, "sliding_window": _formula_window,
            "sparse": _formula_sparse, "linear": _formula_linear}


def attention_cost(kind: str, B: int, H: int, N: int, D: int, *, causal: bool = True, mode: str = "fwd_bwd",
                   dtype_bytes: int = 2, window: Optional[int] = None, visited_fraction: Optional[float] = None,
                   chunk_size: int = 64, F: Optional[int] = None, block_m: int = 128, block_n: int = 64) -> Cost:
    """Cost of one formula of :data:`FORMULAS` by name: ``"standard"`` (S, P materialised), ``"flash"``,
    ``"sliding_window"`` (needs ``window``), ``"sparse"`` (needs ``visited_fraction``) or ``"linear"``. Raises
    ``ValueError`` naming the allowed values. (For a spec of any registered kind: :func:`spec_cost`.)"""
    if kind not in FORMULAS:
        raise ValueError(f"kind={kind!r} is not supported; allowed values: {', '.join(FORMULAS)}")
    return FORMULAS[kind](B, H, N, D, causal=causal, mode=mode, dtype_bytes=dtype_bytes, window=window,
                          visited_fraction=visited_fraction, chunk_size=chunk_size, F=F, block_m=block_m,
                          block_n=block_n)


# --------------------------------------------------------------------------------------------- paper bill
#: FlashAttention paper, Figure 2 (left): GPT-2 medium attention, N = 1024, d = 64, 16 heads, batch 64,
#: forward + backward on an A100. These are *measurements* (profiler readings), not formulas.
FA1_GPT2_MEDIUM = {"standard": {"gflops": 66.6, "hbm_gb": 40.3, "runtime_ms": 41.7},
                   "flash": {"gflops": 75.2, "hbm_gb": 4.4, "runtime_ms": 7.3}}


def gpt2_medium_bill(sram_bytes: float = 192 * 1024) -> Dict[str, Dict[str, float]]:
    """Our model of [FA1] Figure 2's bill (GPT-2 medium: B = 64, H = 16, N = 1024, d = 64, fp16, fwd + bwd).

    Standard: :func:`standard_attention_cost` with the mask and dropout as their own kernels
    (``mask_pass=True, dropout=True``), which is how the PyTorch baseline of the paper's benchmarks computes
    ``masked_fill -> softmax -> dropout``. Flash: :func:`flash_attention_cost` with FA1's loop order and block
    sizes from the A100's 192 KiB SRAM (``B_c = ceil(M / 4d) = 384``, ``T_c = 3``).

    Returns ``{"standard": {...}, "flash": {...}, "ratio": {...}}`` with ``gflops``, ``matmul_gflops``,
    ``hbm_gb`` (1e9 bytes) per method and the flash / standard ratios.

    What the model reproduces (and the test asserts, ``tests/test_cost_model.py``): HBM bytes within 15 % of
    the paper's 40.3 GB and 4.4 GB (model: 44.6 GB and 4.6 GB), the HBM reduction within 3 points of
    -89 % (model: -89.6 %), and the FLOP increase of the recomputation within 5 points of +13 % (model:
    +16.8 %). The tolerances are the size of what the model leaves out: the paper's numbers are profiler
    readings of real kernels (cache hits on the broadcast mask, the RNG state, padding of tiles, the exact
    elementwise instruction count), so an analytic count can match their structure, not their last digit.
    The paper's *absolute* GFLOPs (66.6) are about 12x below the matmul work of this problem
    (``12 B H N^2 d = 825`` GFLOPs for the six matmuls of forward + backward): they cannot be a count of all
    FLOPs and we do not reproduce them; see ``docs/results.md``.
    """
    B, H, N, d = 64, 16, 1024, 64
    std = standard_attention_cost(B, H, N, d, dtype_bytes=2, mode="fwd_bwd", causal=True, mask_pass=True,
                                  dropout=True)
    fl = flash_attention_cost(B, H, N, d, dtype_bytes=2, mode="fwd_bwd", sram_bytes=sram_bytes,
                              loop_order="fa1", visited_fraction=1.0, dropout=True)

    def row(c: Cost) -> Dict[str, float]:
        mm = c.detail.get("matmul_flops")
        return {"gflops": c.flops / 1e9, "hbm_gb": c.hbm_bytes / 1e9,
                "matmul_gflops": (mm / 1e9) if mm is not None else float("nan")}

    s, f = row(std), row(fl)
    f["matmul_gflops"] = B * H * 14.0 * N * N * d / 1e9  # 4 N^2 d forward + 10 N^2 d backward per head
    return {"standard": s, "flash": f,
            "ratio": {"flops": f["gflops"] / s["gflops"], "hbm": f["hbm_gb"] / s["hbm_gb"]}}
