"""``compare=best`` (eval.best, eval.quality speed_backend=best) on synthetic timing tables: no GPU, no timing."""

import math
import os

import numpy as np
import pandas as pd
import pytest

from eval import best
from eval.crossover import STATUS_CROSS


def _row(variant, backend, n, ms, reps=None, check=True, status="ok", hkv=4, kind=None):
    r = {"variant": variant, "kind": kind or ("linear" if variant == "linear" else "flash"), "backend": backend,
         "seq_len": str(n), "head_dim": "128", "causal": "True", "n_kv_heads": str(hkv), "status": status,
         "fwd_bwd_ms": str(ms), "tokens": "16384", "check_ok": "" if check is None else str(check)}
    if reps is not None:
        r["fwd_bwd_ms_reps"] = ";".join(str(x) for x in reps)
    return r


NS = (1024, 2048, 4096, 8192, 16384)


def _table(check_fa4=True):
    """Exact attention: ours (triton) t = n/1000, fa4 0.8x of it, a broken 'fast' anchor 0.5x that fails its check.
    Linear: ours t = 2.5 ms flat (crosses ours at 2,500); fla 2.0 ms flat (crosses fa4 at 2,500 too... scaled)."""
    rows = []
    rng = np.random.default_rng(0)
    for n in NS:
        t = n / 1000
        for b, f, chk in (("triton", 1.0, True), ("fa4", 0.8, check_fa4), ("broken", 0.5, False)):
            reps = list(t * f * (1 + 0.02 * rng.standard_normal(5)))
            rows.append(_row("flash", b, n, float(np.median(reps)), reps, chk))
        for b, c in (("triton", 2.5), ("fla", 3.0)):
            reps = list(c * (1 + 0.02 * rng.standard_normal(5)))
            rows.append(_row("linear", b, n, float(np.median(reps)), reps, True))
    rows.append(_row("linear", "torch", 1024, 0.01, None, True, status="error"))  # failed points never win
    return rows


def test_pick_best_takes_the_fastest_row_that_passed_its_check_and_names_it():
    picks = {(r["variant"], int(r["seq_len"])): r for r in best.pick_best(_table())}
    for n in NS:
        f = picks[("flash", n)]
        assert f["backend"] == "best" and f["impl"] == "fa4" and f["impl_check"] == "passed"  # not "broken"
        assert f["candidates"].split(";")[0].startswith("fa4:") and "broken" not in f["candidates"]
        assert picks[("linear", n)]["impl"] == "triton"  # 2.5 < 3.0; the erroring torch row is out
    picks = {(r["variant"], int(r["seq_len"])): r for r in best.pick_best(_table(check_fa4=False))}
    assert picks[("flash", 4096)]["impl"] == "triton"  # fa4 failing its check: ours is the best correct one
    unchecked = [dict(r, check_ok="") for r in _table()]
    p = {(r["variant"], int(r["seq_len"])): r for r in best.pick_best(unchecked)}
    assert p[("flash", 1024)]["impl"] == "broken" and p[("flash", 1024)]["impl_check"] == "unchecked"


def test_impl_summary_names_runs_of_one_implementation():
    assert best.impl_summary([(1024, "fa4"), (16384, "fa4"), (4096, "fa4")]) == "fa4 (1k-16k)"
    assert best.impl_summary([(1024, "flex_fa4"), (2048, "fa4"), (4096, "fa4")]) == "flex_fa4 @1k; fa4 @2k-4k"
    assert best.impl_summary([(1000, "x")]) == "x (1000)" and best.impl_summary([]) == "-"


