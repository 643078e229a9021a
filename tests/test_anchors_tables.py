"""eval/anchors_tables.py on a synthetic RESULTS_DIR as lab/h200_anchors.sh leaves it (no GPU, no timing)."""

import os
import re

import numpy as np
import pytest

from eval import anchors_tables
from eval.bench_common import write_csv
from eval.sweep import COLUMNS

NS = (1024, 4096, 16384)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _row(variant, backend, n, ms, status="ok", check=True, error="", D=128, hkv=16, causal=True, rng=None):
    reps = [ms * (1 + 0.01 * rng.standard_normal()) for _ in range(3)] if (rng is not None and status == "ok") else []
    fl = 4 * 16 * n * n * D * 3.5 / 2 * (16384 // n)  # fwd+bwd FLOPs, causal
    return {"sweep": "anchors_h200", "variant": variant, "kind": "linear" if "linear" in variant else "flash",
            "backend": backend, "seq_len": n, "head_dim": D, "causal": causal, "n_kv_heads": hkv, "n_heads": 16,
            "batch": 16384 // n, "dtype": "bfloat16", "device": "cuda", "status": status, "error": error,
            "fwd_ms": ms / 3 if status == "ok" else None, "fwd_bwd_ms": float(np.median(reps)) if reps else None,
            "fwd_bwd_ms_reps": ";".join(map(str, reps)), "fwd_bwd_tflops": fl / (ms * 1e-3) / 1e12 if reps else None,
            "fwd_tflops": fl / 3.5 / (ms / 3 * 1e-3) / 1e12 if reps else None, "tokens": 16384,
            "check_rows": 128 if status == "ok" else None, "check_err": 0.01 if check else 0.5,
            "check_ok": check if status == "ok" else None}


@pytest.fixture
def results(tmp_path):
    rng = np.random.default_rng(0)
    soft, lin = [], []
    for n in NS:
        t = n / 1000
        soft += [_row("causal", "triton", n, t, rng=rng), _row("causal", "fa4", n, 0.8 * t, rng=rng),
                 _row("causal", "sdpa_cudnn", n, 0.85 * t, rng=rng),
                 _row("causal", "flex_fa4", n, 0.5 * t, check=False, rng=rng),  # fast and wrong: never best
                 _row("causal", "flex", n, 0, status="error", error="RuntimeError: boom | inductor")]
        soft += [_row("window", "triton", n, min(t, 1.2), rng=rng), _row("window", "fa4", n, min(0.9 * t, 1.0), rng=rng),
                 _row("window", "sdpa_cudnn", n, 0, status="unsupported", error="SDPA: no windows")]
        lin += [_row("linear", "triton", n, 2.5, rng=rng), _row("linear", "fla", n, 3.0, rng=rng)]
    write_csv(soft, str(tmp_path / "softmax" / "kernel.csv"), columns=list(COLUMNS))
    write_csv(lin, str(tmp_path / "linear" / "kernel.csv"), columns=list(COLUMNS))
    return tmp_path


def test_tables_name_the_best_the_ratios_the_intervals_and_the_failures(results, capsys):
    assert anchors_tables.main([str(results), "--n-boot", "200", "--no-plots"]) == 0
    md = capsys.readouterr().out
    # 1: TFLOP/s, the fastest correct implementation bold and named (flex_fa4 failed its check: marked, not best)
    line = next(l for l in md.splitlines() if l.startswith("| causal, D 128 | 16k |"))
    assert line.rstrip().endswith("| FA4 |") and "✗" in line and line.count("**") == 2 and "err" in line
    assert md.index("| case | N | ours (triton) | FA4 | Flex+FA4 | cuDNN | Flex (Triton) | best |") < \
        md.index("| case | N | ours (triton) | fla | best |")  # the softmax family first, one table per family
    # 2: ratios ours / anchor = t_anchor / t_ours (fa4 0.8x our time -> 0.80)
    r = next(l for l in md.splitlines() if l.startswith("| causal, D 128 | 4k | triton |"))
    assert "| 0.80 |" in r or " 0.80 " in r and " 0.85 " in r
    # 4: n* both ways with intervals and the implementations (linear: ours 2.5 ms vs n/1000 -> 2,500; fa4 -> 3,125)
    nline = next(l for l in md.splitlines() if l.startswith("| linear | 128 | 16 |"))
    assert "triton (1k-16k) / triton (1k-16k)" in nline and "triton (1k-16k) / fa4 (1k-16k)" in nline
    assert nline.count("[") == 2 and "1.2" in nline.split("|")[-2]
    assert "- linear: n* moves 1.2" in md
    # 5: every failure listed with its points
    assert "| Flex (Triton) | error | RuntimeError: boom / inductor | causal@1k, causal@4k, causal@16k |" in md
    assert "| Flex+FA4 | check failed | check_err=0.5 > tolerance |" in md
    assert "Best implementation per case: causal, D 128: fa4 (1k-16k)" in md
    comb = results / "combined"
    for f in ("kernel.csv", "best.csv", "crossover_best.csv", "nstar_compare.csv"):
        assert os.path.getsize(comb / f) > 0


def test_no_results_is_a_clear_error(tmp_path, capsys):
    """(A FileNotFoundError traceback before: now the usage error, exit 2.)"""
    with pytest.raises(SystemExit) as e:
        anchors_tables.main([str(tmp_path)])
    assert e.value.code == 2
    assert re.search(r"results_dir .*: no <family>/kernel.csv under .* \(written by lab/h200_anchors.sh\)",
                     capsys.readouterr().err)


def test_a_run_that_kept_only_combined_is_rebuilt_from_it(results, capsys):
    """Committed runs keep ``combined/kernel.csv`` alone (the family tables are the same rows): anchors_tables
    refused them ("no <family>/kernel.csv"), so their tables kept the statuses of the day they were made. It now
    reads the combined rows, family by family, and writes the same tables as from the family folders."""
    assert anchors_tables.main([str(results), "--n-boot", "50", "--no-plots"]) == 0
    first = capsys.readouterr().out
    before = {f: open(results / "combined" / f).read() for f in ("kernel.csv", "best.csv", "nstar_compare.csv")}
    os.remove(results / "linear" / "kernel.csv")  # one family kept its table: the other's rows come from combined/
    assert anchors_tables.main([str(results), "--n-boot", "50", "--no-plots"]) == 0  # (they were dropped, and
    assert capsys.readouterr().out == first  # combined/kernel.csv rewritten without them)
    assert {f: open(results / "combined" / f).read() for f in before} == before
    os.remove(results / "softmax" / "kernel.csv")
    assert anchors_tables.main([str(results), "--n-boot", "50", "--no-plots"]) == 0
    assert capsys.readouterr().out == first
    assert {f: open(results / "combined" / f).read() for f in before} == before
    lines = open(results / "combined" / "kernel.csv").read().splitlines()
    open(results / "combined" / "kernel.csv", "w").write("\n".join(l.rsplit(",", 1)[0] for l in lines) + "\n")
    with pytest.raises(SystemExit):  # a table without the family column: not one of ours
        anchors_tables.main([str(results), "--no-plots"])
    assert "rows without a family column" in capsys.readouterr().err


def test_combined_tables_keep_the_columns_of_the_family_tables(tmp_path):
    """The family tables of a run from before eval.sweep's ``settings`` column: combined/kernel.csv and best.csv
    gained an empty ``settings`` column, so the documented rebuild rewrote the committed tables (every row changed).
    They keep the families' columns (+ ``family`` / the pick's)."""
    old = [c for c in COLUMNS if c != "settings"]
    rng = np.random.default_rng(0)
    rows = [_row("causal", b, n, f * n / 1000, rng=rng) for n in NS for b, f in (("triton", 1.0), ("fa4", 0.8))]
    write_csv(rows, str(tmp_path / "softmax" / "kernel.csv"), columns=old)
    assert anchors_tables.main([str(tmp_path), "--n-boot", "20", "--no-plots"]) == 0
    header = lambda f: open(tmp_path / "combined" / f).readline().strip().split(",")  # noqa: E731
    assert header("kernel.csv") == old + ["family"]
    assert header("best.csv") == old + ["impl", "impl_check", "candidates"]
    write_csv(rows, str(tmp_path / "softmax" / "kernel.csv"), columns=list(COLUMNS))  # a newer run: kept
    anchors_tables.main([str(tmp_path), "--n-boot", "20", "--no-plots"])
    assert header("kernel.csv") == list(COLUMNS) + ["family"]


def _same_table(a, b, rel=1e-12):
    """Two CSVs equal cell for cell, numbers within ``rel`` (a fit's last digits follow the BLAS kernels)."""
    import csv
    import math

    ra, rb = list(csv.reader(open(a))), list(csv.reader(open(b)))
    assert ra[0] == rb[0] and len(ra) == len(rb), (a, ra[0], rb[0])
    for x, y in zip(ra[1:], rb[1:]):
        for u, v in zip(x, y):
            try:
                fu, fv = float(u), float(v)
            except ValueError:
                assert u == v, (a, x, y)
                continue
            assert (math.isnan(fu) and math.isnan(fv)) or math.isclose(fu, fv, rel_tol=rel), (a, x, y)


def test_the_documented_rebuild_reproduces_the_committed_tables(tmp_path):
    """``python -m eval.anchors_tables results/h200/2026-12-03/anchors ...`` (docs/results.md) on a copy of the
    committed run gives its committed combined/ tables (kernel.csv and best.csv byte for byte)."""
    import shutil

    src = os.path.join(ROOT, "results", "h200", "2026-12-03", "anchors")
    for d in ("softmax", "linear"):
        shutil.copytree(os.path.join(src, d), tmp_path / d)
    assert anchors_tables.main([str(tmp_path), "--no-plots", "--config",
                                os.path.join(ROOT, "eval", "conf", "sweep", "anchors_h200.yaml")]) == 0
    for f in ("kernel.csv", "best.csv"):
        assert open(tmp_path / "combined" / f, "rb").read() == open(os.path.join(src, "combined", f), "rb").read(), f
    for f in ("crossover_best.csv", "nstar_compare.csv"):
        _same_table(tmp_path / "combined" / f, os.path.join(src, "combined", f))


def test_roofline_draws_every_correct_implementation_under_the_measured_roof(results):
    rows = anchors_tables.load(str(results))
    decode = [{"case": "mha_b1_16k", "method": "ours_default", "frac": "0.7"},
              {"case": "mha_b1_16k", "method": "sdpa", "frac": "0.8"}]
    fig = anchors_tables.roofline_figure(rows, {"matmul_tflops": 700.0, "copy_gbps": 4000.0}, decode)
    causal, dec = fig.panels[0], fig.panels[-1]
    assert causal.hlines[0][0] == 700.0
    # flex_fa4 failed its check and flex errored: neither is drawn; ours, FA4 and cuDNN are, one point per N
    assert sorted(t.meta["backend"] for t in causal.traces) == ["fa4", "sdpa_cudnn", "triton"]
    assert all(len(t.x) == len(NS) for t in causal.traces)
    assert [t.x for t in dec.traces] == [[0.7], [0.8]] and dec.ylabels == ["mha_b1_16k"]
    with pytest.raises(KeyError, match="matmul_tflops"):
        anchors_tables.roofline_figure(rows, {"copy_gbps": 1.0})
    # rows of decode_probe --matrix: one bar pair per (B, heads, context, page) at Nq 1, other Nq and pages left out
    matrix = [{"B": "1", "Hq": "32", "Hkv": "8", "context": "16384", "page_size": p, "Nq": nq,
               "frac": f, "sdpa_frac": "0.5"}
              for p, nq, f in (("0", "1", "0.7"), ("16", "1", "0.3"), ("32", "1", "0.4"), ("0", "4", "0.9"))]
    dec = anchors_tables.roofline_figure(rows, {"matmul_tflops": 700.0, "copy_gbps": 4000.0}, matrix).panels[-1]
    assert dec.ylabels == ["B1 16k 32:8 contig", "B1 16k 32:8 page 16"]
    assert [t.x for t in dec.traces] == [[0.7, 0.3], [0.5, 0.5]]
    # rows of decode_probe --compare: its "new" (the default plan) is ours; other variants ("deep") are not drawn
    compare = [{"case": "gqa_b1_64k", "method": m, "frac": f} for m, f in (("sdpa", "0.9"), ("new", "0.8"),
                                                                            ("deep", "0.6"))]
    dec = anchors_tables.roofline_figure(rows, {"matmul_tflops": 700.0, "copy_gbps": 4000.0}, compare).panels[-1]
    assert [t.x for t in dec.traces] == [[0.8], [0.9]] and dec.ylabels == ["gqa_b1_64k"]


def test_anchors_script_refuses_an_unknown_family_before_any_work(tmp_path):
    """lab/h200_anchors.sh FAMILIES= names the allowed families and exits 2 before writing anything."""
    import subprocess

    out = tmp_path / "run"
    r = subprocess.run(["bash", "lab/h200_anchors.sh", str(out)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "FAMILIES": "softmax bogus"},
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 2 and "unknown family 'bogus'; allowed: softmax linear" in r.stdout
    assert not out.exists()


def test_points_never_reached_are_failures_and_counted(tmp_path, capsys):
    """A family whose sweep hit its deadline has config points without a row: the Failures section names them per
    series (families without a kernel.csv are not counted) and the header counts config / measured / ok."""
    import yaml

    cfg = {"name": "anchors_h200", "device": "cuda", "dtype": "bfloat16", "n_heads": 16, "tokens": 16384,
           "seq_lens": list(NS), "head_dims": [128], "causal": [True], "kv_heads": [None], "repeats": 3,
           "variants": {"causal": {"kind": "flash", "causal": True},
                        "gqa": {"kind": "flash", "causal": True, "kv_group_size": 4},
                        "linear": {"kind": "linear", "causal": True, "feature_map": "elu1"}},
           "backends": ["triton", "fa4", "fla"],
           "exclude": [{"backend": "fla", "variant": ["causal", "gqa"]}, {"backend": "fa4", "variant": "linear"}],
           "baseline": {"variant": "causal", "backend": "triton"}, "n_boot": 50}
    conf = tmp_path / "conf.yaml"
    conf.write_text(yaml.safe_dump(cfg))
    rng = np.random.default_rng(1)
    rows = [_row("causal", "triton", n, n / 1000, rng=rng) for n in NS] + [_row("causal", "fa4", 1024, 0.9, rng=rng)]
    res = tmp_path / "res"
    write_csv(rows, str(res / "softmax" / "kernel.csv"), columns=list(COLUMNS))  # no linear family: not counted
    assert anchors_tables.main([str(res), "--config", str(conf), "--n-boot", "50", "--no-plots"]) == 0
    md = capsys.readouterr().out
    # softmax config points: (causal, gqa) x (triton, fa4) x 3 N = 12; 4 rows, all ok
    assert md.splitlines()[0].startswith(f"<!-- eval/anchors_tables.py {res}: 12 points in the config, 4 measured, "
                                         f"4 ok, 4 of them checked")
    fail = md[md.index("### Failures"):]
    assert "(none" not in fail and "8 points of the config have no row:" in fail
    assert "- not reached (deadline): causal / FA4 / 4k, 16k" in fail
    assert "- not reached (deadline): gqa / ours (triton) / 1k, 4k, 16k" in fail
    assert "- not reached (deadline): gqa / FA4 / 1k, 4k, 16k" in fail
    assert "linear" not in fail and "causal / ours (triton)" not in fail


def test_families_match_the_anchors_script():
    """anchors_tables.FAMILIES (which config variants count for a family folder) = h200_anchors.sh's run_family
    (its default variants, where an environment variable may reorder them: ``"${LINEAR_VARIANTS:-...}"``), as sets:
    the script orders them to run, the tables to read."""
    import re

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = open(os.path.join(root, "lab", "h200_anchors.sh")).read()
    calls = re.findall(r"\b(\w+)\) run_family \1 \S+ \"?(?:\$\{\w+:-)?([\w,]+)", script)
    got = {f: sorted(v.split(",")) for f, v in calls}  # the script's run order may differ from the tables' order
    assert got == {f: sorted(v) for f, v in anchors_tables.FAMILIES.items()}


def test_empty_kernel_csvs_are_refused_before_any_table(tmp_path, capsys):
    """Every family's kernel.csv empty (or header only): a ValueError naming the files, not a crash half-way through
    the printed tables."""
    (tmp_path / "linear").mkdir()
    (tmp_path / "linear" / "kernel.csv").write_text("")
    write_csv([], str(tmp_path / "softmax" / "kernel.csv"), columns=list(COLUMNS))
    with pytest.raises(SystemExit) as e:
        anchors_tables.main([str(tmp_path), "--no-plots", "--n-boot", "20"])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and re.search("no rows in .*kernel.csv", err) and out == ""


def test_a_missing_config_is_a_usage_error(tmp_path, capsys):
    rng = np.random.default_rng(0)
    write_csv([_row("causal", "triton", n, n / 1000, rng=rng) for n in NS], str(tmp_path / "softmax" / "kernel.csv"),
              columns=list(COLUMNS))
    with pytest.raises(SystemExit) as e:
        anchors_tables.main([str(tmp_path), "--config", str(tmp_path / "nope.yaml"), "--no-plots"])
    assert e.value.code == 2 and "--config" in capsys.readouterr().err


@pytest.mark.parametrize("argv, conf_n_boot, want", [
    (["--n-boot", "0"], None, "argument --n-boot: 0: must be an integer >= 1"),  # was taken as n_boot 1000
    (["--n-boot", "-3"], None, "argument --n-boot: -3: must be an integer >= 1"),  # was 0 resamples: NaN intervals
    (["--n-boot", "x"], None, "argument --n-boot: 'x' is not an integer; allowed values: an integer >= 1"),
    ([], 0, "n_boot=0: must be an integer >= 1 (bootstrap resamples) (or pass --n-boot)"),  # the config's own
])
def test_a_bad_n_boot_is_refused_before_any_table(results, tmp_path, capsys, argv, conf_n_boot, want):
    """``--n-boot 0`` ran every table with 1000 resamples (``n_boot or 1000``), a negative one with none (every
    interval NaN), exit 0 both; now argparse's error naming the flag, before anything is read or written."""
    import yaml

    conf = tmp_path / "conf.yaml"
    conf.write_text(yaml.safe_dump({"name": "anchors_h200", "baseline": {"variant": "causal", "backend": "triton"},
                                    "n_boot": conf_n_boot}))
    with pytest.raises(SystemExit) as e:
        anchors_tables.main([str(results), "--config", str(conf), "--no-plots"] + argv)
    assert e.value.code == 2 and want in capsys.readouterr().err
    assert not (results / "combined").exists()
