"""The lab scripts' comma lists of integers go through ``eval.bench_common.int_list``, as the eval bench scripts'
do: a bad value (not an integer, out of range, an empty item) stops with ``SystemExit`` naming the flag and the
text given, before any GPU work, so on a CPU machine too (it was a bare ``ValueError`` traceback, a 0 reaching
the kernels, or the CUDA check first)."""

import importlib

import pytest

# (lab module, its other arguments (OUT: a folder under tmp_path), the flag, a bad value below its minimum)
LAB_INT_LISTS = [
    ("decode_probe", ["--out", "OUT", "--matrix"], "--block-ns", "0"),
    ("experiments.tile_sweep", ["--out", "OUT"], "--D", "0"),
    ("experiments.tile_sweep", ["--out", "OUT"], "--N", "0"),
    ("fa4_wrapper_cost", ["--out", "OUT"], "--N", "0"),
    ("gluon_band_bench", [], "--D", "0"),
    ("gluon_band_bwd_bench", [], "--D", "0"),
    ("gluon_bwd_sweep", [], "--D", "0"),
    ("gluon_bwd_sweep", [], "--N", "0"),
    ("gluon_bwd_sweep", [], "--causal", "-1"),
    ("gluon_bwd_sweep", [], "--stages", "0"),
    ("gluon_bwd_sweep", [], "--dq-block-n", "-1"),
    ("gluon_bwd_sweep", [], "--dq-stages", "-1"),
    ("inspect_gluon", [], "--D", "0"),
    ("inspect_kernels", [], "--tile", "-1"),
    ("probe_flash", ["--out", "OUT"], "--N", "0"),
    ("read_ceiling", ["--out", "OUT"], "--sizes-mb", "0"),
    ("read_ceiling", ["--out", "OUT"], "--per-prog-kib", "0"),
    ("short_n_sweep", ["--out", "OUT"], "--D", "0"),
    ("short_n_sweep", ["--out", "OUT"], "--N", "0"),
    ("ssd_profile", [], "--lengths", "0"),
    ("taylor_chunk_sweep", [], "--ns", "0"),
    ("taylor_chunk_sweep", [], "--chunks", "0"),
    ("taylor_chunk_sweep", [], "--block-vs", "0"),
    ("taylor_chunk_sweep", [], "--warps", "0"),
    ("taylor_chunk_sweep", [], "--stages", "0"),
    ("taylor_chunk_sweep", [], "--fused", "2"),
    ("ws3p_ab", [], "--N", "0"),
    ("ws3p_ab", [], "--D", "0"),
    ("ws3p_ab", [], "--sections", "-1"),
]


@pytest.mark.parametrize("kind", ["not_an_integer", "out_of_range", "empty_item"])
@pytest.mark.parametrize("module,argv,flag,low", LAB_INT_LISTS, ids=[f"{m}{f}" for m, _, f, _ in LAB_INT_LISTS])
def test_lab_int_lists_are_refused_naming_the_flag(tmp_path, monkeypatch, module, argv, flag, low, kind):
    import torch

    bad = {"not_an_integer": "4,x", "out_of_range": low, "empty_item": "64,,128"}[kind]
    lab = importlib.import_module(f"lab.{module}")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # any CUDA check fails, on a GPU machine too
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    with pytest.raises(SystemExit) as e:
        lab.main(argv + [flag, bad])
    assert str(e.value).startswith(f"{flag} {bad!r}: "), e.value
    assert "must be comma-separated integers " in str(e.value)
