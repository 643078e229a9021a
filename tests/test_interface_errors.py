"""Bad input gets a clear error naming the argument."""

import os
import re

import pytest
import torch

import attn_zoo
from attn_zoo import AttentionSpec, attention, available_backends, make_spec


def qkv(Hq=4, Hkv=2, Nq=8, Nk=8, D=8, dtype=torch.float32):
    return torch.randn(1, Hq, Nq, D, dtype=dtype), torch.randn(1, Hkv, Nk, D, dtype=dtype), torch.randn(1, Hkv, Nk, D, dtype=dtype)


def test_hq_not_multiple_of_hkv():
    q, k, v = qkv(Hq=4, Hkv=3)
    with pytest.raises(ValueError, match=r"Hq=4 must be a multiple of Hkv=3"):
        attention(q, k, v, AttentionSpec())


def test_shape_dtype_device_mismatch():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="q must be 4-D"):
        attention(q[0], k, v, AttentionSpec())
    with pytest.raises(TypeError, match="share one dtype"):
        attention(q, k.double(), v, AttentionSpec())
    with pytest.raises(TypeError, match="q.dtype=torch.int64"):
        attention(q.long(), k.long(), v.long(), AttentionSpec())
    with pytest.raises(ValueError, match="head dims differ"):
        attention(q, k[..., :4], v, AttentionSpec())
    with pytest.raises(ValueError, match=r"must agree in \(B, Hkv, Nk\)"):
        attention(q, k, v[:, :, :5], AttentionSpec())
    with pytest.raises(ValueError, match="batch sizes differ"):
        attention(q, torch.cat([k, k]), torch.cat([v, v]), AttentionSpec())
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="one device"):
            attention(q.cuda(), k, v, AttentionSpec())


def test_spec_validation():
    with pytest.raises(ValueError, match="window_size left=-1"):
        AttentionSpec(kind="sliding_window", window_size=(-1, 0))
    with pytest.raises(ValueError, match="window_size right=-3"):
        AttentionSpec(kind="sliding_window", window_size=(4, -3))
    with pytest.raises(ValueError, match="needs window_size"):
        AttentionSpec(kind="sliding_window")
    with pytest.raises(ValueError, match=r"kind='rnn' is not supported; allowed values: flash, sliding_window, sparse, linear"):
        AttentionSpec(kind="rnn")
    with pytest.raises(ValueError, match="feature_map='cosine' is not supported; allowed values: elu1, relu, favor, taylor"):
        AttentionSpec(kind="linear", feature_map="cosine")
    with pytest.raises(ValueError, match="sparse_pattern="):
        AttentionSpec(kind="sparse", sparse_pattern="dilated")
    with pytest.raises(ValueError, match="block_size"):
        AttentionSpec(kind="sparse", block_size=0)
    with pytest.raises(ValueError, match="eps"):
        AttentionSpec(kind="linear", eps=0.0)
    with pytest.raises(ValueError, match="softmax_scale"):
        AttentionSpec(softmax_scale=-1.0)
    with pytest.raises(ValueError, match="n_kv_heads=3 must divide n_heads=4"):
        AttentionSpec(n_kv_heads=3).resolve_kv_heads(4)
    assert AttentionSpec(kv_group_size=2).resolve_kv_heads(8) == 4
    assert make_spec("sliding_window", window_size=[3, 0]).window_size == (3, 0)


@pytest.mark.parametrize("kind, allowed", [
    ("flash", "causal, kv_group_size, n_kv_heads, name, softmax_scale"),
    ("sliding_window", "causal, kv_group_size, n_kv_heads, name, softmax_scale, window_size"),
    ("linear", "causal, chunk_size, eps, feature_map, kv_group_size, n_kv_heads, name, num_features, seed"),
])
def test_unknown_field_lists_only_the_fields_the_kind_reads(kind, allowed):
    """``+attention.foo=1`` on flash listed window_size, block_size, ... as allowed, which flash then refuses."""
    with pytest.raises(ValueError) as e:
        make_spec(kind, foo=1)
    assert str(e.value) == f"unknown fields ['foo'] for kind={kind!r}; allowed: {allowed}"
    base = {"window_size": (3, 0)} if kind == "sliding_window" else {}
    for field in allowed.split(", "):  # each one listed is taken
        make_spec(kind, **{**base, field: base.get(field, AttentionSpec.__dataclass_fields__[field].default)})


def test_unknown_backend_and_unsupported_request():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="backend='cuda' is not supported; allowed values: auto, triton, parallel, taylor_chunk, torch, reference"):
        attention(q, k, v, AttentionSpec(), backend="cuda")
    with pytest.raises(ValueError, match="return_lse"):
        attention(q, k, v, AttentionSpec(kind="linear"), backend="reference", return_lse=True)
    for bad in ("yes", 1, None):  # a truthy / falsy stand-in changed what came back (a tuple or not)
        with pytest.raises(ValueError, match=f"return_lse={bad!r} is not supported; allowed values: True, False"):
            attention(q, k, v, AttentionSpec(), return_lse=bad)
    assert "reference" in available_backends("linear") and "torch" in available_backends("flash")


