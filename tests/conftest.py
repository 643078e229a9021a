"""Test-session setup.

Without a GPU, Triton kernels run in its interpreter: ``TRITON_INTERPRET=1`` must be set before the first
``@triton.jit`` decoration (i.e. before ``kernels`` is imported anywhere), so it is set here.
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
# W&B: the tests set the mode they exercise. A caller's W&B settings (CI may export WANDB_MODE=disabled, a user
# WANDB_PROJECT or WANDB_DIR) would change what they check, so none is inherited; the default is offline.
for _key in [k for k in os.environ if k.startswith("WANDB_")]:
    del os.environ[_key]
os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"


@pytest.fixture(scope="module")
def one_thread():
    """Tiny CPU ops run much faster single-threaded on a shared machine (restored after the module)."""
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


def pytest_collection_modifyitems(config, items):
    if _cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200; see docs/kernels.md for recorded results)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
