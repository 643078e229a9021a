"""kernels._host.launch: Triton's launcher on the first call of a key, the kept compiled kernel's launcher after it,
and a new Triton launch whenever anything Triton specialises on changes (CPU: a fake kernel stands in for Triton)."""
from types import SimpleNamespace

import pytest
import torch

from kernels import _host


class FakeKernel:
    """``kernel[grid](*args, **kw)`` as Triton's JITFunction: records the call, returns a fake CompiledKernel whose
    ``run`` records the direct launches."""

    def __init__(self, names, constexprs):
        self.params = [SimpleNamespace(name=n, is_constexpr=n in constexprs) for n in names]
        self.triton_calls, self.direct_calls = [], []

    def __getitem__(self, grid):
        def call(*args, **kw):
            self.triton_calls.append((grid, args, kw))
            return SimpleNamespace(run=lambda *a: self.direct_calls.append(a), function="fn", packed_metadata="pm")
        return call


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(_host, "_interpreting", lambda: False)
    monkeypatch.setattr(_host.CompiledLaunch, "ready", staticmethod(lambda: True))
    import sys

    import triton.runtime.driver  # noqa: F401  (the module; triton.runtime.driver the attribute is its `driver`)

    monkeypatch.setattr(sys.modules["triton.runtime.driver"], "driver",
                        SimpleNamespace(active=SimpleNamespace(get_current_stream=lambda d: 7)))
    _host.clear_launches()
    yield
    _host.clear_launches()


def test_repeated_key_skips_tritons_launcher_and_passes_every_parameter_in_order(fast):
    # a constexpr passed by position (G) stays in place; the named ones follow in parameter order
    kern = FakeKernel(["X", "N", "G", "BLOCK", "MODE"], {"G", "BLOCK", "MODE"})
    x = torch.zeros(64)
    _host.launch(kern, (4, 2), (x, 100, 3), num_warps=8, MODE=1, BLOCK=32)
    assert len(kern.triton_calls) == 1 and kern.triton_calls[0][2] == dict(num_warps=8, MODE=1, BLOCK=32)
    y = torch.ones(64)
    _host.launch(kern, (4, 2), (y, 100, 3), num_warps=8, MODE=1, BLOCK=32)
    assert len(kern.triton_calls) == 1 and len(kern.direct_calls) == 1
    a = kern.direct_calls[0]
    assert a[:6] == (4, 2, 1, 7, "fn", "pm") and a[9] is y and a[10:] == (100, 3, 32, 1)


@pytest.mark.parametrize("change", ["int", "constexpr_by_position", "alignment", "dtype", "grid", "warps",
                                    "constexpr"])
def test_anything_triton_specialises_on_goes_back_through_triton(fast, change):
    kern = FakeKernel(["X", "N", "G", "BLOCK"], {"G", "BLOCK"})
    base = torch.zeros(64)
    call = dict(grid=(4,), args=(base, 16, 2), warps=4, BLOCK=32)
    _host.launch(kern, call["grid"], call["args"], num_warps=call["warps"], BLOCK=call["BLOCK"])
    other = {"int": dict(args=(base, 17, 2)), "constexpr_by_position": dict(args=(base, 16, 4)),
             "alignment": dict(args=(base[1:], 16, 2)), "dtype": dict(args=(base.double(), 16, 2)),
             "grid": dict(grid=(5,)), "warps": dict(warps=8), "constexpr": dict(BLOCK=64)}[change]
    call.update(other)
    _host.launch(kern, call["grid"], call["args"], num_warps=call["warps"], BLOCK=call["BLOCK"])
    assert len(kern.triton_calls) == 2 and not kern.direct_calls


