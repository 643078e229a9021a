"""Same PTX: a Triton kernel refactor checked without a GPU, by compiling every kernel the tests launch for sm_90 at
two revisions and comparing the PTX (lab: not installed).

Usage (from the checkout root; the working tree, uncommitted changes included, is compared with ``--base``)::

    python -m lab.same_ptx --base REV --tests "tests/test_kernel_linear.py -k docs" [--only kernels.linear] \\
        [--set UP=False] [--keep DIR]

1. Record: the ``--tests`` pytest selection runs in the working tree under ``TRITON_INTERPRET=1``, with
   ``InterpretedFunction.run`` patched to note each launch of an ``@triton.jit`` kernel whose module starts with
   ``--only`` (default ``kernels.``): module, name, argument types as Triton specialises them (``*bf16``, ``i32``,
   ``u1``, ints equal to 1 as constexprs, 16-divisible ints as ``tt.divisibility=16``; every pointer 16-byte aligned,
   as on a GPU), constexpr values and the launch options (``num_warps``, ``num_stages``, ...). Duplicates are dropped.
2. Compile: each launch, for sm_90 (``GPUTarget("cuda", 90, 32)``: no GPU needed) through TTIR, TTGIR, LLVM IR to PTX,
   in the working tree and in a ``git worktree`` of ``--base`` (one subprocess each, that tree first on ``sys.path``,
   ``TRITON_INTERPRET`` unset). PTX is compared after dropping ``.loc`` / ``.file`` lines, debug sections and
   ``$L__tmp`` labels (line numbers move in any refactor).
3. Report: triton version, launches recorded / compiled / identical / different (a short diff of the first) /
   compile errors / only at one revision. Exit 0 when all identical, 1 when any differs, fails to compile or exists at
   one revision only (not proven the same), 2 for bad arguments.

Interpreter-only constexprs: some are set only under the interpreter (``UP=q.dtype == torch.bfloat16 and
_interpreting()`` in kernels/linear.py, taylor.py, taylor_chunk.py: bf16 dots upcast, the interpreter's bf16 dot being
wrong in some Triton versions), so the recorded value is not the one a GPU compiles. ``--set NAME=VALUE`` (repeatable;
VALUE a Python literal) overrides that constexpr in every recorded launch before compiling; a warning names recorded
constexprs that look interpreter-only (a heuristic: a line of its module with ``_interpreting()`` assigns a name equal
to it, any case) when no ``--set`` covers them. FP fusion is Triton's default (``TRITON_DEFAULT_FP_FUSION``), shown in
the report.

Limits: only the kernels the selected tests launch, with the shapes they use, are compared (a refactor of a path no
test reaches is not checked); the launch is the working tree's (host-side changes, e.g. other constexprs or grids
chosen at ``--base``, are not); ``@triton.jit`` helpers are inlined, so a helper new at one revision is fine, but a
launched kernel missing at ``--base`` is reported and fails the check. Gluon kernels cannot run under the interpreter
and are not recorded: check a Gluon refactor by hand with a ``@gluon.jit`` wrapper kernel that calls the changed
helpers, compiled at both revisions (a subprocess per tree, as here) through
``triton.experimental.gluon._runtime.GluonASTSource(fn, signature=, constexprs=)`` in place of ``ASTSource`` in
:func:`ptx` (its stages are ``ttgir`` -> ``llir`` -> ``ptx``: no ``ttir``), and compare the normalised PTX.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import pickle
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ARCH = 90


def _jit_ref(v):
    """A ``@triton.jit`` function passed as a constexpr, as (JIT, module, name): each tree imports its own."""
    return ("JIT", v.fn.__module__, v.fn.__name__) if hasattr(v, "rewrite") else v


def _spec(kern, args, kwargs):
    """(module, name, arg names, signature, divisible arg indices, constexprs, options) of one interpreted launch."""
    import inspect

    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    fn, names = kern.fn, kern.arg_names
    params = inspect.signature(fn).parameters
    vals = dict(zip(names, args))
    vals.update({k: v for k, v in kwargs.items() if k in params})
    opts = {k: v for k, v in kwargs.items() if k not in params}
    idx = {n: i for i, n in enumerate(names)}
    nospec = {idx.get(a, a) for a in kern.kwargs.get("do_not_specialize") or ()}
    noalign = {idx.get(a, a) for a in kern.kwargs.get("do_not_specialize_on_alignment") or ()}
    sig, const, div = {}, {}, []
    for i, n in enumerate(names):
        v = vals.get(n, params[n].default)
        if "constexpr" in str(params[n].annotation):
            sig[n], const[n] = "constexpr", _jit_ref(v)
            continue
        ty, attr = native_specialize_impl(BaseBackend, v, False, i not in nospec, i not in noalign)
        if ty.startswith("*") and i not in noalign:
            attr = "D"  # a GPU launch of 16-byte aligned tensors, whatever the CPU tensor's address
        sig[n] = ty
        if ty == "constexpr":
            const[n] = v
        elif attr == "D":
            div.append(i)
    return fn.__module__, fn.__name__, list(names), sig, div, const, opts


def _record(out, only, pytest_args):
    """Worker: run pytest in this process under the interpreter, launches of ``only*`` kernels to ``out``."""
    os.environ["TRITON_INTERPRET"] = "1"
    import pytest
    from triton.runtime import interpreter

    seen, launches, calls, orig = set(), [], [0], interpreter.InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        if not warmup and self.fn.__module__.startswith(only):
            calls[0] += 1
            try:
                spec = _spec(self, args, kwargs)
                pickle.dumps(spec)
            except Exception as e:  # recorded as a failure to compile, with the reason
                spec = (self.fn.__module__, self.fn.__name__, None, f"not recordable: {e!r}"[:200], [], {}, {})
            if repr(spec) not in seen:
                seen.add(repr(spec))
                launches.append(spec)
        return orig(self, *args, grid=grid, warmup=warmup, **kwargs)

    interpreter.InterpretedFunction.run = run
    rc = pytest.main(["-q", "-p", "no:cacheprovider"] + pytest_args)
    with open(out, "wb") as f:
        pickle.dump({"rc": int(rc), "calls": calls[0], "launches": launches}, f)
    return 0


def _norm_ptx(t):
    t = re.sub(r"^\s*\.(loc|file)\b.*$\n?", "", t, flags=re.M)
    t = re.sub(r"\.section\s+\.debug.*", "", t, flags=re.S)
    return re.sub(r"^\$L__tmp\d+:\s*$\n?", "", t, flags=re.M)


def _compile_one(spec, be, tgt):
    """Normalised sm_90 PTX of one recorded launch in this process's tree; raises LookupError when it is absent."""
    import importlib

    from triton.runtime.jit import JITFunction

    mod, name, names, sig, div, const, opts = spec
    if names is None:
        raise RuntimeError(sig)
    try:
        fn = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as e:
        raise LookupError(f"{mod}.{name} absent: {e}") from None
    while not isinstance(fn, JITFunction) and hasattr(fn, "fn"):  # autotune / heuristics wrappers
        fn = fn.fn
    if not isinstance(fn, JITFunction):
        raise RuntimeError(f"{mod}.{name} is not a @triton.jit kernel here ({type(fn).__name__})")
    if list(fn.arg_names) != names:
        raise RuntimeError(f"{name}: arguments here {fn.arg_names}, recorded {names}")
    const = {k: getattr(importlib.import_module(v[1]), v[2]) if isinstance(v, tuple) and v[:1] == ("JIT",) else v
             for k, v in const.items()}
    return ptx(fn, sig, const, div, opts, be, tgt)


