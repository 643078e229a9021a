"""Bad input to the eval tools: a clear message naming the argument and the allowed values, a non-zero exit, no
traceback, nothing measured or written; and no run that "succeeds" having done nothing."""

import os
import re
import subprocess
import sys

import pytest

from eval import plots
from eval.crossover import run as crossover_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = {
    "name": "tiny", "device": "cpu", "dtype": "float32", "n_heads": 2, "tokens": 64, "seq_lens": [16, 32],
    "head_dims": [8], "causal": [True], "kv_heads": [None], "modes": ["fwd"], "warmup": 0, "rep": 1,
    "variants": {"flash": {"kind": "flash"}}, "backends": ["torch"],
    "baseline": {"variant": "flash", "backend": "torch"}, "naive": {"variant": "flash", "backend": "naive"},
}


def _cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def _config_error():
    from harness.config import ConfigError

    return ConfigError


@pytest.mark.parametrize("change,want", [
    (dict(compare="bst"), r"compare='bst' is not supported; allowed values: ours, best"),
    (dict(machine="h300"), r"machine='h300' is not supported; allowed values: a100, h100, h200"),
    (dict(formats=["pgn"]), r"formats=\['pgn'\]: 'pgn' is not supported; allowed values: png, svg, pdf"),
    (dict(sweep=dict(TINY, seq_lens=[0])), r"sweep.seq_lens=\[0\]: must be a non-empty list of integers >= 1"),
    (dict(sweep=dict(TINY, backends=["trition"])),
     r"sweep.backends=\['trition'\]: 'trition' is not registered; allowed values: all, triton, .*torch"),
    (dict(sweep=dict(TINY, variants={"flash": {"kind": "flsh"}})),
     r"sweep.variants.flash: kind='flsh' is not supported; allowed values: flash"),
    (dict(sweep=dict(TINY, model_sweep={"variants": {"flash": {"kind": "flash"}}, "backends": ["trition"],
                                        "seq_lens": [16]})),
     r"sweep.model_sweep.backends=\['trition'\]: 'trition' is not registered; allowed values: auto, "),
    # a key no code reads (a typo of seq_lens) ran the sweep without it and exited 0
    (dict(sweep=dict(TINY, seq_len=[32])),
     r"sweep.seq_len=\[32\] is not a key a sweep reads \(did you mean seq_lens\?\); allowed keys: name, variants, "),
    # empty axes / rules that drop every point: an empty crossover table, "results: ... kernel.csv" (not written),
    # exit 0; max_point_s=-1 stopped every series after its first N, 0 meant no limit
    (dict(sweep=dict(TINY, causal=[])), r"sweep.causal=\[\]: must be a non-empty list of true / false"),
    (dict(sweep=dict(TINY, kv_heads=[])), r"sweep.kv_heads=\[\]: must be a non-empty list"),
    (dict(sweep=dict(TINY, backends=[])), r"sweep.backends=\[\]: the sweep names no backend; allowed values: all, "),
    (dict(sweep=dict(TINY, exclude=[{"backend": "torch"}])), r"sweep.exclude=.*drop every point of the sweep"),
    (dict(sweep=dict(TINY, model_sweep={"variants": {"flash": {"kind": "flash"}}, "backends": [], "seq_lens": [16]})),
     r"sweep.model_sweep.backends=\[\]: the model sweep names no backend; allowed values: auto, "),
    (dict(sweep=dict(TINY, max_point_s=-1)), r"sweep.max_point_s=-1: must be null \(no limit\) or a number of "),
    (dict(sweep=dict(TINY, max_point_s=0)), r"sweep.max_point_s=0: must be null"),
    (dict(sweep=dict(TINY, deadline_s=-5)), r"sweep.deadline_s=-5: must be null \(no deadline\) or a number of "),
    (dict(sweep=dict(TINY, model_sweep={"variants": {"flash": {"kind": "flash"}}, "seq_lens": [16], "layers": 2})),
     r"sweep.model_sweep.layers=2 is not a key a model sweep reads \(did you mean n_layer\?\); allowed keys: enabled, "),
    # a crossover reference that names no measured curve: the sweep ran, no crossover was detected, exit 0
    (dict(sweep=dict(TINY, baseline={"variant": "flsh", "backend": "torch"})),
     r"^sweep.baseline=\{variant: flsh, backend: torch\}: variant 'flsh' is not one of the sweep's variants; "
     r"allowed values: flash$"),
    (dict(sweep=dict(TINY, baseline={"variant": "flash", "backend": "trch"})),
     r"^sweep.baseline=\{variant: flash, backend: trch\}: backend 'trch' is not one of the sweep's backends; allowed "
     r"values: torch$"),
    (dict(sweep=dict(TINY, baseline={"variant": "flash", "backend": "naive"})),  # registered, but not swept
     r"backend 'naive' is not one of the sweep's backends; allowed values: torch$"),
    (dict(sweep=dict(TINY, backends=["torch", "naive"], exclude=[{"backend": "naive", "variant": "flash"}],
                     variants={"flash": {"kind": "flash"}, "linear": {"kind": "linear"}},
                     baseline={"variant": "flash", "backend": "naive"})),
     r"the sweep's points have no flash/naive \(the exclude rules drop it\); allowed values: flash/torch, "
     r"linear/naive, linear/torch$"),
    (dict(sweep=dict(TINY, naive={"variant": "flash", "backend": "naiv"})),
     r"^sweep.naive=\{variant: flash, backend: naiv\}: backend 'naiv' is not one of the sweep's backends or the "
     r"registered ones; allowed values: torch, triton, .*naive"),
    (dict(sweep=dict(TINY, extra_baselines={"fa2": {"variant": "flsh", "backend": "sdpa_flash"}})),
     r"^sweep.extra_baselines.fa2=\{variant: flsh, backend: sdpa_flash\}: variant 'flsh' is not one of"),
    (dict(sweep=dict(TINY, baseline=None)), r"^sweep.baseline is not set: the exact reference every curve is "
                                            r"compared with; allowed values: \{variant: <one of flash>, backend: "
                                            r"<one of torch>\}"),
    (dict(sweep=dict(TINY, baseline={"variant": "flash", "backend": "torch", "n_kv_heads": 1})),
     r"sweep.baseline=.*: must be a mapping of exactly variant and backend"),
    (dict(sweep=dict(TINY, baseline="flash")), r"sweep.baseline='flash': must be a mapping of exactly variant and "),
    # compare=best: n_boot=0 was taken as 1000, a negative one gave no resample (NaN intervals)
    (dict(compare="best", sweep=dict(TINY, n_boot=0)), r"^sweep.n_boot=0: must be an integer >= 1 \(bootstrap "),
    (dict(compare="best", sweep=dict(TINY, n_boot=-5)), r"^sweep.n_boot=-5: must be an integer >= 1"),
    (dict(compare="best", sweep=dict(TINY, level=1)), r"^sweep.level=1: must be a number in \(0, 1\)"),
])
def test_crossover_refuses_bad_settings_before_measuring(tmp_path, change, want):
    """``sweep.backends=[trition]`` recorded every point as unsupported and exited 0 with an empty table;
    ``machine=h300`` left the roofline out silently; ``compare=bst`` failed after the sweep ran; ``seq_lens=[0]``,
    ``formats=[pgn]``: a traceback. Now all are refused before anything is measured or written."""
    out = tmp_path / "res"
    cfg = dict({"sweep": TINY, "out_dir": str(out), "progress": False, "wandb": {"enabled": False}}, **change)
    with pytest.raises(_config_error(), match=want):
        crossover_run(cfg)
    assert not out.exists()


def test_crossover_without_sweep_refuses_an_out_dir_with_no_results(tmp_path):
    """``run_sweep=false`` on an out_dir without kernel.csv / model.csv wrote empty crossover tables, drew 0 figures,
    named a kernel.csv that was not there and exited 0."""
    out = tmp_path / "res"
    cfg = {"sweep": TINY, "out_dir": str(out), "run_sweep": False, "progress": False, "wandb": {"enabled": False}}
    with pytest.raises(_config_error(), match=r"run_sweep=false: out_dir=.*res holds no kernel.csv or model.csv"):
        crossover_run(cfg)
    assert not out.exists()


