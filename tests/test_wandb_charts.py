"""Native W&B charts of sweeps and quality joins (eval.wandb_log): logged offline beside the tables and images."""

import pytest

wandb = pytest.importorskip("wandb")

from eval import wandb_log  # noqa: E402


def kernel_rows():
    rows = []
    for n in (512, 1024, 2048):
        for v, b, t in (("flash", "triton", 1e-6 * n * n), ("linear", "triton", 2e-3 * n), ("linear", "torch", 3e-3 * n)):
            rows.append({"variant": v, "backend": b, "seq_len": n, "head_dim": 64, "n_kv_heads": 4, "status": "ok",
                         "fwd_bwd_ms": t, "fwd_ms": t / 3, "peak_mem_bytes": 1e6 * n})
    return rows


def quality_rows():
    return [{"dataset": "mqar", "variant": v, "seq_len": n, "metric": "val_acc", "value": a}
            for v, a in (("flash", 0.9), ("sparse", 0.6)) for n in (64, 128)]


def test_sweep_and_quality_tables_log_line_series_and_scatter(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    logged = []
    real_log = wandb.sdk.wandb_run.Run.log
    monkeypatch.setattr(wandb.sdk.wandb_run.Run, "log",
                        lambda self, payload, *a, **k: (logged.append(payload), real_log(self, payload, *a, **k))[1])
    runs = [{"dataset": "mqar", "variant": v, "seq_len": 64, "val_acc": a, "tokens_per_s": s, "peak_mem_mb": m}
            for v, a, s, m in (("flash", 0.9, 1e5, 400.0), ("sparse", 0.6, 2e5, 300.0))]
    out = wandb_log.log_results("t", "g", {"kernel": kernel_rows(), "quality": quality_rows(), "runs": runs},
                                dir=str(tmp_path), mode="offline")
    assert out is not None and len(logged) == 1
    payload = logged[0]
    chart = payload["chart/kernel/time fwd+bwd (ms)"]
    assert isinstance(chart, wandb.plot.CustomChart)
    # x = N, one line per (variant, backend)
    assert sorted({row[1] for row in chart.table.data}) == ["flash / triton", "linear / torch", "linear / triton"]
    assert sorted({row[0] for row in chart.table.data}) == [512, 1024, 2048]
    assert {r[1] for r in payload["chart/quality/mqar: val_acc"].table.data} == {"flash", "sparse"}
    scatter = payload["chart/bubble_mqar/seq_len 64"]
    assert sorted(r[0] for r in scatter.table.data) == ["flash", "sparse"]
    assert "kernel_table" in payload and "quality_table" in payload


def test_tables_without_chart_columns_draw_nothing():
    assert wandb_log.charts({"leaders": [{"kind": "crossover", "variant": "x"}]}) == {}
    assert wandb_log.charts({"kernel": []}) == {}


def test_disabled_mode_logs_nothing(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_log.log_results("t", "g", {"kernel": kernel_rows()}, mode="auto") is None
