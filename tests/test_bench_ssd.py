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


def test_state_pass_flag_gives_one_ours_row_per_mode_and_their_ratio_lines(tmp_path, monkeypatch, capsys):
    """``--state-pass parallel,sequential --seq-blocks 64x64,32x32``: rows ``ours``, ``ours_seq``,
    ``ours_seq_32x32`` (each built with its ``ssd_scan`` keywords) and the ratio lines for each; the CUDA parts
    (device check, methods, timer) are stood in for on the CPU."""
    import csv

    import torch

    seen = {}

    def fake_methods(B, H, N, P, NS, dtype, dev, notes, fla_noguard=False, mamba_src=None, ours=None):
        seen[N] = ours
        x = torch.randn(2, 3, requires_grad=True)
        names = list(ours) + ["fla_simple_gla"]
        return {name: (lambda x=x: x * 2, [x]) for name in names}

    times = iter(float(i + 1) for i in range(1000))
    monkeypatch.setattr(bench_ssd, "require_cuda", lambda name: None)
    monkeypatch.setattr(bench_ssd, "make_methods", fake_methods)
    monkeypatch.setattr(bench_ssd, "time_cuda", lambda fn, grad_to_none=None: (fn(), next(times))[1])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    bench_ssd.main(["--out", str(tmp_path), "--lengths", "2048,4096", "--tokens", "4096", "--no-check",
                    "--state-pass", "parallel,sequential", "--seq-blocks", "64x64,32x32"])
    assert seen[2048] == {"ours": {"state_pass": "parallel"},
                          "ours_seq": {"state_pass": "sequential", "seq_block": (64, 64)},
                          "ours_seq_32x32": {"state_pass": "sequential", "seq_block": (32, 32)}}
    rows = list(csv.DictReader(open(tmp_path / "ssd_bench.csv")))
    assert [r["method"] for r in rows if r["N"] == "4096"] == ["ours", "ours_seq", "ours_seq_32x32", "fla_simple_gla"]
    out = capsys.readouterr().out
    for me in ("ours", "ours_seq", "ours_seq_32x32"):
        assert f"N=4096: {me} fwd+bwd speedup over fla_simple_gla" in out
        assert f"{me} flatness" in out
    assert "N=2048: ours_seq vs ours (parallel)" in out


@pytest.mark.parametrize("flags, match", [(["--state-pass", "parallel,scan"], "--state-pass"),
                                          (["--state-pass", "sequential", "--seq-blocks", "48x64"], "--seq-blocks")])
def test_bad_state_pass_flags_are_refused_by_name(tmp_path, flags, match):
    with pytest.raises(SystemExit, match=match):
        bench_ssd.main(["--out", str(tmp_path / "o"), *flags])


def test_auto_legacy_and_group_rows_carry_their_ssd_scan_keywords():
    """``--state-pass parallel,auto,sequential --legacy --out-group``: rows ``ours`` (parallel), ``ours_auto`` (the
    default choice), ``ours_seq``, ``ours_legacy`` (fp32 snapshots, the output kernel in one d_state step),
    ``ours_group`` / ``ours_seq_group`` (out_mode="group"), with their ``ssd_scan`` keywords."""
    import torch

    rows = bench_ssd.ours_variants(bench_ssd.parse_state_passes("parallel,auto,sequential"), [(64, 64)], legacy=True,
                                   out_group=True)
    assert rows == {"ours": {"state_pass": "parallel"}, "ours_auto": {"state_pass": "auto"},
                    "ours_seq": {"state_pass": "sequential", "seq_block": (64, 64)},
                    "ours_legacy": {"state_pass": "parallel", "state_dtype": torch.float32, "out_block_n": 256},
                    "ours_group": {"state_pass": "parallel", "out_mode": "group"},
                    "ours_seq_group": {"state_pass": "sequential", "seq_block": (64, 64), "out_mode": "group"}}
