"""Test-session setup.

Without a GPU, Triton kernels run in its interpreter: ``TRITON_INTERPRET=1`` must be set before the first
``@triton.jit`` decoration (i.e. before ``kernels`` is imported anywhere), so it is set here; torch runs
single-threaded in the test process, and three slow spots of the interpreter are replaced by equivalents
(:func:`_speed_up_interpreter_scan`, :func:`_patch_the_language_once_per_launch`,
:func:`_skip_the_discarded_overflow_checks`); the objects that exist once the tests are collected are frozen out of
the garbage collector's scans (:func:`pytest_collection_finish`). The fixtures :func:`cli_in_process` /
:func:`train_py_in_process` (``train_py_in_process_module`` for a module's fixture) run a command (``python train.py
...``, ``python -m eval...``) in the test's interpreter where it needs no process of its own.
"""

import gc
import os

import pytest

try:
    import torch

    _cuda = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _cuda = False

if not _cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # CPU session: torch ops in the test process single-threaded (the tests' tensors are tiny; on a shared 2-core
    # machine a second thread mostly waits: train.py's busy_cpu_note). Subprocesses keep their own setting.
    torch.set_num_threads(1)

# W&B: the tests set the mode they exercise. A caller's W&B settings (CI may export WANDB_MODE=disabled, a user
# WANDB_PROJECT or WANDB_DIR) would change what they check, so none is inherited; the default is offline.
for _key in [k for k in os.environ if k.startswith("WANDB_")]:
    del os.environ[_key]
os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"


@pytest.fixture(scope="module")
def one_thread():
    """Tiny CPU ops run much faster single-threaded on a shared machine (restored after the module; a CPU session
    is single-threaded throughout, see above)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _give_back_gpu_cache(request):
    """After a GPU test, the worker hands its cached CUDA blocks back to the driver. Under ``pytest -n K`` the workers
    share one card, and each one's caching allocator otherwise keeps its high-water mark: with ``-n 14`` on an 80 GB
    H100 three small tests ran out of memory while two other workers held 16.5 and 19.5 GB (2026-12-05, sixteenth
    session; whether cache or live tensors, the message did not say). With this, ``-n 14`` on the same card: 605
    passed, 0 failed (seventeenth session, ``results/h100/2026-12-05d/1/pytest_gpu.txt``)."""
    yield
    if _cuda and request.node.get_closest_marker("gpu") is not None and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()


_REAL_CUDA_IS_AVAILABLE = torch.cuda.is_available


@pytest.fixture(autouse=True)
def _no_faked_backend_availability(monkeypatch):
    """A test that fakes ``torch.cuda.is_available`` (``monkeypatch.setattr(torch.cuda, "is_available", ...)``, e.g.
    ``tests/test_bench_model_check.py``) leaves no backend availability answered under the fake: the registry asks
    each backend's ``available()`` once per process (``attn_zoo.registry``), so an answer cached during such a test
    ("CUDA present") outlived it, and ``test_registry.py``'s anchors test, run later in the same process, found
    ``sdpa_cudnn`` available on a machine without CUDA. This fixture depends on ``monkeypatch``, so its teardown runs
    before the fake is undone: it sees the fake and forgets the answers (``attn_zoo.registry.forget_availability``)."""
    yield
    if torch.cuda.is_available is not _REAL_CUDA_IS_AVAILABLE:
        from attn_zoo.registry import forget_availability

        forget_availability()


def pytest_collection_finish(session):
    """What exists once the tests are collected (the imported libraries: torch, Lightning, Hydra, triton, pandas, ...;
    ~600,000 objects the collector tracks) is moved out of the garbage collector's reach (``gc.freeze``): a
    ``gc.collect()`` (eval.sweep runs one after every point it measures: 0.27 s each before, 0.05 s after) and each
    automatic full collection then visit only the objects made since, which are collected as before
    (test_eval_pipeline: 64 s -> 42 s). Undone at the very end (:func:`pytest_configure`'s cleanup, after pytest's
    own last collections), so the interpreter's exit frees everything as usual."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    config.add_cleanup(gc.unfreeze)  # added before pytest's own cleanups: run after them


