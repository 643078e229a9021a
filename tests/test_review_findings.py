"""Regression tests of defects found in a review (bad inputs, odd shapes, edge cases), all CPU and fast.

Each test names the defect it pins down; the fixes are in the commit that added this file.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import attn_zoo  # noqa: E402
from attn_zoo import AttentionSpec  # noqa: E402
from attn_zoo.decode import KVCache, append_kv  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
FLASH = AttentionSpec(kind="flash")

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------------- attention()
@pytest.mark.parametrize("bad", ["q", "k", "v"])
@pytest.mark.parametrize("value", [None, [1.0, 2.0], "x"])
def test_attention_non_tensor_argument_raises_type_error_naming_it(bad, value):
    """The dispatch cache built its key from ``q.shape`` before check_inputs ran: a non-tensor argument raised
    ``AttributeError: 'list' object has no attribute 'shape'`` instead of the TypeError naming the argument."""
    t = torch.randn(1, 2, 8, 4)
    args = {"q": t, "k": t, "v": t}
    args[bad] = value
    with pytest.raises(TypeError, match=f"{bad} must be a torch.Tensor"):
        attn_zoo.attention(args["q"], args["k"], args["v"], FLASH)


# ------------------------------------------------------------------------------------------- decode
def _ragged_paged_cache(page_size, lens, B=2, Hkv=1, D=16, cap=48, poison=float("nan")):
    """A paged cache whose slots past each sequence's length (and unused pages) hold ``poison``."""
    g = torch.Generator().manual_seed(0)
    max_pages = -(-cap // page_size)
    P = B * max_pages
    kc = torch.full((P, Hkv, page_size, D), poison)
    vc = kc.clone()
    bt = torch.randperm(P, generator=g).view(B, max_pages).to(torch.int32)
    k = torch.randn(B, Hkv, cap, D, generator=g)
    v = torch.randn(B, Hkv, cap, D, generator=g)
    for b, n in enumerate(lens):
        append_kv(kc, vc, k[b:b + 1, :, :n], v[b:b + 1, :, :n], torch.zeros(1, dtype=torch.int32), bt[b:b + 1])
    return kc.to(DEV), vc.to(DEV), bt.to(DEV), torch.tensor(lens, dtype=torch.int32, device=DEV)


@pytest.mark.parametrize("page_size", [5, 24])
def test_decode_kernel_takes_any_page_size(page_size):
    """KVCache accepts any page_size >= 1, but the triton decode kernel (auto's choice on CUDA) raised
    ``page_size=24 and block_n=64: one must divide the other``; its per-key page lookup handles any page size."""
    kc, vc, bt, sl = _ragged_paged_cache(page_size, [7, 41])
    q = torch.randn(2, 2, 2, 16, generator=torch.Generator().manual_seed(1)).to(DEV)
    spec = AttentionSpec(kind="sliding_window", window_size=(9, 0))
    out = attn_zoo.decode_attention(q, kc, vc, spec, sl, bt, backend="triton")
    ref = attn_zoo.decode_attention(q, kc, vc, spec, sl, bt, backend="reference")
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("paged", [False, True])
def test_decode_torch_backend_ignores_slots_past_each_sequence(paged):
    """Ragged ``cache_seqlens``: the torch backend (auto off CUDA) ran SDPA over the gathered cache up to the longest
    sequence, so stale / NaN slots past a shorter sequence's end (``torch.empty`` caches, reused pages) made that
    sequence's output NaN; the triton and reference backends never read them."""
    lens = [5, 30]
    if paged:
        kc, vc, bt, sl = _ragged_paged_cache(8, lens)
    else:
        g = torch.Generator().manual_seed(0)
        kc, vc = (torch.randn(2, 1, 32, 16, generator=g) for _ in range(2))
        kc[0, :, 5:], vc[0, :, 5:] = float("nan"), float("nan")
        kc, vc, bt, sl = kc.to(DEV), vc.to(DEV), None, torch.tensor(lens, dtype=torch.int32, device=DEV)
    q = torch.randn(2, 2, 1, 16, generator=torch.Generator().manual_seed(2)).to(DEV)
    out = attn_zoo.decode_attention(q, kc, vc, FLASH, sl, bt, backend="torch")
    ref = attn_zoo.decode_attention(q, kc, vc, FLASH, sl, bt, backend="reference")
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


def test_decode_zero_kv_heads_raises_value_error():
    """A cache with 0 K/V heads raised ``ZeroDivisionError: integer modulo by zero`` (``Hq % Hkv``)."""
    q = torch.randn(1, 2, 1, 8)
    kc = torch.zeros(1, 0, 4, 8)
    with pytest.raises(ValueError, match=r"k_cache must have every dimension >= 1"):
        attn_zoo.decode_attention(q, kc, kc.clone(), FLASH, torch.tensor([1], dtype=torch.int32))


def test_append_kv_errors_name_k_new_not_q():
    """append_kv's dtype error said ``must match q's dtype`` (append_kv has no q)."""
    kc, vc = torch.zeros(2, 2, 8, 4), torch.zeros(2, 2, 8, 4)
    sl = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(TypeError, match="must match k_new's dtype"):
        append_kv(kc, vc, torch.zeros(2, 2, 1, 4, dtype=torch.float16), torch.zeros(2, 2, 1, 4, dtype=torch.float16), sl)
    with pytest.raises(ValueError, match="k_new has 4"):
        append_kv(kc, vc, torch.zeros(2, 4, 1, 4), torch.zeros(2, 4, 1, 4), sl)


def test_kv_cache_attend_needs_the_new_tokens_appended():
    """KVCache.attend skips decode_attention's value checks, so a query with more new tokens than a sequence holds
    (attend before append, or after release) silently returned zero rows (torch / triton) or crashed in the reference
    backend (``IndexError: amax(): Expected reduction dim -1 to have non-zero size``). The host lengths say it."""
    c = KVCache(2, 1, 8, 16)
    q = torch.randn(2, 2, 1, 8)
    with pytest.raises(ValueError, match="append the new keys / values"):
        c.attend(q, FLASH, backend="reference")
    c.append(torch.randn(2, 1, 3, 8), torch.randn(2, 1, 3, 8))
    assert c.attend(q, FLASH, backend="reference").shape == (2, 2, 1, 8)
    with pytest.raises(ValueError, match="sequence 0 of the cache holds 3"):
        c.attend(torch.randn(2, 2, 5, 8), FLASH)
    c.release(0)
    with pytest.raises(ValueError, match="sequence 0 of the cache holds 0"):
        c.attend(q, FLASH, backend="reference")
    with pytest.raises(ValueError, match=r"b=5 must be a sequence index in \[0, batch=2\)"):
        c.release(5)


def test_generate_rejects_bad_idx_and_max_new_tokens():
    """GPT.generate indexed ``idx[:, -L:]`` before any check: a 1-D prompt raised ``IndexError: too many indices``,
    an empty one failed deep in attention (``Nq=0``), a float one in the embedding; ``max_new_tokens=-1`` silently
    returned the prompt."""
    from attn_zoo.model import GPT, GPTConfig

    m = GPT(GPTConfig(vocab_size=16, n_layer=1, n_head=2, d_model=16, max_seq_len=8), [FLASH]).eval()
    idx = torch.randint(0, 16, (2, 3))
    for bad in (idx[0], idx[:, :0], idx.float()):
        with pytest.raises(ValueError, match="idx must be"):
            m.generate(bad, 2)
    for n in (-1, 2.5):
        with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 0"):
            m.generate(idx, n)
    assert m.generate(idx, 2, greedy=True).shape == (2, 5)


# ------------------------------------------------------------------------------------------- data
def test_text_seq_len_below_one_raises_naming_it(tmp_path):
    """``data=text data.seq_len=0`` raised ``ZeroDivisionError: integer division or modulo by zero``."""
    from harness.data import TextDataModule

    f = tmp_path / "t.txt"
    f.write_text("hello world\n" * 50)
    for n in (0, -3):
        with pytest.raises(ValueError, match="data.seq_len must be >= 1"):
            TextDataModule(path=str(f), seq_len=n)
    with pytest.raises(ValueError, match="data.batch_size must be >= 1"):
        TextDataModule(path=str(f), seq_len=8, batch_size=0)


@pytest.mark.parametrize("n", [0, -6, 2])
def test_mqar_seq_len_too_small_raises_naming_it(n):
    """``data.seq_len=0`` for MQAR said ``data.num_kv_pairs=8 must be in [1, seq_len/4=0]`` (names the other
    setting); ``-5`` said it must be even."""
    from harness.data import MQARDataModule

    with pytest.raises(ValueError, match="data.seq_len must be an even number >= 4"):
        MQARDataModule(seq_len=n, num_kv_pairs=1, num_train=64, num_val=8, batch_size=8)


def test_resume_model_config_error_names_the_differing_keys():
    """The architecture check printed both full model configs without saying which keys differ."""
    from harness.lit import LitLM
    from attn_zoo.model import spec_to_dict

    cfg = dict(vocab_size=16, n_layer=1, n_head=2, d_model=16, max_seq_len=8)
    lit = LitLM(model_config=cfg, layer_specs=[spec_to_dict(FLASH)])
    with pytest.raises(ValueError, match=r"model.vocab_size: checkpoint 32, this run 16") as e:
        lit.check_checkpoint_hparams({"model_config": dict(cfg, vocab_size=32)})
    assert "n_layer" not in str(e.value)


def test_ckpt_path_of_a_file_that_is_not_a_checkpoint_raises_naming_it(tmp_path):
    """``ckpt_path=<run>/final_metrics.json`` raised torch.load's ``RuntimeError: mmap can only be used with files
    saved with torch.save(..., _use_new_zipfile_serialization=True)``; a torch.save'd dict that is not a Lightning
    checkpoint went on to Lightning."""
    from harness.runs import checkpoint_info

    js = tmp_path / "final_metrics.json"
    js.write_text('{"steps": 3}')
    with pytest.raises(ValueError, match=r"ckpt_path=.*final_metrics.json.* is not a checkpoint torch.load can read"):
        checkpoint_info(js)
    sd = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2)}, sd)
    with pytest.raises(ValueError, match=r"is not a Lightning checkpoint of train.py"):
        checkpoint_info(sd)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("spec", [AttentionSpec(kind="sliding_window", window_size=(3, 0)),
                                  AttentionSpec(kind="sparse", sparse_pattern="strided", block_size=4,
                                                stride_blocks=2)], ids=["window", "strided"])