def test_nstar_both_ways_with_intervals_and_the_shift():
    table = {r["variant"]: r for r in best.compare_nstar(_table(), "flash", ours=("triton",), n_boot=300)}
    lin = table["linear"]
    # ours vs ours: 2.5 ms flat against n/1000 -> n* = 2,500 (log-log interpolation between 2k and 4k)
    assert lin["ours_status"] == STATUS_CROSS and abs(lin["ours_n_star"] - 2500) / 2500 < 0.05
    # best vs best: linear's best is triton (2.5), exact's best is fa4 (0.8 n/1000) -> n* = 3,125
    assert lin["best_status"] == STATUS_CROSS and abs(lin["best_n_star"] - 3125) / 3125 < 0.05
    assert lin["best_impl_variant"] == "triton (1k-16k)" and lin["best_impl_baseline"] == "fa4 (1k-16k)"
    assert lin["ours_impl_baseline"] == "triton (1k-16k)"
    for tag in ("ours", "best"):
        lo, hi, n = lin[f"{tag}_lo"], lin[f"{tag}_hi"], lin[f"{tag}_n_star"]
        assert lo < n < hi and hi - lo < 0.2 * n, (tag, lo, n, hi)  # 2% timing noise: a tight interval around n*
        assert lin[f"{tag}_p_cross"] == 1.0 and lin[f"{tag}_reps"] == 5
    assert abs(lin["shift"] - 1.25) < 0.06
    assert "n* moves 1.2" in lin["conclusion"] and "intervals separate" in lin["conclusion"]
    md = best.format_nstar_markdown([lin])
    assert "| linear | 128 | 4 |" in md and "fa4 (1k-16k)" in md and "[" in md


def test_interval_widens_with_noise_and_is_absent_without_repeats():
    rows = _table()
    noisy = []
    rng = np.random.default_rng(1)
    for r in rows:
        if r["variant"] == "linear" and r.get("fwd_bwd_ms_reps"):
            reps = [2.5 * (1 + 0.3 * rng.standard_normal()) for _ in range(5)]
            r = dict(r, fwd_bwd_ms=str(np.median(reps)), fwd_bwd_ms_reps=";".join(map(str, reps)))
        noisy.append(r)
    tight = {r["variant"]: r for r in best.compare_nstar(rows, "flash", ("triton",), n_boot=300)}["linear"]
    wide = {r["variant"]: r for r in best.compare_nstar(noisy, "flash", ("triton",), n_boot=300)}["linear"]
    assert (wide["ours_hi"] - wide["ours_lo"]) > 2 * (tight["ours_hi"] - tight["ours_lo"])
    single = [{k: v for k, v in r.items() if k != "fwd_bwd_ms_reps"} for r in rows]
    one = {r["variant"]: r for r in best.compare_nstar(single, "flash", ("triton",), n_boot=50)}["linear"]
    assert one["ours_reps"] == 1 and one["ours_lo"] == one["ours_hi"] == pytest.approx(one["ours_n_star"])
    assert best.fmt_interval(float("nan"), 1, 2) == "-" and best.fmt_interval(2500, float("nan"), 1) == "2,500"


def test_analyse_best_writes_the_named_tables_and_figure(tmp_path):
    from eval.bench_common import write_csv
    from eval.sweep import COLUMNS

    write_csv(_table(), str(tmp_path / "kernel.csv"), columns=list(COLUMNS))
    cfg = {"name": "synthetic", "modes": ["fwd_bwd"], "baseline": {"variant": "flash", "backend": "triton"},
           "ours": ["triton"], "n_boot": 100}
    res = best.analyse_best(str(tmp_path), cfg, plots=True)
    b = pd.read_csv(tmp_path / "best.csv")
    assert set(b["impl"]) == {"fa4", "triton"} and (b["backend"] == "best").all()
    c = pd.read_csv(tmp_path / "crossover_best.csv")
    lin = c[(c["variant"] == "linear") & (c["metric"] == "fwd_bwd_ms")].iloc[0]
    assert lin["baseline"] == "flash/best" and lin["impl_variant"] == "triton (1k-16k)"
    assert lin["impl_baseline"] == "fa4 (1k-16k)" and abs(lin["n_star"] - 3125) / 3125 < 0.05
    n = pd.read_csv(tmp_path / "nstar_compare.csv")
    assert list(n["variant"]) == ["linear"] and n["best_impl_baseline"].iloc[0] == "fa4 (1k-16k)"
    assert res["figures"] and all(os.path.getsize(f) > 0 for f in res["figures"])