def pytest_collection_modifyitems(config, items):
    if _cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200; see docs/kernels.md for recorded results)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# ---------------------------------------------------------------------- Triton's interpreter, faster (same results)
def _vectorized_generic_scan(self, input):
    """Triton's interpreter runs ``tl.associative_scan`` with a user combine function one element at a time in
    Python (``ScanOps.generic_scan``: one ``combine_fn`` call per element of the block, ~2,000 per program of
    kernels.ssd's state pass, 15 s of the 17 s of one test_ssd case). This is the same scan, one combine call per
    position along the axis over the whole slice across the other axes: the same elementwise operations in the same
    order, each partial result stored in (and read back from) the output dtype as the original does, so the same
    numbers (tests/test_interpreter_scan.py checks it against the original)."""
    import numpy as np
    import triton.language as tl

    datas = [arg.handle.data for arg in input]
    dtypes = [arg.dtype for arg in input]
    shape, axis = datas[0].shape, self.axis
    outs = [np.zeros(shape, dtype=d.dtype) for d in datas]

    def at(k):
        return (slice(None),) * axis + (k,)

    for out, data in zip(outs, datas):
        out[at(0)] = data[at(0)]
    for k in range(1, shape[axis]):
        acc = tuple(self.to_tensor(o[at(k - 1)], dt) for o, dt in zip(outs, dtypes))
        cur = tuple(self.to_tensor(d[at(k)], dt) for d, dt in zip(datas, dtypes))
        ret = self.combine_fn.fn(*acc, *cur)
        ret = ret if isinstance(ret, tuple) else (ret,)
        for out, r in zip(outs, ret):  # a 0-d slot (a 1-D block) takes a scalar tensor's 1-element array
            out[at(k)] = np.reshape(r.handle.data, out[at(k)].shape) if isinstance(r, tl.core.tensor) else r
    return [self.to_tensor(o, dt) for o, dt in zip(outs, dtypes)]


def _speed_up_interpreter_scan():
    """Install :func:`_vectorized_generic_scan` (the original kept as ``ScanOps._elementwise_generic_scan``); a
    Triton whose interpreter has no ``ScanOps.generic_scan`` is left as it is."""
    try:
        from triton.runtime import interpreter
    except Exception:  # pragma: no cover
        return
    ops = getattr(interpreter, "ScanOps", None)
    if ops is None or not hasattr(ops, "generic_scan") or hasattr(ops, "_elementwise_generic_scan"):
        return
    ops._elementwise_generic_scan = ops.generic_scan
    ops.generic_scan = _vectorized_generic_scan

def _patch_the_language_once_per_launch():
    """Triton's interpreter patches ``triton.language`` (``_patch_lang``: ``inspect.getmembers`` of ``tl``,
    ``tl.tensor``, ``tl.math``, ...) at every kernel launch, and again at every call of a ``@triton.jit`` device
    function inside the kernel (~0.3 ms a call; a quarter of test_ssd's interpreter time) although the launch's
    patch is in place and a device function seeing the same ``tl`` / ``tl.core`` modules re-patches nothing (the
    patched members are no longer builtins; the rest are set again to equal closures, and the launch restores the
    originals at its end). Inside a launch, a device call seeing only modules already patched in it skips the
    repeat; any other call patches as before."""

    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except Exception:  # pragma: no cover
        return
    real, executor = getattr(interpreter, "_patch_lang", None), getattr(interpreter, "GridExecutor", None)
    if real is None or executor is None or getattr(real, "_once_per_launch", False):
        return
    state = {"pending": False, "langs": None}

    lang_ids = frozenset((id(tl), id(tl.core)))

    def langs(fn):  # the ids of tl / tl.core among fn's globals (a set intersection: no Python loop over them)
        return lang_ids.intersection(map(id, fn.__globals__.values()))

    class _NothingToRestore:
        def restore(self):
            pass

    def patch_lang(fn):
        if state["pending"]:  # the launch's own patch
            state["pending"] = False
            scope = real(fn)
            state["langs"] = langs(fn)
            return scope
        seen = langs(fn)
        if state["langs"] is None:  # outside a launch
            return real(fn)
        if seen <= state["langs"]:
            return _NothingToRestore()
        scope = real(fn)  # a device function seeing tl.core too (tl.sum, tl.zeros, ...): patched as before, once
        state["langs"] = state["langs"] | seen
        return scope

    patch_lang._once_per_launch = True
    launch = executor.__call__

    def call(self, *args, **kwargs):
        saved = state["langs"]
        state["pending"], state["langs"] = True, None
        try:
            return launch(self, *args, **kwargs)
        finally:
            state["pending"], state["langs"] = False, saved

    interpreter._patch_lang = patch_lang
    executor.__call__ = call


