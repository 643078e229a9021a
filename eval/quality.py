"""Quality join: finished training runs -> quality per variant per context length, joined with speed / memory.

Reads ``train.py`` run folders (``<run>/.hydra/config.yaml`` + ``<run>/csv/metrics.csv``, found recursively
under the given roots, e.g. ``multirun/2026-11-29/10-00-00``) and, when ``wandb_project`` is given and
``WANDB_API_KEY`` is set, the summaries of W&B runs. Per run: dataset (``mqar`` / ``text``), variant
(``attention.name``, or ``a+b`` for per-layer hybrids), ``seq_len``, the last ``val/loss``, ``val/bpb``,
``val/acc`` (MQAR: accuracy on the query positions), the median training ``perf/tokens_per_s`` and step time,
the largest ``perf/peak_mem_mb``, and ``optim.lr`` (``lr``).

One point per (dataset, variant, seq_len) (:func:`aggregate`), as ``eval.recall`` reports: runs of the same
``optim.lr`` are averaged (seeds, repeats), then the lr with the best mean quality is taken (MQAR highest
``val_acc``, text lowest ``val_bpb``: :func:`quality_gain`), its speed and memory with it; ``runs_agg.csv`` says
how many runs were averaged (``runs``), at which lr (``best_lr``) and which lrs were tried (``lrs``). Runs of one
point that differ in any other setting of their config (:func:`run_settings`: the result config without paths,
loggers, logging cadence; ``seed`` / ``*.seed`` ignored), e.g. ``model.d_model``, ``trainer.max_steps``,
``attention.window_size``, are refused before anything is written, naming the point, the keys that differ, their
values and a run of each: pass roots that hold one setting. ``nstar_baseline`` must name a variant of the runs,
else it is refused naming the variants present (checked for any value but the default ``flash``, and for that one
too when ``speed=`` makes the n* table).

Outputs (``<out_dir>/``): ``runs.csv`` (one row per run), ``runs_agg.csv`` (one row per point), ``quality.csv``
(long form: dataset, variant, seq_len, metric, value), ``leaders.csv`` (per dataset and length: the variant with
the best quality per unit time, and the lengths where the leader changes, interpolated in log-log space like
:mod:`eval.crossover`; with ``speed=``, ``impl`` names the implementation behind each leader's speed: the point of
``compare=best``), and the figures ``quality_vs_n`` and ``bubble_<dataset>``.

Speed and memory: by default the runs' own median ``perf/tokens_per_s`` and largest ``perf/peak_mem_mb``. With
``speed=<eval.bench_model CSV>`` they come from that serial model-level benchmark instead (runs trained in
parallel on one GPU have meaningless throughput), matched on (variant, seq_len) for one ``speed_backend``
(default ``triton``) and ``speed_size`` (needed when the CSV holds several sizes); the join goes to
``quality_speed_memory.csv``, the leaders and the bubble chart use it, and the rows that match nothing are
printed. (``speed_csv=<eval.sweep model.csv>`` is the older join with a sweep's ``train_tokens_per_s``.)

Quality per unit time: MQAR ``acc / step_time``; text ``(log2(vocab) - bpb) / step_time`` (bits per byte saved
against a uniform guess, per second of training step): both "higher is better", both 0 for a model that
learned nothing.

    python -m eval.quality runs=[multirun/2026-11-29/10-00-00] out_dir=results/cpu/crossover_quality
    python -m eval.quality runs=[multirun/crossover_quality] out_dir=DIR \
        speed=results/h200/2026-12-01/model_speed_large.csv speed_backend=triton
    python -m eval.quality ... speed=<bench_model csv with anchors> compare=best   # fastest implementation per row

Correctness and n* both ways (with ``speed=``): rows of the benchmark whose correctness check failed (``check_ok``
false: :func:`eval.bench_model.check_case`) never stand for a variant, and the tables say so; rows of a CSV from
before the check are kept as ``unchecked`` (``bench_check`` in the join, ``impl_check`` in the leaders, ``?`` after
the implementation in the figures). ``nstar_compare.csv`` (:func:`compare_nstar`) gives the n* of quality per unit
time (each leader change, and each variant against ``nstar_baseline``, default flash) two ways: ours vs ours (the
``ours`` backends, default triton / parallel) and best vs best (the fastest correct implementation per length),
each with a bootstrap interval over the benchmark's timed steps (``step_ms_reps``; :func:`eval.best.nstar_interval`,
``n_boot``, ``level``; no interval, and said so, for a CSV without them), the implementations on each side, the
``shift`` n*(best) / n*(ours) and a conclusion line; the figure ``nstar_<dataset>`` draws both and the bubble
chart's caption repeats the leader changes'.
"""

from __future__ import annotations

import math
import os
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np
import pandas as pd

from eval.bench_common import check_out_dir, write_csv
from eval.crossover import _f, find_crossover

QUALITY_METRICS = {"mqar": ("val_acc", "val_loss"), "text": ("val_bpb", "val_loss")}


# --------------------------------------------------------------------------------------------- reading runs
def find_runs(roots: Iterable[str]) -> List[str]:
    """Run folders (holding ``csv/metrics.csv`` or ``metrics.csv`` next to ``.hydra/``) under ``roots``."""
    out = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in ("wandb", "checkpoints")]
            if "metrics.csv" in filenames:
                run = os.path.dirname(dirpath) if os.path.basename(dirpath) == "csv" else dirpath
                if os.path.exists(os.path.join(run, ".hydra", "config.yaml")) and run not in out:
                    out.append(run)
    return sorted(out)


def _variant_name(cfg: dict) -> str:
    layers = (cfg.get("model") or {}).get("layers")
    if layers:
        names = [(x if isinstance(x, str) else (x.get("name") or x.get("kind") or x.get("mixer"))) for x in layers]
        return "+".join(names)
    att = cfg.get("attention") or {}
    return str(att.get("name") or att.get("kind") or "unknown")


def _dataset(cfg: dict) -> str:
    target = str((cfg.get("data") or {}).get("_target_", ""))
    if "MQAR" in target:
        return "mqar"
    if "Text" in target:
        d = cfg["data"]
        return "text" if not d.get("hub_name") else f"text:{d['hub_name']}"
    return target.rsplit(".", 1)[-1].lower() or "unknown"


def _run_setup(cfg: dict) -> dict:
    """``dataset``, ``variant``, ``seq_len`` (-1 unknown) and ``vocab_size`` (256 unknown) of a run's config."""
    data = cfg.get("data") or {}
    return {"dataset": _dataset(cfg), "variant": _variant_name(cfg),
            "seq_len": int(_f(data.get("seq_len"))) if math.isfinite(_f(data.get("seq_len"))) else -1,
            "vocab_size": int(_f(data.get("vocab_size"))) if math.isfinite(_f(data.get("vocab_size"))) else 256}


def read_metrics(run_dir: str) -> pd.DataFrame:
    """A run's ``csv/metrics.csv`` (or ``metrics.csv``) as numbers, one row per logged row: a cell that is empty or
    not a finite number is NaN. An empty file (a job killed before its first log flush) has no rows."""
    path = os.path.join(run_dir, "csv", "metrics.csv")
    if not os.path.exists(path):
        path = os.path.join(run_dir, "metrics.csv")
    try:
        df = pd.read_csv(path)
    except pd.errors.EmptyDataError:  # raised naming neither the file nor the run
        df = pd.DataFrame({"step": []})
    df = df.apply(pd.to_numeric, errors="coerce").astype(float)
    return df.where(np.isfinite(df))