@pytest.mark.parametrize("n_boot, level, want", [
    (0, None, r"^n_boot=0: must be an integer >= 1 \(bootstrap resamples\)$"),  # was `or 1000`: 1000 resamples
    (-2, None, r"^n_boot=-2: must be an integer >= 1"),  # was range(-2): no resample, every interval NaN
    (2.5, None, r"^n_boot=2.5: must be an integer >= 1"), (True, None, r"^n_boot=True: "),
    (None, 0, r"^level=0: must be a number in \(0, 1\), e.g. 0.95$"),  # was `or 0.95`
    (None, 1.5, r"^level=1.5: must be a number in \(0, 1\)"),
])
def test_analyse_best_refuses_a_bootstrap_that_would_not_be_the_one_asked_for(tmp_path, n_boot, level, want):
    from eval.bench_common import write_csv
    from eval.sweep import COLUMNS

    write_csv(_table(), str(tmp_path / "kernel.csv"), columns=list(COLUMNS))
    cfg = {"name": "synthetic", "modes": ["fwd_bwd"], "baseline": {"variant": "flash", "backend": "triton"},
           "ours": ["triton"], "n_boot": n_boot, "level": level}
    with pytest.raises(ValueError, match=want):
        best.analyse_best(str(tmp_path), cfg, plots=False)
    assert sorted(os.listdir(tmp_path)) == ["kernel.csv"]
    with pytest.raises(ValueError, match=r"^--n-boot 0: must be an integer >= 1"):
        best.check_bootstrap(0, n_boot_key="--n-boot")
    best.check_bootstrap(None, None)
    best.check_bootstrap(1, 0.5)


def test_crossover_run_refuses_an_unknown_compare(tmp_path):
    from eval import crossover

    with pytest.raises(ValueError, match=r"compare='fastest' is not supported; allowed values: ours, best"):
        crossover.run({"sweep": {"name": "x", "variants": {}}, "out_dir": str(tmp_path), "run_sweep": False,
                       "compare": "fastest", "plots": False})


def test_quality_speed_backend_best_takes_the_fastest_correct_backend_and_names_it(tmp_path):
    from eval.quality import join_bench_speed, load_bench_speed

    rows = [
        dict(size="large", variant="flash", seq_len=4096, backend="triton", tokens_per_s=100.0, step_ms=10.0,
             peak_mem_mib=1.0, check_ok=True),
        dict(size="large", variant="flash", seq_len=4096, backend="fa4", tokens_per_s=130.0, step_ms=7.7,
             peak_mem_mib=1.0, check_ok=True),
        dict(size="large", variant="flash", seq_len=4096, backend="broken", tokens_per_s=500.0, step_ms=2.0,
             peak_mem_mib=1.0, check_ok=False),
        dict(size="large", variant="linear", seq_len=4096, backend="triton", tokens_per_s=150.0, step_ms=6.0,
             peak_mem_mib=1.0, check_ok=True),
    ]
    path = tmp_path / "model_speed.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    df = load_bench_speed(str(path), "best")
    got = {r["variant"]: r for r in df.to_dict("records")}
    assert got["flash"]["bench_backend"] == "fa4" and got["flash"]["tokens_per_s"] == 130.0
    assert got["linear"]["bench_backend"] == "triton"
    agg = [{"dataset": "mqar", "variant": "flash", "seq_len": 4096, "val_acc": 0.9, "tokens_per_s": 1.0,
            "step_time_s": 1.0, "peak_mem_mb": 1.0, "vocab_size": 256}]
    joined = join_bench_speed(agg, df)[0]
    assert joined[0]["speed_source"] == "bench_model:fa4/large"
    assert load_bench_speed(str(path), "triton")["bench_backend"].tolist() == ["triton", "triton"]
    with pytest.raises(ValueError, match=r"speed_backend='nope'.*allowed values: best, fa4, triton"):  # broken: failed check
        load_bench_speed(str(path), "nope")


