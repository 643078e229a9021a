"""``python -m eval.figures``: every committed report table / figure from one command (eval/figures.py).

The run tests use ``--out-root`` and a cheap subset (one eval.recall report, the H200 crossover figures); they read
the committed results and must not write next to them.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from eval import figures  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

EXPECTED_JOBS = {
    "mqar_recall", "mqar_fig2", "mqar_fig2_long", "mqar_window_cliff", "mqar_old_recipe", "mqar_hybrid",
    "lm_wikitext", "lm_shakespeare",
    "join_lm_wikitext", "join_lm_shakespeare", "join_lm_wikitext_best", "join_lm_shakespeare_best",
    "h200_crossover_figures", "cpu_quality_figures", "doclen_crossover",
}
CLIFF = "results/h200/quality/mqar_window_cliff"
H200_FIGS = ["h200_time_vs_n_fwd_bwd", "h200_time_vs_n_fwd", "h200_memory_vs_n", "h200_roofline",
             "h200_model_tokens_per_s"]


def _snapshot(paths):
    """{file: (mtime_ns, size)} of every file under the given repo-relative folders."""
    snap = {}
    for p in paths:
        root = os.path.join(figures.REPO, p)
        for d, _, files in os.walk(root):
            for f in files:
                st = os.stat(os.path.join(d, f))
                snap[os.path.join(d, f)] = (st.st_mtime_ns, st.st_size)
    return snap


def test_list_names_every_job(capsys):
    assert figures.main(["--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert {ln.split(":", 1)[0] for ln in lines} == EXPECTED_JOBS == {j.name for j in figures.JOBS}
    assert len(lines) == len(figures.JOBS)
    # each line is the runnable command, quoted for a shell
    cliff = next(ln for ln in lines if ln.startswith("mqar_window_cliff:"))
    assert f"python -m eval.recall kind=cliff 'runs=[{CLIFF.rsplit('/', 1)[0]}/runs/mqar_window_cliff]'" in cliff


def test_unknown_only_errors_naming_allowed(capsys):
    with pytest.raises(SystemExit) as e:
        # --list: should the check ever break, nothing runs (and nothing is written in place)
        figures.main(["--list", "--only", "mqar_fig2,no_such_job"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "no_such_job" in err
    for name in EXPECTED_JOBS:
        assert name in err


def test_every_job_moves_under_out_root():
    """--out-root must redirect every job's output: each job names an output key, and all of them move."""
    for j in figures.JOBS:
        assert j.module in figures.ENTRY, j.name
        outs = [o for o in j.overrides if o.split("=", 1)[0] in figures.OUTPUT_KEYS]
        assert outs, f"{j.name} writes to the module's default folder: give it out_dir / figures_dir"
        moved = [o for o in figures.with_out_root(j.overrides, "/x") if o.split("=", 1)[0] in figures.OUTPUT_KEYS]
        assert all(o.split("=", 1)[1].startswith("/x/") for o in moved), j.name
        # inputs stay where they are
        assert [o for o in figures.with_out_root(j.overrides, "/x") if o not in moved] == \
               [o for o in j.overrides if o not in outs]
    assert figures.with_out_root(["out_dir=a/b", "runs=[c]"], None) == ["out_dir=a/b", "runs=[c]"]


def test_subset_under_out_root_writes_there_only(tmp_path, capsys, monkeypatch):
    before = _snapshot([CLIFF, "docs/figures"])
    cwd = os.getcwd()
    monkeypatch.setenv("WANDB_MODE", "offline")
    rc = figures.main(["--only", "mqar_window_cliff,h200_crossover_figures", "--out-root", str(tmp_path)])
    assert rc == 0
    # the caller's working directory and W&B mode are back (a leaked WANDB_MODE=disabled changed later tests)
    assert os.getcwd() == cwd and os.environ["WANDB_MODE"] == "offline"
    out = capsys.readouterr().out
    assert "mqar_window_cliff" in out and "h200_crossover_figures" in out and " s" in out
    expected = [tmp_path / CLIFF / "cliff.csv", tmp_path / CLIFF / "cliff.png"]
    expected += [tmp_path / "docs" / "figures" / f"{n}.png" for n in H200_FIGS]
    for p in expected:
        assert p.is_file() and p.stat().st_size > 0, p
    # only the two selected jobs ran
    assert not (tmp_path / "results/h200/quality/mqar_fig2").exists()
    assert sorted(os.listdir(tmp_path / "docs" / "figures")) == sorted(f"{n}.png" for n in H200_FIGS)
    # nothing written in place
    assert _snapshot([CLIFF, "docs/figures"]) == before


def test_failed_job_gives_nonzero_exit_and_names_it(tmp_path, monkeypatch, capsys):
    good = next(j for j in figures.JOBS if j.name == "mqar_window_cliff")
    bad = figures.Job("broken_report", "eval.recall",
                      ["kind=cliff", f"runs=[{tmp_path}/no_runs_here]", "out_dir=results/broken"])
    monkeypatch.setattr(figures, "JOBS", [bad, good])
    rc = figures.main(["--out-root", str(tmp_path)])
    assert rc == 1
    captured = capsys.readouterr()
    assert "broken_report" in captured.err and "1 of 2 job(s) failed" in captured.err
    assert "mqar_window_cliff" not in captured.err
    # the job after the failed one still ran
    assert (tmp_path / CLIFF / "cliff.csv").stat().st_size > 0


def test_a_figure_saved_twice_is_the_same_bytes_in_every_format(tmp_path):
    """SVG (the date and random ids) and PDF (the creation date) differed at every save, so no rebuild of them could
    leave the tree clean; PNG already did not."""
    from eval import figspec

    fig = figspec.Figure("t", [figspec.Panel("p", "N", "ms", xlog=2, ylog=True,
                                             traces=[figspec.Trace("a", [1, 2, 4], [1, 4, 16], {})])])
    a = figspec.to_png(fig, str(tmp_path / "a" / "f"), ["png", "svg", "pdf"])
    b = figspec.to_png(fig, str(tmp_path / "b" / "f"), ["png", "svg", "pdf"])
    for x, y in zip(a, b):
        assert open(x, "rb").read() == open(y, "rb").read(), x


def test_the_command_redraws_the_committed_roofline_byte_for_byte(tmp_path):
    """``python -m eval.figures`` left docs/figures/h200_roofline.png modified on a CPU with AVX-512 (numpy's AVX-512
    log10 moved 41 anti-aliased pixels), and the committed file flipped with the machine of the last rebuild. The
    command runs numpy on its AVX2 path (``figures.SAME_PIXELS_ENV``): the same bytes on either CPU, with the
    matplotlib and numpy that drew the committed file."""
    import subprocess
    import sys

    import matplotlib
    from PIL import Image

    committed = os.path.join(figures.REPO, "docs", "figures", "h200_roofline.png")
    if Image.open(committed).info.get("Software") != f"Matplotlib version{matplotlib.__version__}, https://matplotlib.org/":
        pytest.skip("another matplotlib than the one that drew the committed figure")
    env = {k: v for k, v in os.environ.items() if k != "NPY_DISABLE_CPU_FEATURES"}
    r = subprocess.run([sys.executable, "-m", "eval.figures", "--only", "h200_crossover_figures", "--out-root",
                        str(tmp_path)], cwd=figures.REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert open(tmp_path / "docs" / "figures" / "h200_roofline.png", "rb").read() == open(committed, "rb").read()
