"""Every committed report table and figure, rebuilt in one command from committed results (no GPU, no network).

    python -m eval.figures                       # every job, in place (overwrites the committed outputs)
    python -m eval.figures --list                # the jobs and the command line each one stands for
    python -m eval.figures --only mqar_fig2,h200_crossover_figures
    python -m eval.figures --out-root /tmp/figs  # write everything under /tmp/figs instead (inputs stay in place)

:data:`JOBS` is the table: one row per report command of ``docs/results.md``. Each row is the module and the Hydra
overrides of ``python -m <module> <overrides>``; the job runs in this process through the module's Hydra-free entry
point (:data:`ENTRY`), its config composed by Hydra from ``eval/conf/<name>.yaml`` and the overrides, as the
command line would. Paths are relative to the repository root (the command changes into it). ``--out-root DIR``
prefixes the output keys (:data:`OUTPUT_KEYS`) of every job with ``DIR``. W&B stays off. A failed job does not stop
the others; the command ends with a summary and exit status 1 when any job failed.

The outputs equal the committed files byte for byte with the committed inputs and the same matplotlib / numpy
versions; the command runs numpy on its AVX2 code path (:data:`SAME_PIXELS_ENV`) so that an AVX-512 CPU draws the
same pixels as the machine that drew the committed PNGs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback
from typing import Dict, List, NamedTuple, Optional, Sequence

# numpy's AVX-512 code path rounds some log10 values one ulp apart from the AVX2 one, which moves the anti-aliasing of
# a few pixels of the log-axis figures (docs/figures/h200_roofline.png): the committed figures are numpy's AVX2 path,
# so the command takes it on every x86 CPU (names a CPU lacks are ignored by numpy), before numpy is imported.
# An explicit NPY_DISABLE_CPU_FEATURES wins; in-process callers (tests) are left alone.
SAME_PIXELS_ENV = {"NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR"}
if __name__ == "__main__" and "numpy" not in sys.modules:
    for _k, _v in SAME_PIXELS_ENV.items():
        os.environ.setdefault(_k, _v)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONF_DIR = os.path.join(REPO, "eval", "conf")

Q = "results/h200/quality"  # the H200 quality runs (2026-12-01 and 2026-12-02) and their reports
# the small model's speed with the trained specs (conf/attention: 32-token window, 16-token BigBird blocks), 262k
# tokens a step (GPU-bound), our kernels: eval.bench_model --specs conf of 2026-12-02
LM_SPEED = "results/h200/2026-12-02/model_speed_small_conf/model_speed_small_conf.csv"
# the same model sweep with the anchors (cuDNN, FA4) in one process: the join's best-vs-best mode (compare=best)
LM_SPEED_BEST = "results/h200/2026-12-04g/c4/model_speed_best/model_speed_best.csv"
HYBRID_SPEED = "results/h200/2026-12-01/hybrid_speed/model_speed.csv"


class Job(NamedTuple):
    name: str
    module: str
    overrides: List[str]


JOBS: List[Job] = [
    # eval.recall: MQAR / LM reports (docs/results.md, "Quality on the H200")
    Job("mqar_recall", "eval.recall",
        ["kind=fig2", f"runs=[{Q}/runs/mqar_recall,{Q}/runs/mqar_recall_lr1e-3_callA]", f"out_dir={Q}/mqar_recall"]),
    Job("mqar_fig2", "eval.recall",
        ["kind=fig2", f"runs=[{Q}/runs/mqar_fig2,{Q}/runs/mqar_fig2_based]", f"out_dir={Q}/mqar_fig2"]),
    Job("mqar_fig2_long", "eval.recall",
        ["kind=curves", f"runs=[{Q}/runs/mqar_fig2_long,{Q}/runs/mqar_fig2]", "seq_len=512", "d_model=512",
         "variant=flash", f"out_dir={Q}/mqar_fig2_long"]),
    Job("mqar_window_cliff", "eval.recall",
        ["kind=cliff", f"runs=[{Q}/runs/mqar_window_cliff]", f"out_dir={Q}/mqar_window_cliff"]),
    Job("mqar_old_recipe", "eval.recall",
        ["kind=ablation", f"runs=[{Q}/runs/mqar_old_recipe]", f"out_dir={Q}/mqar_old_recipe"]),
    Job("mqar_hybrid", "eval.recall",
        ["kind=hybrid", f"runs=[{Q}/runs/mqar_hybrid]", f"speed={HYBRID_SPEED}", f"out_dir={Q}/mqar_hybrid"]),
    Job("lm_wikitext", "eval.recall",
        ["kind=lm", f"runs=[{Q}/runs/lm_wikitext]", f"out_dir={Q}/lm_wikitext"]),
    Job("lm_shakespeare", "eval.recall",
        ["kind=lm", f"runs=[{Q}/runs/lm_shakespeare]", f"out_dir={Q}/lm_shakespeare"]),
    # eval.quality: LM quality x model-level speed / memory (bench_model, small model, 262k tokens/step)
    Job("join_lm_wikitext", "eval.quality",
        [f"runs=[{Q}/runs/lm_wikitext]", f"speed={LM_SPEED}", "speed_size=small",
         f"out_dir={Q}/join_lm_wikitext", "name=lm_wikitext_join", "formats=[png]", "wandb.enabled=false"]),
    Job("join_lm_shakespeare", "eval.quality",
        [f"runs=[{Q}/runs/lm_shakespeare]", f"speed={LM_SPEED}", "speed_size=small",
         f"out_dir={Q}/join_lm_shakespeare", "name=lm_shakespeare_join", "formats=[png]", "wandb.enabled=false"]),
    Job("join_lm_wikitext_best", "eval.quality",
        [f"runs=[{Q}/runs/lm_wikitext]", f"speed={LM_SPEED_BEST}", "speed_size=small", "compare=best",
         f"out_dir={Q}/join_lm_wikitext_best", "name=lm_wikitext_join_best", "formats=[png]", "wandb.enabled=false"]),
    Job("join_lm_shakespeare_best", "eval.quality",
        [f"runs=[{Q}/runs/lm_shakespeare]", f"speed={LM_SPEED_BEST}", "speed_size=small", "compare=best",
         f"out_dir={Q}/join_lm_shakespeare_best", "name=lm_shakespeare_join_best", "formats=[png]",
         "wandb.enabled=false"]),
    # eval.plots: the crossover sweep of 2026-11-29 (H200 speed; CPU quality from its committed tables)
    Job("h200_crossover_figures", "eval.plots",
        ["results_dir=results/h200/crossover_speed_h200", "figures_dir=docs/figures", "prefix=h200_",
         "formats=[png]"]),
    Job("cpu_quality_figures", "eval.plots",
        ["quality_csv=results/cpu/crossover_quality/quality.csv", "figures_dir=docs/figures", "prefix=cpu_",
         "formats=[png]"]),
    # eval.plots: n* by document length (eval.doclen's model tables; the H200 measured points when committed)
    Job("doclen_crossover", "eval.plots",
        ["doclen_dir=results/doclen", "doclen_measured=results/h200/doclen/doclen_measured.csv",
         "figures_dir=docs/figures", "formats=[png]"]),
]

# module -> (config name under eval/conf, Hydra-free entry point taking the resolved config as a dict)
ENTRY = {
    "eval.recall": ("recall", "run"),
    "eval.quality": ("quality", "run"),
    "eval.plots": ("plots", "main_from_cfg"),
}

# the overrides that name where a job writes; --out-root prefixes their values
OUTPUT_KEYS = ("out_dir", "figures_dir")


def command_line(job: Job) -> str:
    """The shell command a job stands for (quoted where a shell would glob the brackets)."""
    args = [f"'{o}'" if "[" in o else o for o in job.overrides]
    return " ".join(["python", "-m", job.module, *args])


def with_out_root(overrides: Sequence[str], out_root: Optional[str]) -> List[str]:
    """``overrides`` with each output key's value put under ``out_root`` (unchanged when ``out_root`` is None)."""
    if not out_root:
        return list(overrides)
    out = []
    for o in overrides:
        key, _, value = o.partition("=")
        if key in OUTPUT_KEYS:
            o = f"{key}={os.path.join(out_root, value)}"
        out.append(o)
    return out