def test_quality_leaders_and_bubbles_name_the_implementation_under_compare_best(tmp_path):
    """compare=best in the quality join: the leaders table (each leader and each crossover's n*) and the bubble
    chart name the implementation behind each speed; a join without a benchmark adds no ``impl`` column."""
    from eval import figspec
    from eval.quality import join_bench_speed, leaders, load_bench_speed

    rows = []
    for n, (tf, ta, tl) in {1024: (300.0, 200.0, 150.0), 4096: (100.0, 80.0, 150.0)}.items():
        rows += [dict(size="large", variant="flash", seq_len=n, backend="triton", tokens_per_s=ta, step_ms=1.0,
                      peak_mem_mib=1.0),
                 dict(size="large", variant="flash", seq_len=n, backend="fa4", tokens_per_s=tf, step_ms=1.0,
                      peak_mem_mib=1.0),
                 dict(size="large", variant="linear", seq_len=n, backend="triton", tokens_per_s=tl, step_ms=1.0,
                      peak_mem_mib=1.0)]
    for r in rows:
        r["step_ms"] = 16384 / r["tokens_per_s"] * 1e3
    path = tmp_path / "model_speed.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    agg = [{"dataset": "mqar", "variant": v, "seq_len": n, "val_acc": 0.9, "tokens_per_s": 1.0, "step_time_s": 1.0,
            "peak_mem_mb": 1.0, "vocab_size": 256, "quality_per_s": 0.9} for v in ("flash", "linear") for n in (1024, 4096)]
    joined = join_bench_speed(agg, load_bench_speed(str(path), "best"))[0]
    lead = leaders(joined)
    by = {(r["kind"], r["seq_len"] if r["kind"] == "leader" else None): r for r in lead}
    assert by[("leader", 1024)]["leader"] == "flash" and by[("leader", 1024)]["impl"] == "fa4"
    assert by[("leader", 4096)]["leader"] == "linear" and by[("leader", 4096)]["impl"] == "triton"
    cross = by[("crossover", None)]
    assert cross["leader"] == "flash -> linear" and cross["impl"] == "fa4/fa4 -> triton/triton"
    assert "impl" not in leaders(agg)[0]  # the runs' own speed: no implementation to name
    fig = figspec.bubble([dict(r, val_acc=0.9) for r in joined], "val_acc", impl="bench_backend")
    texts = {t.name: t.text for p in fig.panels for t in p.traces if p.title == "seq_len 1024"}
    assert texts == {"flash": ["fa4"], "linear": ["triton"]}
    assert all("implementation fa4" in h for p in fig.panels for t in p.traces if t.name == "flash" for h in t.hover)
    assert all(t.text is None for p in figspec.bubble(joined, "val_acc").panels for t in p.traces)


# --------------------------------------------------------------------------------------------- the sweep's side
def _sweep_cfg(backends, **kw):
    cfg = {"name": "t", "device": "cpu", "dtype": "float32", "n_heads": 2, "tokens": 64, "seq_lens": [16, 32],
           "head_dims": [8], "causal": [True], "modes": ["fwd"], "warmup": 0, "rep": 1, "check": True,
           "check_rows": 8, "variants": {"flash": {"kind": "flash", "causal": True},
                                         "window": {"kind": "sliding_window", "causal": True, "window_size": [3, 0]},
                                         "linear": {"kind": "linear", "causal": True, "feature_map": "elu1",
                                                    "chunk_size": 16}},
           "backends": backends}
    cfg.update(kw)
    return cfg


