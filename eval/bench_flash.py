"""Benchmark of the fused Triton exact-attention kernel against the anchors a user would pick instead.

In ONE process and run: ours (the registry's ``triton`` backend: ``kernels.flash_attn`` through its adapter, with
``FlashConfig()``: ``fwd_impl="auto"``, so on Hopper the Gluon forward where :func:`kernels.flash.resolve_fwd_impl`
picks it; the forward that ran is the row's ``fwd_impl``, the backward its ``bwd_impl``; whether they stream their
operands by TMA descriptors, ``fwd_tma``, ``bwd_dkdv_tma`` and ``bwd_dq_tma``: :func:`kernels.flash.resolve_fwd_tma` /
``resolve_bwd_tma``, the rule the launches apply, ``FlashConfig.tma`` / ``tma_min_pairs``), and
the registry's anchors (:mod:`attn_zoo.registry`): by default PyTorch SDPA with the flash backend
(FlashAttention-2), SDPA with the cuDNN backend, and compiled FlexAttention (``torch.compile(flex_attention)`` with
dynamo's recompile limit raised, else it falls back to eager and materialises N x N); ``--impls`` takes any
registered backend (``all``: every one), and every backend a ``--plugins`` module registers is timed too;
``ours_triton`` is ours with the Triton forward forced (``FlashConfig(fwd_impl="triton")``), ``ours_gluon_ws3a`` /
``ours_gluon_ws3b`` ours with that Gluon forward forced (Hopper, band masks and block-sparse layouts of whole
128-token tiles (no dilation), D 64 / 128; other cases are error rows), ``ours_gluon_ws3p`` the persistent Gluon forward
(band masks only); the backward is the default one
(``bwd_impl="auto"``: on Hopper the Gluon dK / dV kernel with the Gluon dQ at D 128, the Triton dQ at D 64, where
:func:`kernels.flash.gluon.choose_bwd_impl` picks it, triton version included, else Triton) in all but
``ours_triton_bwd`` (the Triton backward forced), ``ours_gluon_bwd`` (``FlashConfig(bwd_impl="gluon")``: the atomic
dQ), ``ours_gluon_bwd_tdq`` (the same with ``gluon_bwd_dq="triton"``), ``ours_gluon_bwd_2c`` (that with
``gluon_bwd_consumers=2``), ``ours_gluon_dq`` (that with ``gluon_bwd_dq="gluon"``: the Gluon dQ kernel) and
``ours_gluon_tmadq`` (one kernel, dQ by TMA reduce-add, ``gluon_bwd_dq="tma"``: triton 3.7+; ``ours_gluon_tmadq2``
the same in the two-consumer kernel), each with the default forward; ``ours_no_tma`` is the default with
``FlashConfig(tma=False)``: the Triton kernels' TMA off, the pair that times ``tma_min_pairs`` in one process where
``ours`` runs the Triton kernels (``tma=False`` also keeps ``"auto"`` off the Gluon forward, while the backward's
choice ignores it: on Hopper its Gluon backward still reads by TMA; the rows' ``fwd_impl`` / ``fwd_tma`` say which).
``--fwd-only`` times the forward alone (no backward is run). Variants:
non-causal, causal, causal sliding window w = 1024 / 4096, causal BigBird block-sparse, causal strided block-sparse
(Child et al. 2019's fixed pattern, 1024-token windows: ``stride_blocks`` 8 of 128), GQA Hkv = Hq/4 and MQA
Hkv = 1 (causal), and a dilated window (512 keys every 2 tokens, ``dil512x2``). bf16, 16k tokens per batch
(B = 16384 // N), hidden 2048 (H = 2048 // D; ``--hidden 1024``: the sweep's H 16 at D 64). FLOPs by the FlashAttention formula (4 B H N^2 D times the visited
fraction; causal 1/2; backward 2.5x). SDPA cannot skip window / sparse tiles: for those variants its anchor runs
dense causal attention (what SDPA's fast paths can run), marked in the row.

Usage (GPU, from the repo root): ``python -m eval.bench_flash --out results/h200 [--quick] [--variants
causal,win1024] [--N 4096] [--D 128] [--impls ours,sdpa_flash,sdpa_cudnn,flex] [--plugins my_module]
[--flex-max-cases 12] [--check] [--tune] [--rounds 3]``. Our kernel runs with ``kernels.FlashConfig()``
(``--tune``: ``FlashConfig(autotune=True)``, which keeps the Triton forward). Each impl's forward and
forward+backward are timed ``--rounds`` times (default 3), the impls in a rotating order, and the rows give the
median and its spread (``fwd_spread``, ``fwd_bwd_spread``: (max - min) / median): the GPU is shared and its speed
drifts, so a ratio from one back-to-back pass can charge the drift to one impl (``--rounds 1``: that pass alone).

Packed documents (issue 27): ``--docs fixed:512,geometric:512`` runs every case once per document-length
distribution -- each row of the batch packed with documents of exactly 512 tokens (``fixed``) or of lengths drawn
from a geometric distribution of mean 512 (``geometric``, seeded, >= 1 token) or from WikiText-2's article lengths
(``wikitext:512``: the real shape scaled to mean 512; ``wikitext:real``: as they are; the file is
``$ATTN_ZOO_WIKITEXT``, default ``../shared/data/wikitext-2/valid.txt``); the last document of a row is cut at
N -- and passes ``doc_ids`` to every backend that takes documents (ours, ``flex`` / ``flex_fa4``: document
``BlockMask``; ``fa4``: its varlen entry with ``cu_seqlens``, through the registry's padded-form wrapper, which
builds ``cu_seqlens`` (one host sync) and copies the layout on every call; ``fa4_varlen``: FA4's varlen entry as a
user who keeps the packed ``(total_tokens, H, D)`` layout calls it, ``cu_seqlens`` and the packed leaves built once
per case outside the timed region; the others are recorded as not run). FLOPs count the
pairs the document mask keeps (``visited_fraction``: sum of l^2 / 2 over documents / N^2 for causal). E.g.
``python -m eval.bench_flash --out results/h200/docs --tag bench_docs --variants causal,win1024 --N 4096,16384
--D 128 --docs fixed:256,fixed:1024,geometric:256,geometric:1024 --impls ours,fa4,flex_fa4,flex --check``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
import traceback

import torch
import torch.nn.functional as F

from attn_zoo import AttentionSpec, mask_info
from attn_zoo.registry import backend_names, backends_from, get_backends, load_plugins
from eval.bench_common import (NONNEG_INT, POSITIVE_INT, add_time_budget, budget_spent, env_info, error_line,
                               flash_flops, format_table, int_list, interleaved_rounds, median_spread, peak_memory,
                               require_cuda, tflops, time_cuda, write_results)

VARIANTS = {
    "noncausal": dict(kind="flash", causal=False),
    "causal": dict(kind="flash", causal=True),
    "win1024": dict(kind="sliding_window", causal=True, window_size=(1023, 0)),
    "win4096": dict(kind="sliding_window", causal=True, window_size=(4095, 0)),
    "bigbird": dict(kind="sparse", causal=True, sparse_pattern="bigbird", block_size=128, num_local_blocks=2,
                    num_global_blocks=1, num_random_blocks=2),
    "strided": dict(kind="sparse", causal=True, sparse_pattern="strided", block_size=128, stride_blocks=8),
    "gqa4": dict(kind="flash", causal=True),
    "mqa": dict(kind="flash", causal=True),
    "dil512x2": dict(kind="dilated_window", causal=True, window_size=(511, 0), dilation=2),
    "stream1024": dict(kind="streaming", causal=True, window_size=(1023, 0), sink_size=4),  # StreamingLLM's 4 sinks
}
IMPLS = ("ours", "sdpa_flash", "sdpa_cudnn", "flex")  # the default; "ours" is the registry's "triton"
# ours and its forward kernel (FlashConfig.fwd_impl): "ours" is the default ("auto": Gluon or Triton per call, both
# ways), the others force one kernel
OURS = {"ours": "auto", "ours_triton": "triton", "ours_gluon_ws3a": "gluon_ws3a", "ours_gluon_ws3b": "gluon_ws3b",
        "ours_gluon_ws3p": "gluon_ws3p", "ours_gluon_bwd": "auto", "ours_gluon_bwd_tdq": "auto",
        "ours_gluon_bwd_2c": "auto", "ours_gluon_dq": "auto", "ours_gluon_tmadq": "auto", "ours_gluon_tmadq2": "auto",
        "ours_triton_bwd": "auto", "ours_triton_all": "triton", "ours_no_tma": "auto"}
# the backward settings (FlashConfig.bwd_impl, .gluon_bwd_dq, .gluon_bwd_consumers) of the OURS entries that do not
# run the default backward ("auto"): the Gluon backward with its atomic dQ, its dK / dV kernel with the Triton dQ
# kernel ("tdq"), that with two consumer partitions ("2c"), that with the Gluon dQ kernel ("gluon_dq"), the
# Triton backward forced, and both Triton kernels forced ("triton_all")
OURS_BWD = {"ours_gluon_bwd": dict(bwd_impl="gluon"),
            "ours_gluon_bwd_tdq": dict(bwd_impl="gluon", gluon_bwd_dq="triton"),
            "ours_gluon_bwd_2c": dict(bwd_impl="gluon", gluon_bwd_dq="triton", gluon_bwd_consumers=2),
            "ours_gluon_dq": dict(bwd_impl="gluon", gluon_bwd_dq="gluon", gluon_bwd_consumers=2),
            "ours_gluon_tmadq": dict(bwd_impl="gluon", gluon_bwd_dq="tma"),
            "ours_gluon_tmadq2": dict(bwd_impl="gluon", gluon_bwd_dq="tma", gluon_bwd_consumers=2),
            "ours_triton_bwd": dict(bwd_impl="triton"), "ours_triton_all": dict(bwd_impl="triton")}
# the other settings of an OURS entry: ``ours_no_tma`` is the default with ``tma=False``: the Triton kernels' TMA off
# (pointer loads), the pair that times ``FlashConfig.tma_min_pairs``; ``tma=False`` also keeps ``fwd_impl="auto"``
# on the Triton forward, while ``bwd_impl="auto"`` may still take the Gluon backward, which reads by TMA
OURS_SETTINGS = {"ours_no_tma": dict(tma=False)}
DEVICE = "cuda"  # where bench_case puts its inputs (the tests run it on the CPU with fake timers)
DTYPE = torch.bfloat16  # the inputs' dtype (the tests' CPU runs of ours take float32: the interpreter refuses bf16)
NATIVE = ("fa4_varlen",)  # not registry backends: an anchor called in its own layout (--docs only)


WIKITEXT = os.environ.get("ATTN_ZOO_WIKITEXT", "../shared/data/wikitext-2/valid.txt")


@functools.lru_cache(maxsize=None)
def _article_lengths(path: str):
    from attn_zoo.doclen import wikitext_article_lengths

    if not os.path.isfile(path):
        raise ValueError(f"--docs wikitext:<L> reads WikiText article lengths from {path!r}, which is not a file; "
                         f"set ATTN_ZOO_WIKITEXT to a WikiText-2 file (e.g. ../shared/data/wikitext-2/valid.txt)")
    lengths = wikitext_article_lengths(path)
    if not lengths:
        raise ValueError(f"--docs wikitext:<L> reads WikiText article lengths from {path!r}, which holds no article "
                         f"(a line ' = Title = '); set ATTN_ZOO_WIKITEXT to a WikiText-2 file (e.g. "
                         f"../shared/data/wikitext-2/valid.txt)")
    return tuple(lengths)


def document_dists(docs: str) -> list:
    """The entries of a ``--docs`` comma list, each checked by :func:`document_lengths` (``ValueError``) before any
    case runs."""
    dists = docs.split(",")
    for d in dists:
        document_lengths(1, d)
    return dists


def document_lengths(N: int, dist: str, seed: int = 0):
    """Document lengths of one packed row of ``N`` tokens: ``"fixed:L"`` (every document ``L`` tokens),
    ``"geometric:L"`` (geometric lengths of mean ``L``, >= 1, seeded) or ``"wikitext:L"`` / ``"wikitext:real"``
    (WikiText-2's article lengths in UTF-8 bytes, the tokens of ``data=text``, drawn at random (seeded) from the
    file ``$ATTN_ZOO_WIKITEXT`` (default ``../shared/data/wikitext-2/valid.txt``): ``real`` as they are, ``L``
    scaled to mean ``L`` (the real shape at another mean, :func:`attn_zoo.doclen.sampler` ``"empirical"``); the
    row is a window of a packed stream (``data.pack``): it starts at a uniform offset inside a length-biased
    draw, so the first document is a tail); the last document is cut at ``N``. Raises ValueError naming the entry
    and the allowed values."""
    kind, _, mean = dist.partition(":")
    try:
        L = int(mean)
    except ValueError:
        L = 0
    if kind not in ("fixed", "geometric", "wikitext") or (L < 1 and not (kind == "wikitext" and mean == "real")):
        raise ValueError(f"--docs entry {dist!r} is not supported; allowed values: fixed:<L>, geometric:<L>, "
                         f"wikitext:<L>, wikitext:real (L >= 1)")
    if kind == "wikitext":
        import numpy as np

        from attn_zoo.doclen import sampler

        pool = _article_lengths(WIKITEXT)
        mean_l = float(np.mean(pool)) if mean == "real" else float(L)
        draw = sampler("empirical", mean_l, pool=pool, stratified=False)
        rng = np.random.default_rng(seed)
        # a row of a packed stream (data.pack) starts inside an article: the one under a uniform position is
        # drawn by length (length-biased), the row starts at a uniform offset in it (a stationary renewal process);
        # starting every row at an article start gave 2% of 4096-byte rows a document boundary instead of 22%
        scaled = np.maximum(np.rint(np.asarray(pool, dtype=np.float64) * (mean_l / np.mean(pool))), 1).astype(np.int64)
        L0 = int(rng.choice(scaled, p=scaled / scaled.sum()))
        first = min(L0 - int(rng.integers(0, L0)), N)
        out, total = [first], first
        while total < N:
            n = min(int(draw(1, rng)[0]), N - total)
            out.append(n)
            total += n
        return out
    out, total = [], 0
    g = torch.Generator().manual_seed(seed)
    while total < N:
        if kind == "fixed":
            n = L
        else:  # P(n) = p (1 - p)^(n - 1), mean 1 / p
            u = torch.rand((), generator=g).item()
            n = 1 + int(torch.log1p(torch.tensor(-u)).item() / torch.log1p(torch.tensor(-1.0 / L)).item()) if L > 1 else 1
        n = min(n, N - total)
        out.append(n)
        total += n
    return out


def packed_doc_ids(B: int, N: int, dist: str, device="cuda") -> torch.Tensor:
    """int32 ``(B, N)`` document ids, each row packed with :func:`document_lengths` (row ``b`` seeded with ``b``)."""
    rows = []
    for b in range(B):
        lens = document_lengths(N, dist, seed=b)
        rows.append(torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens)))
    return torch.stack(rows).to(device=device, dtype=torch.int32)


def document_fraction(doc_ids: torch.Tensor, causal: bool) -> float:
    """Kept fraction of ``N^2`` under the document mask alone (causal: ``sum l^2 / 2``, the FlashAttention
    convention), averaged over the rows."""
    N = doc_ids.shape[1]
    tot = 0.0
    for row in doc_ids.cpu():
        _, counts = torch.unique_consecutive(row, return_counts=True)
        tot += float((counts.double() ** 2).sum()) * (0.5 if causal else 1.0)
    return tot / (doc_ids.shape[0] * N * N)


def visited_fraction(name: str, N: int) -> float:
    """Fraction of (query, key) pairs the mask keeps (causal counted as 1/2, the FlashAttention convention; other
    masks: the variant's cost entry, :func:`attn_zoo.variants.element_fraction`)."""
    from attn_zoo.variants import element_fraction

    spec = AttentionSpec(**VARIANTS[name])
    mi = mask_info(spec, N, N)
    if mi.is_full:
        return 1.0
    if mi.is_plain_causal:
        return 0.5
    return element_fraction(spec, N)


def _exact(spec: AttentionSpec, N: int) -> bool:
    mi = mask_info(spec, N, N)
    return mi.is_full or mi.is_plain_causal


HIDDEN = 2048  # the default model width every case keeps: H = hidden // D query heads (``--hidden``)


def heads(name: str, D: int, hidden: int = HIDDEN):
    """``(Hq, Hkv)`` of variant ``name`` at head dim ``D``: ``hidden // D`` query heads; GQA a quarter of them as
    K / V heads, MQA one."""
    H = hidden // D
    if name == "gqa4":
        return H, H // 4
    if name == "mqa":
        return H, 1
    return H, H


def flex_fn():
    """The process-wide compiled FlexAttention (recompile limits raised; backward re-runnable for timing)."""
    from attn_zoo.flex import allow_retain_graph, compiled_flex_attention

    allow_retain_graph()
    return compiled_flex_attention("cuda")


def flex_block_mask(name: str, N: int, device):
    """FlexAttention ``BlockMask`` of a variant (:func:`attn_zoo.flex.flex_block_mask`); ``None`` for full attention."""
    from attn_zoo.flex import flex_block_mask as _bm

    return _bm(AttentionSpec(**VARIANTS[name]), N, N, str(device))


def make_impl(impl: str, name: str, N: int, D: int, spec: AttentionSpec, config=None, inputs=None, doc_ids=None):
    """A callable ``f(q, k, v) -> out`` for one implementation, or raise if it cannot run the case.

    ``impl``: a registered backend name (``"ours"`` = ``"triton"``), bound through the registry
    (:meth:`attn_zoo.registry.Backend.bind`: availability and ``supports()`` first). An SDPA anchor that cannot
    express the mask runs the dense causal mask instead (see the module docstring). ``config``: the
    :class:`kernels.FlashConfig` of ours (default ``FlashConfig()``). ``inputs``: ``(q, k, v)`` of the case (default:
    empty bf16 CUDA tensors of its shapes, for the checks). ``doc_ids``: packed documents (backends without them
    raise ``Unsupported``)."""
    backend = "triton" if impl in OURS else impl
    b = get_backends(spec.kind).get(backend)
    if b is None:
        raise ValueError(f"impl={impl!r} is not a backend of kind={spec.kind!r}; allowed values: ours, "
                         f"{', '.join(backend_names(spec.kind))}, {', '.join(list(OURS)[1:])}")
    if inputs is None:
        Hq, Hkv = heads(name, D)
        mk = lambda h: torch.empty(1, h, N, D, device="cuda", dtype=torch.bfloat16)  # noqa: E731
        inputs = (mk(Hq), mk(Hkv), mk(Hkv))
    opts = {}
    if backend == "triton":
        from kernels import FlashConfig

        opts["config"] = ours_config(impl, config)
    if doc_ids is not None:
        opts["doc_ids"] = doc_ids
    elif backend.startswith("sdpa") and not _exact(spec, N):
        spec = AttentionSpec(kind="flash", causal=spec.causal)  # dense causal: what SDPA's fast paths run
    return b.bind(spec, *inputs, **opts)


def ours_config(impl: str, config=None):
    """The :class:`kernels.FlashConfig` that ``impl`` (a key of ``OURS``, or the registry's ``"triton"``: as
    ``"ours"``) runs with: ``config`` (default ``FlashConfig()``) with that impl's ``fwd_impl`` (and the backward
    settings of the keys of ``OURS_BWD``: ``ours_gluon_bwd`` is the default forward with the Gluon backward,
    ``ours_gluon_bwd_tdq`` the same with ``gluon_bwd_dq="triton"``: Gluon dK / dV, Triton dQ; ``ours_gluon_bwd_2c``
    that with two consumers; ``ours_gluon_dq`` that with the Gluon dQ kernel; ``ours_gluon_tmadq`` the one-kernel
    backward with the dQ by TMA reduce-add; ``ours_triton_bwd`` the Triton
    backward; ``ours_triton_all`` the Triton forward and backward, no Gluon kernel at all; ``ours_no_tma`` the
    default with ``tma=False``: ``OURS_SETTINGS``, which also keeps ``"auto"`` on the Triton forward)."""
    from kernels import FlashConfig

    cfg = config if config is not None else FlashConfig()
    if impl in OURS_BWD:
        return cfg.replace(fwd_impl=OURS[impl], **OURS_BWD[impl])
    return cfg.replace(fwd_impl=OURS.get(impl, "auto"), **OURS_SETTINGS.get(impl, {}))


def _mask_args(spec: AttentionSpec, q, k, doc_ids=None) -> dict:
    """The mask arguments the registry's ``triton`` backend passes :func:`kernels.flash.flash_attn` for ``spec``
    (:func:`attn_zoo.masks.mask_info`), as :func:`kernels.flash.resolve_fwd_impl` / ``resolve_bwd_impl`` take them."""
    mi = mask_info(spec, q.shape[2], k.shape[2])
    window = None if mi.window_left is None and mi.window_right is None else (mi.window_left, mi.window_right)
    return dict(causal=mi.causal, window_size=window, dilation=mi.dilation, block_layout=mi.layout, doc_ids=doc_ids,
                block_size=mi.block_size if mi.layout is not None else 0, sink_size=mi.sink_size)


def ours_fwd_impl(impl: str, spec: AttentionSpec, q, k, v, config=None, doc_ids=None) -> str:
    """The forward kernel ``impl`` (a key of ``OURS``) runs on ``q, k, v`` under ``spec`` (``"triton"``,
    ``"gluon_ws3a"``, ``"gluon_ws3b"``): :func:`kernels.flash.resolve_fwd_impl`."""
    from kernels.flash import resolve_fwd_impl

    return resolve_fwd_impl(ours_config(impl, config), q, k, v, **_mask_args(spec, q, k, doc_ids))


def ours_bwd_impl(impl: str, spec: AttentionSpec, q, k, v, config=None, doc_ids=None) -> str:
    """The backward kernel ``impl`` (a key of ``OURS``) runs (``"triton"`` or ``"gluon"``; ``"auto"`` resolves by
    device, shape and triton version): :func:`kernels.flash.resolve_bwd_impl`."""
    from kernels.flash import resolve_bwd_impl

    return resolve_bwd_impl(ours_config(impl, config), q, k, v, **_mask_args(spec, q, k, doc_ids))


def ours_tma(impl: str, spec: AttentionSpec, q, k, v, config=None, doc_ids=None, fwd_only=False) -> dict:
    """The row fields saying whether ``impl``'s kernels (a key of ``OURS``) stream their operands by TMA on ``q, k,
    v`` under ``spec``: ``fwd_tma`` (:func:`kernels.flash.resolve_fwd_tma`: the Gluon forward always, the Triton one
    by its launch's rule, ``FlashConfig.tma`` / ``tma_min_pairs``) and, unless ``fwd_only``, ``bwd_dkdv_tma`` /
    ``bwd_dq_tma`` (:func:`kernels.flash.resolve_bwd_tma`: the backward's dK/dV pass and its dQ)."""
    from kernels.flash import resolve_bwd_tma, resolve_fwd_tma

    cfg, mask = ours_config(impl, config), _mask_args(spec, q, k, doc_ids)
    row = {"fwd_tma": resolve_fwd_tma(cfg, q, k, v, **mask)}
    if not fwd_only:
        row["bwd_dkdv_tma"], row["bwd_dq_tma"] = resolve_bwd_tma(cfg, q, k, v, **mask)
    return row


def fa4_varlen_native(q, k, v, spec: AttentionSpec, doc_ids: torch.Tensor):
    """FA4's ``flash_attn_varlen_func`` in its own packed layout: ``(B*N, H, D)`` leaves (copies of ``q, k, v``,
    ``requires_grad``) and ``cu_seqlens`` built here, once; returns ``f(*_)`` (arguments ignored) giving the output
    as a ``(B, H, N, D)`` view, with ``f.leaves`` the packed tensors the backward writes. The timed call is the
    kernel's entry alone, as in a training loop whose data loader yields ``cu_seqlens``."""
    from flash_attn.cute import flash_attn_varlen_func

    from attn_zoo.backends.torch_anchors import packed_cu_seqlens

    B, Hq, Nq, Dh = q.shape
    Nk = k.shape[2]
    if Nq != Nk:
        raise ValueError(f"fa4_varlen needs Nq == Nk, got Nq={Nq}, Nk={Nk}")
    mi = mask_info(spec, Nq, Nk)
    cu_q, cu_k, mq, mk = packed_cu_seqlens(doc_ids, Nq)
    leaves = [t.detach().transpose(1, 2).reshape(B * t.shape[2], t.shape[1], t.shape[3]).clone().requires_grad_(True)
              for t in (q, k, v)]
    qf, kf, vf = leaves

    def f(*_):
        out = flash_attn_varlen_func(qf, kf, vf, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=mq,
                                     max_seqlen_k=mk, softmax_scale=spec.scale(Dh), causal=mi.causal,
                                     window_size=(mi.window_left, mi.window_right))
        out = out[0] if isinstance(out, tuple) else out
        return out.view(B, Nq, Hq, -1).transpose(1, 2)

    f.leaves = leaves
    return f


def case_setup(name: str, N: int, D: int, tokens: int, docs=None, hidden: int = HIDDEN):
    """One case's ``(B, Hq, Hkv, spec, visited_fraction, doc_ids)``: ``B = tokens // N`` rows (at least 1), the
    variant's heads at model width ``hidden`` (:func:`heads`) and spec, the kept fraction of ``N^2`` (with ``docs``,
    a ``--docs`` entry: the packed rows' ``doc_ids`` on ``DEVICE`` and the smaller of the mask's and the documents'
    fractions; else ``doc_ids`` is ``None``)."""
    B = max(tokens // N, 1)
    Hq, Hkv = heads(name, D, hidden)
    spec = AttentionSpec(**VARIANTS[name])
    frac = visited_fraction(name, N)
    doc_ids = None
    if docs is not None:
        doc_ids = packed_doc_ids(B, N, docs, device=DEVICE)
        frac = min(frac, document_fraction(doc_ids, spec.causal))  # (a window inside documents: the smaller bound)
    return B, Hq, Hkv, spec, frac, doc_ids


def bench_case(name, N, D, impls, tokens, check, rows, flex_budget, config=None, docs=None, fwd_only=False,
               rounds=1, hidden=HIDDEN, after_impl=None):
    """Time every impl of ``impls`` on one case (variant ``name``, ``N``, ``D``, ``docs``), append a row each to
    ``rows`` and return impl -> row. Each impl is compiled, checked and timed once in turn (fwd, bwd, fwd+bwd, peak
    memory); with ``rounds > 1`` the forward and the forward+backward of every impl that ran are timed ``rounds - 1``
    more times in rotating order (:func:`eval.bench_common.interleaved_rounds`), and the row reports the median of its
    ``rounds`` timings with their spread (``fwd_spread``, ``fwd_bwd_spread``: (max - min) / median), so a drift of
    the shared GPU is not charged to one impl. ``after_impl(row)``, if given, is called as each impl's row is
    appended (its first-round times, or its error), before the rounds: ``main`` writes the results there, so a run
    cut while a later anchor compiles keeps the rows before it."""
    B, Hq, Hkv, spec, frac, doc_ids = case_setup(name, N, D, tokens, docs, hidden)

    def done(row):
        rows.append(row)
        if after_impl is not None:
            after_impl(row)

    if docs is not None:
        n_docs = int((doc_ids[:, 1:] != doc_ids[:, :-1]).sum()) + B
    g = torch.Generator(device=DEVICE).manual_seed(N + D)
    q = torch.randn(B, Hq, N, D, device=DEVICE, dtype=DTYPE, generator=g).requires_grad_(True)
    k = torch.randn(B, Hkv, N, D, device=DEVICE, dtype=DTYPE, generator=g).requires_grad_(True)
    vv = torch.randn(B, Hkv, N, D, device=DEVICE, dtype=DTYPE, generator=g).requires_grad_(True)
    do = torch.randn(B, Hq, N, D, device=DEVICE, dtype=DTYPE, generator=g)
    res, timers = {}, {}
    for impl in impls:
        row = dict(variant=name, N=N, D=D, B=B, Hq=Hq, Hkv=Hkv, impl=impl, visited_fraction=round(frac, 5))
        if docs is not None:
            row["docs"] = docs
            row["n_docs"] = n_docs
            row["mean_doc_len"] = round(B * N / n_docs, 1)
        if impl.startswith("sdpa") and not _exact(spec, N) and docs is None:
            row["note"] = "dense causal (SDPA cannot skip masked tiles)"
        if impl == "flex":
            if flex_budget[0] <= 0:
                row["error"] = "skipped (flex compile budget)"
                done(row)
                continue
            flex_budget[0] -= 1
        t0 = time.time()
        try:
            if impl in OURS:
                row["fwd_impl"] = ours_fwd_impl(impl, spec, q, k, vv, config, doc_ids)
                if not fwd_only:
                    row["bwd_impl"] = ours_bwd_impl(impl, spec, q, k, vv, config, doc_ids)
                row.update(ours_tma(impl, spec, q, k, vv, config, doc_ids, fwd_only))
            if impl in NATIVE:
                if doc_ids is None:
                    raise ValueError(f"impl {impl!r} runs packed documents only (--docs)")
                f = fa4_varlen_native(q, k, vv, spec, doc_ids)
            else:
                f = make_impl(impl, name, N, D, spec, config, inputs=(q, k, vv), doc_ids=doc_ids)
            grads = getattr(f, "leaves", [q, k, vv])
            out = f(q, k, vv)
            if not fwd_only:
                out.backward(do)
            torch.cuda.synchronize()
            row["compile_s"] = round(time.time() - t0, 1)
            if check and docs is not None:
                row["max_err_vs_reference"] = _check_doc_err(f, q, k, vv, spec, doc_ids)
            elif check and impl in OURS:
                row["max_err_vs_sdpa"] = _check_err(f, q, k, vv, name)
            timer = {"fwd": lambda f=f: time_cuda(lambda: f(q, k, vv)),
                     "fwd_bwd": lambda f=f, grads=grads: time_cuda(lambda: f(q, k, vv).backward(do),
                                                                   grad_to_none=grads)}
            ms_f = timer["fwd"]()
            if fwd_only:
                _set_times(row, "fwd", [ms_f], B, Hq, N, D, frac)
                res[impl], timers[impl] = row, dict(fwd=(timer["fwd"], [ms_f]))
                done(row)
                torch.cuda.empty_cache()
                continue
            out = f(q, k, vv)
            ms_b = time_cuda(lambda: out.backward(do, retain_graph=True), grad_to_none=grads)
            del out  # the fwd+bwd timing runs without the retained graph
            ms_fb = timer["fwd_bwd"]()
            for t in grads:
                t.grad = None
            mem = peak_memory(lambda: f(q, k, vv).backward(do))
            for t in grads:
                t.grad = None
            for mode, ms in (("fwd", ms_f), ("bwd", ms_b), ("fwd_bwd", ms_fb)):
                _set_times(row, mode, [ms], B, Hq, N, D, frac)
            row["peak_mem_mib"] = round(mem / 2**20, 1)
            res[impl] = row
            timers[impl] = dict(fwd=(timer["fwd"], [ms_f]), fwd_bwd=(timer["fwd_bwd"], [ms_fb]))
        except Exception as e:  # an anchor that cannot run this case is recorded, not fatal
            row["error"] = error_line(e)
            if os.environ.get("BENCH_TRACE"):
                traceback.print_exc()
        done(row)
        torch.cuda.empty_cache()
    if rounds > 1 and timers:
        for mode in ("fwd",) if fwd_only else ("fwd", "fwd_bwd"):
            try:
                more = interleaved_rounds({i: t[mode][0] for i, t in timers.items()}, rounds - 1, start=1)
            except Exception as e:  # the single-round numbers stand; the row says why there are no more
                for impl in timers:
                    res[impl]["rounds_error"] = error_line(e, 120)
                break
            for impl, ms in more.items():
                _set_times(res[impl], mode, timers[impl][mode][1] + ms, B, Hq, N, D, frac)
    ours = res.get("ours")
    if ours:
        for impl, r in res.items():
            if impl == "ours":
                continue
            for mode in ("fwd",) if fwd_only else ("fwd", "bwd", "fwd_bwd"):
                ours[f"x_{impl}_{mode}"] = round(r[f"{mode}_ms"] / ours[f"{mode}_ms"], 3)
    return res


def _set_times(row, mode, times, B, Hq, N, D, frac):
    """``row``'s ``<mode>_ms`` (the median of ``times``, ms), ``<mode>_tflops`` (FlashAttention FLOPs over the visited
    fraction ``frac``), and with more than one time ``<mode>_spread``, ``rounds`` and ``<mode>_rounds_ms`` (every
    round's time in ms in the order they ran, ``;``-separated: a spread's outlier is named, not only counted)."""
    ms, spread = median_spread(times)
    row[f"{mode}_ms"] = round(ms, 4)
    row[f"{mode}_tflops"] = round(tflops(flash_flops(B, Hq, N, D, visited_fraction=frac, mode=mode), ms), 1)
    if len(times) > 1:
        row[f"{mode}_spread"] = round(spread, 4)
        row["rounds"] = len(times)
        row[f"{mode}_rounds_ms"] = ";".join(f"{t:.4f}" for t in times)


def _check_doc_err(f, q, k, vv, spec, doc_ids, rows: int = 128):
    """Max |impl - fp32 document-masked reference| over the last ``rows`` query rows of batch row 0 (the full call
    is run; the reference only for those rows: bottom-right alignment keeps their mask)."""
    from attn_zoo import attention

    with torch.no_grad():
        o = f(q, k, vv)[:1, :, -rows:].float()
        r = attention(q[:1, :, -rows:].float(), k[:1].float(), vv[:1].float(), spec, backend="reference",
                      doc_ids=doc_ids[:1])
    return round((o - r).abs().max().item(), 5)


def _check_err(f, q, k, vv, name):
    """Max |ours - SDPA(math, fp32 upcast)| on batch row 0 (plain sanity check in the bench). Ours runs the whole
    batch: the forward ``"auto"`` picks depends on the problem size, so it is the one the timings ran."""
    if not _exact(AttentionSpec(**VARIANTS[name]), q.shape[2]):
        return None
    with torch.no_grad():
        o = f(q, k, vv)[:1].float()
        r = F.scaled_dot_product_attention(q[:1].float(), k[:1].float(), vv[:1].float(),
                                           is_causal=VARIANTS[name]["causal"], enable_gqa=q.shape[1] != k.shape[1])
    return round((o - r).abs().max().item(), 5)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/h200")
    ap.add_argument("--tag", default="bench_flash")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--N", default="512,1024,2048,4096,8192,16384,32768", help="sequence lengths, comma list")
    ap.add_argument("--D", default="64,128",
                    help="head dims, comma list, each at most the kernels' kernels.flash.common.MAX_HEAD_DIM")
    ap.add_argument("--impls", default=",".join(IMPLS), help="registered backend names (ours = triton); all = every "
                                                               "registered backend")
    ap.add_argument("--plugins", default=None, help="comma-separated modules that register backends (timed too)")
    ap.add_argument("--tokens", type=POSITIVE_INT, default=16384, help="B * N per case (B = max(1, tokens // N))")
    ap.add_argument("--hidden", type=POSITIVE_INT, default=2048,
                    help="model width: H = hidden // D query heads (default 2048; the sweep's H 16 at D 64 is 1024)")
    ap.add_argument("--quick", action="store_true", help="D=128, N in {4096, 16384}, causal/noncausal/win1024/bigbird")
    ap.add_argument("--flex-max-cases", type=NONNEG_INT, default=1000,
                    help="compile FlexAttention for at most this many cases")
    ap.add_argument("--flex-min-n", type=NONNEG_INT, default=0, help="run Flex only for N >= this")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--fwd-only", action="store_true", help="time the forward alone (no backward runs)")
    ap.add_argument("--tune", action="store_true", help="ours with FlashConfig(autotune=True); print the winning configs")
    ap.add_argument("--flash-config", default=None, metavar="JSON",
                    help="ours with these kernels.FlashConfig fields, e.g. '{\"sparse_fwd\": {\"BLOCK_M\": 128, "
                         "\"BLOCK_N\": 64, \"num_warps\": 8, \"num_stages\": 3}}' (a sweep of forced configs)")
    ap.add_argument("--date", default=None)
    ap.add_argument("--docs", default=None, help="packed documents: comma-separated fixed:<L> / geometric:<L> / wikitext:<L> / wikitext:real "
                                                  "(every case once per distribution, doc_ids to every backend)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="time each impl's fwd and fwd+bwd this many times per case, in rotating order across the "
                         "impls, and report the median with its spread (1: once each, back to back)")
    add_time_budget(ap)
    a = ap.parse_args(argv)
    if a.rounds < 1:
        raise SystemExit(f"--rounds {a.rounds} is not supported; allowed values: an integer >= 1")
    from attn_zoo.flex import allow_retain_graph
    from kernels import FlashConfig
    from kernels.flash.common import MAX_HEAD_DIM

    Ns = int_list(a.N, "--N", "sequence lengths")
    Ds = int_list(a.D, "--D", "head dims", maximum=MAX_HEAD_DIM)  # above it the kernels refuse the case

    allow_retain_graph()  # the compiled backwards (flex) are timed with retain_graph=True
    try:
        changes = json.loads(a.flash_config) if a.flash_config else {}
        if not isinstance(changes, dict):
            raise ValueError("not a JSON object")
        config = FlashConfig(autotune=a.tune, **changes)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"--flash-config {a.flash_config!r}: {e}; allowed: a JSON object of kernels.FlashConfig "
                         f"fields") from None
    variants = a.variants.split(",")
    if a.quick:
        variants, Ns, Ds = ["noncausal", "causal", "win1024", "bigbird"], [4096, 16384], [128]
    bad_v = [v for v in variants if v not in VARIANTS]
    if bad_v:
        raise SystemExit(f"--variants: {bad_v} not supported; allowed values: {', '.join(VARIANTS)}")
    bad_d = [D for D in Ds if a.hidden < D or a.hidden % D or ("gqa4" in variants and (a.hidden // D) % 4)]
    if bad_d:
        raise SystemExit(f"--hidden {a.hidden} is not supported with --D {bad_d}; allowed values: a multiple of every "
                         f"head dim (of 4 x the head dim with gqa4), so that H = hidden // D query heads")
    try:
        plugins = load_plugins(a.plugins)
    except ImportError as e:
        raise SystemExit(f"--plugins {a.plugins!r}: {e}") from None
    names = backend_names()
    impls = ["ours"] + [n for n in names if n != "triton"] if a.impls == "all" else a.impls.split(",")
    bad = [i for i in impls if i not in OURS and i not in names and i not in NATIVE]
    if bad:
        raise SystemExit(f"--impls: {bad} not supported; allowed values: ours, {', '.join(names)}, "
                         f"{', '.join(list(OURS)[1:])}, "
                         f"{', '.join(NATIVE)} (with --docs)")
    if any(i in NATIVE for i in impls) and a.docs is None:
        raise SystemExit(f"--impls: {', '.join(NATIVE)} run packed documents only; give --docs")
    impls += [n for n in backends_from(plugins) if n not in impls]
    try:
        dists = [None] if a.docs is None else document_dists(a.docs)  # a bad entry (or WikiText file) fails on CPU too
    except ValueError as e:  # a bad entry, a missing WikiText file
        raise SystemExit(str(e) if str(e).startswith("--docs") else f"--docs {a.docs!r}: {e}") from None
    require_cuda("bench_flash")
    env = env_info(a.date)
    print({k: env[k] for k in ("date", "gpu", "torch", "triton", "cuda")}, flush=True)
    rows, t_start = [], time.time()
    flex_budget = [a.flex_max_cases]
    for D in Ds:
        for name in variants:
            for N in Ns:
              for docs in dists:  # noqa: E111
                if budget_spent(t_start, a.time_budget_s, f"{name} N={N} D={D}"):
                    continue
                case_impls = [i for i in impls if not (i == "flex" and N < a.flex_min_n)]
                t0 = time.time()

                def after_impl(row, name=name, N=N, D=D, docs=docs):  # a line and the files as each impl finishes
                    mode = "fwd" if a.fwd_only else "fwd_bwd"
                    got = row.get("error") or f"{row.get(mode + '_tflops', float('nan')):.1f} TF/s {mode} (first round)"
                    print(f"  {row['impl']}: {name} {docs or ''} N={N} D={D}: {got} (compile {row.get('compile_s', '-')} s, "
                          f"{time.time() - t0:.0f} s into the case)", flush=True)
                    write_results(rows, a.out, a.tag, env)

                res = bench_case(name, N, D, case_impls, a.tokens, a.check, rows, flex_budget, config, docs, a.fwd_only,
                                 a.rounds, a.hidden, after_impl=after_impl)
                o = res.get("ours", {})
                mode = "fwd" if a.fwd_only else "fwd_bwd"
                tf = lambda r: r.get(mode + "_tflops", float("nan"))  # noqa: E731
                print(f"{name:9s} {docs or '':14s} N={N:6d} D={D:3d} ours [{o.get('fwd_impl', '-')}] {mode} "
                      f"{tf(o):7.1f} TF/s "
                      + " ".join(f"{i}={tf(r):.1f}" for i, r in res.items() if i != "ours")
                      + f"  ({time.time() - t0:.0f}s)", flush=True)
                write_results(rows, a.out, a.tag, env)  # after every case: a killed run keeps what it measured
    ours = [r for r in rows if r["impl"] in OURS and "fwd_ms" in r]
    cols = ["variant"] + (["docs"] if a.docs else []) + ["N", "D", "impl", "fwd_impl"] + (
        [] if a.fwd_only else ["bwd_impl"]) + ["fwd_tma"] + (
        [] if a.fwd_only else ["bwd_dkdv_tma", "bwd_dq_tma"]) + ["fwd_tflops"] + (
        [] if a.fwd_only else ["bwd_tflops", "fwd_bwd_tflops", "peak_mem_mib"]) + [
        c for c in ("fwd_spread",) + (() if a.fwd_only else ("fwd_bwd_spread",)) if any(c in r for r in ours)]
    cols += [c for c in ("x_sdpa_flash_fwd_bwd", "x_sdpa_cudnn_fwd_bwd", "x_flex_fwd_bwd", "x_fa4_fwd_bwd",
                         "x_flex_fa4_fwd_bwd", "x_fa4_varlen_fwd_bwd", "x_sdpa_flash_fwd", "x_sdpa_cudnn_fwd",
                         "x_flex_fwd", "x_fa4_fwd")
             + tuple(f"x_{i}_fwd" for i in list(OURS)[1:]) + ("max_err_vs_sdpa", )
             if any(c in r for r in ours)]
    print(format_table(ours, cols))
    if a.tune:
        from kernels.flash import autotune_results

        for key, cache in autotune_results().items():
            for k, cfg in cache.items():
                print("tuned", key, k, cfg)
    errs = [r for r in rows if "error" in r]
    if errs:
        print("not run / failed:")
        for r in errs:
            print(f"  {r['impl']} {r['variant']} N={r['N']} D={r['D']}: {r['error']}")


if __name__ == "__main__":
    main()