def _kernel_csv(out_dir, pairs):
    """A kernel.csv of ok rows (``N`` 16, 32) of each (variant, backend) of ``pairs``, as a finished sweep leaves it."""
    from eval.bench_common import write_csv
    from eval.sweep import COLUMNS

    rows = [dict(sweep="tiny", variant=v, kind="flash" if v == "flash" else "linear", backend=b, seq_len=n,
                 head_dim=8, causal=True, n_kv_heads=2, n_heads=2, batch=1, status="ok", fwd_ms=0.001 * n,
                 model_footprint_bytes=100 * n, tokens=n)
            for v, b in pairs for n in (16, 32)]
    return write_csv(rows, os.path.join(str(out_dir), "kernel.csv"), columns=COLUMNS)


@pytest.mark.parametrize("change,want", [
    (dict(baseline={"variant": "flsh", "backend": "torch"}),  # a typo
     r"^sweep.baseline=\{variant: flsh, backend: torch\}: variant 'flsh' is not one of .*res/kernel.csv's variants; "
     r"allowed values: flash, linear \(run_sweep=false analyses out_dir=.*res: pass the sweep=<name> it was measured "
     r"with\)$"),
    # another sweep's config over this out_dir (sweep=taylor_h200 on cpu_tiny's results): its baseline is not there
    (dict(baseline={"variant": "flash", "backend": "sdpa_flash"}),
     r"^sweep.baseline=\{variant: flash, backend: sdpa_flash\}: backend 'sdpa_flash' is not one of .*kernel.csv's "
     r"backends; allowed values: torch \("),
    (dict(naive={"variant": "flash", "backend": "naiv"}), r"^sweep.naive=.*backend 'naiv' is not one of "),
])
def test_crossover_reanalysis_refuses_references_its_kernel_csv_lacks(tmp_path, change, want):
    """``run_sweep=false`` with a misspelt ``sweep.baseline`` (or the ``sweep=<name>`` of another sweep than the one
    out_dir holds) detected no crossover, wrote empty tables and exited 0. Now the references are checked against
    the rows of out_dir's kernel.csv, before anything is written; the right ones still analyse it."""
    out = tmp_path / "res"
    _kernel_csv(out, [("flash", "torch"), ("linear", "torch")])
    cfg = {"sweep": dict(TINY, **change), "out_dir": str(out), "run_sweep": False, "plots": False,
           "wandb": {"enabled": False}}
    with pytest.raises(_config_error(), match=want):
        crossover_run(cfg)
    assert sorted(os.listdir(out)) == ["kernel.csv"]
    res = crossover_run(dict(cfg, sweep=TINY))  # naive flash/naive not measured here: a note, not an error
    assert {(r["variant"], r["reference"]) for r in res["crossovers"]} == {("linear", "exact")}


@pytest.mark.parametrize("override", ["sweep.seq_lens=[128]", "~sweep.variants.gqa", "+sweep.batch=2",
                                      "sweep.backends=[torch]", "resume=false", "retry_failed=true"])
def test_crossover_reanalysis_refuses_options_it_would_ignore(tmp_path, cli_in_process, override):
    """``run_sweep=false`` with an option that only shapes what is measured (``sweep.seq_lens=[128]``,
    ``resume=false``) ignored it, re-analysed out_dir as it was and exited 0. Now refused naming the option, before
    anything is read or written; the analysis keys (``sweep.baseline...``) and ``sweep=<name>`` are taken."""
    from eval.crossover import check_overrides

    out = tmp_path / "res"
    r = cli_in_process(tmp_path, "-m", "eval.crossover", "sweep=cpu_tiny", f"out_dir={out}", "run_sweep=false",
                       override)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"run_sweep=false measures nothing, so {override} would be ignored; a re-analysis reads only " \
           f"sweep.{{name, baseline, naive, extra_baselines, modes, fit_min_seq_len, ours, best_metric, n_boot, " \
           f"level, plugins}}" in r.stderr, r.stderr[-2000:]
    assert not out.exists()
    ok = ["sweep=cpu_tiny", "run_sweep=false", "sweep.baseline.backend=naive", "+sweep.n_boot=10", "plots=false",
          "model_sweep=false", "'sweep.modes=[fwd]'", "+sweep.extra_baselines={}", "sweep.naive=null"]
    check_overrides({"run_sweep": False}, ok)
    check_overrides({"run_sweep": True}, [override])  # measured: every option is used


def test_crossover_cli_refuses_a_misspelt_baseline_before_measuring(tmp_path, cli_in_process):
    """``python -m eval.crossover sweep=cpu_tiny sweep.baseline.variant=flsh`` measured the whole sweep, detected no
    crossover and exited 0."""
    out = tmp_path / "res"
    r = cli_in_process(tmp_path, "-m", "eval.crossover", "sweep=cpu_tiny", f"out_dir={out}",
                       "sweep.baseline.variant=flsh")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert ("sweep.baseline={variant: flsh, backend: torch}: variant 'flsh' is not one of the sweep's variants; "
            "allowed values: flash, gqa, linear, sliding_window, sparse") in r.stderr
    assert not out.exists()


def test_every_sweep_configs_references_name_measured_curves():
    """The shipped sweep configs pass :func:`eval.crossover.check_references` against their own grid (else the check
    would refuse a shipped config): each baseline names a measured (variant, backend)."""
    import glob

    from eval.crossover import check_references
    from eval.sweep import BENCH_BACKENDS, expand_points, load_config

    for f in sorted(glob.glob(os.path.join(ROOT, "eval", "conf", "sweep", "*.yaml"))):
        cfg = load_config(f)
        pairs = [(p["variant"], p["backend"]) for p in expand_points(cfg)]
        assert check_references(cfg, pairs, "the sweep's", list(BENCH_BACKENDS)) == [], f


def test_crossover_cli_prints_the_message_alone(tmp_path):
    r = _cli("eval.crossover", "sweep=cpu_tiny", f"out_dir={tmp_path / 'res'}", "compare=bst", "sweep.backends=[torch]",
             cwd=tmp_path)
    assert r.returncode != 0
    assert "compare='bst' is not supported; allowed values: ours, best" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "res").exists()


def test_eval_clis_refuse_keys_they_do_not_read(tmp_path, cli_in_process):
    """``+sweep.seq_len=[32]`` (a typo of seq_lens) and ``+foo=1`` ran the default sweep and exited 0 (train.py
    refused both); every eval CLI's top-level keys are its yaml's. (The commands in this interpreter: each CLI's
    process is run by another test of this file.)"""
    from eval import top_level_keys

    r = cli_in_process(tmp_path, "-m", "eval.crossover", "sweep=cpu_tiny", f"out_dir={tmp_path / 'res'}",
                       "+sweep.seq_len=[32]")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "sweep.seq_len=[32] is not a key a sweep reads (did you mean seq_lens?)" in r.stderr
    r = cli_in_process(tmp_path, "-m", "eval.plots", "+formt=[png]")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "formt=['png'] is not a key eval.plots reads (did you mean formats?); top-level keys: results_dir," in r.stderr
    assert not (tmp_path / "res").exists()
    assert "sweep" in top_level_keys("crossover") and "defaults" not in top_level_keys("crossover")
    assert {"speed", "speed_backend", "speed_size"} <= set(top_level_keys("plots"))  # read by eval.plots


