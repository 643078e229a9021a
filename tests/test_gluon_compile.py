"""The Gluon kernels compile for Hopper (sm_90a) on the installed triton, without a GPU (lab/inspect_gluon.py).

Gluon's API moves between triton versions: triton 3.9 (what CI and `pip install torch` bring) removed two calls the
kernels were written with on the GPU image's 3.6, and nothing failed on a CPU until a kernel was compiled. These
cases compile the kernels ``"auto"`` runs at D 128 (the forward, the two-consumer dK / dV kernel, the dQ kernel) and
the fused dQ by TMA reduce-add where this triton has it, and check the report: no spills at the defaults, the
wgmma / TMA instructions present. Skipped where triton has no Gluon (the CPU-only runs of other platforms).

The compiles run in a fresh interpreter without ``TRITON_INTERPRET`` (one for all the cases: ~4.5 s of start-up
each): the CPU test session sets it
(tests/conftest.py) before triton is imported, which makes triton.language's own ``@triton.jit`` helpers (the
combine functions behind ``gl.max`` / ``gl.sum``) interpreter functions that the Gluon compiler refuses ("Unsupported
function referenced: InterpretedFunction"): the forward failed so on a clean CPU runner, and passed only where the
compile cache already held it."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    from triton.experimental.gluon import language as _gl  # noqa: F401
    from triton.experimental.gluon._runtime import GluonASTSource  # noqa: F401

    _HAS_GLUON = True
except Exception:  # noqa: BLE001
    _HAS_GLUON = False

pytestmark = pytest.mark.skipif(not _HAS_GLUON, reason="this triton has no Gluon (triton.experimental.gluon)")


ROOT = Path(__file__).resolve().parents[1]
_MARK = "@@inspect_gluon_report@@"


def _inspect():
    from lab import inspect_gluon

    return inspect_gluon


def _tma_reduce_ok() -> bool:
    from kernels.flash import gluon as G

    return G.gluon_tma_reduce_ok()


# name: (lab.inspect_gluon function, args, keyword args); the TMA dQ cases only where this triton has the reduce-add
CASES = {
    "fwd_ws3a": ("compile_case", ["gluon_ws3a", "causal", 128], {}),
    "fwd_ws3p": ("compile_case", ["gluon_ws3p", "causal", 128], dict(ptx=True)),
    "fwd_ws3p_dynamic": ("compile_case", ["gluon_ws3p", "causal", 128], dict(dynamic=True, ptx=True)),
    "dkdv2": ("compile_bwd_case", ["causal", 128], dict(write_dq=False, consumers=2)),
    "dkdv2_overlap": ("compile_bwd_case", ["causal", 64], dict(write_dq=False, consumers=2, overlap=True)),
    "dq": ("compile_dq_case", ["causal", 128], {}),
    "tma_dq_one": ("compile_bwd_case", ["causal", 128], dict(write_dq=True, dq_tma=True, ptx=True)),
    "tma_dq_two": ("compile_bwd_case", ["full", 128], dict(write_dq=True, consumers=2, dq_tma=True, ptx=True)),
}


@pytest.fixture(scope="module")
def reports():
    """Every case of :data:`CASES` compiled in one subprocess without ``TRITON_INTERPRET``: ``name -> report``, or
    ``name -> [error, traceback]`` for a case that failed (the others still compile)."""
    cases = {k: c for k, c in CASES.items() if not k.startswith("tma_") or _tma_reduce_ok()}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    code = ("import json, sys, traceback\nfrom lab import inspect_gluon as ig\nout = {}\n"
            "for name, (fn, args, kw) in json.loads(sys.argv[1]).items():\n"
            "    try:\n        out[name] = getattr(ig, fn)(*args, **kw)\n"
            "    except Exception as e:\n        out[name] = [repr(e), traceback.format_exc()]\n"
            f"print({_MARK!r} + json.dumps(out))")
    p = subprocess.run([sys.executable, "-c", code, json.dumps(cases)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0 and _MARK in p.stdout, (p.stdout[-2000:], p.stderr[-4000:])
    return json.loads(p.stdout.rsplit(_MARK, 1)[1])


def _compile(reports: dict, name: str) -> dict:
    """Case ``name``'s report (``lab.inspect_gluon.<fn>(*args, **kw)`` of :data:`CASES`)."""
    r = reports[name]
    assert isinstance(r, dict), (name, CASES[name], r)
    return r


def _checked(r: dict, stack_max: int = 0) -> dict:
    assert r["wgmma"] > 0 and r["tma"] > 0 and r["setmaxnreg"] > 0, r  # warpgroup MMAs, TMA, register moves
    assert r["stack_bytes"] <= stack_max, r  # spills at the default settings: a regression
    assert r["ptxas_warnings"] == 0, r
    return r


def test_forward_ws3a_compiles_causal_d128(reports):
    _checked(_compile(reports, "fwd_ws3a"))


def test_persistent_forward_compiles_static_and_dynamic(reports):
    """gluon_ws3p, causal D 128, both schedules: no spills; the dynamic one claims items with one global atomic
    add and reads the hand-over slot with volatile loads; the static one has neither."""
    import re

    static = _checked(_compile(reports, "fwd_ws3p"))
    dynamic = _checked(_compile(reports, "fwd_ws3p_dynamic"))
    assert len(re.findall(r"atom\.global\.\S*add", dynamic["ptx"])) == 1
    assert re.search(r"ld\.volatile", dynamic["ptx"])
    assert not re.search(r"atom\.global", static["ptx"]) and not re.search(r"ld\.volatile", static["ptx"])


def test_two_consumer_dkdv_and_dq_kernels_compile_causal_d128(reports):
    _checked(_compile(reports, "dkdv2"))
    _checked(_compile(reports, "dq"))


def test_two_consumer_dkdv_with_overlap_compiles_causal_d64(reports):
    """GLUON_BWD_OVERLAP's schedule (the first visited tile peeled, then tiles that issue the previous tile's dK)
    compiles without spills at D 64 (at D 128 it spills a little: ``lab.inspect_gluon --impls gluon_bwd_dkdv2ov``)."""
    _checked(_compile(reports, "dkdv2_overlap"))


def test_tma_dq_kernels_compile_where_triton_has_the_reduce_add(reports):
    """gluon_bwd_dq="tma": one reduce-add site per consumer in the PTX (one-consumer kernel: 1; two: 2); on a
    triton without the reduce-add the compile helper refuses, naming the version."""
    import re

    if not _tma_reduce_ok():  # (refused before anything is compiled: in this process)
        with pytest.raises(ValueError, match=r"dq_tma needs Gluon's TMA reduce-add .* this triton is"):
            _inspect().compile_bwd_case("causal", 128, write_dq=True, dq_tma=True)
        return
    one = _checked(_compile(reports, "tma_dq_one"))
    two = _checked(_compile(reports, "tma_dq_two"))
    for r, sites in ((one, 1), (two, 2)):
        assert len(re.findall(r"cp\.reduce\.async\.bulk\.tensor\.4d\S*\.add", r["ptx"])) == sites
        assert "red.global" not in r["ptx"]  # no per-element atomics left
