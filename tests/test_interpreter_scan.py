"""The test session's faster ``tl.associative_scan`` for Triton's interpreter (tests/conftest.py,
``_vectorized_generic_scan``) gives what the interpreter's own element-by-element scan gives, bit for bit: kernels
with user combine functions (kernels.ssd's state-pass combine, one with a single output, an integer one) over
both axes of a block and a 1-D block, forward and reversed, each run under both implementations. The session's
interpreter builds no integer overflow checks (``_skip_the_discarded_overflow_checks``): the interpreter's own
options compute them and drop them (debug off), with the same results, and only debug makes them act."""

import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from kernels.ssd import _pass_combine

try:
    from triton.runtime.interpreter import ScanOps
except Exception:  # pragma: no cover
    ScanOps = None

pytestmark = pytest.mark.skipif(ScanOps is None or not hasattr(ScanOps, "_elementwise_generic_scan"),
                                reason="the interpreter's scan is not replaced in this session (a GPU, or a Triton "
                                       "without ScanOps.generic_scan)")


@triton.jit
def _halve_add(a, b):
    return a * 0.5 + b


@triton.jit
def _max_plus_one(a, b):
    return tl.maximum(a, b) + 1


@triton.jit
def _pair_scan_kernel(E, X, OE, OX, R: tl.constexpr, C: tl.constexpr, AXIS: tl.constexpr, REV: tl.constexpr):
    offs = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    es, xs = tl.associative_scan((tl.load(E + offs), tl.load(X + offs)), AXIS, _pass_combine, reverse=REV)
    tl.store(OE + offs, es)
    tl.store(OX + offs, xs)


@triton.jit
def _one_scan_kernel(X, O, N: tl.constexpr, REV: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(O + offs, tl.associative_scan(tl.load(X + offs), 0, _halve_add, reverse=REV))


@triton.jit
def _int_scan_kernel(X, O, R: tl.constexpr, C: tl.constexpr, AXIS: tl.constexpr):
    offs = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    tl.store(O + offs, tl.associative_scan(tl.load(X + offs), AXIS, _max_plus_one))


def _both(monkeypatch, launch):
    """``launch()``'s outputs with the interpreter's own scan and with the session's."""
    fast = ScanOps.generic_scan
    with monkeypatch.context() as m:
        m.setattr(ScanOps, "generic_scan", ScanOps._elementwise_generic_scan)
        ref = launch()
    assert ScanOps.generic_scan is fast
    return ref, launch()


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_vectorized_scan_equals_the_interpreters_scan(monkeypatch, axis, reverse):
    g = torch.Generator().manual_seed(axis + 2 * reverse)
    R, C = 8, 16
    e, x = torch.rand(R, C, generator=g), torch.randn(R, C, generator=g)

    def pair():
        oe, ox = torch.empty_like(e), torch.empty_like(x)
        _pair_scan_kernel[(1,)](e, x, oe, ox, R=R, C=C, AXIS=axis, REV=reverse)
        return oe, ox

    (re, rx), (fe, fx) = _both(monkeypatch, pair)
    assert torch.equal(fe, re) and torch.equal(fx, rx)
    assert not torch.equal(rx, x)  # the scan did something

    v = torch.randn(32, generator=g)

    def one():
        o = torch.empty_like(v)
        _one_scan_kernel[(1,)](v, o, N=32, REV=reverse)
        return o

    ref, got = _both(monkeypatch, one)
    assert torch.equal(got, ref) and not torch.equal(ref, v)

    n = torch.randint(-50, 50, (R, C), generator=g, dtype=torch.int32)

    def ints():
        o = torch.empty_like(n)
        _int_scan_kernel[(1,)](n, o, R=R, C=C, AXIS=axis)
        return o

    ref, got = _both(monkeypatch, ints)
    assert torch.equal(got, ref) and not torch.equal(ref, n)


@triton.jit
def _int_arith_kernel(X, Y, O, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(X + offs)
    y = tl.load(Y + offs)
    tl.store(O + offs, x * y + x - y)


def test_skipped_overflow_checks_were_computed_and_dropped(monkeypatch):
    from triton.runtime import interpreter

    options = interpreter.interpreter_builder.options
    assert not options.debug and not options.sanitize_overflow, "the session's interpreter builds no overflow checks"
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-2**31, 2**31 - 1, (32,), generator=g, dtype=torch.int32)
    y = torch.randint(-2**31, 2**31 - 1, (32,), generator=g, dtype=torch.int32)
    x[:2], y[:2] = torch.tensor([3, -5], dtype=torch.int32), torch.tensor([4, 6], dtype=torch.int32)

    def run():
        o = torch.empty_like(x)
        _int_arith_kernel[(1,)](x, y, o, N=32)
        return o

    got = run()
    x64, y64 = x.long(), y.long()
    wrapped = ((x64 * y64 + x64 - y64 + 2**31) % 2**32 - 2**31).int()  # int32 arithmetic wraps around
    assert torch.equal(got, wrapped) and got[:2].tolist() == [11, -41]
    with monkeypatch.context() as m:  # the interpreter's own options: the checks built, and dropped
        m.setattr(interpreter.interpreter_builder, "options", dataclasses.replace(options, sanitize_overflow=True))
        assert torch.equal(run(), got)
        # debug on: the checks act (the values above overflow int32), so they were not skipped there
        m.setattr(interpreter.interpreter_builder, "options",
                  dataclasses.replace(options, sanitize_overflow=True, debug=True))
        with pytest.raises(Exception, match="overflow detected"):
            run()