def test_every_sweep_configs_keys_are_read():
    """The sweep configs use only keys of SWEEP_KEYS / MODEL_SWEEP_KEYS (else the check would refuse a shipped
    config)."""
    import glob

    import yaml

    from eval.sweep import MODEL_SWEEP_KEYS, SWEEP_KEYS, check_sweep_config

    files = sorted(glob.glob(os.path.join(ROOT, "eval", "conf", "sweep", "*.yaml")))
    assert len(files) >= 4
    for f in files:
        cfg = yaml.safe_load(open(f))
        assert set(cfg) <= set(SWEEP_KEYS), (f, set(cfg) - set(SWEEP_KEYS))
        assert set(cfg.get("model_sweep") or {}) <= set(MODEL_SWEEP_KEYS), f
    with pytest.raises(ValueError, match=r"check_row=1 is not a key a sweep reads \(did you mean check_rows\?\)"):
        check_sweep_config(dict(TINY, check_row=1))
    check_sweep_config(dict(TINY, best_metric="fwd_ms"))  # read by eval.best, in no shipped yaml


# ------------------------------------------------------------------------------------------------ eval.plots
@pytest.mark.parametrize("cfg,want", [
    ({}, r"nothing to plot: give results_dir=.*quality_csv=.*doclen_dir="),
    ({"results_dir": "/nonexistent"}, r"results_dir=/nonexistent: no such directory"),
    ({"quality_csv": "/nonexistent.csv"}, r"quality_csv=/nonexistent.csv: no such file"),
    ({"doclen_dir": "/nonexistent"}, r"doclen_dir=/nonexistent: no fit.json"),
    ({"results_dir": "RES", "formats": ["pgn"]}, r"formats=\['pgn'\]: 'pgn' is not supported; allowed values: png, svg"),
    ({"results_dir": "RES", "machine": "h300"}, r"machine='h300' is not supported; allowed values: a100, h100, h200"),
    ({"results_dir": "EMPTY"}, r"results_dir=.*holds neither kernel.csv nor model.csv"),
    ({"results_dir": "RES"}, r"nothing to plot: results_dir=.*holds no measured rows"),
    ({"quality_csv": "EMPTY_CSV"}, r"quality_csv=.*the table has no rows"),
])
def test_plots_refuses_nothing_to_plot_and_bad_values(tmp_path, cfg, want):
    """``eval.plots`` with no arguments or ``results_dir=/nonexistent`` exited 0 having written nothing;
    ``quality_csv=/nonexistent.csv`` drew a "no rows to draw" figure; ``machine=h300`` dropped the roofline."""
    from eval.sweep import COLUMNS

    res = tmp_path / "res"
    res.mkdir()
    (res / "kernel.csv").write_text(",".join(COLUMNS) + "\n")  # a sweep's header, no row
    (tmp_path / "empty").mkdir()
    (tmp_path / "q.csv").write_text("dataset,variant,seq_len,metric,value\n")
    subst = {"RES": str(res), "EMPTY": str(tmp_path / "empty"), "EMPTY_CSV": str(tmp_path / "q.csv")}
    cfg = {k: subst.get(v, v) if isinstance(v, str) else v for k, v in cfg.items()}
    with pytest.raises((_config_error(), FileNotFoundError), match=want):
        plots.main_from_cfg(dict(cfg, figures_dir=str(tmp_path / "figs")))
    assert not (tmp_path / "figs").exists()


SWEEP = os.path.join(ROOT, "results", "h200", "crossover_speed_h200")


def _broken_inputs(tmp_path, case):
    """A copy of a committed input with one defect: the folder / file to pass and nothing else changed."""
    import shutil

    if case.startswith("doclen"):
        d = tmp_path / "doclen"
        shutil.copytree(os.path.join(ROOT, "results", "doclen"), d)
        if case == "doclen_fit_truncated":
            (d / "fit.json").write_text((d / "fit.json").read_text()[:40])
        elif case == "doclen_no_curves":
            (d / "doclen_curves.csv").unlink()
        elif case == "doclen_curves_columns":
            (d / "doclen_curves.csv").write_text("N,family\n4096,fixed\n")
        return str(d)
    if case.startswith("quality"):
        q = tmp_path / "quality.csv"
        q.write_text("" if case == "quality_empty" else "variant,value\nflash,1\n")
        return str(q)
    d = tmp_path / "res"
    d.mkdir()
    kernel = open(os.path.join(SWEEP, "kernel.csv")).read()
    if case == "kernel_empty":
        (d / "kernel.csv").write_text("")
    elif case == "kernel_no_ms":  # the timing columns gone: only the memory figure was drawn, exit 0
        import pandas as pd

        pd.read_csv(os.path.join(SWEEP, "kernel.csv")).drop(columns=["fwd_ms", "bwd_ms", "fwd_bwd_ms"]).to_csv(
            d / "kernel.csv", index=False)
    elif case == "kernel_corrupt":
        (d / "kernel.csv").write_text(kernel[:300] + '"unterminated\n1,2')
    else:
        (d / "kernel.csv").write_text(kernel)
    if case == "crossover_json_truncated":
        (d / "crossover.json").write_text(open(os.path.join(SWEEP, "crossover.json")).read()[:200])
    elif case == "env_json_truncated":
        (d / "env.json").write_text(open(os.path.join(SWEEP, "env.json")).read()[:50])
    elif case == "model_columns":
        (d / "model.csv").write_text("variant,seq_len\nflash,512\n")
    return str(d)


@pytest.mark.parametrize("case,key,want", [
    ("kernel_empty", "results_dir", r"results_dir=.*: results CSV kernel.csv is empty \(0 bytes\); expected the "
                                    r"columns written by eval.sweep"),
    ("kernel_no_ms", "results_dir", r"results_dir=.*: results CSV kernel.csv lacks columns \['fwd_ms', 'bwd_ms', "
                                    r"'fwd_bwd_ms'\]; expected the columns written by eval.sweep"),
    ("kernel_corrupt", "results_dir", r"results CSV kernel.csv is not a readable CSV \(ParserError: .*\); expected"),
    ("crossover_json_truncated", "results_dir", r"results_dir=.*: crossover.json is not valid JSON \(JSONDecodeError: "
                                                r".*\); expected the crossover.json eval.crossover writes"),
    ("env_json_truncated", "results_dir", r"results_dir=.*: env.json is not valid JSON"),
    ("model_columns", "results_dir", r"results CSV model.csv lacks columns \['sweep', 'backend', "),
    ("quality_empty", "quality_csv", r"quality_csv=.*quality.csv is empty \(0 bytes\); expected the quality.csv"),
    ("quality_columns", "quality_csv", r"quality_csv=.* lacks columns \['dataset', 'seq_len', 'metric'\]"),
    ("doclen_fit_truncated", "doclen_dir", r"doclen_dir=.*: fit.json is not valid JSON"),
    ("doclen_no_curves", "doclen_dir", r"doclen_dir=.*: no doclen_curves.csv there"),
    ("doclen_curves_columns", "doclen_dir", r"doclen_dir=.*: doclen_curves.csv lacks columns \['mean', "),
])
def test_plots_refuses_missing_empty_and_corrupt_inputs_naming_the_file(tmp_path, case, key, want):
    """An empty or corrupt kernel.csv, a truncated crossover.json / env.json / fit.json, a model.csv or quality.csv
    lacking columns, a doclen folder without its curves: a pandas / JSON traceback, a KeyError, or figures silently
    left out with exit 0. Now refused before drawing, naming the argument, the file and what was expected."""
    cfg = {key: _broken_inputs(tmp_path, case), "figures_dir": str(tmp_path / "figs"), "formats": ["png"]}
    with pytest.raises((_config_error(), FileNotFoundError), match=want):
        plots.main_from_cfg(cfg)
    assert not (tmp_path / "figs").exists()


def test_plots_refuses_a_doclen_measured_table_that_is_not_there(tmp_path):
    """``doclen_measured=<missing>`` drew the model alone (the H200 points silently gone) and exited 0."""
    cfg = {"doclen_dir": os.path.join(ROOT, "results", "doclen"), "doclen_measured": str(tmp_path / "m.csv"),
           "figures_dir": str(tmp_path / "figs"), "formats": ["png"]}
    with pytest.raises(FileNotFoundError, match=r"doclen_measured=.*m.csv: no such file"):
        plots.main_from_cfg(cfg)
    assert not (tmp_path / "figs").exists()


