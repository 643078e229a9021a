"""eval/bench_linear.py --docs glue on the CPU (the timing replaced, the kernels under the Triton interpreter): every
method runs, the check compares each method with documents against the fp32 reference, and the rows and files come
out. fla is made absent (its row is missing and the run goes on)."""

import json
import os
import time
import types

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import eval.bench_linear as bl  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_bench_docs_checks_every_method_and_writes_its_files(tmp_path, monkeypatch):
    monkeypatch.setattr(bl, "time_cuda", lambda fn, grad_to_none=None, **k: (fn(), 2.0)[1])
    monkeypatch.setattr(bl, "peak_memory", lambda fn: 0)

    def no_fla(cu):
        raise ImportError("fla made absent by the test")

    monkeypatch.setattr(bl, "_fla_varlen", no_fla)
    args = types.SimpleNamespace(docs="fixed:24,geometric:20", docs_tokens="72", docs_torch=True,
                                 docs_variants=False, no_check=False, time_budget_s=1e9, out=str(tmp_path),
                                 prefix="linear")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows = bl.bench_docs(args, dev, torch.float32, 2, 16, time.time(), {"gpu": None})
    ours = [r for r in rows if r["method"] == "ours_docs"]
    assert [r["docs"] for r in ours] == ["fixed:24", "geometric:20"]
    assert ours[0]["n_docs"] == 3 and ours[0]["x_ours_nodocs_fwd_bwd"] == 1.0
    for r in rows:
        if r["method"] == "ours_nodocs":
            assert "rel_err_out" not in r
        else:  # with documents: checked against the reference, forward and every gradient
            for what in ("out", "dq", "dk", "dv"):
                assert r[f"rel_err_{what}"] < 1e-5, (r["method"], what)
    data = json.load(open(tmp_path / "linear_docs_bench.json"))
    assert len(data["rows"]) == len(rows) and len(data["env"]["checks"]) == 4
    assert (tmp_path / "linear_docs_bench.csv").exists()


def test_bench_docs_refuses_a_bad_distribution_before_running(tmp_path):
    args = types.SimpleNamespace(docs="fixed:24,poisson:3", docs_tokens="72", docs_torch=False, docs_variants=False,
                                 no_check=True, time_budget_s=1e9, out=str(tmp_path), prefix="linear")
    with pytest.raises(ValueError, match="poisson:3"):
        bl.bench_docs(args, "cpu", torch.float32, 1, 16, time.time(), {})
