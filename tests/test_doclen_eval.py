"""eval.doclen: the fit on a committed-like sweep table, the measured interpolation, the figure and the CLI."""
import csv
import json
import os

import pytest

from eval import doclen as cli
from eval import figspec

C0, C2, CLIN = 0.02, 4e-5, 0.06  # us per token; n* by N = (CLIN - C0) / C2 = 1000


def _kernel_csv(path, noise=0.0):
    """A sweep table as eval.sweep writes it: exact (flash/triton) t/token = C0 + C2 N, linear flat CLIN, other
    rows that must be ignored (another head dim, an error, another backend)."""
    cols = ["variant", "kind", "backend", "seq_len", "head_dim", "causal", "n_kv_heads", "n_heads", "status",
            "fwd_bwd_ms", "tokens"]
    rows = []
    for i, N in enumerate([512, 1024, 2048, 4096, 8192]):
        e = 1 + (noise if i % 2 else -noise)
        rows.append(["flash", "flash", "triton", N, 128, True, 16, 16, "ok", (C0 + C2 * N) * e * 16384 / 1e3, 16384])
        rows.append(["linear", "linear", "triton", N, 128, True, 16, 16, "ok", CLIN * 16384 / 1e3, 16384])
        rows.append(["flash", "flash", "triton", N, 64, True, 16, 16, "ok", 99.0, 16384])
        rows.append(["flash", "flash", "sdpa_flash", N, 128, True, 16, 16, "ok", 99.0, 16384])
    rows.append(["linear", "linear", "triton", 16384, 128, True, 16, 16, "oom", "", 16384])
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        w.writerows(rows)
    return str(path)


def test_fit_recovers_the_constants(tmp_path):
    fit = cli.fit_costs(_kernel_csv(tmp_path / "kernel.csv"))
    assert fit["c0"] == pytest.approx(C0, rel=1e-6) and fit["c2"] == pytest.approx(C2, rel=1e-6)
    assert fit["c_lin"] == pytest.approx(CLIN, rel=1e-9)
    assert fit["n_star_fit"] == pytest.approx(1000, rel=1e-4)
    assert fit["exact_lengths"] == [1024, 2048, 4096, 8192] and "kernel.csv" in fit["source"]
    noisy = cli.fit_costs(_kernel_csv(tmp_path / "k2.csv", noise=0.02))
    assert noisy["c2"] == pytest.approx(C2, rel=0.1) and noisy["c2"] != pytest.approx(C2, rel=1e-6)


def test_fit_errors_name_the_series(tmp_path):
    with pytest.raises(ValueError, match="exact"):
        cli.fit_costs(_kernel_csv(tmp_path / "k.csv"), fit_min_seq_len=8192)
    with pytest.raises(ValueError, match="linear"):
        cli.fit_costs(_kernel_csv(tmp_path / "k.csv"), linear=("linear", "fla"))


def test_measured_n_star_interpolates_in_log_space():
    n, st = cli.measured_n_star([100, 1000, 10000], [1.0, 4.0, 16.0], 2.0)
    assert st == "crossing" and n == pytest.approx(10 ** 2.5)
    assert cli.measured_n_star([100, 1000], [3.0, 4.0], 2.0)[1] == "linear faster in whole range"
    assert cli.measured_n_star([100, 1000], [1.0, 1.5], 2.0)[1] == "linear slower in whole range"