def test_plots_cli_corrupt_input_is_the_message_alone(tmp_path, cli_in_process):
    r = cli_in_process(tmp_path, "-m", "eval.plots", f"results_dir={_broken_inputs(tmp_path, 'env_json_truncated')}",
                       f"figures_dir={tmp_path / 'figs'}")
    assert r.returncode != 0 and "env.json is not valid JSON" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "figs").exists()


def test_plots_cli_exits_non_zero_with_the_message(tmp_path, cli_in_process):
    """(In this interpreter: eval.plots' process is test_plots_cli_writes_the_formats_asked_for's.)"""
    r = cli_in_process(tmp_path, "-m", "eval.plots")
    assert r.returncode != 0 and "nothing to plot: give results_dir=" in r.stderr and "Traceback" not in r.stderr
    r = cli_in_process(tmp_path, "-m", "eval.plots", "results_dir=/nonexistent")
    assert r.returncode != 0 and "results_dir=/nonexistent: no such directory" in r.stderr


def test_plots_cli_writes_the_formats_asked_for(tmp_path):
    """``python -m eval.plots ... 'formats=[png]'`` (docs/crossover.md's command) wrote .svg files too: set_formats set
    the FORMATS of the ``__main__`` copy of eval/plots.py, and eval.figspec.to_png read eval.plots' (png, svg)."""
    figs = tmp_path / "figs"
    r = _cli("eval.plots", f"quality_csv={ROOT}/results/cpu/crossover_quality/quality.csv", f"figures_dir={figs}",
             "formats=[png]", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    written = sorted(p.suffix for p in figs.iterdir())
    assert written and set(written) == {".png"}, written


# ------------------------------------------------------------------------------------------------ eval.quality
def _quality_runs(root):
    from test_eval_pipeline import _fake_run  # as pytest named it: a second copy re-registers its backends

    i = 0
    for n in (64, 128):
        for v, t in (("flash", 0.001 * n), ("linear", 0.08)):
            _fake_run(root, i, "mqar", v, n, 0.9 if v == "flash" else 0.3, 1.0, t)
            i += 1


@pytest.mark.parametrize("change,want", [
    (dict(compare="bst"), r"compare='bst' is not supported; allowed values: ours, best"),
    (dict(formats=["pgn"]), r"formats=\['pgn'\]: 'pgn' is not supported; allowed values: png, svg, pdf"),
    (dict(n_boot=0), r"n_boot=0: must be an integer >= 1"), (dict(level=1.5), r"level=1.5: must be a number in \(0, 1\)"),
    (dict(runs=["/nonexistent"]), r"runs=\['/nonexistent'\]: no such folder"),
    (dict(speed="/nonexistent.csv"), r"speed=/nonexistent.csv: no such file"),
    (dict(speed_csv="/nonexistent.csv"), r"speed_csv=/nonexistent.csv: no such file"),
    # an unknown n* baseline was accepted in silence (exit 0, the same tables)
    (dict(nstar_baseline="nope"), r"^nstar_baseline='nope' is not a variant of the runs; allowed values: flash, linear$"),
])
def test_quality_refuses_bad_values_before_writing(tmp_path, change, want):
    """``compare=bst`` / ``formats=[pgn]`` failed with a traceback after the tables were written; a missing root or
    speed file: a bare traceback."""
    from eval.quality import run as quality_run

    root = tmp_path / "multirun"
    _quality_runs(root)
    out = tmp_path / "q"
    cfg = dict({"runs": [str(root)], "out_dir": str(out), "wandb": {"enabled": False}, "plots": False}, **change)
    with pytest.raises((_config_error(), FileNotFoundError), match=want) as e:
        quality_run(cfg)
    assert type(e.value).__name__ in ("ConfigError", "ConfigFileError")  # Hydra prints these as the message alone
    assert not out.exists()


def test_quality_says_where_the_tables_went(tmp_path, capsys):
    """A successful eval.quality printed nothing (no leader change): now where the tables and figures went."""
    from eval.quality import run as quality_run

    root = tmp_path / "multirun"
    _quality_runs(root)
    out = tmp_path / "q"
    quality_run({"runs": [str(root)], "out_dir": str(out), "wandb": {"enabled": False}, "plots": False})
    said = capsys.readouterr().out
    assert f"4 runs (4 variant x length x dataset points; datasets: mqar;" in said
    assert f"-> tables in {out} (runs.csv, runs_agg.csv, quality.csv, leaders.csv); 0 figure files in {out}" in said


def _lr_run(root, name, variant, lr, seed, acc, d_model=64):
    """A finished MQAR run folder at seq_len 64 with its optim.lr, seed and model.d_model (as train.py writes them)."""
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / "csv").mkdir()
    (run / ".hydra" / "config.yaml").write_text(
        f"seed: {seed}\nexperiment_name: q\npaths:\n  output_dir: ${{hydra:runtime.output_dir}}\n"
        f"optim:\n  lr: {lr}\n  weight_decay: 0.1\ndata:\n  _target_: harness.data.MQARDataModule\n  seq_len: 64\n"
        f"  vocab_size: 128\n  seed: ${{seed}}\nmodel:\n  d_model: {d_model}\n  layers: null\n"
        f"attention:\n  name: {variant}\n  kind: {variant}\ntrainer:\n  max_steps: 5\n")
    lines = ["epoch,perf/peak_mem_mb,perf/step_time_s,perf/tokens_per_s,step,val/acc,val/loss"]
    lines += [f"0,100,0.1,1000,{s},," for s in range(1, 6)] + [f"0,,,,5,{acc},1.0"]
    (run / "csv" / "metrics.csv").write_text("\n".join(lines) + "\n")


def test_quality_takes_the_best_lr_per_variant_not_the_mean(tmp_path):
    """``train.py -m attention=flash,linear optim.lr=1e-3,3e-3``: quality.csv gave flash's val_acc as the mean of
    its lr=1e-3 and lr=3e-3 runs ("mean over seeds"). Now, as eval.recall: seeds of one lr averaged, then the best
    lr, named in runs_agg.csv with the lrs tried."""
    import pandas as pd

    from eval.quality import run as quality_run

    root = tmp_path / "multirun"
    for name, variant, lr, seed, acc in [("f1", "flash", 1e-3, 0, 0.2), ("f2", "flash", 1e-3, 1, 0.4),
                                         ("f3", "flash", 3e-3, 0, 0.8), ("f4", "flash", 3e-3, 1, 1.0),
                                         ("l1", "linear", 1e-3, 0, 0.5), ("l2", "linear", 3e-3, 0, 0.1)]:
        _lr_run(root, name, variant, lr, seed, acc)
    out = tmp_path / "q"
    res = quality_run({"runs": [str(root)], "out_dir": str(out), "wandb": {"enabled": False}, "plots": False})
    q = pd.read_csv(out / "quality.csv")
    acc = dict(zip(q[q["metric"] == "val_acc"]["variant"], q[q["metric"] == "val_acc"]["value"]))
    assert acc == pytest.approx({"flash": 0.9, "linear": 0.5})  # was flash 0.6, linear 0.3: means over the lrs
    agg = pd.read_csv(out / "runs_agg.csv").set_index("variant")
    assert agg.loc["flash", "best_lr"] == pytest.approx(3e-3) and agg.loc["flash", "runs"] == 2
    assert agg.loc["linear", "best_lr"] == pytest.approx(1e-3) and agg.loc["linear", "runs"] == 1
    assert list(agg["lrs"]) == ["0.001;0.003", "0.001;0.003"]
    assert sorted(pd.read_csv(out / "runs.csv")["lr"]) == pytest.approx([1e-3] * 3 + [3e-3] * 3)
    assert [r["quality_per_s"] for r in res["agg"]] == pytest.approx([0.9 / 0.1, 0.5 / 0.1])