def ptx(fn, sig, const, div, opts, be=None, tgt=None):
    """Normalised PTX of ``fn`` (a JITFunction) for sm_90; ``div``: indices of arguments divisible by 16."""
    import triton._C.libtriton as lt
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    tgt = tgt or GPUTarget("cuda", ARCH, 32)
    be = be or make_backend(tgt)
    src = ASTSource(fn, signature=sig, constexprs=const, attrs={(i,): [["tt.divisibility", 16]] for i in div})
    o = be.parse_options(dict(opts))
    ctx = lt.ir.context()
    lt.ir.load_dialects(ctx)
    be.load_dialects(ctx)
    m = src.make_ir(tgt, o, be.get_codegen_implementation(o), be.get_module_map(), ctx)
    stages, md = {}, {}
    be.add_stages(stages, o, src.language)
    for st, step in stages.items():  # ttir, ttgir, llir, ptx (cubin would need ptxas)
        m = step(m, md)
        if st == "ptx":
            return _norm_ptx(m)
    raise RuntimeError(f"no ptx stage in {list(stages)}")


def _compile(tree, launches_file, outdir):
    """Worker: compile every launch in ``launches_file`` with ``tree`` first on sys.path; PTX and status to outdir."""
    os.environ.pop("TRITON_INTERPRET", None)
    sys.path[0] = tree  # not lab/, this script's folder
    os.chdir(tree)
    import warnings

    warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")  # its default: reported as fp_fusion
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    tgt = GPUTarget("cuda", ARCH, 32)
    be = make_backend(tgt)
    with open(launches_file, "rb") as f:
        launches = pickle.load(f)
    status = []
    os.makedirs(outdir, exist_ok=True)
    for i, spec in enumerate(launches):
        try:
            text = _compile_one(spec, be, tgt)
            with open(os.path.join(outdir, f"{i:04d}_{spec[1]}.ptx"), "w") as f:
                f.write(text)
            status.append("ok")
        except LookupError as e:
            status.append("absent: " + str(e))
        except Exception as e:
            status.append("error: " + f"{type(e).__name__}: {e}".strip().splitlines()[0][:300])
    with open(os.path.join(outdir, "status.json"), "w") as f:
        json.dump({"triton": triton.__version__, "fp_fusion": be.parse_options({}).enable_fp_fusion,
                   "status": status}, f)
    return 0


