"""lab.where_time: the parts that run without a GPU (case parsing, the kernel table, the markdown)."""
import re
from types import SimpleNamespace

import pytest
import torch

from lab import where_time as W


def _ev(name, us, cuda=True):
    dt = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    return SimpleNamespace(name=name, device_type=dt, time_range=SimpleNamespace(elapsed_us=lambda us=us: us))


def test_parse_cases_and_its_errors():
    assert W.parse_cases("causal:4096:128,gqa4:16384:64") == [("causal", 4096, 128), ("gqa4", 16384, 64)]
    for bad in ("causal:4096", "nosuch:4096:128", "causal:4k:128", "causal:4096:128:1", "causal:0:128"):
        with pytest.raises(ValueError, match="VARIANT:N:D") as e:
            W.parse_cases(bad)
        assert repr(bad) in str(e.value) and "causal" in str(e.value)  # names the entry and the allowed variants


def test_kernel_table_keeps_gpu_kernels_per_step():
    events = [_ev("fwd", 100), _ev("fwd", 120), _ev("dq", 60), _ev("aten::add", 999, cuda=False),
              _ev("Memset (Device)", 0), _ev("Memset (Device)", 4)]
    table = W.kernel_table(events, iters=2)
    assert table["fwd"] == (110.0, 1.0) and table["dq"] == (30.0, 0.5)
    assert "aten::add" not in table  # host events are not kernels
    assert table["Memset (Device)"] == (2.0, 0.5)  # a zero-length memset record is dropped, a timed one kept


def test_markdown_lists_errors_and_the_top_kernels():
    summary = [dict(variant="causal", N=4096, D=128, impl="ours", docs="", fwd_impl="gluon_ws3a", bwd_impl="gluon",
                    wall_ms=1.0, kernel_ms=0.9, busy=0.9, tflops_wall=400.0, tflops_kernels=444.4, launches=4),
               dict(variant="causal", N=4096, D=128, impl="sdpa_cudnn", docs="", wall_ms=1.2, graph_ms=1.1,
                    kernel_ms=1.05, busy=0.875, tflops_wall=333.3, tflops_kernels=380.9, launches=5),
               dict(variant="causal", N=4096, D=128, impl="flex_fa4", docs="", wall_ms=1.5, graph_error="RuntimeError: x",
                    kernel_ms=1.4, busy=0.933, tflops_wall=266.7, tflops_kernels=285.7, launches=3),
               dict(variant="causal", N=4096, D=128, impl="fa4", docs="", error="ImportError: no flash_attn | x")]
    kernels = [dict(variant="causal", N=4096, D=128, impl="ours", docs="", kernel=f"k{i}", us_per_step=10.0 - i,
                    share=0.1, launches=1) for i in range(8)]
    md = W.markdown(summary, kernels, top=3)
    assert "| causal N 4096 D 128 | ours (gluon_ws3a / gluon) | 1.000 | - | 0.900 | 0.90 | 400.0 | 444.4 | 4 |" in md
    assert "| causal N 4096 D 128 | sdpa_cudnn | 1.200 | 1.100 | 1.050 | 0.88 | 333.3 | 380.9 | 5 |" in md
    assert "| flex_fa4 | 1.500 | failed | 1.400 |" in md
    assert "ImportError: no flash_attn \\| x | | | | | | |" in md
    summary_rows = md.split("\n\n")[0].splitlines()
    assert len(summary_rows) == 6 and all(len(re.split(r"(?<!\\)\|", row)) - 2 == 9 for row in summary_rows)
    assert "`k2`" in md and "`k3`" not in md  # the top 3 kernels of each impl and case


def test_graph_time_reports_a_failed_capture_in_the_row(monkeypatch):
    """The CUDA-graph column never ends the probe: a step that cannot be captured gives ``graph_error`` naming the
    exception instead of ``graph_ms``; a step that can gives ``graph_ms`` (the timer stands in for the GPU's)."""
    def capture_and_time(step, warmup, calls):
        for _ in range(warmup + calls):
            step()
        return 1.23456

    monkeypatch.setattr(W, "time_cuda_graph", capture_and_time)
    calls = []
    assert W.graph_time(lambda: calls.append(1)) == {"graph_ms": 1.2346} and len(calls) == 3

    def bad_step():
        raise RuntimeError("operation not permitted when stream is capturing\nsecond line")

    assert W.graph_time(bad_step) == {"graph_error": "RuntimeError: operation not permitted when stream is capturing"}