@pytest.mark.parametrize("off", ["flag", "hook", "interpreter", "compiling"])
def test_tritons_path_when_fast_launch_is_off_a_hook_is_set_or_interpreting(fast, monkeypatch, off):
    if off == "compiling":  # torch.compile traces kernel[grid](...) itself
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    elif off == "flag":
        monkeypatch.setattr(_host, "FAST_LAUNCH", False)
    elif off == "hook":
        monkeypatch.setattr(_host.CompiledLaunch, "ready", staticmethod(lambda: False))
    else:
        monkeypatch.setattr(_host, "_interpreting", lambda: True)
    kern = FakeKernel(["X", "BLOCK"], {"BLOCK"})
    x = torch.zeros(8)
    for _ in range(3):
        _host.launch(kern, (1,), (x,), BLOCK=16)
    assert len(kern.triton_calls) == 3 and not kern.direct_calls


def test_a_kernel_whose_trailing_parameters_are_not_all_given_is_never_kept(fast):
    # BLOCK has a default and is not passed: the direct launcher could not be given every parameter
    kern = FakeKernel(["X", "N", "BLOCK"], {"BLOCK"})
    x = torch.zeros(8)
    for _ in range(2):
        _host.launch(kern, (1,), (x,), num_warps=4)
    assert len(kern.triton_calls) == 2 and not kern.direct_calls


class FakeDescriptor:
    """A host TMA descriptor as Gluon's / triton.tools' (a dataclass: not hashable)."""
    __hash__ = None

    def __init__(self, base, block_shape, layout="nvmma128", padding="zero"):
        self.base, self.shape, self.strides = base, list(base.shape), list(base.stride())
        self.block_shape, self.layout, self.padding = list(block_shape), layout, padding


@pytest.mark.parametrize("change", [None, "shape", "strides", "block", "layout", "dtype", "alignment"])
def test_a_descriptor_argument_is_keyed_by_what_its_launch_encodes(fast, change):
    # a Gluon kernel declares num_warps as a constexpr parameter too: the kept launcher passes it in the tail
    kern = FakeKernel(["desc", "N", "BLOCK", "num_warps"], {"BLOCK", "num_warps"})
    base = torch.zeros(4, 64)
    _host.launch(kern, (2,), (FakeDescriptor(base, [2, 64]), 4), num_warps=8, BLOCK=64)
    other = {None: base.clone(), "shape": torch.zeros(8, 64), "strides": torch.zeros(4, 128)[:, :64],
             "dtype": base.double(), "alignment": torch.zeros(4 * 64 + 1)[1:].view(4, 64)}.get(change, base)
    desc = FakeDescriptor(other, [1, 64] if change == "block" else [2, 64],
                          layout="nvmma64" if change == "layout" else "nvmma128")
    _host.launch(kern, (2,), (desc, 4), num_warps=8, BLOCK=64)
    if change is None:  # same everything but the base tensor: the kept launcher, every parameter in order
        assert len(kern.triton_calls) == 1 and len(kern.direct_calls) == 1
        assert kern.direct_calls[0][9] is desc and kern.direct_calls[0][10:] == (4, 64, 8)
    else:
        assert len(kern.triton_calls) == 2 and not kern.direct_calls


def test_a_descriptor_layout_is_keyed_by_value_hashable_or_not(fast):
    """A hashable layout (Gluon's are frozen dataclasses) keys by value; an unhashable one by its repr: equal values
    share the kept launcher, different ones launch through Triton again."""
    kern = FakeKernel(["desc", "num_warps"], {"num_warps"})
    base = torch.zeros(4, 64)
    for layout, again, other in ((("nvmma", 128), ("nvmma", 128), ("nvmma", 64)), (["nvmma", 128], ["nvmma", 128],
                                                                                   ["nvmma", 64])):
        _host.clear_launches()
        kern.triton_calls.clear(), kern.direct_calls.clear()
        _host.launch(kern, (1,), (FakeDescriptor(base, [2, 64], layout=layout),))
        _host.launch(kern, (1,), (FakeDescriptor(base.clone(), [2, 64], layout=again),))
        assert len(kern.triton_calls) == 1 and len(kern.direct_calls) == 1, layout
        _host.launch(kern, (1,), (FakeDescriptor(base, [2, 64], layout=other),))
        assert len(kern.triton_calls) == 2 and len(kern.direct_calls) == 1, layout