def test_quality_refuses_runs_of_one_point_with_other_settings(tmp_path):
    """Runs of one (dataset, variant, seq_len) that differ in a setting other than the seed and optim.lr (here
    model.d_model) were averaged in silence; now refused before anything is written, naming the keys and values."""
    from eval.quality import run as quality_run

    root = tmp_path / "multirun"
    _lr_run(root, "a", "flash", 1e-3, 0, 0.2, d_model=64)
    _lr_run(root, "b", "flash", 1e-3, 1, 0.9, d_model=128)
    _lr_run(root, "c", "linear", 1e-3, 0, 0.3)
    out = tmp_path / "q"
    with pytest.raises(_config_error(), match=r"^runs=\[.*\]: runs of one \(dataset, variant, seq_len\) differ in more "
                       r"than their seed and optim.lr.*: mqar / flash at seq_len 64 \(2 runs\) differ in "
                       r"model.d_model \(64, 128\) \(e.g. .*/a vs .*/b\)\. Pass runs="):
        quality_run({"runs": [str(root)], "out_dir": str(out), "wandb": {"enabled": False}, "plots": False})
    assert not out.exists()


def test_quality_cli_bad_value_is_the_message_alone(tmp_path):
    r = _cli("eval.quality", f"runs=[{tmp_path}/none]", f"out_dir={tmp_path}/q", "wandb.enabled=false", cwd=tmp_path)
    assert r.returncode != 0 and "no such folder" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------------------------------------ eval.sweep
SWEEP_ARGS = [
    # "" ran every variant of the config; an empty item was dropped in silence
    (["--variants", ""], r"--variants '': give comma-separated variant names of .*cpu_tiny.yaml \(an empty "
                         r"list\); allowed values: flash, sliding_window, sparse, linear, gqa"),
    (["--variants", "flash,,linear"], r"--variants 'flash,,linear': give comma-separated .* \(an empty item\)"),
    (["--variants", "flsh"], r"--variants: \['flsh'\] not supported; allowed values: flash, sliding_window, "),
    # was blamed on the config: "--config ...: deadline_s=-5.0: must be null (no deadline) ..."
    (["--deadline-s", "-5"], r"argument --deadline-s: -5: must be a number of seconds > 0"),
    (["--deadline-s", "0"], r"argument --deadline-s: 0: must be a number of seconds > 0"),
    (["--deadline-s", "inf"], r"argument --deadline-s: inf: must be a number of seconds > 0"),
]