def _skip_the_discarded_overflow_checks():
    """Triton's interpreter builds every integer ``+``, ``-`` and ``*`` of a kernel twice: the operation, and an
    overflow check (``binary_op_sanitize_overflow_impl``: both operands cast to int64, the operation again, two
    comparisons and an ``and``) whose result goes to ``device_assert``, which drops it unless the options have
    ``debug`` on; the interpreter's options never do (``InterpreterOptions()``, debug off), so the check is computed
    and discarded: about a third of an interpreted kernel's time (test_decode_split's fused merge: 34 s -> 22 s without
    it). With ``debug`` off the interpreter's options ask for no such check (``sanitize_overflow=False``): the same
    operations and results; with ``debug`` on they are left as they are (tests/test_interpreter_scan.py)."""
    import dataclasses

    try:
        from triton.runtime import interpreter
    except Exception:  # pragma: no cover
        return
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is None or getattr(options, "debug", True) or not getattr(options, "sanitize_overflow", False):
        return
    builder.options = dataclasses.replace(options, sanitize_overflow=False)


if os.environ.get("TRITON_INTERPRET") == "1":
    _speed_up_interpreter_scan()
    _patch_the_language_once_per_launch()
    _skip_the_discarded_overflow_checks()


# ---------------------------------------------------------------------- commands run in the test's interpreter
def _launcher(monkeypatch):
    """``launch(cwd, *argv, env=None)``: ``python <argv>`` (a script and its arguments, or ``-m <module>`` and its
    arguments) run from ``cwd`` in this interpreter (``runpy``, as ``__main__``: for train.py Hydra's launch, its
    callbacks and its error report as on the command line), with ``WANDB_MODE=disabled`` unless ``env`` (variables
    set for the launch) says otherwise and no ``HYDRA_FULL_ERROR``; returns a ``CompletedProcess`` with the exit
    status and what it printed. For commands that do not need a process of their own (a refusal, a rerun that skips
    its jobs, a short run whose files and printed lines a test reads): a subprocess spends ~5-8 s importing torch,
    Lightning, ... first. Python warnings go to pytest's record, not to the result's stderr (a process prints
    them). What a launch sets in this process is
    undone after it: the logging it configured, the run folders :func:`harness.runs.claim_run_dir` claimed (a new
    launch is a new process), Hydra's global state (GlobalHydra, HydraConfig, JobRuntime), the environment,
    ``sys.path``, torch's threads and the random generators; what it registers with ``atexit`` runs at its end, as
    at a process's exit. Every command keeps a test that runs it as a real process."""
    import atexit
    import contextlib
    import io
    import logging
    import random
    import runpy
    import subprocess
    import sys
    import warnings

    import numpy as np

    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import JobRuntime

    from harness import runs as runs_mod

    def launch(cwd, *argv, env=None):
        argv = [str(a) for a in argv]
        loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                           if isinstance(lg, logging.Logger)]
        saved = [(lg, list(lg.handlers), list(lg.filters), lg.level, lg.propagate, lg.disabled) for lg in loggers]
        out, err, code = io.StringIO(), io.StringIO(), 0
        hydra_state = (HydraConfig.instance().cfg, JobRuntime.instance().conf)  # a launch sets both (the job's config,
        # its name): to_absolute_path and get_original_cwd would read the launch's cwd after it
        environ, path, threads = dict(os.environ), list(sys.path), torch.get_num_threads()
        rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())  # seed_everything, when it gets there
        with monkeypatch.context() as m:
            m.chdir(cwd)
            m.setattr(sys, "argv", list(argv[1:] if argv[0] == "-m" else argv))  # run_module sets argv[0]
            m.setattr(runs_mod, "_CLAIMED", {})
            m.delenv("HYDRA_FULL_ERROR", raising=False)
            for key, value in dict({"WANDB_MODE": "disabled"}, **(env or {})).items():
                m.setenv(key, value)
            at_exit = []  # what the launch registers to run at its process's exit runs at the end of the launch
            m.setattr(atexit, "register", lambda fn, *a, **kw: at_exit.append((fn, a, kw)) or fn)
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    try:
                        if argv[0] == "-m":
                            with warnings.catch_warnings():  # the module imported already (by a test): a new copy
                                # runs as __main__ all the same, as in a process where something imports it again
                                warnings.filterwarnings("ignore", r".* found in sys\.modules after import of package",
                                                        RuntimeWarning)
                                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
                        else:
                            runpy.run_path(argv[0], run_name="__main__")
                    except SystemExit as e:  # sys.exit(message): printed to stderr, status 1, as Python does
                        if isinstance(e.code, str):
                            err.write(e.code + "\n")
                        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                    finally:
                        for fn, a, kw in reversed(at_exit):
                            fn(*a, **kw)
            finally:
                for lg, handlers, filters, level, propagate, disabled in saved:
                    for h in lg.handlers:
                        if h not in handlers:
                            h.close()
                    lg.handlers[:], lg.filters[:] = handlers, filters
                    lg.setLevel(level)
                    lg.propagate, lg.disabled = propagate, disabled
                known = {id(s[0]) for s in saved}
                for lg in list(logging.Logger.manager.loggerDict.values()):  # loggers the launch created
                    if isinstance(lg, logging.Logger) and id(lg) not in known:
                        for h in list(lg.handlers):
                            h.close()
                            lg.removeHandler(h)
                GlobalHydra.instance().clear()
                HydraConfig.instance().cfg, JobRuntime.instance().conf = hydra_state
                os.environ.clear()
                os.environ.update(environ)
                sys.path[:] = path
                torch.set_num_threads(threads)
                random.setstate(rng[0])
                np.random.set_state(rng[1])
                torch.set_rng_state(rng[2])
        return subprocess.CompletedProcess(["python", *argv], code, out.getvalue(), err.getvalue())

    return launch


@pytest.fixture
def cli_in_process(monkeypatch):
    """:func:`_launcher`: ``launch(cwd, *argv, env=None)`` runs ``python <argv>`` in this interpreter."""
    return _launcher(monkeypatch)


def _train_py(launch):
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "train.py"
    return lambda cwd, *args, env=None: launch(cwd, script, *args, env=env)


@pytest.fixture
def train_py_in_process(cli_in_process):
    """``launch(cwd, *args, env=None)``: :func:`cli_in_process` of ``train.py <args>``, for train.py launches refused
    before training, that train nothing, or short runs (a few steps, single or ``-m``) whose outputs a test reads.
    What needs a process stays one: DDP, W&B offline runs and their resume, stdout to a file, a multirun that runs
    its jobs, a refused multirun, a plugin registered at start-up."""
    return _train_py(cli_in_process)


@pytest.fixture(scope="module")
def train_py_in_process_module():
    """:func:`train_py_in_process` for a module's shared fixture (a run that several tests read or copy)."""
    with pytest.MonkeyPatch.context() as mp:
        yield _train_py(_launcher(mp))
