"""eval/bench_mixers.py: the CPU smoke run (one mixer layer per family vs N), its CSV, and its refusals."""

import re

import pandas as pd
import pytest

from eval.bench_mixers import COLUMNS, main

SMALL = ["--device", "cpu", "--d-model", "32", "--heads", "2", "--seq-lens", "32,64", "--tokens", "64"]


def test_cpu_smoke_run_times_every_layer_and_writes_csv(tmp_path):
    layers = ["flash", "linformer", "mamba2", "mla"]
    rows = main(SMALL + ["--out", str(tmp_path), "--layers", ",".join(layers)])
    df = pd.read_csv(tmp_path / "mixers_bench.csv")
    assert list(df.columns) == COLUMNS
    assert (tmp_path / "mixers_bench.json").exists()
    assert len(df) == len(rows) == len(layers) * 2
    assert set(zip(df["layer"], df["N"])) == {(l, n) for l in layers for n in (32, 64)}
    assert df["error"].isna().all(), df["error"].tolist()
    for col in ("fwd_ms", "fwd_bwd_ms", "fwd_ns_per_token", "fwd_bwd_ns_per_token", "params"):
        assert (df[col] > 0).all(), col
    assert (df["B"] == 64 // df["N"]).all()
    causal = dict(zip(df["layer"], df["causal"]))
    assert causal["linformer"] == False and causal["flash"] == True and causal["mamba2"] == True  # noqa: E712
    # a layer the causal GPT refuses (Linformer) is timed here; its projections grow with max_seq_len = N
    lin = df[df["layer"] == "linformer"].set_index("N")["params"]
    assert lin[64] > lin[32]


def test_bad_layer_name_names_the_allowed_values(tmp_path, capsys, monkeypatch):
    """An unknown layer / backend was a ValueError traceback, and only after the CUDA check: now argparse's error
    (exit 2) on any machine."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path), "--layers", "flash,nosuchmixer"])  # --device cuda: named before the CUDA check
    err = capsys.readouterr().err
    assert e.value.code == 2 and re.search(r"error: --layers.*nosuchmixer.*allowed values:", err)
    allowed = err.split("allowed values:")[1]
    for name in ("flash", "sliding_window", "mamba2", "deltanet", "mla", "linformer"):
        assert name in allowed, name
    with pytest.raises(SystemExit, match=r"^--layers 'flash,,linear': give comma-separated layer names \(an empty "
                                         r"item\)"):  # the empty item was dropped in silence
        main(SMALL + ["--out", str(tmp_path), "--layers", "flash,,linear"])
    assert not (tmp_path / "mixers_bench.csv").exists()


def test_bad_backend_and_seq_lens_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(SMALL + ["--out", str(tmp_path), "--layers", "flash", "--backend", "nope"])
    assert e.value.code == 2 and re.search(r"error: --backend 'nope'.*allowed values:.*torch", capsys.readouterr().err)
    with pytest.raises(SystemExit, match=r"^--seq-lens '0,x': sequence lengths must be comma-separated integers"):
        main(["--device", "cpu", "--out", str(tmp_path), "--layers", "flash", "--seq-lens", "0,x"])


@pytest.mark.parametrize("args, msg", [
    (["--d-model", "30", "--heads", "4"], r"--d-model 30 with --heads 4 is not supported: head_dim = d_model / heads "
                                          r"must be an even integer"),
    (["--d-model", "36", "--heads", "4"], r"--d-model 36 with --heads 4 is not supported"),  # head_dim 9: odd
    (["--heads", "0"], r"--heads 0 is not supported; allowed values: an integer >= 1"),
    (["--tokens", "-1"], r"--tokens -1 is not supported"),
    (["--time-budget-s", "-1"], r"argument --time-budget-s: '-1' is not supported; allowed values: a number of "
                                r"seconds >= 0"),
    (["--time-budget-s", "nan"], r"argument --time-budget-s: 'nan' is not supported"),
    (["--time-budget-s", "x"], r"argument --time-budget-s: 'x' is not supported"),
])
def test_bad_shape_and_time_budget_are_one_argparse_error_up_front(args, msg, tmp_path, capsys):
    """--d-model 30 --heads 4 used to become one error row per (layer, N), --time-budget-s -1 was taken.
    Both are refused while parsing (exit 2, the usage and a message naming the flag), before any case or file."""
    with pytest.raises(SystemExit) as e:
        main(SMALL + ["--out", str(tmp_path), "--layers", "flash,linear"] + args)
    assert e.value.code == 2
    assert re.search(msg, capsys.readouterr().err)
    assert not (tmp_path / "mixers_bench.csv").exists()


def test_time_budget_skips_cases_and_keeps_rows(tmp_path):
    main(SMALL + ["--out", str(tmp_path), "--layers", "flash,linear", "--time-budget-s", "0"])
    df = pd.read_csv(tmp_path / "mixers_bench.csv")
    assert len(df) == 4 and (df["error"] == "skipped (time budget)").all()