def test_cli_end_to_end_tiny_grid(tmp_path, capsys):
    k = _kernel_csv(tmp_path / "kernel.csv")
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("length\n" + "\n".join(str(x) for x in [300, 900, 2500, 60, 7000]) + "\n")
    out = tmp_path / "out"
    assert cli.main(["--kernel-csv", k, "--N", "4096", "--families", "fixed", "geometric", "--wikitext", str(lengths),
                     "--points-per-octave", "1", "--tokens", "65536", "--out", str(out), "--measure"]) == 0
    text = capsys.readouterr().out
    assert "c2 = 4e-05" in text and "kernel.csv" in text  # the constants and where they come from
    assert "no CUDA device" in text and not (out / "doclen_measured.csv").exists()  # CPU: skipped, said so
    rows = list(csv.DictReader(open(out / "doclen.csv")))
    assert [r["family"] for r in rows] == ["fixed", "geometric", "wikitext-2"]
    for r in rows:  # every family crosses where the pieces' size-biased mean is n* by N
        assert float(r["piece_size_biased_at_n_star"]) == pytest.approx(1000, rel=0.02)
    assert float(rows[0]["n_star_mean"]) > float(rows[1]["n_star_mean"])
    assert all(0 < float(r["n_star_mean_tiles"]) < float(r["n_star_mean"]) for r in rows)  # whole tiles cost more
    assert json.load(open(out / "fit.json"))["c_lin"] == pytest.approx(CLIN)
    assert (out / "doclen_crossover.png").stat().st_size > 10_000
    # --c2 overrides the fit and halves n*
    cli.main(["--kernel-csv", k, "--c2", "8e-5", "--N", "4096", "--families", "fixed", "--tokens", "65536",
              "--out", str(tmp_path / "o2"), "--no-figure"])
    r = next(csv.DictReader(open(tmp_path / "o2" / "doclen.csv")))
    assert float(r["piece_size_biased_at_n_star"]) == pytest.approx(500, rel=0.02)
    assert "kernel.csv" in capsys.readouterr().out  # the fit's source, then the override
    # all three constants given, no kernel.csv: the source is the command line alone
    cli.main(["--kernel-csv", str(tmp_path / "none.csv"), "--c0", "0", "--c2", "4e-5", "--c-lin", "0.04", "--N",
              "4096", "--families", "fixed", "--tokens", "65536", "--out", str(tmp_path / "o3"), "--no-figure"])
    assert "\n  from the command line: {'c0': 0.0, 'c2': 4e-05, 'c_lin': 0.04}" in capsys.readouterr().out


def test_figure_marks_n_star_and_takes_measured_points(tmp_path):
    fit = dict(c0=C0, c2=C2, c_lin=CLIN, n_star_fit=1000.0, source="k.csv: x")
    curves = [dict(N="4096", family=f, mean=str(m), piece_size_biased=str(m), exact_us_per_token=str(C0 + C2 * m))
              for f in ("fixed", "geometric") for m in (64, 256, 1024, 4096)]
    nst = [dict(N="4096", family="fixed", n_star_mean="1000"), dict(N="4096", family="geometric", n_star_mean="520")]
    wiki = [dict(N="4096", mean="3000", p90="5000", exact_us_per_token="0.1", exact_over_linear="1.7")]
    fig = figspec.doclen(curves, nst, wiki, fit)
    (p,) = fig.panels
    stars = {t.meta["family"]: t for t in p.traces if t.style.get("marker") == "*"}
    assert stars["fixed"].x == [1000.0] and stars["geometric"].x == [520.0]
    assert stars["fixed"].y == [CLIN]
    assert any(t.meta.get("family") == "wikitext-2 real" and t.x == [3000.0] for t in p.traces)
    assert [v[0] for v in p.vlines] == [1000.0]
    assert not any(t.style.get("ls") == "--" for t in p.traces)  # no tile columns in these curves: no dashed line
    meas = [dict(N="4096", family="fixed", impl="exact", target_mean="512", us_per_token="0.05"),
            dict(N="4096", family="-", impl="linear", target_mean="", us_per_token="0.065")]
    fig = figspec.doclen(curves, nst, wiki, fit, measured=meas)
    m = [t for t in fig.panels[0].traces if t.meta.get("measured")]
    assert len(m) == 1 and m[0].x == [512.0] and m[0].hollow == [True]
    assert [h[0] for h in fig.panels[0].hlines] == [0.065]
    paths = figspec.to_png(fig, str(tmp_path / "f"), ["png"])
    assert (tmp_path / "f.png").stat().st_size > 10_000 and paths == [str(tmp_path / "f.png")]
    assert figspec.to_plotly(fig)["data"]  # the report renders the same definition


