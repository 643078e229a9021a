"""lab/same_ptx.py on a throwaway git repo (CPU: records under the interpreter, compiles for sm_90 without a GPU): a
refactor into a helper compiles to the same PTX, an arithmetic change does not, a bad --base is refused."""
import os
import subprocess
import sys
import warnings

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "lab", "same_ptx.py")

KERNEL = '''
import torch
import triton
import triton.language as tl

{helper}

@triton.jit
def toy_kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(X + offs, mask=m)
    tl.store(Y + offs, {body}, mask=m)


def toy(x):
    y = torch.empty_like(x)
    toy_kernel[(triton.cdiv(x.numel(), 16),)](x, y, x.numel(), BLOCK=16)
    return y
'''
HELPER = '''
@triton.jit
def _affine(x):
    return x * 2.0 + 1.0
'''
TEST = '''
import torch
from kernels.toy import toy


def test_toy():
    x = torch.arange(20.0)
    assert torch.allclose(toy(x), x * 2 + 1) or torch.allclose(toy(x), x * 3 + 1)
'''


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A git repo with kernels/toy.py and its test committed; skipped when triton cannot compile for sm_90 here."""
    try:
        from triton.runtime.jit import JITFunction

        from lab.same_ptx import ptx

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # triton 3.9's TRITON_DEFAULT_FP_FUSION notice
            ptx(JITFunction(_noop), {"X": "*fp32"}, {}, [0], {})
    except Exception as e:
        pytest.skip(f"triton cannot compile for sm_90 without a GPU here: {e!r}")
    d = tmp_path_factory.mktemp("toyrepo")
    (d / "kernels").mkdir()
    (d / "tests").mkdir()
    (d / "kernels" / "__init__.py").write_text("")
    (d / "kernels" / "toy.py").write_text(KERNEL.format(helper="", body="x * 2.0 + 1.0"))
    (d / "tests" / "test_toy.py").write_text(TEST)
    for cmd in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "toy"]):
        subprocess.run(["git", *cmd], cwd=d, check=True)
    return d


def _noop(X):  # the smallest kernel: tried once to see that this machine's triton compiles for sm_90
    pass


def _same_ptx(repo, *args):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, TOOL, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def test_helper_refactor_same_ptx(repo):
    (repo / "kernels" / "toy.py").write_text(KERNEL.format(helper=HELPER, body="_affine(x)"))
    rc, out = _same_ptx(repo, "--base", "HEAD", "--tests", "tests/test_toy.py")
    assert rc == 0, out
    assert "identical PTX 1, different 0, compile errors 0" in out and "toy_kernel" in out


def test_arithmetic_change_differs(repo):
    (repo / "kernels" / "toy.py").write_text(KERNEL.format(helper="", body="x * 3.0 + 1.0"))
    rc, out = _same_ptx(repo, "--base", "HEAD", "--tests", "tests/test_toy.py", "--only", "kernels.toy")
    assert rc == 1, out
    assert "DIFFERENT kernels.toy.toy_kernel" in out and "different 1" in out


def test_kernel_at_one_revision_only(repo):
    (repo / "kernels" / "toy.py").write_text(KERNEL.format(helper="", body="x * 2.0 + 1.0").replace("toy_k", "toy2_k"))
    rc, out = _same_ptx(repo, "--base", "HEAD", "--tests", "tests/test_toy.py")
    assert rc == 1 and "toy2_kernel: only in the working tree" in out, out


def test_bad_arguments(repo):
    rc, out = _same_ptx(repo, "--base", "no-such-rev", "--tests", "tests/test_toy.py")
    assert rc == 2 and "--base 'no-such-rev'" in out, out
    rc, out = _same_ptx(repo, "--base", "HEAD")
    assert rc == 2 and "--tests is required" in out, out
    rc, out = _same_ptx(repo, "--base", "HEAD", "--tests", "tests/test_toy.py", "--set", "UP")
    assert rc == 2 and "--set 'UP'" in out, out
