"""eval/bench_ssd's command line and anchors without a GPU: --mamba-ssm-src (a folder without mamba_ssm/ is named;
the tree given wins over an installed mamba_ssm), --lengths checked before the CUDA check, --fla-noguard parsed."""
import sys
from types import ModuleType

import pytest

from eval import bench_ssd


def test_mamba_ssm_src_without_the_package_folder_is_named(tmp_path):
    with pytest.raises(SystemExit, match=r"--mamba-ssm-src .*no mamba_ssm/ folder there"):
        bench_ssd.main(["--out", str(tmp_path), "--mamba-ssm-src", str(tmp_path)])
    with pytest.raises(ImportError, match=r"--mamba-ssm-src .*holds no mamba_ssm/ folder"):
        bench_ssd.import_mamba_chunk_scan(str(tmp_path))


@pytest.mark.parametrize("lengths", ["512,abc", "0", "", "512,-4"])
def test_bad_lengths_are_named_before_the_cuda_check(tmp_path, lengths):
    with pytest.raises(SystemExit, match=r"^--lengths .*: sequence lengths must be comma-separated integers >= 1"):
        bench_ssd.main(["--out", str(tmp_path), "--lengths", lengths, "--fla-noguard"])


def test_the_source_tree_given_wins_over_an_installed_mamba_ssm(tmp_path, monkeypatch):
    """Before: an installed mamba_ssm was timed silently whatever --mamba-ssm-src named."""
    names = ["mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton", "mamba_ssm.ops.triton.ssd_combined"]
    for n in names:  # an "installed" mamba_ssm
        monkeypatch.setitem(sys.modules, n, ModuleType(n))
    sys.modules[names[-1]].mamba_chunk_scan_combined = "installed"
    tree = tmp_path / "mamba_ssm" / "ops" / "triton"
    tree.mkdir(parents=True)
    (tmp_path / "mamba_ssm" / "__init__.py").write_text("raise ImportError('compiled extensions')\n")
    (tmp_path / "mamba_ssm" / "ops" / "__init__.py").write_text("")
    (tree / "__init__.py").write_text("")
    (tree / "ssd_combined.py").write_text("mamba_chunk_scan_combined = 'from the tree'\n")
    try:
        assert bench_ssd.import_mamba_chunk_scan(str(tmp_path)) == "from the tree"
        assert bench_ssd.import_mamba_chunk_scan(None) == "from the tree"  # now the one imported
    finally:
        for n in [m for m in sys.modules if m == "mamba_ssm" or m.startswith("mamba_ssm.")]:
            del sys.modules[n]


def test_fla_noguard_is_skipped_when_there_is_no_guard_to_lift(monkeypatch):
    monkeypatch.setitem(sys.modules, "fla.ops.common.chunk_o", ModuleType("fla.ops.common.chunk_o"))
    assert not bench_ssd._FlaNoGuard.available()
    sys.modules["fla.ops.common.chunk_o"].IS_NVIDIA_HOPPER = True
    assert bench_ssd._FlaNoGuard.available()
