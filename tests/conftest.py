"""Test-session setup.

Without a GPU, Triton kernels run in its interpreter: ``TRITON_INTERPRET=1`` must be set before the first
``@triton.jit`` decoration (i.e. before ``kernels`` is imported anywhere), so it is set here.
"""

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


def pytest_collection_modifyitems(config, items):
    if _cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200; see docs/kernels.md for recorded results)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