def _worker(cmd, cwd, env_extra=None, log=None):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # the tree first, then the caller's PYTHONPATH (a triton there, e.g. the GPU image's 3.6 unpacked to /tmp/t36,
    # is the one both revisions record and compile with)
    env["PYTHONPATH"] = os.pathsep.join([cwd] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(env_extra or {})
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"] + cmd, cwd=cwd, env=env,
                            stdout=log, stderr=subprocess.STDOUT if log else None)


def _git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def _interp_only(tree, launches):
    """Recorded constexpr names that a line with ``_interpreting()`` in their module assigns (any case)."""
    names = {}
    for mod, _, _, _, _, const, _ in launches:
        path = os.path.join(tree, *mod.split(".")) + ".py"
        lhs = set()
        if os.path.exists(path):
            for ln in open(path).read().splitlines():
                if "_interpreting()" in ln:
                    lhs.update(n.lower() for n in re.findall(r"(\w+)\s*=(?!=)", ln))
        names.update({k: mod for k in const if k.lower() in lhs})
    return names


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m lab.same_ptx", description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="revision to compare the working tree with (a commit-ish)")
    p.add_argument("--tests", help='pytest arguments (paths from the checkout root) that launch the kernels, '
                   'e.g. "tests/test_x.py -k y"')
    p.add_argument("--only", default="kernels.", help="module prefix of the kernels to compare (default kernels.)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="override a constexpr in every recorded launch (e.g. UP=False); repeatable")
    p.add_argument("--keep", help="keep the base worktree, launches and PTX in this new folder")
    p.add_argument("--compile-path", help="a folder put after the tree on the compile workers' PYTHONPATH only: "
                   "record with this environment's triton, compile with another (e.g. the GPU image's 3.6 unpacked "
                   "to /tmp/t36, whose interpreter may not run the tests)")
    a = p.parse_args(argv)
    if not a.tests:
        p.error("--tests is required: a pytest selection whose tests launch the kernels to compare")
    sets = {}
    for s in a.set:
        k, eq, v = s.partition("=")
        try:
            if not (eq and k.isidentifier()):
                raise ValueError
            sets[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            p.error(f"--set {s!r}: expected NAME=VALUE with VALUE a Python literal (True, False, 3, 'x')")
    a.set = sets
    top = _git("rev-parse", "--show-toplevel", cwd=os.getcwd())
    if top.returncode:
        p.error(f"not in a git checkout ({os.getcwd()}): --base needs one")
    a.tree = top.stdout.strip()
    rev = _git("rev-parse", "--verify", "--quiet", a.base + "^{commit}", cwd=a.tree)
    if rev.returncode:
        p.error(f"--base {a.base!r}: not a commit of {a.tree}")
    a.base_sha = rev.stdout.strip()
    if a.compile_path and not os.path.isdir(a.compile_path):
        p.error(f"--compile-path {a.compile_path!r}: not a folder")
    if a.keep and os.path.exists(a.keep) and os.listdir(a.keep):
        p.error(f"--keep {a.keep!r}: exists and is not empty")
    return a


def _record_launches(a, work):
    """Run the tests under the interpreter: (launches after --set, all calls, distinct recorded) or an exit code."""
    rec, log_path = os.path.join(work, "recorded.pkl"), os.path.join(work, "pytest.log")
    print(f"same_ptx: recording launches: pytest {a.tests} (TRITON_INTERPRET=1, {a.tree})", flush=True)
    with open(log_path, "w") as log:
        cmd = ["record", rec, a.only, "--"] + shlex.split(a.tests)
        rc = _worker(cmd, a.tree, {"TRITON_INTERPRET": "1"}, log).wait()
    if rc or not os.path.exists(rec):
        print(f"same_ptx: recording failed (exit {rc}); pytest's output ends:\n" + open(log_path).read()[-3000:])
        return 1
    with open(rec, "rb") as f:
        r = pickle.load(f)
    if r["rc"] in (2, 3, 4, 5):
        print(f"same_ptx: --tests {a.tests!r}: pytest exit {r['rc']} (interrupted, usage error or nothing collected)")
        return 2
    if r["rc"]:
        print(f"same_ptx: warning: some selected tests failed (pytest exit {r['rc']}); their launches are kept")
    if not r["launches"]:
        print(f"same_ptx: --tests {a.tests!r} launched no kernel of a module starting with --only {a.only!r}")
        return 2
    launches = {}
    for mod, name, names, sig, div, const, opts in r["launches"]:
        spec = (mod, name, names, sig, div, {k: a.set.get(k, v) for k, v in const.items()}, opts)
        launches.setdefault(repr(spec), spec)
    for k, m in sorted(_interp_only(a.tree, r["launches"]).items()):
        if k not in a.set:
            print(f"same_ptx: warning: constexpr {k} looks interpreter-only ({m} sets it with _interpreting()); "
                  f"its recorded values are compiled (--set {k}=VALUE for a GPU's)")
    unused = sorted(set(a.set) - {k for s in r["launches"] for k in s[5]})
    if unused:
        print(f"same_ptx: warning: --set {', '.join(unused)}: no recorded launch has such a constexpr")
    return list(launches.values()), r["calls"], len(r["launches"])


def main(argv=None):
    a = parse_args(argv)
    t0 = time.time()
    work = os.path.abspath(a.keep) if a.keep else tempfile.mkdtemp(prefix="same_ptx_")
    os.makedirs(work, exist_ok=True)
    try:
        got = _record_launches(a, work)
        if isinstance(got, int):
            return got
        launches, n_calls, n_recorded = got
        todo, base_tree = os.path.join(work, "launches.pkl"), os.path.join(work, "base")
        with open(todo, "wb") as f:
            pickle.dump(launches, f)
        wt = _git("worktree", "add", "--detach", base_tree, a.base_sha, cwd=a.tree)
        if wt.returncode:
            print(f"same_ptx: git worktree add failed: {wt.stderr.strip()}")
            return 1
        print(f"same_ptx: compiling {len(launches)} launches for sm_{ARCH} at the working tree and at {a.base}",
              flush=True)
        try:
            extra = lambda t: {"PYTHONPATH": os.pathsep.join([t, a.compile_path])} if a.compile_path else None  # noqa: E731
            procs = [_worker(["compile", t, todo, os.path.join(work, "ptx", tag)], t, extra(t))
                     for tag, t in (("new", a.tree), ("base", base_tree))]
            if any([p.wait() for p in procs]):
                print("same_ptx: a compile worker failed (output above)")
                return 1
        finally:
            if not a.keep:
                _git("worktree", "remove", "--force", base_tree, cwd=a.tree)
        return _report(a, work, launches, n_calls, n_recorded, time.time() - t0)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


def _report(a, work, launches, n_calls, n_recorded, wall):
    st = {}
    for tag in ("new", "base"):
        with open(os.path.join(work, "ptx", tag, "status.json")) as f:
            st[tag] = json.load(f)
    same, diff, errors, one_side, first_diff = [], [], [], [], None
    for i, spec in enumerate(launches):
        name, sn, sb = spec[1], st["new"]["status"][i], st["base"]["status"][i]
        label = f"{spec[0]}.{name} {json.dumps(spec[5], default=repr, sort_keys=True)} {spec[6]}"
        if sn.startswith("absent") != sb.startswith("absent"):
            one_side.append(f"{name}: only in the {'working tree' if sb.startswith('absent') else 'base'} ({label})")
        elif sn != "ok" or sb != "ok":
            errors.append(f"{name} ({'working tree' if sn != 'ok' else 'base'}): {sn if sn != 'ok' else sb}")
        else:
            text = [open(os.path.join(work, "ptx", t, f"{i:04d}_{name}.ptx")).read() for t in ("base", "new")]
            if text[0] == text[1]:
                same.append(name)
            else:
                diff.append(label)
                if first_diff is None:
                    first_diff = list(difflib.unified_diff(text[0].splitlines(), text[1].splitlines(),
                                                           f"{a.base}:{name}.ptx", f"working tree:{name}.ptx", n=2,
                                                           lineterm=""))
    kernels = sorted({s[1] for s in launches})
    print(f"same_ptx: triton {st['new']['triton']}, sm_{ARCH}, fp_fusion {st['new']['fp_fusion']}, --base {a.base} "
          f"({a.base_sha[:10]}) vs the working tree")
    print(f"  --tests {a.tests!r} --only {a.only!r}" + (f" --set {a.set}" if a.set else ""))
    print(f"  launches recorded {n_calls} ({n_recorded} distinct), compiled {len(launches)} ({len(kernels)} kernels: "
          f"{', '.join(kernels)})")
    print(f"  identical PTX {len(same)}, different {len(diff)}, compile errors {len(errors)}, "
          f"at one revision only {len(one_side)}   ({wall:.0f} s)")
    for line in diff[:20]:
        print("  DIFFERENT", line)
    for line in errors[:20] + one_side[:20]:
        print("  ", line)
    if first_diff:
        print(f"  first difference ({len(first_diff)} diff lines, 60 shown):")
        print("\n".join("    " + ln for ln in first_diff[:60]))
    if a.keep:
        print(f"  kept: {work} (base/ worktree: git worktree remove --force {work}/base)")
    print("same_ptx: ALL IDENTICAL" if not (diff or errors or one_side) else "same_ptx: NOT IDENTICAL")
    return 0 if not (diff or errors or one_side) else 1


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        if sys.argv[2] == "record":  # record OUT ONLY -- PYTEST_ARGS
            sys.path[0] = os.getcwd()
            sys.exit(_record(sys.argv[3], sys.argv[4], sys.argv[6:]))
        sys.exit(_compile(*sys.argv[3:6]))  # compile TREE LAUNCHES OUTDIR
    sys.exit(main())