def compose(module: str, overrides: Sequence[str]) -> dict:
    """The job's config as ``python -m <module> <overrides>`` would build it (Hydra compose, resolved)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    config_name = ENTRY[module][0]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


def run_job(job: Job, out_root: Optional[str] = None) -> None:
    """Run one job in this process; raises what the module raises."""
    overrides = with_out_root(job.overrides, out_root)
    cfg = compose(job.module, overrides)
    entry = getattr(importlib.import_module(job.module), ENTRY[job.module][1])
    entry(cfg)


def select(only: Optional[str]) -> List[Job]:
    """The jobs named in ``only`` (comma-separated), in table order; all jobs when ``only`` is empty."""
    if not only:
        return list(JOBS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    allowed = [j.name for j in JOBS]
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise ValueError(f"unknown job(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
    return [j for j in JOBS if j.name in names]


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.figures", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", help="comma-separated job names (see --list)")
    p.add_argument("--list", action="store_true", help="print the jobs and their commands, run nothing")
    p.add_argument("--out-root", help="write every output under this folder instead of in place")
    args = p.parse_args(argv)
    from eval.bench_common import check_out_dirs_or_exit

    check_out_dirs_or_exit(p, ("--out-root", args.out_root))
    try:
        jobs = select(args.only)
    except ValueError as e:
        p.error(str(e))
    if args.list:
        for j in jobs:
            print(f"{j.name}: {command_line(j)}")
        return 0

    out_root = os.path.abspath(args.out_root) if args.out_root else None
    wandb_mode = os.environ.get("WANDB_MODE")
    os.environ["WANDB_MODE"] = "disabled"  # rebuilding figures logs nothing; restored below for in-process callers
    cwd = os.getcwd()
    os.chdir(REPO)  # the table's paths are relative to the repository root
    times: Dict[str, float] = {}
    failed: Dict[str, str] = {}
    try:
        for j in jobs:
            print(f"=== {j.name}: {command_line(j)}" + (f"  [out-root {out_root}]" if out_root else ""), flush=True)
            t0 = time.perf_counter()
            try:
                run_job(j, out_root)
            except Exception as e:  # noqa: BLE001 - report it, run the other jobs
                traceback.print_exc()
                failed[j.name] = f"{type(e).__name__}: {e}"
            times[j.name] = time.perf_counter() - t0
            print(f"=== {j.name}: {'FAILED' if j.name in failed else 'ok'} in {times[j.name]:.1f} s", flush=True)
    finally:
        os.chdir(cwd)
        if wandb_mode is None:
            os.environ.pop("WANDB_MODE", None)
        else:
            os.environ["WANDB_MODE"] = wandb_mode

    print("\njob                          status   seconds")
    for j in jobs:
        print(f"{j.name:<28} {'FAILED' if j.name in failed else 'ok':<8} {times[j.name]:7.1f}")
    print(f"{'total':<28} {'':<8} {sum(times.values()):7.1f}")
    if failed:
        print(f"\n{len(failed)} of {len(jobs)} job(s) failed:", file=sys.stderr)
        for name, msg in failed.items():
            print(f"  {name}: {msg}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