def load_run(run_dir: str) -> dict:
    """One run's summary row (see module docstring); raises ``FileNotFoundError`` for a non-run folder."""
    import yaml

    with open(os.path.join(run_dir, ".hydra", "config.yaml")) as f:
        cfg = yaml.safe_load(f) or {}
    m = read_metrics(run_dir)

    def col(name: str) -> pd.Series:  # the logged values of one metric, in order
        return m[name].dropna() if name in m else pd.Series(dtype=float)

    def last(name: str) -> float:
        return float(col(name).iloc[-1]) if len(col(name)) else float("nan")

    tps, stt, steps = col("perf/tokens_per_s"), col("perf/step_time_s"), col("step")
    skip = min(len(tps) // 5, 3)  # first steps include compilation / warm-up
    return {
        "run_dir": run_dir, **_run_setup(cfg), "experiment": cfg.get("experiment_name"), "seed": cfg.get("seed"),
        "lr": _lr(cfg), "val_loss": last("val/loss"), "val_bpb": last("val/bpb"), "val_acc": last("val/acc"),
        "tokens_per_s": float(tps.iloc[skip:].median()), "step_time_s": float(stt.iloc[skip:].median()),
        "peak_mem_mb": float(col("perf/peak_mem_mb").max()),
        "steps": int(steps.max()) if len(steps) else 0, "source": "csv", "settings": run_settings(cfg),
    }


def load_wandb_runs(project: str, group: Optional[str] = None, entity: Optional[str] = None) -> List[dict]:
    """Summaries of W&B runs (needs ``WANDB_API_KEY`` and network; returns ``[]`` otherwise)."""
    if not os.environ.get("WANDB_API_KEY"):
        return []
    try:
        import wandb

        api = wandb.Api(timeout=20)
        path = f"{entity}/{project}" if entity else project
        runs = api.runs(path, filters={"group": group} if group else None)
    except Exception:  # noqa: BLE001 - W&B is optional
        return []
    out = []
    for r in runs:
        c, s = r.config or {}, r.summary or {}
        out.append({
            "run_dir": f"wandb:{r.path}", **_run_setup(c), "experiment": r.group, "seed": c.get("seed"), "lr": _lr(c),
            "val_loss": _f(s.get("val/loss")),
            "val_bpb": _f(s.get("val/bpb")), "val_acc": _f(s.get("val/acc")),
            "tokens_per_s": _f(s.get("perf/tokens_per_s")), "step_time_s": _f(s.get("perf/step_time_s")),
            "peak_mem_mb": _f(s.get("perf/peak_mem_mb")), "steps": int(_f(s.get("trainer/global_step")) or 0),
            "source": "wandb", "settings": run_settings(c)})
    return out


# --------------------------------------------------------------------------------------------- tables
AGG_METRICS = ("val_loss", "val_bpb", "val_acc", "tokens_per_s", "step_time_s", "peak_mem_mb")


LR_KEY = "optim.lr"  # the one setting a group may vary: the best lr is taken (eval.recall's best_over_lr)


def _lr(cfg: dict) -> float:
    """A run config's ``optim.lr`` (NaN without one)."""
    return _f((cfg.get("optim") or {}).get("lr")) if isinstance(cfg.get("optim"), dict) else float("nan")


def flat_config(node, prefix: str = "") -> dict:
    """A nested config as ``{"dotted.key": value}`` (lists are values; also :mod:`eval.recall`'s)."""
    if not isinstance(node, dict):
        return {prefix: node} if prefix else {}
    out = {}
    for k, v in node.items():
        out.update(flat_config(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v})
    return out


def _is_seed(key: str) -> bool:
    return key == "seed" or key.endswith(".seed")


def result_settings(cfg: dict) -> dict:
    """A run's settings for comparing runs: its flattened :func:`harness.runs.result_config` (what changes a result:
    no paths, loggers, checkpoint / logging cadence, deadlines), its own output folder in a value written as
    ``${paths.output_dir}`` (also :mod:`eval.recall`'s)."""
    from harness.runs import result_config

    out_dir = (cfg.get("paths") or {}).get("output_dir") if isinstance(cfg.get("paths"), dict) else None
    out = {}
    for k, v in flat_config(result_config(cfg)).items():
        if isinstance(out_dir, str) and out_dir and isinstance(v, str):
            v = v.replace(out_dir, "${paths.output_dir}")
        out[k] = v
    return out


def run_settings(cfg: dict) -> dict:
    """:func:`result_settings` for grouping, without the seeds (``seed``, ``data.seed``, any ``*.seed``)."""
    try:
        flat = result_settings(cfg or {})
    except Exception:  # noqa: BLE001 - a config that cannot be read as one: no settings to compare
        return {}
    return {k: v for k, v in flat.items() if not _is_seed(k)}


def fmt_value(v) -> str:
    """A setting's value as a message or table writes it (``true``, ``0.001``, ``null``; also :mod:`eval.recall`'s)."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:g}"
    return "null" if v is None else str(v)


def setting_differences(runs: Sequence[dict], ignore: Sequence[str] = (LR_KEY,)) -> Dict[str, list]:
    """``{key: [its values]}`` of the settings (``settings``: :func:`run_settings`) on which ``runs`` differ,
    keys sorted, values in first-seen order; keys in ``ignore`` and runs without ``settings`` left out."""
    sets = [r["settings"] for r in runs if isinstance(r.get("settings"), dict)]
    out: Dict[str, list] = {}
    for k in sorted({k for s in sets for k in s} - set(ignore)):
        vals = []
        for s in sets:
            v = s.get(k, "<unset>")
            if v not in vals:
                vals.append(v)
        if len(vals) > 1:
            out[k] = vals
    return out


def check_one_setting(runs: Sequence[dict]) -> None:
    """Every (dataset, variant, seq_len) group of ``runs`` differs in nothing but its seeds and ``optim.lr``
    (:func:`setting_differences`); else ``ValueError`` naming each such group, the keys that differ and their
    values, and a run of each value: averaging them would mix settings in silence."""
    groups: Dict[tuple, List[dict]] = {}
    for r in runs:
        if _f(r.get("seq_len")) > 0:
            groups.setdefault((r["dataset"], r["variant"], int(r["seq_len"])), []).append(r)
    bad = []
    for (ds, v, n), rs in sorted(groups.items()):
        diff = setting_differences(rs)
        if diff:
            k0, vals = next(iter(diff.items()))
            where = [next(r["run_dir"] for r in rs if (r.get("settings") or {}).get(k0, "<unset>") == x)
                     for x in vals[:2]]
            bad.append(f"{ds} / {v} at seq_len {n} ({len(rs)} runs) differ in "
                       + ", ".join(f"{k} ({', '.join(fmt_value(x) for x in xs)})" for k, xs in diff.items())
                       + f" (e.g. {' vs '.join(where)})")
    if bad:
        more = f"; and {len(bad) - 3} more group(s)" if len(bad) > 3 else ""
        raise ValueError(
            "runs of one (dataset, variant, seq_len) differ in more than their seed and optim.lr, so eval.quality "
            "would average different settings: " + "; ".join(bad[:3]) + more + ". Pass runs=[...] roots that hold "
            "one value of each of these keys (one eval.quality call per value)")


def aggregate(runs: Sequence[dict]) -> List[dict]:
    """One row per (dataset, variant, seq_len): its runs of the same ``optim.lr`` averaged (seeds / repeats; NaN /
    inf left out of the mean), then the lr whose mean has the highest :func:`quality_gain` (MQAR ``val_acc``; text
    lowest ``val_bpb``; ties and all-NaN: the smallest lr), as :func:`eval.recall.best_over_lr` does. Columns:
    ``dataset, variant, seq_len, runs`` (averaged, at that lr), ``best_lr`` (NaN: no ``optim.lr`` in the configs),
    ``lrs`` (the lrs tried, ``;``-joined, ``?`` for an unknown one), ``vocab_size``, :data:`AGG_METRICS`,
    ``quality_per_s``. Runs of a group that differ in any other setting (:func:`check_one_setting`) raise
    ``ValueError`` naming the keys; runs without ``seq_len`` (-1) are left out."""
    runs = [r for r in runs if _f(r.get("seq_len")) > 0]
    check_one_setting(runs)
    groups: Dict[tuple, Dict[Optional[float], List[dict]]] = {}
    for r in runs:
        lr = _f(r.get("lr"))
        groups.setdefault((r["dataset"], r["variant"], int(r["seq_len"])), {}).setdefault(
            lr if math.isfinite(lr) else None, []).append(r)  # None: no optim.lr in the config (one group)
    out = []
    for (ds, v, n), by_lr in sorted(groups.items()):
        lrs = sorted(by_lr, key=lambda x: (x is None, x or 0.0))
        rows = []
        for lr in lrs:
            rs = by_lr[lr]
            num = pd.DataFrame([{m: r.get(m) for m in AGG_METRICS} for r in rs], columns=list(AGG_METRICS))
            num = num.apply(pd.to_numeric, errors="coerce").astype(float)
            mean = num.where(np.isfinite(num)).mean()
            rows.append({"dataset": ds, "variant": v, "seq_len": n, "runs": len(rs),
                         "best_lr": float("nan") if lr is None else lr,
                         "lrs": ";".join("?" if x is None else fmt_value(x) for x in lrs),
                         "vocab_size": next((r["vocab_size"] for r in rs if r.get("vocab_size") is not None), None),
                         **{m: float(mean[m]) for m in AGG_METRICS}})
        gains = [quality_gain(r) for r in rows]
        best = max(range(len(rows)), key=lambda i: (gains[i] if math.isfinite(gains[i]) else -math.inf, -i))
        row = rows[best]
        row["quality_per_s"] = quality_per_time(row)
        out.append(row)
    return out


def quality_gain(row: dict) -> float:
    """The quality a run bought: MQAR ``acc``; text ``log2(vocab) - bpb`` (bits per byte saved against a uniform
    guess; ``bpb`` from ``val_loss / ln 2`` when not logged). Higher is better; 0 for a model that learned nothing."""
    if row["dataset"] == "mqar":
        return _f(row.get("val_acc"))
    bpb = _f(row.get("val_bpb"))
    if not math.isfinite(bpb):
        bpb = _f(row.get("val_loss")) / math.log(2)
    return math.log2(_f(row.get("vocab_size")) or 256) - bpb


def quality_per_time(row: dict) -> float:
    """MQAR: ``acc / step_time``; text: ``(log2(vocab) - bpb) / step_time`` (higher is better):
    :func:`quality_gain` over ``step_time_s``."""
    t = _f(row.get("step_time_s"))
    if not (t > 0):
        return float("nan")
    return quality_gain(row) / t


def long_form(agg: Sequence[dict]) -> List[dict]:
    """``(dataset, variant, seq_len, metric, value)`` rows of the quality metrics (for plots / W&B)."""
    out = []
    for r in agg:
        for m in QUALITY_METRICS.get(r["dataset"].split(":")[0], ("val_loss",)):
            if math.isfinite(_f(r.get(m))):
                out.append({"dataset": r["dataset"], "variant": r["variant"], "seq_len": r["seq_len"], "metric": m,
                            "value": r[m]})
    return out


def _impl(r: dict) -> str:
    """The implementation behind a joined row's speed (``bench_backend`` of :func:`join_bench_speed`), or ``"-"``."""
    b = r.get("bench_backend")
    return "-" if b is None or (isinstance(b, float) and math.isnan(b)) else str(b)


def _checks(rows: Iterable[dict]) -> str:
    """The correctness-check states (``bench_check``: passed / failed / unchecked) behind rows' speeds, ``/``-joined
    (``"unchecked"``: a bench_model CSV from before the check), ``"-"`` without any."""
    states = sorted({str(r.get("bench_check")) for r in rows if isinstance(r.get("bench_check"), str)})
    return "/".join(states) or "-"


def leaders(agg: Sequence[dict]) -> List[dict]:
    """Per dataset and length, the variant with the highest quality per unit time; then each change of leader
    between consecutive lengths as a crossover (``kind="crossover"``, interpolated in log-log space on
    ``1 / quality_per_s``; ``"no crossover in range"`` when one variant leads everywhere). Rows joined with a
    model benchmark (``bench_backend``: :func:`join_bench_speed`, e.g. ``compare=best``) add ``impl``: the
    implementation behind the leader's speed, and on a crossover row each side's at the two lengths
    (``"triton -> fa4/fa4"``: the old leader's, then the new one's), and ``impl_check``: the correctness-check
    states behind them (:func:`_checks`; ``unchecked`` for a bench_model CSV without ``check_ok``)."""
    out, nan = [], float("nan")
    named = any("bench_backend" in r for r in agg)

    def entry(ds, kind, seq_len, leader, quality_per_s=nan, n_star=nan, status="", impl="-", checks=()):  # one row
        out.append({"dataset": ds, "kind": kind, "seq_len": seq_len, "leader": leader,
                    "quality_per_s": quality_per_s, "n_star": n_star, "status": status,
                    **({"impl": impl, "impl_check": _checks(checks)} if named else {})})

    for ds in sorted({r["dataset"] for r in agg}):
        rows = [r for r in agg if r["dataset"] == ds and math.isfinite(_f(r["quality_per_s"]))]
        lens = sorted({r["seq_len"] for r in rows})
        lead = []
        for n in lens:
            cands = [r for r in rows if r["seq_len"] == n]
            best = max(cands, key=lambda r: r["quality_per_s"])
            lead.append(best["variant"])
            entry(ds, "leader", n, best["variant"], best["quality_per_s"], impl=_impl(best), checks=[best])
        changes = 0
        for i in range(1, len(lens)):
            a, b = lead[i - 1], lead[i]
            if a == b:
                continue
            changes += 1
            ca = {r["seq_len"]: r["quality_per_s"] for r in rows if r["variant"] == a}
            cb = {r["seq_len"]: r["quality_per_s"] for r in rows if r["variant"] == b}
            ns = [n for n in lens[max(0, i - 1): i + 1] if n in ca and n in cb]
            res = find_crossover(ns, [1 / max(cb[n], 1e-30) for n in ns], ns, [1 / max(ca[n], 1e-30) for n in ns])
            ia = "/".join(_impl(r) for n in ns for r in rows if r["variant"] == a and r["seq_len"] == n)
            ib = "/".join(_impl(r) for n in ns for r in rows if r["variant"] == b and r["seq_len"] == n)
            entry(ds, "crossover", nan, f"{a} -> {b}", n_star=res["n_star"], status=res["status"],
                  impl=f"{ia or '-'} -> {ib or '-'}",
                  checks=[r for r in rows if r["variant"] in (a, b) and r["seq_len"] in ns])
        if lens and not changes:
            entry(ds, "crossover", nan, lead[0], status=f"no crossover in range ({lead[0]} leads at every length)")
    return out


BENCH_COLUMNS = ("variant", "seq_len", "backend", "tokens_per_s", "peak_mem_mib")
BEST = "best"  # speed_backend=best: per (variant, seq_len) the fastest correct backend of the CSV (compare=best)
STEP = "step_ms"  # the timing the picks and the n* intervals use (its repeats: step_ms_reps, eval.bench_model)


def read_bench(path: str):
    """Every measured row of an ``eval.bench_model`` CSV (``tokens_per_s > 0``) as a pandas DataFrame, with
    ``size`` (``""`` when the CSV has none), ``step_ms`` (from ``tokens_per_step / tokens_per_s`` when the CSV has
    none), ``check`` (``passed`` / ``failed`` / ``unchecked``: :func:`eval.best.check_state` of ``check_ok``; a CSV
    from before the check is all ``unchecked``) and ``step_reps`` (how many per-step timings ``step_ms_reps``
    holds: 0 for a CSV from before they were written).

    Raises ``FileNotFoundError`` / ``ValueError`` naming ``speed``: no such file, not a bench_model CSV."""
    import pandas as pd

    from eval.best import check_state

    if not os.path.isfile(str(path)):
        raise FileNotFoundError(f"speed={path}: no such file (an eval.bench_model CSV, e.g. "
                                f"results/h200/2026-12-01/model_speed_large.csv)")
    df = pd.read_csv(path)
    missing = [c for c in BENCH_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"speed={path} is not an eval.bench_model CSV: columns {missing} missing (has "
                         f"{list(df.columns)}); a model sweep of eval.sweep (train_tokens_per_s) goes to speed_csv=")
    df = df[pd.to_numeric(df["tokens_per_s"], errors="coerce") > 0].copy()
    if "size" not in df.columns:
        df["size"] = ""
    tps = df["tokens_per_s"].astype(float)
    derived = (df["tokens_per_step"].astype(float) if "tokens_per_step" in df.columns else 1.0) / tps * 1e3
    df[STEP] = pd.to_numeric(df[STEP], errors="coerce").fillna(derived) if STEP in df.columns else derived
    if "check_ok" not in df.columns:
        df["check_ok"] = float("nan")
    df["check"] = [check_state({"check_ok": c}) for c in df["check_ok"]]
    reps = df[f"{STEP}_reps"] if f"{STEP}_reps" in df.columns else pd.Series([""] * len(df), index=df.index)
    df["step_reps"] = [len([x for x in str(c).split(";") if _f(x) > 0]) if isinstance(c, str) else 0 for c in reps]
    return df


def _as_series_rows(df) -> List[dict]:
    """bench_model rows as the rows :mod:`eval.best` groups (one series per variant: ``head_dim`` / ``causal`` /
    ``n_kv_heads`` fixed placeholders, ``status="ok"``), keeping ``backend``, ``step_ms``, ``step_ms_reps`` and
    ``check_ok``."""
    out = []
    for r in df.to_dict("records"):
        out.append(dict(r, head_dim=0, causal=True, n_kv_heads=0, status="ok", seq_len=int(r["seq_len"]),
                        check_ok=r.get("check_ok")))
    return out


def _series_key(variant: str) -> tuple:
    """The :mod:`eval.best` series key of one variant's bench_model rows (:func:`_as_series_rows`)."""
    return (str(variant), 0, True, 0)


def check_notes(df, what: str = "") -> List[str]:
    """Caption / console lines on the correctness checks of bench_model rows ``df`` (:func:`read_bench`): the rows
    left out because their check failed, and how many are unchecked (a CSV from before the check)."""
    notes = []
    failed = df[df["check"] == "failed"]
    if len(failed):
        err = failed["check_err"] if "check_err" in failed.columns else [float("nan")] * len(failed)
        notes.append(f"left out{what}, failed the correctness check: " + ", ".join(
            f"{b} {v}@{int(n)} (err {_f(e):.2g})" for b, v, n, e in zip(failed["backend"], failed["variant"],
                                                                       failed["seq_len"], err)))
    un = int((df["check"] == "unchecked").sum())
    if un:
        notes.append(f"{un} of {len(df)} speed rows{what} unchecked (no check_ok: a bench_model CSV from before "
                     f"the correctness check): their implementations are named, not verified")
    return notes


def load_bench_speed(path: str, backend: str = "triton", size: Optional[str] = None,
                     notes: Optional[List[str]] = None):
    """The rows of an ``eval.bench_model`` CSV (``size, variant, seq_len, backend, tokens_per_s, step_ms,
    peak_mem_mib, n_params, ...``, :func:`read_bench`) for one ``backend`` and one model ``size``, as a pandas
    DataFrame with columns ``variant, seq_len, tokens_per_s, step_time_s, peak_mem_mb, bench_n_params, bench_size,
    bench_backend, bench_check, bench_step_reps``. Failed rows (no ``tokens_per_s``) and rows whose correctness
    check failed (``check_ok`` false) are dropped, and ``notes`` (when given) says so (:func:`check_notes`; also
    how many rows are unchecked: ``bench_check="unchecked"``, kept as before the check existed).
    ``backend="best"`` (``compare=best``): per variant and length the fastest correct backend
    (:func:`eval.best.pick_best` on ``step_ms``), named in ``bench_backend`` (so in ``speed_source`` of the join and
    in the bubble chart's caption).

    Raises ``FileNotFoundError`` / ``ValueError`` naming the option (``speed``, ``speed_backend``, ``speed_size``):
    no such file, not a bench_model CSV, no row of that backend, several sizes and ``size`` not given.
    """
    import pandas as pd

    from eval.best import pick_best

    full = read_bench(path)
    df = full[full["check"] != "failed"]  # a failed correctness check never stands for a variant
    if backend != BEST and backend not in set(df["backend"]):
        raise ValueError(f"speed_backend={backend!r}: no row of that backend in speed={path}; allowed values: "
                         f"{BEST}, {', '.join(sorted(set(map(str, df['backend']))))}")
    if backend != BEST:
        df, full = df[df["backend"] == backend], full[full["backend"] == backend]
    sizes = sorted(set(map(str, df["size"])))
    if size is None:
        if len(sizes) > 1:
            raise ValueError(f"speed={path} holds the model sizes {sizes}; pick one with speed_size=<size>")
        size = sizes[0]
    if str(size) not in sizes:
        raise ValueError(f"speed_size={size!r}: not in speed={path}; allowed values: {', '.join(sizes)}")
    df = df[df["size"].astype(str) == str(size)]
    if notes is not None:
        notes += check_notes(full[full["size"].astype(str) == str(size)])
    if backend == BEST:  # per variant and length: the fastest correct implementation, named in bench_backend
        picks = pick_best(_as_series_rows(df), STEP)
        df = pd.DataFrame(picks).drop(columns="backend").rename(columns={"impl": "backend"}) if picks else df
    out = pd.DataFrame({"variant": df["variant"].astype(str), "seq_len": df["seq_len"].astype(int),
                        "tokens_per_s": df["tokens_per_s"].astype(float), "step_time_s": df[STEP] / 1e3,
                        "peak_mem_mb": df["peak_mem_mib"].astype(float),
                        "bench_n_params": df["n_params"] if "n_params" in df.columns else float("nan"),
                        "bench_size": str(size), "bench_backend": df["backend"].astype(str),
                        "bench_check": df["check"].astype(str), "bench_step_reps": df["step_reps"].astype(int)})
    return out.drop_duplicates(["variant", "seq_len"], keep="last").reset_index(drop=True)


def bench_rows(path: str, size: Optional[str] = None):
    """Every measured row of one model ``size`` of a bench_model CSV (:func:`read_bench`; ``size`` as in
    :func:`load_bench_speed`), every backend, failed checks included (:func:`eval.best.eligible` leaves them out):
    the input of :func:`compare_nstar`."""
    df = read_bench(path)
    sizes = sorted(set(map(str, df["size"])))
    if size is None:
        if len(sizes) > 1:
            raise ValueError(f"speed={path} holds the model sizes {sizes}; pick one with speed_size=<size>")
        size = sizes[0] if sizes else ""
    return df[df["size"].astype(str) == str(size)]


def join_bench_speed(agg: Sequence[dict], bench) -> tuple:
    """Quality x speed x memory: the aggregated runs joined on ``(variant, seq_len)`` with the serial model-level
    benchmark (:func:`load_bench_speed`), whose tokens/s, step time and peak memory replace the runs' own (runs
    trained in parallel on one GPU have meaningless throughput). The runs' own values stay in ``run_tokens_per_s``
    / ``run_peak_mem_mb``; rows without a benchmark row get NaN speed / memory and ``speed_source="unmatched"``.

    Returns ``(rows, unmatched_runs, unused_bench)``: the joined rows (``quality_per_s`` recomputed from the
    benchmark's step time), the ``(dataset, variant, seq_len)`` of rows without a benchmark row, and the
    ``(variant, seq_len)`` of benchmark rows no run matched.
    """
    import pandas as pd

    runs = pd.DataFrame(list(agg))
    if runs.empty:
        return [], [], []
    runs = runs.rename(columns={"tokens_per_s": "run_tokens_per_s", "peak_mem_mb": "run_peak_mem_mb",
                                "step_time_s": "run_step_time_s"})
    j = runs.merge(bench, on=["variant", "seq_len"], how="left", indicator=True)
    matched = j["_merge"] == "both"
    j["speed_source"] = ("bench_model:" + j["bench_backend"].astype(str) + "/" + j["bench_size"].astype(str)).where(
        matched, "unmatched")
    rows = j.drop(columns="_merge").to_dict("records")
    for r in rows:
        r["quality_per_s"] = quality_per_time(r)
    unmatched = [(r["dataset"], r["variant"], int(r["seq_len"])) for r in rows if r["speed_source"] == "unmatched"]
    used = set(zip(j.loc[matched, "variant"], j.loc[matched, "seq_len"]))
    unused = [(v, int(n)) for v, n in zip(bench["variant"], bench["seq_len"]) if (v, n) not in used]
    return rows, unmatched, unused


def speed_caption(speed: Optional[str] = None, speed_csv: Optional[str] = None, backend: str = "triton",
                  size: Optional[str] = None) -> str:
    """Where the bubble chart's speed and memory come from, in one line."""
    if speed and backend == BEST:
        return (f"speed, memory: eval.bench_model {os.path.basename(str(speed))} (serial, the fastest backend per "
                f"variant and length: speed_source names it" + (f", size {size}" if size else "") + ")")
    if speed:
        return (f"speed, memory: eval.bench_model {os.path.basename(str(speed))} (serial, backend {backend}"
                + (f", size {size}" if size else "") + ")")
    if speed_csv:
        return f"speed, memory: model sweep {os.path.basename(str(speed_csv))} where it has the row, else the runs' own"
    return "speed, memory: the training runs' own perf/tokens_per_s, perf/peak_mem_mb (not comparable for runs " \
           "that shared a GPU: use speed=<eval.bench_model csv>)"


# --------------------------------------------------------------------------------------------- n* both ways
COST = "cost_ms"  # step time per unit of quality (ms / quality_gain = 1e3 / quality_per_s): lower is better
NSTAR_BASELINE = "flash"
NO_REPS = "no interval: the speed CSV has no per-step times (step_ms_reps; a bench_model run from before them)"
NSTAR_COLUMNS = ("dataset", "variant", "baseline", "pair", "metric",
                 "ours_status", "ours_n_star", "ours_ahead_from", "ours_ahead_until", "ours_lo", "ours_hi",
                 "ours_p_cross", "ours_impl_variant", "ours_impl_baseline", "ours_check", "best_status", "best_n_star",
                 "best_ahead_from", "best_ahead_until", "best_lo", "best_hi",
                 "best_p_cross", "best_impl_variant", "best_impl_baseline", "best_check", "shift", "ours_reps",
                 "best_reps", "level", "conclusion")


def cost_rows(agg: Sequence[dict], bench) -> List[dict]:
    """The :mod:`eval.best` series rows of one dataset's quality per unit time: for each bench_model row
    (:func:`bench_rows`, any backend) whose (variant, seq_len) has aggregated runs in ``agg``, ``cost_ms`` = its
    step time per unit of quality (``step_ms / quality_gain``: ``1e3 / quality_per_s``, lower is better) and
    ``cost_ms_reps`` = each timed step's (``step_ms_reps``; empty when the CSV has none). The quality is held fixed:
    only the timings vary. Runs that gained nothing (:func:`quality_gain` ``<= 0``) are left out."""
    from eval.best import repeats

    gains = {}
    for r in agg:
        g = quality_gain(r)
        if g > 0 and math.isfinite(g):
            gains[(str(r["variant"]), int(_f(r["seq_len"])))] = g
    out = []
    for r in _as_series_rows(bench):
        g = gains.get((str(r["variant"]), int(r["seq_len"])))
        if g is None:
            continue
        reps = repeats(r, STEP) / g if r.get("step_reps") else []
        out.append(dict(r, **{COST: _f(r[STEP]) / g, f"{COST}_reps": ";".join(repr(float(x)) for x in reps)}))
    return out


def _leader_changes(rows: Sequence[dict], backends: Optional[Sequence[str]]) -> List[tuple]:
    """``(a, b)`` for each change of the lowest-cost variant between consecutive lengths, each variant on its best
    eligible implementation among ``backends`` (``None``: all)."""
    from eval.best import pick_best

    by_n: Dict[int, List[dict]] = {}
    for r in pick_best(rows, COST, backends):
        by_n.setdefault(int(r["seq_len"]), []).append(r)
    lead = [min(by_n[n], key=lambda r: _f(r[COST]))["variant"] for n in sorted(by_n)]
    return [(a, b) for a, b in zip(lead, lead[1:]) if a != b]


def compare_nstar(agg: Sequence[dict], bench, ours: Sequence[str] = ("triton", "parallel"),
                  baseline: str = NSTAR_BASELINE, n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> List[dict]:
    """n* of quality per unit time, ours vs ours and best vs best, with bootstrap intervals (:mod:`eval.best`).

    Per dataset of ``agg`` (the aggregated runs), on the cost curves of :func:`cost_rows` (``bench``: every row of
    :func:`bench_rows`): the pairs ``baseline -> v`` for every other variant ``v``, and every change of leader
    (the cheapest variant per length) between consecutive lengths in either mode. For each pair, ``v``'s n*
    against the old leader / baseline by :func:`eval.best.nstar_interval`: ``ours`` = only the backends ``ours``
    (our kernels) on both sides, ``best`` = the fastest implementation per length that did not fail its check (the
    pick redone in every resample of the timed steps; quality fixed). ``<tag>_check``: the check states behind the
    picks (``unchecked`` for a CSV without ``check_ok``). Without per-step times (``<tag>_reps <= 1``) the interval
    and ``p_cross`` are NaN and the conclusion says so. ``shift`` = n*(best) / n*(ours); ``conclusion``:
    :func:`eval.best.conclusion`. Columns: :data:`NSTAR_COLUMNS`."""
    from eval import best as B

    nan = float("nan")
    modes = (("ours", list(ours)), ("best", None))
    out = []
    for ds in sorted({r["dataset"] for r in agg}):
        rows = cost_rows([r for r in agg if r["dataset"] == ds], bench)
        pairs: Dict[tuple, set] = {}
        for tag, backs in modes:
            for a, b in _leader_changes(rows, backs):
                pairs.setdefault((a, b), set()).add(f"leader change ({tag})")
        variants = sorted({r["variant"] for r in rows})
        if baseline in variants:
            for v in variants:
                if v != baseline:
                    pairs.setdefault((baseline, v), set()).add(f"vs {baseline}")
        checks = {tag: [(r["variant"], r["impl_check"]) for r in B.pick_best(rows, COST, backs)]
                  for tag, backs in modes}
        for (a, b), why in sorted(pairs.items(), key=lambda kv: (not any("leader" in w for w in kv[1]), kv[0])):
            row = {"dataset": ds, "variant": b, "baseline": a, "pair": "; ".join(sorted(why)),
                   "metric": "step_ms / quality gain", "level": level}
            for tag, backs in modes:
                r = B.nstar_interval(rows, _series_key(b), _series_key(a), COST, backs, backs, n_boot, level, seed)
                if r["reps"] <= 1:  # one timing per point: the bootstrap has nothing to resample
                    r.update(lo=nan, hi=nan, p_cross=nan)
                r["check"] = "/".join(sorted({c for v, c in checks[tag] if v in (a, b)})) or "-"
                row.update({f"{tag}_{k}": v for k, v in r.items()})
            x, y = _f(row["ours_n_star"]), _f(row["best_n_star"])
            row["shift"] = y / x if x > 0 and y > 0 else nan
            row["conclusion"] = B.conclusion(row) + (f"; {NO_REPS}" if min(row["ours_reps"], row["best_reps"]) <= 1
                                                     else "")
            out.append(row)
    return out


def _nstar_cell(r: dict, tag: str, short: bool = False) -> str:
    """n* of one side of a :func:`compare_nstar` row with its interval, else its status (``short``: a few words)."""
    from eval.best import fmt_interval
    from eval.crossover import STATUS_AHEAD_THEN_BEHIND, STATUS_ALWAYS, STATUS_CROSS, STATUS_NEVER, STATUS_TIE, \
        status_note

    status = str(r[f"{tag}_status"])
    if status == STATUS_AHEAD_THEN_BEHIND and short:  # no n*: where it is ahead
        a, b = _f(r.get(f"{tag}_ahead_from")), _f(r.get(f"{tag}_ahead_until"))
        return f"ahead only in [{a:.0f}, {b:.0f}]" if math.isfinite(a) and math.isfinite(b) else "ahead, then behind"
    if status != STATUS_CROSS:
        return {STATUS_ALWAYS: "ahead everywhere", STATUS_NEVER: "never (behind)",
                STATUS_TIE: "equal everywhere"}.get(status, status) if short \
            else status_note(r, f"{tag}_")
    return fmt_interval(r[f"{tag}_n_star"], r[f"{tag}_lo"], r[f"{tag}_hi"])


def nstar_line(r: dict) -> str:
    """One line of a :func:`compare_nstar` row: both n* with intervals and implementations, and the conclusion."""
    sides = "; ".join(f"{tag} vs {tag} {_nstar_cell(r, tag)} ({r[f'{tag}_impl_variant']} vs "
                      f"{r[f'{tag}_impl_baseline']}, {r[f'{tag}_check']})" for tag in ("ours", "best"))
    return f"[{r['dataset']}] {r['variant']} vs {r['baseline']} ({r['pair']}): {sides}. {r['conclusion']}"


def nstar_figure(rows: Sequence[dict], table: Sequence[dict], ours: Sequence[str] = ("triton", "parallel"),
                 title: Optional[str] = None, caption: Optional[str] = None):
    """Step time per unit of quality vs N (:func:`cost_rows` of one dataset), one panel ours vs ours, one best vs
    best, each point labelled with the implementation behind it (``?`` after an unchecked one), a dotted line at
    each leader change's n* of that mode; and a table panel of every n* both ways with the shift
    (:func:`compare_nstar` rows ``table``). Returns an :class:`eval.figspec.Figure`."""
    from eval import figspec
    from eval.best import pick_best
    from eval.crossover import STATUS_CROSS
    from eval.plots import variant_style

    panels, names = [], sorted({r["variant"] for r in rows})
    for tag, backs in (("ours", list(ours)), ("best", None)):
        what = f"ours vs ours ({'/'.join(ours)})" if tag == "ours" else "best vs best (fastest correct)"
        p = figspec.Panel(what, "sequence length N", "step time per unit quality (ms)", xlog=2, ylog=True,
                          note="no rows")
        picks = pick_best(rows, COST, backs)
        for v in names:
            pts = sorted((r for r in picks if r["variant"] == v), key=lambda r: int(r["seq_len"]))
            if pts:
                labels = [r["impl"] + ("?" if r["impl_check"] == "unchecked" else "") for r in pts]
                p.traces.append(figspec.Trace(  # the implementation named where it starts and where it changes
                    v, [float(r["seq_len"]) for r in pts], [_f(r[COST]) for r in pts], variant_style(v),
                    text=[x if i == 0 or x != labels[i - 1] else "" for i, x in enumerate(labels)],
                    hover=[f"{v}, N {r['seq_len']}: {_f(r[COST]):.4g} ms per unit quality on {r['impl']} "
                           f"(check {r['impl_check']}; candidates {r['candidates']})" for r in pts],
                    meta={"variant": v, "mode": tag}))
        for r in table:
            if f"leader change ({tag})" in r["pair"] and r[f"{tag}_status"] == STATUS_CROSS:
                p.vlines.append((_f(r[f"{tag}_n_star"]), {"color": variant_style(r["variant"])["color"], "ls": ":",
                                                          "lw": 1.2}))
        panels.append(p)
    cells = [[f"{r['variant']} vs {r['baseline']}", _nstar_cell(r, "ours", True), _nstar_cell(r, "best", True),
              "-" if not math.isfinite(_f(r["shift"])) else f"{_f(r['shift']):.2f}x"] for r in table]
    panels.append(figspec.Panel("n* of quality per unit time", "", "", note="no pair to compare",
                                table=(["variant vs old leader / baseline", "ours vs ours", "best vs best", "shift"],
                                       cells, [variant_style(r["variant"])["color"] for r in table],
                                       [0.42, 0.24, 0.24, 0.10])))
    head = ("Where does each variant give more quality per unit of training time? n* ours vs ours and best vs best "
            "(labels: the implementation, where it starts or changes; ?: unchecked)")
    return figspec.Figure(head + (f"\n{title}" if title else "") + (f"\n{caption}" if caption else ""), panels,
                          legend=[(v, dict(variant_style(v), ls="-")) for v in names], ncols=3, panel_w=5.0)


def report_unmatched(unmatched: Sequence[tuple], unused: Sequence[tuple], speed: str) -> None:
    """Print the quality rows without a benchmark row and the benchmark rows without runs."""
    if unmatched:
        print(f"speed={speed}: no benchmark row for {len(unmatched)} quality row(s) (left out of the bubble chart "
              f"and leaders): " + ", ".join(f"{d}/{v}@{n}" for d, v, n in unmatched))
    if unused:
        print(f"speed={speed}: {len(unused)} benchmark row(s) match no run: "
              + ", ".join(f"{v}@{n}" for v, n in unused))


def join_speed(agg: Sequence[dict], speed_rows: Optional[Sequence[dict]] = None) -> List[dict]:
    """Bubble-chart rows: quality joined with speed / memory. With ``speed_rows`` (``eval.sweep`` model CSV:
    ``variant``, ``seq_len``, ``train_tokens_per_s``, ``train_peak_mem_bytes``) those replace the runs' own
    throughput and memory where (variant, seq_len) match (e.g. GPU speed for CPU-trained quality)."""
    sp = {}
    for r in speed_rows or []:
        if r.get("status", "ok") == "ok":
            sp[(r["variant"], int(_f(r["seq_len"])))] = r
    out = []
    for r in agg:
        row = dict(r)
        s = sp.get((r["variant"], r["seq_len"]))
        if s is not None:
            row["tokens_per_s"] = _f(s.get("train_tokens_per_s"))
            m = _f(s.get("train_peak_mem_bytes"))
            row["peak_mem_mb"] = m / 2**20 if math.isfinite(m) else row["peak_mem_mb"]
            row["speed_source"] = "sweep"
        out.append(row)
    return out


# --------------------------------------------------------------------------------------------- figures / io
def quality_figures(quality_csv: str, figures_dir: str, speed_csv: Optional[str] = None, prefix: str = "",
                    title: Optional[str] = None, speed: Optional[str] = None, speed_backend: str = "triton",
                    speed_size: Optional[str] = None, nstar: Optional[Sequence[dict]] = None,
                    ours: Sequence[str] = ("triton", "parallel")) -> Dict[str, List[str]]:
    """Quality-vs-N and one bubble chart per dataset from ``runs_agg.csv`` next to ``quality_csv``; speed and
    memory from ``speed`` (an ``eval.bench_model`` CSV, :func:`join_bench_speed`), else from ``speed_csv`` (an
    ``eval.sweep`` model CSV, :func:`join_speed`), else the runs' own. With ``speed``: also ``nstar_<dataset>``
    (:func:`nstar_figure` of ``nstar``, the :func:`compare_nstar` table, computed when not given), and the bubble
    chart's caption says which checks failed / are missing and gives each leader change's n* both ways."""
    from eval import figspec, plots
    from eval.bench_common import read_rows

    qdir = os.path.dirname(quality_csv)
    agg = [dict(r, seq_len=int(_f(r["seq_len"]))) for r in read_rows(os.path.join(qdir, "runs_agg.csv"))]
    long = read_rows(quality_csv)
    figs = {"quality_vs_n": plots.plot_quality_vs_n(long, os.path.join(figures_dir, f"{prefix}quality_vs_n"), title)}
    notes: List[str] = []
    if speed:
        rows = join_bench_speed(agg, load_bench_speed(speed, speed_backend, speed_size))[0]
        bench = bench_rows(speed, speed_size)
        notes = [_short(n) for n in check_notes(bench)]
        if nstar is None:
            nstar = compare_nstar(agg, bench, ours)
        for r in rows:  # the implementation behind each point, "?" after an unchecked one
            r["bench_impl"] = _impl(r) + ("?" if r.get("bench_check") == "unchecked" else "")
    else:
        rows = join_speed(agg, read_rows(speed_csv) if speed_csv else None)
    caption = speed_caption(speed, speed_csv, speed_backend, speed_size)
    for ds in sorted({r["dataset"] for r in rows}):
        q = QUALITY_METRICS.get(ds.split(":")[0], ("val_loss",))[0]
        lines = [f"n* {r['baseline']} -> {r['variant']}: ours vs ours {_nstar_cell(r, 'ours')}, best vs best "
                 f"{_nstar_cell(r, 'best')} ({r['best_impl_variant']} vs {r['best_impl_baseline']})"
                 for r in nstar or [] if r["dataset"] == ds and "leader change" in r["pair"]][:3]
        cap = "\n".join([caption] + notes + lines)
        figs[f"bubble_{ds}"] = plots.plot_bubble([r for r in rows if r["dataset"] == ds],
                                                 os.path.join(figures_dir, f"{prefix}bubble_{ds.replace(':', '_')}"),
                                                 quality=q, title=f"dataset {ds}" + (f" — {title}" if title else ""),
                                                 caption=cap,
                                                 impl="bench_impl" if speed and speed_backend == BEST else None)
        if speed:
            table = [r for r in nstar or [] if r["dataset"] == ds]
            reps = any(min(r["ours_reps"], r["best_reps"]) > 1 for r in table)
            cap = "\n".join([caption + "; quality: the runs' (fixed)", "intervals: bootstrap over the timed steps "
                              f"(eval.best), level {table[0]['level'] if table else 0.95}" if reps else NO_REPS]
                             + notes)
            figs[f"nstar_{ds}"] = figspec.to_png(
                nstar_figure([r for r in cost_rows([a for a in agg if a["dataset"] == ds], bench)], table, ours,
                             f"dataset {ds}" + (f" — {title}" if title else ""), cap),
                os.path.join(figures_dir, f"{prefix}nstar_{ds.replace(':', '_')}"))
    return figs


def _short(note: str, n: int = 180) -> str:
    """A caption line of at most ``n`` characters."""
    return note if len(note) <= n else note[: n - 3] + "..."


def check_config(cfg: dict) -> None:
    """:func:`run`'s settings before anything is read or written: ``compare`` (ours | best), ``formats``, ``n_boot``
    (an integer >= 1), ``level`` (in (0, 1)), the roots of ``runs`` and the files ``speed`` / ``speed_csv``
    (there). Raises ``ValueError`` / ``FileNotFoundError`` naming the key and the allowed values."""
    from eval.plots import check_formats

    compare = str(cfg.get("compare") or "ours")
    if compare not in ("ours", BEST):
        raise ValueError(f"compare={compare!r} is not supported; allowed values: ours, {BEST}")
    check_formats(cfg.get("formats"))
    check_out_dir(cfg.get("out_dir"), "out_dir")
    check_out_dir(cfg.get("figures_dir"), "figures_dir")
    from eval.best import check_bootstrap

    check_bootstrap(cfg.get("n_boot"), cfg.get("level"))
    roots = cfg.get("runs") or []
    missing = [r for r in ([roots] if isinstance(roots, str) else list(roots)) if not os.path.isdir(str(r))]
    if missing and not cfg.get("wandb_project"):
        raise FileNotFoundError(f"runs={[str(r) for r in missing]}: no such folder (roots searched for finished "
                                f"training runs: <run>/.hydra/config.yaml + <run>/csv/metrics.csv)")
    for key in ("speed", "speed_csv"):
        if cfg.get(key) and not os.path.isfile(str(cfg[key])):
            raise FileNotFoundError(f"{key}={cfg[key]}: no such file")


def check_nstar_baseline(baseline: str, agg: Sequence[dict], used: bool, given: bool = True) -> None:
    """``nstar_baseline`` names a variant of the aggregated runs ``agg``, else ``ValueError`` naming it and the
    variants present. Checked when the n* table is made (``used``: a ``speed=`` CSV) or the value is not the
    default (``given``: a misspelt name was accepted in silence); without ``speed=`` the default (flash) may be
    absent: nothing reads it."""
    variants = sorted({str(r["variant"]) for r in agg})
    if (used or given) and baseline not in variants:
        raise ValueError(f"nstar_baseline={baseline!r} is not a variant of the runs; allowed values: "
                         f"{', '.join(variants) or '(no run with a seq_len)'}")


def run(cfg: dict) -> dict:
    """Collect runs (``runs``: list of roots; ``wandb_project`` / ``wandb_group`` optional), write the tables to
    ``out_dir``, draw the figures (``plots``), log to W&B (``wandb.enabled``); print where the tables went and a
    short summary. Returns the tables. Bad settings and missing inputs raise before anything is written, as
    :class:`harness.config.ConfigError` / ``ConfigFileError`` (Hydra prints the message alone)."""
    from eval import config_errors

    with config_errors():
        check_config(cfg)
    roots = cfg.get("runs") or []
    roots = [roots] if isinstance(roots, str) else list(roots)
    runs = [load_run(d) for d in find_runs(roots)]
    if cfg.get("wandb_project"):
        runs += load_wandb_runs(cfg["wandb_project"], cfg.get("wandb_group"), cfg.get("wandb_entity"))
    if not runs:
        with config_errors():
            raise FileNotFoundError(f"no finished training runs (.hydra/config.yaml + csv/metrics.csv) under {roots}; "
                                    f"train them first (e.g. python train.py -m experiment=crossover_quality writes "
                                    f"multirun/crossover_quality) or pass runs=[<multirun folder>, ...]")
    speed, sb, ss = cfg.get("speed"), cfg.get("speed_backend") or "triton", cfg.get("speed_size")
    compare = str(cfg.get("compare") or "ours")
    if compare == BEST:  # the fastest implementation per variant and length (named in speed_source)
        sb = BEST
    bench_speed = bench = None
    if speed:
        with config_errors():  # speed_backend / speed_size not in the table: named, before anything is written
            bench_speed, bench = load_bench_speed(speed, sb, ss), bench_rows(speed, ss)
    baseline = str(cfg.get("nstar_baseline") or NSTAR_BASELINE)
    with config_errors():  # runs of one group with different settings, an unknown baseline: before anything is written
        try:
            agg = aggregate(runs)
        except ValueError as e:
            raise ValueError(f"runs={[str(r) for r in roots]}: {e}") from None
        check_nstar_baseline(baseline, agg, bool(speed), cfg.get("nstar_baseline") is not None
                             and baseline != NSTAR_BASELINE)
    out_dir = cfg.get("out_dir") or "results/quality"
    os.makedirs(out_dir, exist_ok=True)
    long = long_form(agg)
    ours = cfg.get("ours") or ["triton", "parallel"]
    ours = [ours] if isinstance(ours, str) else list(ours)
    joined, unmatched, nstar = None, [], None
    if speed:  # speed / memory of the serial model-level benchmark, not of the (possibly parallel) training runs
        joined, unmatched, unused = join_bench_speed(agg, bench_speed)
        report_unmatched(unmatched, unused, speed)
        for note in check_notes(bench):
            print(f"speed={speed}: {note}")
        write_csv(joined, os.path.join(out_dir, "quality_speed_memory.csv"))
        # n* of quality per unit time both ways: ours vs ours, best vs best, bootstrap intervals over the steps
        nstar = compare_nstar(agg, bench, ours, baseline,
                              int(cfg.get("n_boot") or 1000), float(cfg.get("level") or 0.95))
        write_csv(nstar, os.path.join(out_dir, "nstar_compare.csv"), columns=NSTAR_COLUMNS)
        for r in nstar:
            print(nstar_line(r))
    lead = leaders(joined if joined is not None else agg)
    write_csv([{k: v for k, v in r.items() if k != "settings"} for r in runs], os.path.join(out_dir, "runs.csv"))
    write_csv(agg, os.path.join(out_dir, "runs_agg.csv"))
    qcsv = write_csv(long, os.path.join(out_dir, "quality.csv"))
    write_csv(lead, os.path.join(out_dir, "leaders.csv"))
    figs = {}
    if cfg.get("plots", True):
        from eval.plots import set_formats

        set_formats(cfg.get("formats"))
        figs = quality_figures(qcsv, cfg.get("figures_dir") or out_dir, speed_csv=cfg.get("speed_csv"),
                               prefix=cfg.get("prefix") or "", title=cfg.get("title"), speed=speed,
                               speed_backend=sb, speed_size=ss, nstar=nstar, ours=ours)
    wb = cfg.get("wandb") or {}
    wdir = None
    if wb.get("enabled", False):
        from eval.wandb_log import log_results

        wdir = log_results(name=cfg.get("name") or "quality", group=wb.get("group", "crossover"),
                           project=wb.get("project", "attn-zoo"),
                           tables={"runs": agg, "quality": long, "leaders": lead,
                                   **({"nstar_compare": nstar} if nstar else {})},
                           images={k: v[0] for k, v in figs.items()}, config={"roots": roots},
                           mode=wb.get("mode", "auto"), dir=wb.get("dir") or out_dir, job_type="quality")
    for r in lead:
        if r["kind"] == "crossover":
            ns = "-" if not math.isfinite(_f(r["n_star"])) else f"{_f(r['n_star']):.0f}"
            print(f"[{r['dataset']}] {r['leader']}: n*={ns} {r['status']}")
    datasets = sorted({str(r.get("dataset")) for r in agg})
    n_cross = sum(r["kind"] == "crossover" for r in lead)
    tables = ["runs.csv", "runs_agg.csv", "quality.csv", "leaders.csv"]
    tables += ["quality_speed_memory.csv", "nstar_compare.csv"] if speed else []
    print(f"{len(runs)} runs ({len(agg)} variant x length x dataset points; datasets: {', '.join(datasets)}; "
          f"{n_cross} leader change{'s' if n_cross != 1 else ''}) -> tables in {os.path.abspath(out_dir)} "
          f"({', '.join(tables)}); {sum(len(v) for v in figs.values())} figure files in "
          f"{os.path.abspath(cfg.get('figures_dir') or out_dir)}" + (f"; W&B run in {wdir}" if wdir else ""))
    return {"runs": runs, "agg": agg, "quality": long, "leaders": lead, "figures": figs, "wandb_dir": wdir,
            "joined": joined, "unmatched": unmatched, "nstar": nstar}


if __name__ == "__main__":  # pragma: no cover - exercised through the CLI
    from eval import hydra_cli

    hydra_cli("quality", run)
