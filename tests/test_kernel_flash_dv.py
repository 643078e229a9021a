"""Our Triton exact-attention kernel with v's head dim ``Dv`` != q/k's ``D`` (MLA: 48 vs 32 at tiny scale, 192 vs
128 in DeepSeek-V2): output, lse and every gradient against the fp32 reference, on CPU under the interpreter (small
shapes) and compiled on CUDA. Dense, causal (Nq < Nk too), window, block-sparse, GQA, non-power-of-two dims, the
atomic dQ mode and the split dK/dV."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import attn_zoo  # noqa: E402
from attn_zoo import softmax_attention_reference  # noqa: E402

pytest.importorskip("triton")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _check(spec, Hq=2, Hkv=2, Nq=40, Nk=40, D=48, Dv=32, config=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).to(DEV)  # noqa: E731
    q, k, v, do = mk(1, Hq, Nq, D), mk(1, Hkv, Nk, D), mk(1, Hkv, Nk, Dv), mk(1, Hq, Nq, Dv)
    dlse = mk(1, Hq, Nq)
    res = []
    for fn in (lambda a, b, c: attn_zoo.attention(a, b, c, spec, backend="triton", return_lse=True) if config is None
               else __import__("kernels").flash_attn(a, b, c, causal=spec.causal, return_lse=True, config=config),
               lambda a, b, c: softmax_attention_reference(a, b, c, spec, return_lse=True)):
        a, b, c = (t.clone().requires_grad_(True) for t in (q, k, v))
        out, lse = fn(a, b, c)
        grads = torch.autograd.grad((out * do).sum() + (torch.nan_to_num(lse, neginf=0.0) * dlse).sum(), (a, b, c))
        res.append((out, lse, *grads))
    assert res[0][0].shape == (1, Hq, Nq, Dv) and res[0][4].shape == v.shape
    for name, x, y in zip(("out", "lse", "dq", "dk", "dv"), res[0], res[1]):
        torch.testing.assert_close(x, y.float(), atol=2e-4, rtol=2e-4, msg=lambda m: f"{name}: {m}")


def test_dense_and_causal():
    _check(attn_zoo.make_spec("flash", causal=True), D=48, Dv=32)  # Dv < D, both padded (64 / 32)
    _check(attn_zoo.make_spec("flash", causal=False), Nq=24, Nk=40, D=24, Dv=40, Hq=4, Hkv=1)  # Dv > D, MQA


def test_causal_decode_offset_window_and_sparse():
    _check(attn_zoo.make_spec("flash", causal=True), Nq=8, Nk=40, Hq=4, Hkv=2)
    _check(attn_zoo.make_spec("sliding_window", causal=True, window_size=(9, 0)), Nq=40, Nk=40)
    _check(attn_zoo.make_spec("sparse", causal=True, block_size=16, num_random_blocks=0), Nq=48, Nk=48)


def test_atomic_dq_and_split_dkdv():
    from kernels import FlashConfig

    _check(attn_zoo.make_spec("flash", causal=True), Hq=4, Hkv=1, config=FlashConfig(dq_mode="atomic"))
    _check(attn_zoo.make_spec("flash", causal=True), Hq=4, Hkv=1, config=FlashConfig(dkdv_split=2))


def test_v_head_dim_errors():
    from kernels import flash_attn

    q = k = torch.randn(1, 1, 4, 8, device=DEV)
    with pytest.raises(ValueError, match=r"v head dim Dv=300 \(v.shape\[3\]\) is not supported"):
        flash_attn(q, k, torch.randn(1, 1, 4, 300, device=DEV))
    with pytest.raises(ValueError, match=r"q and k head dims must agree \(q D=8, k D=4\)"):
        flash_attn(q, torch.randn(1, 1, 4, 4, device=DEV), torch.randn(1, 1, 4, 8, device=DEV))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_deepseek_sizes(dtype):
    """DeepSeek-V2's per-head dims (q.k 192, v 128), causal, N = 1024, compiled: within 2x (grads 3x) the error of
    plain PyTorch attention in the same dtype against the fp32 reference (FlashAttention's rule)."""
    spec = attn_zoo.make_spec("flash", causal=True)
    g = torch.Generator().manual_seed(0)
    mk = lambda *s: torch.randn(*s, generator=g).to("cuda", dtype)  # noqa: E731
    q, k, v, do = mk(2, 4, 1024, 192), mk(2, 4, 1024, 192), mk(2, 4, 1024, 128), mk(2, 4, 1024, 128)

    def run(fn, *t):
        t = [x.clone().requires_grad_(True) for x in t]
        out = fn(*t)
        return (out, *torch.autograd.grad(out, t, do.to(out.dtype)))

    ours = run(lambda a, b, c: attn_zoo.attention(a, b, c, spec, backend="triton"), q, k, v)
    ref = run(lambda a, b, c: softmax_attention_reference(a, b, c, spec), q.float(), k.float(), v.float())
    def plain_torch(a, b, c):  # scores, softmax output and P V in the inputs' dtype
        s = (a @ b.transpose(-1, -2)) * 192 ** -0.5
        s = s.masked_fill(~torch.ones(1024, 1024, dtype=torch.bool, device="cuda").tril(), float("-inf"))
        return torch.softmax(s.float(), dim=-1).to(a.dtype) @ c

    plain = run(plain_torch, q, k, v)
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        err = (ours[i].float() - ref[i]).abs().max().item()
        base = (plain[i].float() - ref[i]).abs().max().item()
        assert err <= (2 if i == 0 else 3) * base + 1e-5, f"{name}: {err} vs plain {base}"
