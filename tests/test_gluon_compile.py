"""The Gluon kernels compile for Hopper (sm_90a) on the installed triton, without a GPU (lab/inspect_gluon.py).

Gluon's API moves between triton versions: triton 3.9 (what CI and `pip install torch` bring) removed two calls the
kernels were written with on the GPU image's 3.6, and nothing failed on a CPU until a kernel was compiled. These
cases compile the kernels ``"auto"`` runs at D 128 (the forward, the two-consumer dK / dV kernel, the dQ kernel) and
the fused dQ by TMA reduce-add where this triton has it, and check the report: no spills at the defaults, the
wgmma / TMA instructions present. Skipped where triton has no Gluon (the CPU-only runs of other platforms).

Each compile runs in a fresh interpreter without ``TRITON_INTERPRET``: the CPU test session sets it
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


def _compile(fn: str, *args, **kw) -> dict:
    """``lab.inspect_gluon.<fn>(*args, **kw)``'s report, compiled in a subprocess without ``TRITON_INTERPRET``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    code = ("import json, sys\nfrom lab import inspect_gluon as ig\na = json.loads(sys.argv[1])\n"
            f"print({_MARK!r} + json.dumps(getattr(ig, a['fn'])(*a['args'], **a['kw'])))")
    p = subprocess.run([sys.executable, "-c", code, json.dumps(dict(fn=fn, args=args, kw=kw))], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and _MARK in p.stdout, (fn, args, kw, p.stdout[-2000:], p.stderr[-4000:])
    return json.loads(p.stdout.rsplit(_MARK, 1)[1])


def _checked(r: dict, stack_max: int = 0) -> dict:
    assert r["wgmma"] > 0 and r["tma"] > 0 and r["setmaxnreg"] > 0, r  # warpgroup MMAs, TMA, register moves
    assert r["stack_bytes"] <= stack_max, r  # spills at the default settings: a regression
    assert r["ptxas_warnings"] == 0, r
    return r


def test_forward_ws3a_compiles_causal_d128():
    _checked(_compile("compile_case", "gluon_ws3a", "causal", 128))


def test_two_consumer_dkdv_and_dq_kernels_compile_causal_d128():
    _checked(_compile("compile_bwd_case", "causal", 128, write_dq=False, consumers=2))
    _checked(_compile("compile_dq_case", "causal", 128))


def test_tma_dq_kernels_compile_where_triton_has_the_reduce_add():
    """gluon_bwd_dq="tma": one reduce-add site per consumer in the PTX (one-consumer kernel: 1; two: 2); on a
    triton without the reduce-add the compile helper refuses, naming the version."""
    import re

    from kernels.flash import gluon as G

    if not G.gluon_tma_reduce_ok():  # (refused before anything is compiled: in this process)
        with pytest.raises(ValueError, match=r"dq_tma needs Gluon's TMA reduce-add .* this triton is"):
            _inspect().compile_bwd_case("causal", 128, write_dq=True, dq_tma=True)
        return
    one = _checked(_compile("compile_bwd_case", "causal", 128, write_dq=True, dq_tma=True, ptx=True))
    two = _checked(_compile("compile_bwd_case", "full", 128, write_dq=True, consumers=2, dq_tma=True, ptx=True))
    for r, sites in ((one, 1), (two, 2)):
        assert len(re.findall(r"cp\.reduce\.async\.bulk\.tensor\.4d\S*\.add", r["ptx"])) == sites
        assert "red.global" not in r["ptx"]  # no per-element atomics left
