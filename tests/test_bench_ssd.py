"""eval/bench_ssd.py glue on the CPU: the anchors it imports and the arguments it refuses (the timing needs CUDA)."""
import sys

import pytest

from eval import bench_ssd


def test_mamba_ssm_triton_ssd_imports_from_a_source_tree_without_its_package_init(tmp_path, monkeypatch):
    """``--mamba-ssm-src``: the Triton SSD module is imported from the tree; the package's ``__init__`` (which
    imports compiled CUDA extensions) is not run."""
    pkg = tmp_path / "mamba_ssm"
    (pkg / "ops" / "triton").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('selective_scan_cuda: compiled extension missing')\n")
    (pkg / "ops" / "triton" / "ssd_combined.py").write_text(
        "def mamba_chunk_scan_combined(*args, **kwargs):\n    return 'from the tree'\n")
    for name in [m for m in sys.modules if m == "mamba_ssm" or m.startswith("mamba_ssm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "path", [str(tmp_path)] + sys.path)
    with pytest.raises(ImportError):  # without the source option the package's __init__ fails
        bench_ssd.import_mamba_chunk_scan(None)
    fn = bench_ssd.import_mamba_chunk_scan(str(tmp_path))
    assert fn() == "from the tree"
    for name in [m for m in sys.modules if m == "mamba_ssm" or m.startswith("mamba_ssm.")]:
        del sys.modules[name]


def test_a_source_tree_without_mamba_ssm_is_refused_by_name(tmp_path):
    with pytest.raises(SystemExit, match="--mamba-ssm-src"):
        bench_ssd.main(["--out", str(tmp_path / "o"), "--mamba-ssm-src", str(tmp_path)])
    if "mamba_ssm" not in sys.modules:
        with pytest.raises(ImportError, match="no mamba_ssm/ folder"):
            bench_ssd.import_mamba_chunk_scan(str(tmp_path))


def test_fla_guard_is_restored_after_the_timed_call(monkeypatch):
    """``--fla-noguard`` lifts fla's Hopper flag only inside the timed region."""
    import types

    co = types.ModuleType("fla.ops.common.chunk_o")  # fla's module as far as the guard goes (fla is optional)
    co.IS_NVIDIA_HOPPER = True
    for name in ("fla", "fla.ops", "fla.ops.common"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "fla.ops.common.chunk_o", co)
    monkeypatch.setattr(sys.modules["fla.ops.common"], "chunk_o", co, raising=False)
    with bench_ssd._FlaNoGuard():
        assert co.IS_NVIDIA_HOPPER is False
    assert co.IS_NVIDIA_HOPPER is True
