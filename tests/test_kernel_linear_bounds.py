"""Memory bounds of the fused linear-attention kernels (kernels/linear.py) with packed documents, under the
interpreter, which does not check addresses itself (an index one past a tensor's end reads its neighbour).

Every memory op of every kernel must stay inside that launch's tensor arguments (lab/interp_bounds.py
``bounds_checked``), and with every input (q, k, v, the document index, the initial state, dout) and every buffer
the launcher allocates placed in the middle of a sentinel-filled buffer (NaN, a huge document number), the
results must match the fp32 torch form and the guards must be untouched. Shapes: the H200 bench's structure
(``eval.bench_linear --docs``: one packed row, G = 1, bf16, several segments, documents at chunk edges) scaled
down, and the edges (N not a multiple of the chunk, two rows, GQA, the initial / final state)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import kernels.linear as KL  # noqa: E402
from attn_zoo.backends.torch_linear import chunked_linear_attention  # noqa: E402
from lab.interp_bounds import bounds_checked, guarded, guarded_empty, guards_intact  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter-only bounds check")]


class _GuardedTorch:
    """``torch`` for kernels.linear whose ``empty`` / ``empty_like`` return guarded, sentinel-filled tensors."""

    def __init__(self):
        self.made = []

    def __getattr__(self, name):
        return getattr(torch, name)

    def empty(self, *shape, device=None, dtype=None):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
        t = guarded_empty(shape, dtype or torch.float32, device)
        self.made.append(t)
        return t

    def empty_like(self, x, dtype=None):
        return self.empty(tuple(x.shape), device=x.device, dtype=dtype or x.dtype)


def _docs(N, lens):
    ids = []
    for i, n in enumerate(lens):
        ids += [i] * n
    ids = (ids + [len(lens)] * N)[:N]
    return torch.tensor(ids, dtype=torch.int32)


def _run(monkeypatch, B, Hq, Hkv, N, F, Dv, dtype, doc, chunk, seg, tiles=None):
    g = torch.Generator().manual_seed(N + 7 * B)
    q = torch.randn(B, Hq, N, F, generator=g).sigmoid()  # features >= 0 (as phi(q))
    k = torch.randn(B, Hkv, N, F, generator=g).sigmoid()
    v = torch.randn(B, Hkv, N, Dv, generator=g)
    do = torch.randn(B, Hq, N, Dv, generator=g)
    cfg = KL.LinearConfig(tiles=tiles or ())

    # reference: the fp32 torch chunked form with documents (inputs rounded to the kernel's dtype)
    ref_in = [t.to(dtype).float().clone().requires_grad_() for t in (q, k, v)]
    gq = Hq // Hkv
    rk, rv = (t.repeat_interleave(gq, 1) for t in ref_in[1:])
    ref = chunked_linear_attention(ref_in[0], rk, rv, True, 1e-6, chunk, doc)
    ref.backward(do)

    proxy = _GuardedTorch()
    ins = [guarded(t.to(dtype)).requires_grad_() for t in (q, k, v)]
    idx = guarded(KL.document_index(doc))
    monkeypatch.setattr(KL, "torch", proxy)
    monkeypatch.setattr(KL, "_cached_document_index", lambda d: idx)
    with bounds_checked() as st:
        out = KL.linear_attention(*ins, causal=True, chunk_size=chunk, segment_size=seg, doc_ids=doc, config=cfg)
        out.backward(guarded(do.to(dtype)))
    monkeypatch.undo()
    assert st.n_checked > 0 and not st.violations, st.violations
    for t in proxy.made + [idx] + ins:
        assert guards_intact(t), f"guard of a {tuple(t.shape)} {t.dtype} tensor overwritten"
    tol = 5e-2 if dtype == torch.bfloat16 else 1e-4
    for got, want, name in [(out, ref, "out")] + [(a.grad, b.grad, n) for a, b, n in zip(ins, ref_in, "qkv")]:
        err = ((got.float() - want).norm() / want.norm()).item()
        assert err < tol, f"{name}: rel. error {err:.3g}"


# the bench's structure: B = 1, G = 1, documents at chunk edges (fixed:L), several segments, N % chunk == 0
@pytest.mark.parametrize("lens", [[32] * 8, [20, 44, 3, 61, 128]], ids=["fixed32", "mixed"])
def test_bench_structure_bf16(monkeypatch, lens):
    N = 256
    _run(monkeypatch, 1, 2, 2, N, 32, 32, torch.bfloat16, _docs(N, lens)[None], 16, 64)


def test_edges_fp32(monkeypatch):
    """N not a multiple of the chunk, two rows, GQA, documents ending at the last position and one-token ones."""
    N = 90
    doc = torch.stack([_docs(N, [16, 1, 31, 16, 25, 1]), _docs(N, [89, 1])])
    _run(monkeypatch, 2, 2, 1, N, 16, 16, torch.float32, doc, 16, 32)