@pytest.mark.parametrize("args,want", SWEEP_ARGS, ids=[" ".join(a) for a, _ in SWEEP_ARGS])
def test_sweep_cli_refuses_bad_variants_and_deadline_naming_the_flag(tmp_path, capsys, args, want):
    """``eval.sweep --variants ""`` ran every variant of the config instead of refusing; ``--deadline-s -5`` was
    blamed on ``--config ...: deadline_s=-5.0``. Both are argparse's usage error naming the flag (exit 2), nothing
    written."""
    from eval.sweep import main

    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        main(["--config", os.path.join(ROOT, "eval", "conf", "sweep", "cpu_tiny.yaml"), "--out", str(out), *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert re.search(want, err), err
    assert "--config" not in err.split("error:", 1)[1] and not out.exists()


# ------------------------------------------------------------------------------------------------ argparse tools
@pytest.mark.parametrize("args,want", [
    (["--measured", "/nope.csv"], r"--measured /nope.csv: no such file"),  # was: the model only, the points gone
    (["--N", "0"], r"argument --N: 0: must be an integer >= 1"),  # was ZeroDivisionError
    (["--wikitext", "/nope"], r"--wikitext /nope: no such file or folder"),  # was a bare FileNotFoundError
    (["--c2", "-1"], r"argument --c2: -1: must be a number > 0"),  # was accepted: negative n_star_by_N
    (["--c-lin", "0"], r"argument --c-lin: 0: must be a number > 0"),
    (["--c0", "-2"], r"argument --c0: -2: must be a number >= 0"),
    (["--block", "-1"], r"argument --block: -1: must be an integer >= 0"),  # was "block must divide N"
    (["--N", "1000"], r"--block 128 must divide every --N \(not 1000\); or --block 0"),
    (["--tokens", "0"], r"argument --tokens: 0: must be an integer >= 1"),
    (["--means", "0"], r"argument --means: 0: must be a number > 0"),
    (["--time-budget-s", "nan"], r"argument --time-budget-s: nan: must be a number > 0"),
    # were a ValueError traceback from fit_costs: a file without our GPU kernels' rows (a CPU sweep), too few points
    (["--kernel-csv", "README.md"], r"--kernel-csv README.md: exact=.*fewer than two .*or --c0, --c2 and --c-lin"),
    (["--fit-min-seq-len", "1e9"], r"--kernel-csv .*kernel.csv: exact=.*fit_min_seq_len=1000000000.0"),
])
def test_doclen_refuses_bad_numbers_naming_the_option(tmp_path, capsys, args, want):
    from eval import doclen

    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        doclen.main(args + ["--out", str(out), "--no-figure"])
    assert e.value.code == 2
    import re

    assert re.search(want, capsys.readouterr().err)
    assert not out.exists()


@pytest.mark.parametrize("config,extra,want", [
    ("/nope.yaml", [], r"--config /nope.yaml: no such file"),  # was FileNotFoundError
    ("README.md", [], r"--config README.md: not a YAML file"),  # was a yaml ScannerError
    ("BAD", [], r"--config .*bad.yaml: seq_lens=\[0\]: must be a non-empty list of integers >= 1"),  # ValueError
    ("eval/conf/sweep/cpu_tiny.yaml", ["--plugins", "no_such_module"],
     r"--config .*: plugins: cannot import 'no_such_module'"),  # ImportError
])
def test_sweep_cli_refuses_bad_configs_without_a_traceback(tmp_path, capsys, config, extra, want):
    """``python -m eval.sweep`` (the sweep without Hydra) ended in a traceback for a missing or unreadable
    ``--config``, a bad value in it or a plugin that does not import; the last two after making ``--out``."""
    import re

    from eval import sweep

    (tmp_path / "bad.yaml").write_text("name: x\nseq_lens: [0]\n")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        sweep.main(["--config", str(tmp_path / "bad.yaml") if config == "BAD" else config, "--out", str(out), *extra])
    assert e.value.code == 2
    assert re.search(want, capsys.readouterr().err)
    assert not out.exists()


def test_report_refuses_a_directory_as_out(tmp_path, capsys):
    """``eval.report --out <a directory>`` raised IsADirectoryError (after building the page); missing parent
    directories of a file path are still created."""
    from eval import report

    for bad in (str(tmp_path), str(tmp_path / "new_dir") + "/"):
        with pytest.raises(SystemExit) as e:
            report.main(["--out", bad])
        assert e.value.code == 2
        assert "is a directory; give the HTML file to write, e.g. --out " in capsys.readouterr().err
    assert not (tmp_path / "new_dir").exists()
    (tmp_path / "f").write_text("")
    with pytest.raises(SystemExit):
        report.main(["--out", str(tmp_path / "r.html"), "--screenshots", str(tmp_path / "f")])
    assert "--screenshots" in capsys.readouterr().err and not (tmp_path / "r.html").exists()


def _report_root(tmp_path, case):
    """A repository root for ``eval.report --root`` with one committed input copied and broken."""
    import shutil

    root = tmp_path / "repo"
    root.mkdir()
    if case == "empty":
        return str(root)
    if case == "no_results":
        (root / "results").mkdir()
        return str(root)
    if case.startswith("doclen"):
        shutil.copytree(os.path.join(ROOT, "results", "doclen"), root / "results" / "doclen")
        (root / "results" / "doclen" / "fit.json").write_text("{\"c0\": 0.02,")
        return str(root)
    if case == "quality_empty":
        (root / "results" / "cpu" / "crossover_quality").mkdir(parents=True)
        (root / "results" / "cpu" / "crossover_quality" / "quality.csv").write_text("")
        return str(root)
    d = root / "results" / "x"
    d.mkdir(parents=True)
    if case == "kernel_columns":
        (d / "kernel.csv").write_text("variant,seq_len\nflash,512\n")
    else:
        shutil.copy(os.path.join(SWEEP, "kernel.csv"), d / "kernel.csv")
        (d / "env.json").write_text(open(os.path.join(SWEEP, "env.json")).read()[:60])
    return str(root)


@pytest.mark.parametrize("case,want", [
    ("missing", r"--root .*missing: no such directory"),
    # nothing under it: the page was written with no chart, exit 0
    ("empty", r"--root .*repo: nothing to report: no results/\*\*/kernel.csv, "),
    ("no_results", r"--root .*repo: nothing to report"),
    ("kernel_columns", r"--root .*repo: results/x: results CSV kernel.csv lacks columns \['sweep', 'kind', "
                       r"'backend', .*\]; expected the columns written by eval.sweep"),
    ("env_truncated", r"--root .*repo: results/x: env.json is not valid JSON \(JSONDecodeError: .*\); expected"),
    ("quality_empty", r"--root .*repo: results/cpu/crossover_quality/quality.csv is empty \(0 bytes\)"),
    ("doclen_fit_truncated", r"--root .*repo: results/doclen: fit.json is not valid JSON"),
])
def test_report_refuses_missing_empty_and_corrupt_results_naming_the_file(tmp_path, capsys, case, want):
    """The report's inputs missing, empty or corrupt: a pandas / JSON traceback after part of the page was built, or
    (no results at all) a page without a chart and exit 0. Now ``--root`` (the checkout whose results/ it shows)
    is checked first: exit 2 with the file and what was expected, nothing written."""
    import re

    from eval import report

    root = str(tmp_path / "missing") if case == "missing" else _report_root(tmp_path, case)
    out = tmp_path / "r.html"
    with pytest.raises(SystemExit) as e:
        report.main(["--root", root, "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert re.search(want, err), err
    assert not out.exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="CPU only: device=cuda without a GPU")
def test_a_cuda_sweep_on_a_cpu_machine_is_refused_naming_the_device(tmp_path, capsys, cli_in_process):
    """``python -m eval.crossover sweep=speed_h200`` (a README command) and ``python -m eval.sweep --config
    eval/conf/sweep/speed_h200.yaml`` on a machine without a GPU ended in ``RuntimeError: sweep config asks for
    device=cuda but CUDA is not available`` with its traceback, after making the output folder."""
    out = tmp_path / "res"
    cfg = {"sweep": dict(TINY, device="cuda"), "out_dir": str(out), "progress": False, "wandb": {"enabled": False}}
    with pytest.raises(_config_error(), match=r"^sweep\.device='cuda': no CUDA GPU is visible here; allowed values "
                                              r"on this machine: cpu, null"):
        crossover_run(cfg)
    assert not out.exists()

    from eval import sweep

    with pytest.raises(SystemExit) as e:
        sweep.main(["--config", "eval/conf/sweep/speed_h200.yaml", "--out", str(out)])
    assert e.value.code == 2
    assert "--config eval/conf/sweep/speed_h200.yaml: device='cuda': no CUDA GPU is visible here" in \
        capsys.readouterr().err
    assert not out.exists()

    # the command, in this interpreter (eval.crossover's process: test_crossover_cli_prints_the_message_alone)
    r = cli_in_process(tmp_path, "-m", "eval.crossover", "sweep=speed_h200", f"out_dir={out}")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "sweep.device='cuda': no CUDA GPU is visible here" in r.stderr and not out.exists()


# in_process: the commands whose process another test runs (eval.quality: test_quality_cli_bad_value_is_the_message_
# alone; eval.crossover: test_crossover_cli_prints_the_message_alone) run in this interpreter; the others as processes
@pytest.mark.parametrize("args,want", [
    (["eval.recall", "fig2", "runs=[{runs}]", "out_dir={f}"], "eval.recall: error: out_dir={f}: {f} is a file"),
    (["in_process", "eval.quality", "runs=[{runs}]", "out_dir={f}", "wandb.enabled=false"],
     "out_dir={f}: {f} is a file"),
    (["in_process", "eval.crossover", "sweep=cpu_tiny", "out_dir={f}/sub", "sweep.backends=[torch]",
      "wandb.enabled=false"], "out_dir={f}/sub: {f} is a file"),
    (["eval.sweep", "--config", os.path.join(ROOT, "eval/conf/sweep/cpu_tiny.yaml"), "--out", "{f}"],
     "--out {f}: {f} is a file"),
    (["eval.doclen", "--out", "{f}", "--no-figure"], "--out {f}: {f} is a file"),
    (["eval.bench_decode", "--quick", "--out", "{f}/x"], "--out {f}/x: {f} is a file"),
    (["eval.figures", "--only", "mqar_recall", "--out-root", "{f}"], "--out-root {f}: {f} is a file"),
])
def test_an_output_folder_naming_a_file_is_refused_naming_the_option(tmp_path, args, want, cli_in_process):
    """``out_dir=`` / ``--out`` naming an existing file (or a folder under one) ended in a FileExistsError /
    NotADirectoryError traceback from ``os.makedirs`` (``eval.crossover``: after the sweep had been measured)."""
    f = tmp_path / "afile"
    f.write_text("x")
    runs = tmp_path / "runs"
    (runs / "job" / ".hydra").mkdir(parents=True)
    (runs / "job" / "csv").mkdir()
    args = [a.format(f=f, runs=runs) for a in args]
    r = cli_in_process(tmp_path, "-m", *args[1:]) if args[0] == "in_process" else _cli(*args, cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert want.format(f=f) in r.stderr, r.stderr[-2000:]
    assert f.read_text() == "x"


class _ReachedCuda(Exception):
    """``eval.bench_flash`` got past its argument checks (to the CUDA check, which stops it on this machine)."""


@pytest.mark.parametrize("argv, want", [
    (["--N", "0"], r"--N '0': sequence lengths must be comma-separated integers >= 1"),
    (["--N", "512,-1024"], r"--N '512,-1024': sequence lengths"),
    (["--N", "512", "--D", "64,x"], r"^--D '64,x': head dims must be comma-separated integers"),
    (["--D", "0"], r"--D '0': head dims"),
    (["--variants", "foo"], r"--variants: \['foo'\] not supported; allowed values: .*causal"),
    (["--variants", "causal, gqa4"], r"--variants: \[' gqa4'\] not supported"),
    (["--docs", "bogus"], r"--docs entry 'bogus' is not supported; allowed values"),
    (["--plugins", "no_such_module_for_the_test"], r"--plugins 'no_such_module_for_the_test'"),
])
def test_bench_flash_refuses_bad_arguments_before_the_gpu(monkeypatch, argv, want):
    """``python -m eval.bench_flash``: a bad list, variant, document distribution or plugin stops with one message
    naming the argument, before any GPU work (once such values reached the cases: ``ZeroDivisionError`` for N 0,
    ``KeyError`` for a variant name, a traceback for --docs / --plugins)."""
    from eval import bench_flash as bf

    def reached(name):
        raise _ReachedCuda(name)

    monkeypatch.setattr(bf, "require_cuda", reached)
    with pytest.raises(SystemExit, match=want):
        bf.main(argv)
    with pytest.raises(_ReachedCuda):  # the same command line without the bad value is accepted
        bf.main(["--N", "512", "--D", "64", "--variants", "causal"])


def test_int_list_parses_a_comma_list_and_names_the_flag_for_a_bad_one():
    """``eval.bench_common.int_list``, the one checker of the bench scripts' integer lists: the integers in order
    (spaces around items stripped, duplicates kept); an empty list or item, a non-integer or a value outside
    ``[minimum, maximum]``: ``SystemExit`` naming the flag, the text given, the allowed values and the bad item."""
    from eval.bench_common import int_list

    assert int_list("512,1024", "--lengths", "sequence lengths") == [512, 1024]
    assert int_list(" 512 , 64,512 ", "--lengths", "sequence lengths") == [512, 64, 512]
    assert int_list("0,3", "--x", "counts", minimum=0, maximum=3) == [0, 3]
    for text, bad in (("0,64", "not '0'"), ("64,x", "not 'x'"), ("64,,128", "an empty item"), ("64,", "an empty item"),
                      ("", "an empty list"), (" ", "an empty list"), ("64,-1", "not '-1'"), ("1.5", "not '1.5'")):
        with pytest.raises(SystemExit) as e:
            int_list(text, "--lengths", "sequence lengths")
        assert str(e.value) == f"--lengths {text!r}: sequence lengths must be comma-separated integers >= 1 ({bad})"
    with pytest.raises(SystemExit) as e:
        int_list("64,512", "--D", "head dims", maximum=256)
    assert str(e.value) == "--D '64,512': head dims must be comma-separated integers from 1 to 256 (not '512')"


# (module, its other arguments, the flag): every comma list of integers an eval bench script reads from argv
INT_LIST_FLAGS = [
    ("bench_flash", [], "--N"), ("bench_flash", [], "--D"),
    ("bench_linear", [], "--ns"), ("bench_linear", ["--taylor"], "--taylor-ns"),
    ("bench_linear", ["--docs", "fixed:64"], "--docs-tokens"),
    ("bench_delta", ["--out", "OUT"], "--lengths"),
    ("bench_ssd", ["--out", "OUT"], "--lengths"),
    ("bench_model", ["--out", "OUT", "--sizes", "small", "--variants", "flash", "--backends", "torch"], "--seq-lens"),
    ("bench_mixers", ["--out", "OUT", "--layers", "flash"], "--seq-lens"),
]


@pytest.mark.parametrize("bad", ["64,x", "0", "64,,128"], ids=["not_an_integer", "zero", "empty_item"])
@pytest.mark.parametrize("module,argv,flag", INT_LIST_FLAGS, ids=[f"{m}{f}" for m, _, f in INT_LIST_FLAGS])
def test_bench_int_lists_are_refused_naming_the_flag_before_the_gpu(tmp_path, monkeypatch, module, argv, flag, bad):
    """A bad comma list of integers on an eval bench script's command line (a non-integer, a 0, an empty item) stops
    with ``SystemExit`` naming the flag and the text (``eval.bench_common.int_list``), before the CUDA check, so on
    a CPU machine too; it was a ``ValueError`` traceback, or a 0 reaching the cases (``ZeroDivisionError``), or (for
    bench_linear's and bench_delta's lists) only after the CUDA check. The same command line with a good list gets
    to the CUDA check (made to fail here on any machine)."""
    import importlib

    import torch

    bench = importlib.import_module(f"eval.{module}")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    with pytest.raises(SystemExit) as e:
        bench.main(argv + [flag, bad])
    assert str(e.value).startswith(f"{flag} {bad!r}: "), e.value
    assert "must be comma-separated integers " in str(e.value)
    with pytest.raises(SystemExit, match="needs a CUDA device"):  # the good list passes the check
        bench.main(argv + [flag, "64"])
    assert not (tmp_path / "out").exists()


def test_bench_delta_refuses_an_unknown_kind_before_the_gpu(tmp_path, monkeypatch):
    """``--kinds`` with a name that is not a delta-rule kind stops naming the flag and the allowed values before the
    CUDA check (it was checked only inside the GPU loop); a good list gets to the CUDA check."""
    import torch

    from eval import bench_delta

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = str(tmp_path / "out")
    with pytest.raises(SystemExit, match=r"--kinds: 'nope' is not supported; allowed values: "):
        bench_delta.main(["--out", out, "--kinds", "deltanet,nope"])
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        bench_delta.main(["--out", out, "--kinds", "deltanet"])
    assert not (tmp_path / "out").exists()


def test_bench_flash_refuses_head_dims_above_the_kernels_maximum(monkeypatch):
    """``--D`` above ``kernels.flash.common.MAX_HEAD_DIM`` reached the cases (each failed in the kernels' own check,
    one row at a time); now refused up front naming --D and the allowed range. The maximum itself is accepted."""
    from eval import bench_flash as bf
    from kernels.flash.common import MAX_HEAD_DIM

    def reached(name):
        raise _ReachedCuda(name)

    monkeypatch.setattr(bf, "require_cuda", reached)
    hidden = str(8 * MAX_HEAD_DIM)  # a multiple of every head dim below: only the maximum can refuse them
    with pytest.raises(SystemExit) as e:
        bf.main(["--hidden", hidden, "--N", "512", "--variants", "causal", "--D", f"64,{2 * MAX_HEAD_DIM}"])
    assert str(e.value) == (f"--D '64,{2 * MAX_HEAD_DIM}': head dims must be comma-separated integers from 1 to "
                            f"{MAX_HEAD_DIM} (not '{2 * MAX_HEAD_DIM}')")
    with pytest.raises(_ReachedCuda):
        bf.main(["--hidden", hidden, "--N", "512", "--variants", "causal", "--D", f"64,{MAX_HEAD_DIM}"])


# (module, its other arguments, the flag, a bad value, the smallest allowed): scalar sizes of the eval bench scripts
SIZE_FLAGS = [
    ("bench_flash", ["--N", "512", "--D", "64", "--variants", "causal"], "--tokens", "0", 1),
    ("bench_flash", ["--N", "512", "--D", "64", "--variants", "causal"], "--flex-max-cases", "-1", 0),
    ("bench_flash", ["--N", "512", "--D", "64", "--variants", "causal"], "--flex-min-n", "-1", 0),
    ("bench_linear", [], "--tokens", "0", 1), ("bench_linear", [], "--heads", "0", 1),
    ("bench_linear", [], "--dim", "-1", 1), ("bench_linear", [], "--flat-tokens", "0", 1),
    ("bench_linear", ["--taylor"], "--taylor-dim", "0", 1), ("bench_linear", ["--taylor"], "--taylor-dv", "0", 1),
    ("bench_ssd", ["--out", "OUT"], "--heads", "0", 1), ("bench_ssd", ["--out", "OUT"], "--tokens", "-5", 1),
    ("bench_ssd", ["--out", "OUT"], "--d-state", "0", 1), ("bench_ssd", ["--out", "OUT"], "--head-dim", "-1", 1),
    ("bench_delta", ["--out", "OUT"], "--tokens", "0", 1), ("bench_delta", ["--out", "OUT"], "--heads", "0", 1),
    ("bench_delta", ["--out", "OUT"], "--head-dim", "0", 1), ("bench_delta", ["--out", "OUT"], "--chunk-size", "0", 1),
    ("bench_delta", ["--out", "OUT"], "--naive-max-t", "-1", 0),
    ("bench_delta", ["--out", "OUT"], "--check-max-t", "-1", 0),
]


@pytest.mark.parametrize("module,argv,flag,bad,lo", SIZE_FLAGS, ids=[f"{m}{f}" for m, _, f, _, _ in SIZE_FLAGS])
def test_bench_sizes_are_refused_naming_the_flag_before_the_gpu(tmp_path, monkeypatch, capsys, module, argv, flag,
                                                                bad, lo):
    """A 0 / negative size (``--tokens 0``, ``--heads 0``, ``--chunk-size 0``) passed every check: on a GPU it
    reached the cases (empty tensors timed, a ZeroDivisionError, or ``max(1, tokens // N)`` made it 1 in silence;
    ``bench_delta --device cpu`` ran and exited 0). Now argparse's error naming the flag and the allowed values
    (exit 2, :data:`eval.bench_common.POSITIVE_INT` / ``NONNEG_INT``), before the CUDA check; the smallest allowed
    value gets to the CUDA check (made to fail here on any machine)."""
    import importlib

    import torch

    bench = importlib.import_module(f"eval.{module}")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    with pytest.raises(SystemExit) as e:
        bench.main(argv + [flag, bad])
    assert e.value.code == 2
    assert f"argument {flag}: {bad}: must be an integer >= {lo}" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        bench.main(argv + [flag, str(lo)])
    assert not (tmp_path / "out").exists()


# (module, its other arguments, the flag, a bad comma list, what the message says)
NAME_LISTS = [
    ("bench_model", ["--out", "OUT"], "--sizes", "large,,small", "an empty item"),
    ("bench_model", ["--out", "OUT"], "--sizes", "", "an empty list"),
    ("bench_model", ["--out", "OUT", "--sizes", "small"], "--variants", "flash,,linear", "an empty item"),
    ("bench_model", ["--out", "OUT", "--sizes", "small", "--variants", "flash"], "--backends", "torch,",
     "an empty item"),
    ("bench_model", ["--out", "OUT", "--sizes", "small", "--variants", "flash"], "--backends", "", "an empty list"),
    ("bench_mixers", ["--out", "OUT"], "--layers", "flash,,linear", "an empty item"),
    ("bench_ssd", ["--out", "OUT"], "--state-pass", "parallel,,auto", "an empty item"),
    ("bench_ssd", ["--out", "OUT"], "--seq-blocks", "64x64,,32x32", "an empty item"),
    ("bench_linear", [], "--methods", "ours,,torch", "an empty item"),
    ("bench_linear", [], "--methods", "ourz", "['ourz'] not supported; allowed values: ours, "),
    ("bench_linear", ["--taylor"], "--methods", "ours", "['ours'] not supported; allowed values: ours_parallel, "),
    ("bench_linear", ["--docs", "fixed:64"], "--methods", "ours", "is not used with --docs"),
    ("bench_linear", [], "--docs", "", "--docs entry '' is not supported; allowed values: fixed:<L>"),
]


@pytest.mark.parametrize("module,argv,flag,bad,want", NAME_LISTS, ids=[f"{m}{f}={b}" for m, _, f, b, _ in NAME_LISTS])
def test_bench_name_lists_are_refused_naming_the_flag_before_the_gpu(tmp_path, monkeypatch, capsys, module, argv,
                                                                     flag, bad, want):
    """A comma list of names with an empty item (``--sizes large,,small``, ``--layers flash,,linear``) lost the item
    in silence; an empty one (``--backends ''``) fell back to the defaults; ``bench_linear --methods ourz`` kept no
    method (nothing timed, exit 0); ``--docs ''`` ran the main benchmark instead. Now each stops naming the flag
    (:func:`eval.bench_common.name_list`), before the CUDA check."""
    import importlib

    import torch

    bench = importlib.import_module(f"eval.{module}")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    with pytest.raises(SystemExit) as e:
        bench.main(argv + [flag, bad])
    said = str(e.value) + capsys.readouterr().err
    assert "needs a CUDA device" not in said and want in said, said
    if want.startswith("an empty"):
        assert str(e.value).startswith(f"{flag} {bad!r}: ") and f"({want})" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_name_list_parses_a_comma_list_and_names_the_flag_for_a_bad_one():
    from eval.bench_common import name_list

    assert name_list(" a, b ,a", "--x", "names") == ["a", "b"]
    assert name_list("a", "--x", "names", ("a", "b")) == ["a"]
    for text, bad in (("a,,b", "an empty item"), ("a,", "an empty item"), ("", "an empty list"),
                      (" ", "an empty list")):
        with pytest.raises(SystemExit) as e:
            name_list(text, "--x", "names", ("a", "b"))
        assert str(e.value) == f"--x {text!r}: give comma-separated names ({bad}); allowed values: a, b"
    with pytest.raises(SystemExit) as e:
        name_list("a,c", "--x", "names", ("a", "b"), more=", or all")
    assert str(e.value) == "--x: ['c'] not supported; allowed values: a, b, or all"


@pytest.mark.parametrize("argv,want", [
    (["--heads", "0"], "argument --heads: 0: must be an integer >= 1"),  # was accepted, exit 0
    (["--heads", "-4"], "argument --heads: -4: must be an integer >= 1"),
    (["--head-dim", "0"], "argument --head-dim: 0: must be an integer >= 1"),  # was a ValueError traceback
    (["--gqa-group", "0"], "argument --gqa-group: 0: must be an integer >= 1"),  # was ZeroDivisionError
    (["--gqa-group", "5"], "--gqa-group 5 does not divide --model-heads 32; allowed values: a divisor of "
                           "--model-heads (1, 2, 4, 8, 16, 32)"),  # was a ValueError traceback
    (["--model-heads", "30"], "--gqa-group 8 does not divide --model-heads 30"),
    (["--model-heads", "0"], "argument --model-heads: 0: must be an integer >= 1"),  # was ZeroDivisionError
    (["--model-layers", "0"], "argument --model-layers: 0: must be an integer >= 1"),
    (["--page-size", "0"], "argument --page-size: 0: must be an integer >= 1"),  # was accepted
    (["--window", "0"], "argument --window: 0: must be an integer >= 1"),  # was a ValueError traceback
    (["--feature-map", "foo"], "argument --feature-map: invalid choice: 'foo'"),  # was a ValueError traceback
    (["--variant-batch", "0"], "argument --variant-batch: 0: must be an integer >= 1"),  # was accepted
    (["--mem-batch", "-1"], "argument --mem-batch: -1: must be an integer >= 1"),  # was a ValueError traceback
    (["--mem-batch", "x"], "argument --mem-batch: 'x' is not an integer; allowed values: an integer >= 1"),
    (["--weights-gb", "-1"], "argument --weights-gb: -1: must be a number >= 0"),  # was accepted
    (["--memory-gb", "0"], "argument --memory-gb: 0: must be a number > 0"),  # was accepted: max_context <= 0
    (["--memory-gb", "10"], "--memory-gb 10 leaves no memory for the cache beside --weights-gb 14; allowed values: "
                            "--memory-gb > --weights-gb"),  # was accepted: a negative "longest context that fits"
    (["--gqa-group", "3", "--model-heads", "24", "--timed"], "--gqa-group 3 does not divide --heads 32"),
    (["--head-dim", "4096", "--timed"], "--head-dim 4096 is not supported by the decode kernel; allowed values: 1 "
                                        "to 1024 (any >= 1 with --memory-only)"),  # was one error row per case
])
def test_bench_decode_checks_its_arguments_before_any_work(tmp_path, capsys, argv, want):
    """``python -m eval.bench_decode`` had no checks of its own: a 0 / negative size, an unknown feature map, a GQA
    group that does not divide the heads, device memory below the weights either crashed with a traceback after
    ``--out`` was made or ran and exited 0 with a wrong table (``--memory-gb 10``: a negative longest context).
    Now argparse's error naming the flag and the allowed values (exit 2), before anything is written. (``--timed``
    here: without ``--memory-only``, where the GPU sections' limits apply too.)"""
    from eval import bench_decode as bd

    timed = "--timed" in argv
    argv = [a for a in argv if a != "--timed"] + ([] if timed else ["--memory-only"])
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        bd.main(argv + ["--out", str(out)])
    assert e.value.code == 2
    assert want in capsys.readouterr().err
    assert not out.exists()


def test_bench_decode_refuses_weights_that_fill_the_device_before_writing(tmp_path):
    from eval import bench_decode as bd

    out = tmp_path / "out"
    if not __import__("torch").cuda.is_available():  # 141 GB assumed without a GPU
        with pytest.raises(SystemExit, match=r"^--weights-gb 500 fills the device's 141 GB; allowed values: less "):
            bd.main(["--memory-only", "--weights-gb", "500", "--out", str(out)])
    with pytest.raises(SystemExit, match=r"^--weights-gb 5000 fills the device's "):
        bd.main(["--memory-only", "--weights-gb", "5000", "--out", str(out)])
    assert not out.exists()
    s = bd.main(["--memory-only", "--heads", "16", "--gqa-group", "16", "--model-heads", "16", "--head-dim", "2000",
                 "--out", str(out)])  # any head dim for the memory model; the timed --heads unused
    assert {r["variant"] for r in s["memory"]} >= {"mha", "gqa1", "mqa"}
