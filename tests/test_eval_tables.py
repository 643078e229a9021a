"""Result tables through pandas keep the files the results always had: header order, cell formats, CRLF lines."""

import csv
import math
import os
import subprocess

import pandas as pd
import pytest

from eval import sweep as sw
from eval.bench_common import format_table, write_csv
from eval.quality import aggregate, read_metrics
from eval.recall import val_points

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _dictwriter(rows, path):
    """What write_csv wrote before pandas: csv.DictWriter, header = keys in first-seen order."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


ROWS = [
    {"variant": "flash", "seq_len": 512, "ms": 0.1 + 0.2, "n_star": float("nan"), "c0": None, "ok": True,
     "note": 'a, "quoted"\nline'},
    {"variant": "linear", "seq_len": 1024.0, "ms": 1e-5, "flops": 1e16, "ok": False},  # a new key joins the header
    {"variant": "gqa", "ms": float("inf"), "flops": 35032006656.0},
]


def test_write_csv_bytes_match_the_csv_module(tmp_path):
    _dictwriter(ROWS, tmp_path / "old.csv")
    write_csv(ROWS, str(tmp_path / "new.csv"))
    new = (tmp_path / "new.csv").read_bytes()
    assert new == (tmp_path / "old.csv").read_bytes()
    assert new.startswith(b"variant,seq_len,ms,n_star,c0,ok,note,flops\r\n")
    # explicit NaN -> "nan", None / missing -> "", floats at full precision, ints stay ints
    assert b"flash,512,0.30000000000000004,nan,,True," in new and b"1024.0,1e-05,,,False,,1e+16" in new


def test_write_csv_columns_and_empty_tables(tmp_path):
    p = tmp_path / "c.csv"
    write_csv([{"b": 1, "a": 2, "extra": 3}], str(p), columns=["a", "b", "c"])
    assert p.read_bytes() == b"a,b,c\r\n2,1,\r\n"
    write_csv([], str(p), columns=["a", "b"])  # no rows: the header only
    assert p.read_bytes() == b"a,b\r\n" and sw.read_rows(str(p)) == []


def test_append_row_and_read_rows_round_trip(tmp_path):
    p = str(tmp_path / "sub" / "k.csv")
    sw.append_row(p, {"variant": "flash", "seq_len": 16, "fwd_ms": 0.25, "bwd_ms": float("nan"), "extra": 1,
                      "error": "x, y", "causal": True})
    sw.append_row(p, {"variant": "linear", "seq_len": 32, "peak_mem_bytes": None})
    text = open(p, newline="").read()
    assert text.count("sweep,variant") == 1 and text.endswith("\r\n")  # header once, CRLF lines
    rows = sw.read_rows(p)
    assert list(rows[0]) == list(sw.COLUMNS)  # every column, nothing else ("extra" dropped)
    assert rows[0]["fwd_ms"] == "0.25" and rows[0]["bwd_ms"] == "" and rows[0]["causal"] == "True"
    assert rows[0]["error"] == "x, y" and rows[1]["peak_mem_bytes"] == "" and rows[1]["seq_len"] == "32"
    assert sw.read_rows(str(tmp_path / "missing.csv")) == []
    open(tmp_path / "empty.csv", "w").close()
    assert sw.read_rows(str(tmp_path / "empty.csv")) == []


def test_read_rows_equals_the_csv_module_on_committed_results():
    files = subprocess.run(["git", "ls-files", "results/*.csv"], cwd=ROOT, capture_output=True, text=True).stdout
    files = [f for f in files.split() if "/runs/" not in f][:40]
    if not files:
        pytest.skip("no committed results here")
    for f in files:
        with open(os.path.join(ROOT, f), newline="") as fh:
            assert sw.read_rows(os.path.join(ROOT, f)) == list(csv.DictReader(fh)), f


def test_committed_tables_rewrite_byte_for_byte(tmp_path):
    """Read with pandas-backed read_rows, write with write_csv: the committed files come back unchanged."""
    for f in ("results/h200/crossover_speed_h200/crossover.csv", "results/cpu/crossover_quality/leaders.csv",
              "results/h200/quality/mqar_hybrid/hybrid.csv"):
        src = os.path.join(ROOT, f)
        if not os.path.exists(src):
            pytest.skip(f"{f} not here")
        write_csv(sw.read_rows(src), str(tmp_path / "x.csv"))
        assert (tmp_path / "x.csv").read_bytes() == open(src, "rb").read(), f


def test_format_table():
    out = format_table(ROWS, ["variant", "seq_len", "ms", "c0", "missing"], "{:.3f}").splitlines()
    assert out[0].split() == ["variant", "seq_len", "ms", "c0", "missing"]
    assert out[1].split() == ["flash", "512", "0.300", "-", "-"]
    assert out[3].split() == ["gqa", "-", "inf", "-", "-"]
    assert len({len(line) for line in out}) == 1  # fixed width
    assert format_table([], ["a", "b"]) == "a  b"


def _metrics(tmp_path, text):
    run = tmp_path / "run"
    (run / "csv").mkdir(parents=True, exist_ok=True)
    (run / "csv" / "metrics.csv").write_text(text)
    return str(run)


def test_read_metrics_and_val_points(tmp_path):
    run = _metrics(tmp_path, "epoch,step,val/acc,val/loss,train/loss\n0,10,0.5,,1.0\n0,10,,2.0,\n0,20,inf,1.5,\n"
                             "0,30,,,0.9\n")
    m = read_metrics(run)
    assert list(m.columns) == ["epoch", "step", "val/acc", "val/loss", "train/loss"]
    assert math.isnan(m["val/acc"].iloc[2])  # not finite -> NaN
    # metrics.csv's step is Lightning's 0-based logging step; val_points counts optimizer steps (logged 10 -> 11)
    assert val_points(m) == [{"val/acc": 0.5, "val/loss": 2.0, "step": 11.0}, {"val/loss": 1.5, "step": 21.0}]
    assert val_points(pd.DataFrame()) == []


def test_aggregate_means_over_seeds():
    runs = [dict(dataset="mqar", variant="flash", seq_len=64, vocab_size=128, val_loss=1.0, val_bpb=float("nan"),
                 val_acc=0.5, tokens_per_s=100.0, step_time_s=0.1, peak_mem_mb=10.0),
            dict(dataset="mqar", variant="flash", seq_len=64, vocab_size=128, val_loss=3.0, val_bpb=float("nan"),
                 val_acc=float("inf"), tokens_per_s=300.0, step_time_s=0.3, peak_mem_mb=30.0),
            dict(dataset="mqar", variant="flash", seq_len=-1, vocab_size=128, val_loss=9.0),  # no length: left out
            dict(dataset="mqar", variant="a_first", seq_len=128, vocab_size=64, val_loss=2.0, val_bpb=1.0,
                 val_acc=0.25, tokens_per_s=50.0, step_time_s=0.5, peak_mem_mb=5.0)]
    agg = aggregate(runs)
    assert [(r["variant"], r["seq_len"], r["runs"]) for r in agg] == [("a_first", 128, 1), ("flash", 64, 2)]
    assert list(agg[0]) == ["dataset", "variant", "seq_len", "runs", "best_lr", "lrs", "vocab_size", "val_loss",
                            "val_bpb", "val_acc", "tokens_per_s", "step_time_s", "peak_mem_mb", "quality_per_s"]
    f = agg[1]
    assert f["val_loss"] == 2.0 and f["val_acc"] == 0.5 and math.isnan(f["val_bpb"])  # inf / NaN left out
    assert f["step_time_s"] == pytest.approx(0.2) and f["quality_per_s"] == pytest.approx(0.5 / 0.2)
    assert isinstance(f["runs"], int) and isinstance(f["seq_len"], int) and f["vocab_size"] == 128
    assert aggregate([]) == []


def test_try_call_records_a_failure_as_text():
    """The bench_* scripts' one guard (eval.bench_common.try_call): a failing method gives its error as text."""
    import torch

    from eval.bench_common import try_call

    assert try_call(lambda: 3) == 3
    assert try_call(lambda: 1 / 0) == "error: ZeroDivisionError: division by zero"
    assert try_call(lambda: int("x" * 300), max_chars=20) == "error: ValueError: invalid literal for "

    def oom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")

    assert try_call(oom, short_oom=True) == "error: OutOfMemoryError"
    assert try_call(oom).startswith("error: OutOfMemoryError: CUDA out of memory")