def test_the_sweep_check_flags_a_wrong_backend_and_best_skips_it(tmp_path):
    from attn_zoo import attention
    from eval.sweep import register_bench_backend, run_sweep

    @register_bench_backend("off_by_one_window")  # a plausible bug: the window one key too wide, fast
    def _build(spec, q, k, v):
        wide = spec.replace(window_size=(spec.window_size[0] + 1, 0)) if spec.window_size else spec
        return lambda q, k, v: attention(q, k, v, wide, backend="naive")

    rows = run_sweep(_sweep_cfg(["torch", "off_by_one_window"], repeats=2), str(tmp_path / "k.csv"), resume=False,
                     progress=False)
    got = {(r["variant"], r["backend"], r["seq_len"]): r for r in rows}
    assert got[("window", "off_by_one_window", "16")]["check_ok"] == "False"
    assert float(got[("window", "off_by_one_window", "16")]["check_err"]) > 0.01
    assert got[("flash", "off_by_one_window", "16")]["check_ok"] == "True"  # no window: the same mask, correct
    assert got[("window", "torch", "32")]["check_ok"] == "True" and got[("linear", "torch", "32")]["check_ok"] == "True"
    assert len(got[("window", "torch", "32")]["fwd_ms_reps"].split(";")) == 2
    picks = {(r["variant"], r["seq_len"]): r["impl"] for r in best.pick_best(rows, "fwd_ms")}
    assert picks[("window", "16")] == "torch" and picks[("window", "32")] == "torch"


def test_a_point_the_process_died_on_is_recorded_and_passed_on_resume(tmp_path):
    from eval.sweep import POINT_KEYS, run_sweep

    out = str(tmp_path / "k.csv")
    cfg = _sweep_cfg(["naive"], variants={"flash": {"kind": "flash", "causal": True}}, check=False)
    with open(out + ".inflight", "w") as f:  # as a segfault at (flash, naive, N=16) leaves it
        f.write("\t".join(str(x) for x in ("flash", "naive", 16, 8, True, 2)))
    rows = {r["seq_len"]: r for r in run_sweep(cfg, out, resume=True, progress=False)}
    assert rows["16"]["status"] == "error" and "process died while measuring" in rows["16"]["error"]
    assert rows["32"]["status"] == "skipped"  # the series stops after the failure, as after any error
    assert not os.path.exists(out + ".inflight") and len(POINT_KEYS) == 6


def test_sticky_cuda_errors_are_recognised():
    from eval.sweep import is_sticky_cuda_error

    assert is_sticky_cuda_error("RuntimeError: CUDA error: an illegal memory access was encountered")
    assert is_sticky_cuda_error("AcceleratorError: CUDA error: device-side assert triggered")
    assert not is_sticky_cuda_error("RuntimeError: CUDA out of memory") and not is_sticky_cuda_error("")


def test_cli_variants_subset_and_deadline(tmp_path):
    import yaml

    from eval.sweep import main

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_sweep_cfg(["naive"], check=False)))
    assert main(["--config", str(path), "--out", str(tmp_path / "o"), "--variants", "linear", "--no-progress",
                 "--deadline-s", "60"]) == 0
    d = pd.read_csv(tmp_path / "o" / "kernel.csv")
    assert set(d["variant"]) == {"linear"}
    with pytest.raises(SystemExit):
        main(["--config", str(path), "--out", str(tmp_path / "o"), "--variants", "nope"])