def test_decode_nan_in_a_key_no_query_sees_changes_nothing(backend, spec):
    """Prefill zeroes keys that no query may see (README: they "contribute nothing on every backend"), decode did
    not: a NaN key / value left of a sliding window (inside a visited key tile) made every decode output NaN on
    triton (``0 * NaN`` in ``p @ v``) and on torch (SDPA's additive mask), while reference and prefill stayed
    finite."""
    g = torch.Generator().manual_seed(3)
    kc, vc = (torch.randn(2, 1, 32, 16, generator=g) for _ in range(2))
    q = torch.randn(2, 2, 2, 16, generator=g)
    sl = torch.tensor([32, 27], dtype=torch.int32)
    kc[:, :, 1], vc[:, :, 1] = float("nan"), float("inf")  # position 1: outside both masks for the last 2 queries
    kc, vc, q, sl = kc.to(DEV), vc.to(DEV), q.to(DEV), sl.to(DEV)
    assert not any(attn_zoo.mask_info(spec, 2, n).dense("cpu")[:, 1].any() for n in (32, 27))
    out = attn_zoo.decode_attention(q, kc, vc, spec, sl, backend=backend)
    ref = attn_zoo.decode_attention(q, kc, vc, spec, sl, backend="reference")
    assert torch.isfinite(ref).all()
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


def test_dkdv_split_error_at_the_call_names_the_setting():
    """A ``dkdv_split`` that does not divide the GQA group was read from the environment at backward time; it is a
    setting now (``FlashConfig`` / ``flash_settings``) and the forward call raises, naming it."""
    from kernels import flash_attn, flash_settings

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 16, 16, generator=g).to(DEV).requires_grad_(True)
    k, v = (torch.randn(1, 1, 16, 16, generator=g).to(DEV) for _ in range(2))
    with flash_settings(dkdv_split=3):
        with pytest.raises(ValueError, match=r"dkdv_split=3 must be an integer >= 1 dividing the GQA group size "
                                             r"Hq // Hkv = 4"):
            flash_attn(q, k, v, causal=True)