@pytest.mark.parametrize("backend", ["auto", "reference", "torch", "triton", "naive"])
@pytest.mark.parametrize("docs", [False, True])
def test_return_lse_for_a_linear_kind_says_so_first(backend, docs):
    """``attention(..., kind="linear", return_lse=True)`` listed every backend's refusal, starting with "triton:
    auto uses it on CUDA only", before the real reason; it now refuses up front, as ``attention_varlen`` does."""
    from attn_zoo import attention_varlen

    q, k, v = qkv()
    spec = AttentionSpec(kind="linear")
    want = "return_lse=True is only defined for softmax kinds, got kind='linear'"
    kw = {"doc_ids": torch.zeros(1, 8, dtype=torch.int32)} if docs else {}
    with pytest.raises(ValueError) as e:
        attention(q, k, v, spec, backend=backend, return_lse=True, **kw)
    assert str(e.value) == want
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError) as e:
        attention_varlen(*(t[0].transpose(0, 1) for t in (q, k, v)), cu, cu, 8, 8, spec, return_lse=True)
    assert str(e.value) == want  # the same words as the varlen form


def test_auto_on_cpu_never_silently_wrong():
    q, k, v = qkv(Nq=5, Nk=11)
    for spec in (AttentionSpec(), AttentionSpec(kind="sparse", block_size=4), AttentionSpec(kind="linear")):
        torch.testing.assert_close(attention(q, k, v, spec), attention(q, k, v, spec, backend="reference"), atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter behaviour")
def test_triton_backend_refuses_what_the_interpreter_gets_wrong(monkeypatch):
    q, k, v = qkv(dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16 is not supported by the CPU interpreter"):
        attention(q, k, v, AttentionSpec(), backend="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    for kind in ("flash", "linear"):
        with pytest.raises(ValueError, match="needs a CUDA device"):
            attention(q.float(), k.float(), v.float(), AttentionSpec(kind=kind), backend="triton")


def test_flex_off_cuda_refuses_gradients_naming_the_backend():
    """FlexAttention has no CPU backward: backend='flex' with inputs that need gradients failed at backward with
    torch's NotImplementedError (in train.py: after the data work); now refused naming the backend, whether or
    not the same shapes were dispatched without gradients before. Without gradients it runs."""
    q, k, v = qkv()
    spec = AttentionSpec()
    if q.is_cuda or attn_zoo.registry.get_backends("flash")["flex"].unavailable() is not None:
        pytest.skip("FlexAttention missing")
    # the backends that take these inputs, asked of the registry (triton too under the interpreter), no flex one
    want = (r"backend='flex'.*no backward off CUDA.*allowed values: (?!.*flex)(?=.*\btorch\b)(?=.*\bnaive\b)"
            r"(?=.*\breference\b)" + (r"(?=.*\btriton\b)" if os.environ.get("TRITON_INTERPRET") == "1" else ""))
    with pytest.raises(ValueError, match=want):  # first call of these shapes: refused by its supports()
        attention(q.clone().requires_grad_(), k, v, spec, backend="flex")
    with torch.no_grad():  # forward only: runs, and the dispatch cache remembers the backend for these shapes
        torch.testing.assert_close(attention(q, k, v, spec, backend="flex"), attention(q, k, v, spec, backend="reference"),
                                   atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match=want):  # the remembered dispatch: refused by the backend itself
        attention(q, k.clone().requires_grad_(), v, spec, backend="flex")


def test_empty_dimensions_raise_naming_the_argument():
    """Zero query heads / batch / value dim used to give empty outputs (and interpreter warnings): now errors."""
    q, k, v = qkv()
    for backend in ("auto", "reference", "torch"):
        with pytest.raises(ValueError, match=r"Hq=0 \(q.shape\[1\]\)"):
            attention(q[:, :0], k, v, AttentionSpec(), backend=backend)
        with pytest.raises(ValueError, match=r"B=0 \(q.shape\[0\]\)"):
            attention(q[:0], k[:0], v[:0], AttentionSpec(kind="linear"), backend=backend)
        with pytest.raises(ValueError, match=r"Dv=0 \(v.shape\[3\]\)"):
            attention(q, k, v[..., :0], AttentionSpec(), backend=backend)


@pytest.mark.parametrize("field,value", [("softmax_scale", True), ("softmax_scale", False), ("eps", True)])
def test_bool_is_not_a_number(field, value):
    """``softmax_scale=True`` was taken as 1.0 (bool is an int subclass); ``eps=True`` as 1."""
    kw = {"kind": "linear"} if field == "eps" else {}
    with pytest.raises(ValueError, match=rf"{field} must be .*got {value}"):
        AttentionSpec(**kw, **{field: value})
    assert AttentionSpec(**kw, **{field: 1}).scale(4) == (1.0 if field == "softmax_scale" else 0.5)


@pytest.mark.parametrize("build", [
    lambda: AttentionSpec(kind="sliding_window", window_size=(3, 0), dilation=2),
    lambda: AttentionSpec(kind="sliding_window", window_size=(3, 0)).replace(dilation=2),
])
def test_constructor_and_replace_refuse_unknown_fields_as_make_spec_does(build):
    """Before: AttentionSpec(...) and spec.replace(...) raised dataclass's TypeError ("__init__() got an unexpected
    keyword argument 'dilation'"), naming neither the kind nor the fields it reads; make_spec named both."""
    with pytest.raises(ValueError) as e:
        build()
    assert str(e.value) == ("unknown fields ['dilation'] for kind='sliding_window'; allowed: causal, kv_group_size, "
                            "n_kv_heads, name, softmax_scale, window_size")
    with pytest.raises(ValueError, match=r"unknown fields \['blocksize'\] for kind='sparse'; allowed: block_size"):
        AttentionSpec(kind="sparse", blocksize=16)
    with pytest.raises(ValueError, match=r"kind='flsh' is not supported"):  # an unknown kind is named first
        AttentionSpec(kind="flsh", windowsize=(3, 0))


def test_a_subclass_built_without_kind_names_its_own_kind_and_fields():
    """A variant's spec subclass built without ``kind`` named flash's fields in the unknown-field error (``kind``'s
    dataclass default): ``DilatedWindowSpec(dilation=2, foo=1)`` said "for kind='flash'; allowed: causal,
    kv_group_size, n_kv_heads, name, softmax_scale", leaving out ``dilation`` and ``window_size``. It names the kind
    the subclass is registered for (a plugin's too), or the class when no kind is registered with it; and refusing
    the default kind, it names the subclass's own."""
    from dataclasses import dataclass

    from attn_zoo.variants import register_variant, unregister_variant
    from attn_zoo.variants.dilated_window import DilatedWindowSpec

    with pytest.raises(ValueError) as e:
        DilatedWindowSpec(window_size=(3, 0), dilation=2, foo=1)
    assert str(e.value) == ("unknown fields ['foo'] for kind='dilated_window'; allowed: causal, dilation, "
                            "kv_group_size, n_kv_heads, name, softmax_scale, window_size")
    with pytest.raises(ValueError, match=r"unknown fields \['foo'\] for kind='flash'; allowed: causal, kv_group_size"):
        DilatedWindowSpec(kind="flash", foo=1)  # a kind given is the kind named
    with pytest.raises(ValueError, match=r"^kind='flash' is built by AttentionSpec, not DilatedWindowSpec \(the spec "
                                         r"class of kind='dilated_window'\); .*, or pass kind='dilated_window'$"):
        DilatedWindowSpec(window_size=(3, 0), dilation=2)
    assert DilatedWindowSpec(kind="dilated_window", window_size=(3, 0), dilation=2).dilation == 2

    @dataclass(frozen=True)
    class StrideSpec(AttentionSpec):
        stride: int = 2

    with pytest.raises(ValueError, match=r"^unknown fields \['strid'\] for StrideSpec \(no registered kind builds "
                                         r"it\); its fields: .*, stride, .*$"):
        StrideSpec(strid=3)
    register_variant("strided_toy", "softmax", spec_class=StrideSpec, fields=("stride",),
                     mask=lambda spec, Nq, Nk: {"dilation": spec.stride})
    try:
        with pytest.raises(ValueError) as e:
            StrideSpec(strid=3)
        assert str(e.value) == ("unknown fields ['strid'] for kind='strided_toy'; allowed: causal, kv_group_size, "
                                "n_kv_heads, name, softmax_scale, stride")
        assert AttentionSpec(kind="strided_toy", stride=3) == StrideSpec(kind="strided_toy", stride=3)
    finally:
        unregister_variant("strided_toy")


@pytest.mark.parametrize("kind", [["flash"], {"kind": "flash"}, 5])
def test_unknown_fields_with_a_kind_that_is_no_string_name_the_kind(kind):
    """AttentionSpec(kind=<not a string>, <unknown field>) looks the kind up in __new__: an unhashable one (a list)
    raised a bare TypeError ('unhashable type: list') instead of the ValueError naming the registered kinds."""
    with pytest.raises(ValueError, match=r"kind=.* is not supported; allowed values: flash"):
        AttentionSpec(kind=kind, windowsize=(3, 0))
    with pytest.raises(ValueError, match=r"is not supported; allowed values: flash"):
        AttentionSpec(kind=kind)


@pytest.mark.parametrize("kind", [None, 5, ["flash"]])
def test_a_kind_that_is_no_string_is_named_as_given(kind):
    """``AttentionSpec(kind=None)`` (``kind: null`` in a yaml) said "kind='' is not supported": the value given is named."""
    with pytest.raises(ValueError, match=rf"^kind={re.escape(repr(kind))} is not supported; allowed values: flash"):
        AttentionSpec(kind=kind)
    with pytest.raises(ValueError, match=rf"^kind={re.escape(repr(kind))} is not supported"):
        make_spec(kind)