def test_measure_path_on_cpu_interpreter():
    """The measured mode's code path (doc_ids to our exact kernel, linear with or without them, the budget, the
    n* rows) on tiny shapes under the Triton interpreter, with a fake timer (no timing is asserted)."""
    import torch

    calls = []

    def timer(fn, grad_to_none=None):
        calls.append(1)
        return float(len(calls))  # grows with each point: exact rises through linear's time

    fit = dict(c0=C0, c2=C2, c_lin=CLIN)
    nst = [dict(N=64, family="geometric", n_star_mean=16.0)]
    rows, nrows = cli.measure(fit, [64], ["geometric"], [8, 16, 32], nst, pool=[5, 20, 40], time_budget_s=600,
                              tokens=64, H=1, D=16, device="cpu", timer=timer, dtype=torch.float32)
    lin = [r for r in rows if r["impl"] == "linear"]
    ex = [r for r in rows if r["impl"] == "exact"]
    assert len(lin) == 1 and "error" not in lin[0] and lin[0]["us_per_token"] > 0
    assert all("error" not in r for r in ex), [r.get("error") for r in ex]
    assert {r["family"] for r in ex} == {"geometric", "wikitext-2"} and len(ex) == 3 + 4
    assert all(0 < r["mean_doc_len"] <= 64 for r in ex)
    assert [r["family"] for r in nrows] == ["geometric", "wikitext-2"] and nrows[0]["points"] == 3
    # a zero budget: linear only, no exact point, n* says so
    rows, nrows = cli.measure(fit, [64], ["geometric"], [8], nst, time_budget_s=0, tokens=64, H=1, D=16,
                              device="cpu", timer=timer, dtype=torch.float32)
    assert [r["impl"] for r in rows] == ["linear"] and nrows[0]["status"] == "no points"


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_figure_of_the_default_fit_takes_the_committed_h200_points(tmp_path, monkeypatch, capsys):
    """``python -m eval.doclen --wikitext ... --out results/doclen --figures-dir docs/figures`` (docs/crossover.md)
    drew the figure without the H200 measured points (it looked for them in --out only) and so rewrote the committed
    figure without them. With the default constants it now takes the committed ones, and says so; other constants,
    or ``--measured none``: the model only."""
    monkeypatch.chdir(ROOT)  # the default paths are the repository's
    out = tmp_path / "out"
    assert cli.main(["--N", "4096", "--families", "fixed", "--tokens", "65536", "--points-per-octave", "1",
                     "--out", str(out), "--figures-dir", str(tmp_path / "figs")]) == 0
    said = capsys.readouterr().out
    assert f"doclen figure: the measured points of {cli.DEFAULT_MEASURED} (the committed H200 run" in said
    assert cli.figure_measured(None, str(out), default_fit=False) == "none"
    assert "no measured table" in capsys.readouterr().out
    assert cli.figure_measured("none", str(out), default_fit=True) == "none"
    (out / "doclen_measured.csv").write_text("N,family,impl,target_mean,us_per_token\n")
    assert cli.figure_measured(None, str(out), default_fit=True) == str(out / "doclen_measured.csv")  # its own first


def test_the_committed_figure_is_redrawn_with_its_measured_points(tmp_path, monkeypatch):
    """The committed tables and the default choice of measured points give docs/figures/doclen_crossover.png byte for
    byte (with the matplotlib that drew it)."""
    import matplotlib
    from PIL import Image

    monkeypatch.chdir(ROOT)
    committed = "docs/figures/doclen_crossover.png"
    if Image.open(committed).info.get("Software") != f"Matplotlib version{matplotlib.__version__}, https://matplotlib.org/":
        pytest.skip("another matplotlib than the one that drew the committed figure")
    (path,) = cli.figure("results/doclen", str(tmp_path), cli.figure_measured(None, "results/doclen", True))
    assert open(path, "rb").read() == open(committed, "rb").read()