# --------------------------------------------------------------------------------------------- the quality join
def _bench_csv(path, reps=5, checks=True, broken=True, seed=0):
    """A bench_model CSV of the small model: flash on ours (triton, step n/100 ms) and fa4 (0.8x of it), linear on
    ours (25 ms flat), and a 'broken' anchor 2x faster than fa4 that fails its check. ``reps``: timed steps per row
    with 2% noise (0: an old CSV without step_ms_reps); ``checks=False``: no check_ok column."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in NS:
        for variant, backend, t, ok in (("flash", "triton", n / 100, True), ("flash", "fa4", 0.8 * n / 100, True),
                                        ("flash", "broken", 0.4 * n / 100, False), ("linear", "triton", 25.0, True)):
            if backend == "broken" and not broken:
                continue
            steps = list(t * (1 + 0.02 * rng.standard_normal(max(reps, 1))))
            r = dict(size="small", variant=variant, seq_len=n, backend=backend, batch=16384 // n,
                     tokens_per_step=16384, step_ms=float(np.median(steps)),
                     tokens_per_s=16384 / float(np.median(steps)) * 1e3, peak_mem_mib=100.0, n_params=1000)
            if reps:
                r["step_ms_reps"] = ";".join(f"{x:.5f}" for x in steps)
            if checks:
                r.update(check_ok=ok, check_err=0.01 if ok else 0.4)
            rows.append(r)
    pd.DataFrame(rows).to_csv(path, index=False)
    return str(path)


def _agg(acc_flash=0.9, acc_linear=0.9):
    return [{"dataset": "mqar", "variant": v, "seq_len": n, "val_acc": a, "val_bpb": float("nan"),
             "val_loss": 1.0, "tokens_per_s": 1.0, "step_time_s": 1.0, "peak_mem_mb": 1.0, "vocab_size": 256}
            for v, a in (("flash", acc_flash), ("linear", acc_linear)) for n in NS]


def test_quality_best_skips_failed_checks_says_so_and_labels_unchecked_rows(tmp_path):
    from eval.quality import bench_rows, check_notes, join_bench_speed, leaders, load_bench_speed

    path = _bench_csv(tmp_path / "new.csv")
    notes = []
    best_df = load_bench_speed(path, "best", notes=notes)
    got = {(r["variant"], r["seq_len"]): r for r in best_df.to_dict("records")}
    assert got[("flash", 4096)]["bench_backend"] == "fa4"  # 'broken' is faster but failed its check
    assert got[("flash", 4096)]["bench_check"] == "passed" and got[("flash", 4096)]["bench_step_reps"] == 5
    assert len(notes) == 1 and notes[0].startswith("left out, failed the correctness check: broken flash@1024")
    assert "broken flash@16384 (err 0.4)" in notes[0]
    assert check_notes(bench_rows(path)) == notes
    # an old CSV (no check_ok): the pick stays what it was (the fastest) but every row is labelled unchecked
    old = _bench_csv(tmp_path / "old.csv", reps=0, checks=False)
    notes = []
    old_df = load_bench_speed(old, "best", notes=notes)
    pick = {(r["variant"], r["seq_len"]): r for r in old_df.to_dict("records")}[("flash", 4096)]
    assert pick["bench_backend"] == "broken" and pick["bench_check"] == "unchecked"
    assert pick["bench_step_reps"] == 0
    assert notes == ["20 of 20 speed rows unchecked (no check_ok: a bench_model CSV from before the correctness "
                     "check): their implementations are named, not verified"]
    lead = leaders(join_bench_speed(_agg(), old_df)[0])
    assert {r["impl_check"] for r in lead} == {"unchecked"}
    lead = leaders(join_bench_speed(_agg(), best_df)[0])
    assert {r["impl_check"] for r in lead} == {"passed"}
    assert load_bench_speed(path, "triton")["bench_check"].tolist() == ["passed"] * 10


def test_quality_nstar_both_ways_with_intervals_from_the_timed_steps(tmp_path):
    from eval.quality import bench_rows, compare_nstar, nstar_line

    path = _bench_csv(tmp_path / "new.csv")
    table = compare_nstar(_agg(), bench_rows(path), ours=("triton",), n_boot=300)
    by = {(r["baseline"], r["variant"]): r for r in table}
    assert set(by) == {("flash", "linear")}  # flash leads, then linear: the leader change is the vs-flash pair
    lin = by[("flash", "linear")]
    assert lin["pair"] == "leader change (best); leader change (ours); vs flash"
    # equal quality: cost = step time / 0.9; ours: 25 = n / 100 at n = 2,500; best: fa4 0.8 n / 100 -> 3,125
    assert lin["ours_status"] == STATUS_CROSS and abs(lin["ours_n_star"] - 2500) / 2500 < 0.05
    assert lin["best_status"] == STATUS_CROSS and abs(lin["best_n_star"] - 3125) / 3125 < 0.05
    assert lin["best_impl_baseline"] == "fa4 (1k-16k)" and lin["ours_impl_baseline"] == "triton (1k-16k)"
    assert "broken" not in lin["best_impl_baseline"] and lin["best_check"] == "passed"
    for tag in ("ours", "best"):
        lo, n, hi = lin[f"{tag}_lo"], lin[f"{tag}_n_star"], lin[f"{tag}_hi"]
        assert lo < n < hi and hi - lo < 0.2 * n and lin[f"{tag}_reps"] == 5, (tag, lo, n, hi)
    assert abs(lin["shift"] - 1.25) < 0.06
    assert "n* moves 1.2" in lin["conclusion"] and "intervals separate" in lin["conclusion"]
    line = nstar_line(lin)
    assert "ours vs ours 2," in line and "best vs best 3," in line and "fa4 (1k-16k)" in line and "[" in line
    # quality moves n*: linear at a third of flash's accuracy needs 3x the length
    worse = {r["variant"]: r for r in compare_nstar(_agg(acc_linear=0.3), bench_rows(path), ("triton",),
                                                     n_boot=50)}["linear"]
    assert abs(worse["ours_n_star"] - 7500) / 7500 < 0.05
    # noisier steps: a wider interval
    noisy = _bench_csv(tmp_path / "noisy.csv", seed=1)
    df = pd.read_csv(noisy)
    rng = np.random.default_rng(2)
    lin_rows = df["variant"] == "linear"
    df.loc[lin_rows, "step_ms_reps"] = [";".join(str(25 * (1 + 0.3 * rng.standard_normal())) for _ in range(5))
                                        for _ in range(int(lin_rows.sum()))]
    df.to_csv(noisy, index=False)
    wide = compare_nstar(_agg(), bench_rows(noisy), ("triton",), n_boot=300)[0]
    assert (wide["ours_hi"] - wide["ours_lo"]) > 2 * (lin["ours_hi"] - lin["ours_lo"])
    # an old CSV: same n*, no interval (said so), unchecked
    old = compare_nstar(_agg(), bench_rows(_bench_csv(tmp_path / "old.csv", reps=0, checks=False, broken=False)),
                        ("triton",), n_boot=50)[0]
    assert abs(old["best_n_star"] - 3125) / 3125 < 0.05 and old["ours_reps"] == 1
    assert all(math.isnan(old[k]) for k in ("ours_lo", "ours_hi", "best_lo", "best_hi", "ours_p_cross"))
    assert "no interval: the speed CSV has no per-step times" in old["conclusion"]
    assert old["ours_check"] == old["best_check"] == "unchecked"


def test_quality_run_writes_nstar_both_ways_and_its_figure(tmp_path):
    from eval.quality import NSTAR_COLUMNS
    from eval.quality import run as quality_run
    from test_eval_pipeline import _fake_run

    root = tmp_path / "multirun"
    for i, (v, n) in enumerate((v, n) for v in ("flash", "linear") for n in NS):
        _fake_run(root, i, "mqar", v, n, 0.9, 1.0, 1.0)
    path = _bench_csv(tmp_path / "speed.csv")
    res = quality_run({"runs": [str(root)], "out_dir": str(tmp_path / "q"), "speed": path, "compare": "best",
                       "ours": ["triton"], "n_boot": 200, "formats": ["png"], "wandb": {"enabled": False}})
    n = pd.read_csv(tmp_path / "q" / "nstar_compare.csv")
    assert list(n.columns) == list(NSTAR_COLUMNS) and len(n) == 1
    assert abs(n["shift"].iloc[0] - 1.25) < 0.06 and n["best_impl_baseline"].iloc[0] == "fa4 (1k-16k)"
    assert n["best_lo"].iloc[0] < n["best_n_star"].iloc[0] < n["best_hi"].iloc[0]
    lead = pd.read_csv(tmp_path / "q" / "leaders.csv")
    assert set(lead["impl_check"]) == {"passed"} and "broken" not in " ".join(lead["impl"])
    q = pd.read_csv(tmp_path / "q" / "quality_speed_memory.csv")
    assert set(q["bench_check"]) == {"passed"}
    png = tmp_path / "q" / "nstar_mqar.png"
    assert png.exists() and png.stat().st_size > 5000 and res["nstar"][0]["variant"] == "linear"
