"""Recall and language-modelling reports of issue 13, from finished ``train.py`` run folders.

    python -m eval.recall <kind> runs=[<multirun dir>,...] out_dir=<dir> [select=best|last] [speed=<csv>]

Each kind writes ``<out_dir>/<kind>.csv`` and ``<out_dir>/<kind>.png`` and prints where:

* ``fig2`` (Zoology, Arora et al. 2023, Fig. 2): MQAR accuracy ``val/acc`` vs ``model.d_model`` (log2 axis), one
  panel per ``data.seq_len``, one line per variant (``attention.name``; linear kinds with their
  ``attention.feature_map``; window kinds with their left window), the **best over** ``optim.lr`` per (variant,
  seq_len, d_model) (runs of one lr, e.g. seeds, averaged first); dashed line at the chance level
  ``1 / data.num_kv_pairs``.
* ``cliff``: the window recall cliff, ``val/acc_far`` / ``val/acc_near`` (queries whose key lies beyond / within
  the sliding window, logged by :class:`harness.callbacks.RecallByDistance`) and ``val/acc`` vs the left window
  ``attention.window_size[0]``, one panel per ``data.seq_len``; a vertical line at the median query-key distance
  (where ``val/frac_far`` crosses 1/2, else from the MQAR generator with the runs' data config); full-attention
  runs at the same length as a horizontal reference.
* ``hybrid``: accuracy vs ``k``, the number of ``flash`` entries in ``model.layers``, one line per base mixer
  (the non-flash entries); all-flash runs are the ``k = L`` end of every line. With ``speed=<eval.bench_model
  CSV>`` a second row of panels shows that benchmark's tokens/s for the rows it has (``variant`` = the layers
  joined by ``+``, or the pure variant at ``k = 0`` / ``k = L``); what it lacks is said in the caption, nothing is
  interpolated.
* ``lm``: ``val/bpb`` vs ``data.seq_len`` (log2 axis) per variant and text data set, best over ``optim.lr``,
  the token budget ``trainer.max_steps * data.batch_size * data.seq_len`` in the title (a warning when it differs
  between runs), every variant labelled with its parameter count (GQA / MQA vs MHA).
* ``ablation`` (``experiment=mqar_old_recipe``): one row and one horizontal bar per option of the swept config group
  ``mqar_change`` (``old``, the control, first; then by ``val/acc``, highest first). A run's option is
  ``hydra.runtime.choices.mqar_change`` of its ``.hydra/hydra.yaml``, else the ``+mqar_change=<option>`` entry of
  ``.hydra/overrides.yaml``; runs without one are left out. The change an option makes is what differs between its
  resolved config and the ``old`` run's (``model.n_layer: 4 -> 2``; without an ``old`` run: the keys of
  ``conf/mqar_change/<option>.yaml``); columns ``option, setting, old_value, value, change, label, acc, step,
  steps_run, finished, max_steps, chance, delta_vs_old, lr, n_runs, acc_from``. The figure: the control bar grey,
  unfinished runs hatched, dashed line at chance, solid line at the 0.99 target.
* ``curves``: learning curves, ``val/acc`` vs training step, one panel per (variant, ``data.seq_len``,
  ``model.d_model``) cell, one line per run, coloured by ``optim.lr`` and styled by ``trainer.max_steps`` (e.g.
  ``experiment=mqar_fig2_long`` beside ``mqar_fig2``: does a longer cosine schedule let recall form?). Narrow the
  cells with ``seq_len=``, ``d_model=`` and ``variant=`` (a line label such as ``linear (elu1)``, or the config's
  ``attention.name`` such as ``linear``); more than 12 cells is an error naming them. The CSV has one row per
  (run, validation). ``select`` does not apply: every validation is drawn.

``seq_len`` / ``d_model`` / ``variant`` / ``speed`` given to a kind that does not take them (see
:data:`FILTER_KINDS`), or a ``seq_len`` / ``d_model`` that is not an integer, raise ``ValueError`` naming the
argument before any run is read; from the command line every ``ValueError`` is one line ``eval.recall: error:
...`` and exit status 2.

Which validation: ``select=best`` (default) takes the validation with the highest ``val/acc`` (``lm``: lowest
``val/bpb``), as Zoology reports the best; ``cliff`` reads ``val/acc_far`` / ``val/acc_near`` of that same
validation. ``select=last``: the last validation. Runs are read with :func:`eval.quality.find_runs` and
:func:`eval.quality.load_run` (``.hydra/config.yaml`` + ``csv/metrics.csv``), plus ``final_metrics.json`` (its
metrics count as one more validation, its ``n_params`` as the parameter count) and the resolved config that
``train.py`` logs to ``csv/hparams.yaml`` (``.hydra/config.yaml`` keeps Hydra's interpolations).

Steps: the ``step`` (of a validation) and ``steps_run`` columns count optimizer steps, as ``final_metrics.json``'s
``steps`` and ``trainer.max_steps`` do (a finished 6-step run: ``steps_run`` 6; its validation after 3 steps:
``step`` 3), not ``metrics.csv``'s 0-based logging step (:func:`optimizer_steps`).

No matching run raises ``ValueError`` naming the argument (``runs``, ``kind``, ``seq_len``; ``ablation``: no run with
a ``mqar_change`` option under ``runs``): no silent empty plot.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import warnings
from typing import List, Optional, Sequence

import numpy as np
import pandas as pd

from eval.bench_common import check_out_dir, write_csv
from eval.crossover import _f
from eval.quality import find_runs, flat_config, fmt_value, load_run, read_metrics, result_settings

KINDS = ("fig2", "cliff", "hybrid", "lm", "ablation", "curves")
MQAR_KINDS = ("fig2", "cliff", "hybrid", "curves")  # the reports of MQAR runs (data=mqar)
# the arguments that narrow or extend a report, and the kinds that take them (any other kind refuses them)
FILTER_KINDS = {"seq_len": ("cliff", "hybrid", "curves"), "d_model": ("curves",), "variant": ("curves",),
                "speed": ("hybrid",), "speed_size": ("hybrid",)}
FULL = "flash"  # the full-attention layer name of model.layers


# --------------------------------------------------------------------------------------------- reading runs
def _resolve_each(node):
    """An OmegaConf node as plain containers, each interpolation resolved on its own (None where it cannot be
    outside Hydra, e.g. ``${hydra:runtime.output_dir}``)."""
    from omegaconf import DictConfig, ListConfig

    if isinstance(node, DictConfig):
        out = {}
        for k in node.keys():
            try:
                v = node[k]
            except Exception:  # noqa: BLE001 - an unresolvable interpolation
                v = None
            out[str(k)] = _resolve_each(v)
        return out
    if isinstance(node, ListConfig):
        out = []
        for i in range(len(node)):
            try:
                v = node[i]
            except Exception:  # noqa: BLE001
                v = None
            out.append(_resolve_each(v))
        return out
    return node


def _register_resolvers() -> None:
    from harness.runs import register_resolvers  # the one registration (stored configs use ${attn_zoo.div:..})

    register_resolvers()


def read_config(run_dir: str) -> dict:
    """The run's resolved config: ``csv/hparams.yaml``'s ``config`` (what ``train.py`` logged, resolved), else
    ``.hydra/config.yaml`` with each interpolation resolved where it can be."""
    import yaml
    from omegaconf import OmegaConf

    hp = os.path.join(run_dir, "csv", "hparams.yaml")
    if os.path.exists(hp):
        try:
            with open(hp) as f:
                d = yaml.safe_load(f) or {}
            if isinstance(d.get("config"), dict):
                return d["config"]
        except yaml.YAMLError:
            pass
    _register_resolvers()
    return _resolve_each(OmegaConf.load(os.path.join(run_dir, ".hydra", "config.yaml")))


def optimizer_steps(step, final: Optional[dict] = None):
    """The optimizer steps done at each ``step`` of a run's ``metrics.csv`` (a number or a pandas Series), the count
    ``final_metrics.json``'s ``steps`` and ``trainer.max_steps`` use. Lightning logs the metrics of the k-th
    optimizer step, and a validation run after it, at its 0-based ``step`` k - 1; ``train.py``'s own final validation
    (logged when the fit did not validate the last step; every run before the final validation was logged once) is
    logged at ``global_step`` itself, ``final["steps"]``. So: ``step + 1``, except a row at ``final["steps"]``, which
    is kept, and nothing counts past ``final["steps"]`` (a run resumed under an older train.py logged its later
    validations one step late); a run without ``final_metrics.json`` (cut off) has only fit rows: all ``+ 1``."""
    fs = _f((final or {}).get("steps"))
    if isinstance(step, pd.Series):
        return (step + 1).where(~(step >= fs), fs) if math.isfinite(fs) else step + 1  # NaN stays NaN
    step = _f(step)
    return fs if math.isfinite(fs) and step >= fs else step + 1


def val_points(rows, final: Optional[dict] = None) -> List[dict]:
    """One dict per validation (rows of the same ``step`` merged: Lightning may write a step's metrics in several
    rows), with every finite ``val/*`` value, sorted by step; ``final`` (``final_metrics.json``) adds its metrics
    as the validation at its ``steps`` when the CSV has none there. ``rows``: the metrics table
    (:func:`eval.quality.read_metrics`) or its rows as dicts. ``step``: the optimizer steps done before the
    validation (:func:`optimizer_steps`: 1-based, as ``final_metrics.json`` counts; metrics.csv's ``step`` is
    Lightning's 0-based logging step)."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    vals = df[[c for c in df.columns if str(c).startswith("val/")]].apply(pd.to_numeric, errors="coerce").astype(float)
    vals = vals.where(np.isfinite(vals))
    step = pd.to_numeric(df["step"], errors="coerce").astype(float) if "step" in df else pd.Series(np.nan, df.index)
    step = optimizer_steps(step, final)
    merged = vals.groupby(step.where(np.isfinite(step), -1.0)).last()  # per step, the last value of each metric
    merged = merged.dropna(how="all")
    by_step = {float(s): r.dropna().to_dict() for s, r in merged.iterrows()}
    if final and final.get("metrics"):
        fvals = {k: _f(v) for k, v in final["metrics"].items() if k.startswith("val/") and math.isfinite(_f(v))}
        s = float(_f(final.get("steps")))
        s = s if math.isfinite(s) else max(by_step, default=0.0) + 1
        if fvals:
            by_step[s] = {**fvals, **by_step.get(s, {})}
    return [dict(v, step=s) for s, v in sorted(by_step.items())]


def pick(points: Sequence[dict], metric: str = "val/acc", select: str = "best", higher: bool = True) -> dict:
    """The validation ``select``-ed on ``metric``: ``best`` (max, or min with ``higher=False``) or ``last``;
    ``{}`` when no validation has it."""
    have = [p for p in points if math.isfinite(_f(p.get(metric)))]
    if not have:
        return {}
    if select == "last":
        return have[-1]
    if select != "best":
        raise ValueError(f"select={select!r}: allowed values: best, last")
    return (max if higher else min)(have, key=lambda p: _f(p[metric]))


def _get(cfg: dict, path: str, default=None):
    node = cfg
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


def _layer_name(entry) -> str:
    if isinstance(entry, dict):
        return str(entry.get("name") or entry.get("kind") or entry.get("mixer") or "?")
    return str(entry)


def _fields_read(kind: str) -> tuple:
    """The spec fields the variant ``kind`` reads (none for a kind not registered here, e.g. an old run's)."""
    from attn_zoo.variants import get_variant

    try:
        return get_variant(kind).fields
    except ValueError:
        return ()


def variant_label(cfg: dict) -> str:
    """Line label of a run: ``model.layers`` joined by ``+`` for hybrids, else ``attention.name``, with the feature
    map of linear kinds (``linear (elu1)``; a name that already says it, e.g. ``linear_taylor``, stays) and the left
    window of window kinds (``sliding_window (w=31)``)."""
    layers = _get(cfg, "model.layers")
    if layers:
        return "+".join(_layer_name(x) for x in layers)
    att = _get(cfg, "attention", {}) or {}
    name = str(att.get("name") or att.get("kind") or "unknown")
    kind = str(att.get("kind") or name)
    reads = _fields_read(kind)
    if "feature_map" in reads and att.get("feature_map") and str(att["feature_map"]) not in name:
        name += f" ({att['feature_map']})"
    ws = att.get("window_size")
    if "window_size" in reads and isinstance(ws, (list, tuple)) and ws:
        name += f" (w={ws[0]})"
    return name


def load_recall_run(run_dir: str) -> dict:
    """One run for the reports: :func:`eval.quality.load_run`'s summary plus the resolved config, every validation
    (:func:`val_points`), ``final_metrics.json`` and the settings the reports group by."""
    base = load_run(run_dir)
    cfg = read_config(run_dir)
    final = {}
    fpath = os.path.join(run_dir, "final_metrics.json")
    if os.path.exists(fpath):
        try:
            with open(fpath) as f:
                final = json.load(f) or {}
        except (OSError, ValueError):
            final = {}
    metrics = read_metrics(run_dir)
    logged = metrics["model/n_params"].dropna() if "model/n_params" in metrics else []
    n_params = _f(final.get("n_params"))
    if not math.isfinite(n_params) and len(logged):
        n_params = float(logged.iloc[0])
    if not math.isfinite(n_params):
        hp = os.path.join(run_dir, "csv", "hparams.yaml")
        if os.path.exists(hp):
            import yaml

            with open(hp) as f:
                n_params = _f((yaml.safe_load(f) or {}).get("n_params"))
    seq_len = _f(_get(cfg, "data.seq_len"))
    seq_len = int(seq_len) if math.isfinite(seq_len) else base["seq_len"]
    layers = _get(cfg, "model.layers")
    n_layer = len(layers) if layers else int(_f(_get(cfg, "model.n_layer", float("nan"))) or 0)
    att = _get(cfg, "attention", {}) or {}
    ws = att.get("window_size")
    return dict(base, run_dir=run_dir, cfg=cfg, final=final, vals=val_points(metrics, final),
                seq_len=seq_len, label=variant_label(cfg), lr=_f(_get(cfg, "optim.lr")),
                d_model=int(_f(_get(cfg, "model.d_model", float("nan")))) if math.isfinite(
                    _f(_get(cfg, "model.d_model"))) else -1,
                n_layer=n_layer, layers=[_layer_name(x) for x in layers] if layers else None,
                attention=att.get("name") or att.get("kind"), attention_kind=att.get("kind"),
                window=int(ws[0]) if isinstance(ws, (list, tuple)) and ws and ws[0] is not None else None,
                num_kv_pairs=_f(_get(cfg, "data.num_kv_pairs")), n_params=n_params,
                batch_size=_f(_get(cfg, "data.batch_size")), max_steps=_f(_get(cfg, "trainer.max_steps")),
                steps_done=_f(final.get("steps")) if final else float(base.get("steps") or "nan"),
                finished=bool(final), steps_run=_steps_run(metrics, final),
                date=_run_date(run_dir))


def _steps_run(metrics: pd.DataFrame, final: Optional[dict]) -> float:
    """Optimizer steps a run's ``metrics.csv`` reaches (:func:`optimizer_steps` of its largest ``step``; NaN
    without one): a finished run's ``trainer.max_steps`` / ``final_metrics.json`` ``steps``."""
    if "step" not in metrics:
        return float("nan")
    last = pd.to_numeric(metrics["step"], errors="coerce").max()
    return float(optimizer_steps(float(last), final)) if math.isfinite(_f(last)) else float("nan")


_LOG_DATE = re.compile(r"^\[(\d{4}-\d{2}-\d{2}) ")


def _run_date(run_dir: str) -> str:
    """The day a run ended, from what the run wrote, never from file times (a clone sets those to its own day):
    ``final_metrics.json``'s ``date`` (train.py writes it), else the last dated line of ``train.log`` (Hydra's
    ``[YYYY-MM-DD hh:mm:ss,ms]`` prefix), else ``""`` (the run is left out of the caption's date span)."""
    try:
        with open(os.path.join(run_dir, "final_metrics.json")) as f:
            date = json.load(f).get("date")
        if isinstance(date, str) and date:
            return date
    except (OSError, ValueError, AttributeError):
        pass
    last = ""
    try:
        with open(os.path.join(run_dir, "train.log"), errors="replace") as f:
            for line in f:
                m = _LOG_DATE.match(line)
                if m:
                    last = m.group(1)
    except OSError:
        pass
    return last


def load_runs(roots) -> List[dict]:
    """Every run under ``roots`` (a path or a list); ``ValueError`` naming ``runs`` when there is none."""
    if roots is None or roots == "" or roots == []:
        raise ValueError("runs is empty: pass runs=[<multirun dir>,...] (folders holding train.py runs)")
    roots = [roots] if isinstance(roots, str) else [str(r) for r in roots]
    missing = [r for r in roots if not os.path.isdir(r)]
    if missing:
        raise ValueError(f"runs={roots}: {missing} not a directory")
    dirs = find_runs(roots)
    if not dirs:
        raise ValueError(f"runs={roots}: no train.py run folder (.hydra/config.yaml + csv/metrics.csv) under them")
    return [load_recall_run(d) for d in dirs]


# --------------------------------------------------------------------------------------------- tables
def best_over_lr(recs: Sequence[dict], keys: Sequence[str], value: str, higher: bool = True) -> List[dict]:
    """Per group of ``keys``: runs of the same ``lr`` averaged (seeds), then the ``lr`` with the best mean ``value``
    (max, or min with ``higher=False``). Rows: the keys, ``value``, ``best_lr``, ``lrs`` (tried, ``;``-joined),
    ``n_runs``, and the other numeric columns of the records, averaged at the best lr."""
    import pandas as pd

    df = pd.DataFrame([{k: v for k, v in r.items() if not isinstance(v, (dict, list))} for r in recs])
    df = df[pd.to_numeric(df[value], errors="coerce").notna()] if value in df.columns else df.iloc[0:0]
    if df.empty:
        return []
    keys = list(keys)
    df = df.assign(lr=df["lr"].fillna(-1.0))
    num = [c for c in df.columns if c not in keys + ["lr"] and pd.api.types.is_numeric_dtype(df[c])]
    per_lr = df.groupby(keys + ["lr"], dropna=False)[num].mean().reset_index()
    per_lr["n_runs"] = df.groupby(keys + ["lr"], dropna=False).size().values
    lrs = df.groupby(keys, dropna=False)["lr"].apply(lambda s: ";".join(f"{x:g}" for x in sorted(set(s))))
    idx = (per_lr.groupby(keys, dropna=False)[value].idxmax() if higher
           else per_lr.groupby(keys, dropna=False)[value].idxmin())
    best = per_lr.loc[idx.values].rename(columns={"lr": "best_lr"})
    best = best.merge(lrs.rename("lrs").reset_index(), on=keys, how="left")
    cols = keys + [value, "best_lr", "lrs", "n_runs"] + [c for c in best.columns if c not in keys + [
        value, "best_lr", "lrs", "n_runs"]]
    return best[cols].sort_values(keys).to_dict("records")


def _setup(recs: Sequence[dict], extra: str = "") -> str:
    """One line: data set, vocab, layers, d_model, batch, steps, lrs, number of runs, dates."""

    def span(vals, fmt="{:g}"):
        vals = sorted({v for v in vals if v is not None and not (isinstance(v, float) and not math.isfinite(v))})
        if not vals:
            return None
        return fmt.format(vals[0]) if len(vals) == 1 else f"{fmt.format(vals[0])}-{fmt.format(vals[-1])}"

    parts = []
    ds = span([r["dataset"] for r in recs], "{}")
    if ds:
        parts.append(ds.replace("mqar", "MQAR"))
    for lab, vals, fmt in (("vocab", [_f(_get(r["cfg"], "data.vocab_size")) for r in recs], "{:.0f}"),
                           ("layers", [float(r["n_layer"]) for r in recs], "{:.0f}"),
                           ("batch", [r["batch_size"] for r in recs], "{:.0f}"),
                           ("max steps", [r["max_steps"] for r in recs], "{:,.0f}")):
        s = span(vals, fmt)
        if s:
            parts.append(f"{lab} {s}")
    lrs = sorted({r["lr"] for r in recs if math.isfinite(r["lr"])})
    if lrs:
        parts.append("lr ∈ {" + ", ".join(f"{x:g}" for x in lrs) + "}")
    parts.append(f"{len(recs)} runs")
    dates = span([r["date"] for r in recs if r["date"]], "{}")
    if dates:
        parts.append(dates)
    return " · ".join(parts) + (f" · {extra}" if extra else "")


def _mqar(recs: Sequence[dict], kind: str, roots) -> List[dict]:
    out = [r for r in recs if r["dataset"] == "mqar"]
    if not out:
        raise ValueError(f"{kind}: no MQAR run (data=mqar) under runs={roots}; found data sets "
                         f"{sorted({r['dataset'] for r in recs})}")
    return out


def _only(recs: List[dict], key: str, value, kind: str, roots) -> List[dict]:
    """The runs whose ``key`` equals ``value`` (``seq_len`` / ``d_model``: ints, checked by :func:`run`;
    ``variant``: the line label, e.g. ``linear (elu1)``, or the config's ``attention.name``, e.g. ``linear``);
    ``value=None`` keeps all. ``ValueError`` naming the argument and the values there when none matches."""
    if value is None:
        return recs
    if key == "variant":
        out = [r for r in recs if str(value) in (r["label"], str(r["attention"]))]
        there = sorted({r["label"] for r in recs} | {str(r["attention"]) for r in recs})
    else:
        out = [r for r in recs if r[key] == value]
        there = sorted({r[key] for r in recs})
    if not out:
        raise ValueError(f"{kind}: {key}={value} matches no run under runs={roots}; values there: {there}")
    return out


# --------------------------------------------------------------------------------------------- fig2
def _picked(recs: Sequence[dict], metric: str, select: str, higher: bool = True):
    """``(run, its selected validation)`` (:func:`pick`) of each run of ``recs`` that logged ``metric``."""
    for r in recs:
        p = pick(r["vals"], metric, select, higher=higher)
        if p:
            yield r, p


def _chance(num_kv_pairs) -> float:
    """MQAR accuracy by chance, ``1 / num_kv_pairs`` (NaN when the count is unknown)."""
    return 1.0 / num_kv_pairs if _f(num_kv_pairs) > 0 else float("nan")


def _acc_from(select: str) -> str:
    return "max over validations" if select == "best" else "last validation"


def _status(r: dict) -> dict:
    """``finished``: 1.0 when the run wrote ``final_metrics.json`` (reached ``trainer.max_steps`` or stopped early),
    0.0 when it was cut off (a time limit, a crash): its metrics stop at ``steps_run``. Averaged over the runs of a
    row, so a row with ``finished < 1`` holds unfinished runs."""
    return {"finished": 1.0 if r.get("finished") else 0.0, "steps_run": r.get("steps_run", float("nan"))}


def _coverage(recs: Sequence[dict], rows: Sequence[dict], metric: str, notes: Optional[List[str]] = None) -> str:
    """Caption note: runs cut off before the end, and runs dropped because they never validated (appended to
    ``notes`` too, when given and not empty)."""
    out = []
    unfinished = [r for r in recs if not r.get("finished")]
    if unfinished:
        out.append(f"{len(unfinished)} of {len(recs)} runs unfinished (cut off before max_steps; column "
                   f"'finished' < 1 in the CSV)")
    silent = [r for r in recs if not any(math.isfinite(_f(v.get(metric))) for v in r["vals"])]
    if silent:
        names = ", ".join(os.path.basename(r["run_dir"]) for r in silent[:3])
        out.append(f"{len(silent)} run(s) never logged {metric} and are not drawn ({names}"
                   f"{', ...' if len(silent) > 3 else ''})")
    for line in out:
        print(f"warning: {line}")
    if out and notes is not None:
        notes.append("; ".join(out))
    return "; ".join(out)


def fig2_table(recs: Sequence[dict], select: str = "best") -> List[dict]:
    """Zoology Fig. 2 rows: (variant, seq_len, d_model) -> accuracy, best over lr."""
    flat = [{"variant": r["label"], "seq_len": r["seq_len"], "d_model": r["d_model"], "lr": r["lr"],
             "max_steps": r["max_steps"], "acc": p["val/acc"], "step": p["step"], "num_kv_pairs": r["num_kv_pairs"],
             "n_params": r["n_params"], **_status(r)} for r, p in _picked(recs, "val/acc", select)]
    rows = best_over_lr(flat, ["variant", "seq_len", "d_model", "max_steps"], "acc")
    for row in rows:
        row["chance"], row["acc_from"] = _chance(row.get("num_kv_pairs")), _acc_from(select)
    return rows


def plot_fig2(rows: Sequence[dict], base: str, caption: str, select: str = "best") -> List[str]:
    """The PNG of :func:`eval.figspec.fig2` (the same definition the report draws)."""
    from eval import figspec

    return figspec.to_png(figspec.fig2(rows, caption, select), base)


# --------------------------------------------------------------------------------------------- cliff
def median_key_distance(rows: Sequence[dict]) -> float:
    """The window at which ``frac_far`` (share of queries beyond the window) crosses 1/2, linearly interpolated:
    the median query-key distance. NaN when the rows do not bracket 1/2."""
    pts = sorted((r["window"], _f(r.get("frac_far"))) for r in rows if math.isfinite(_f(r.get("frac_far"))))
    for (w0, f0), (w1, f1) in zip(pts, pts[1:]):
        if f0 >= 0.5 >= f1 and f0 != f1:
            return w0 + (f0 - 0.5) * (w1 - w0) / (f0 - f1)
    for w, f in pts:
        if f == 0.5:
            return float(w)
    return float("nan")


def generated_key_distance(cfg: dict, n: int = 256) -> float:
    """Median query-key distance of ``n`` MQAR examples generated with the run's data config (NaN if that fails)."""
    try:
        import torch

        from harness.callbacks import mqar_key_distance
        from harness.data import generate_mqar

        d = cfg.get("data") or {}
        x, y = generate_mqar(n, int(d["seq_len"]), int(d["vocab_size"]), int(d["num_kv_pairs"]),
                             float(d.get("power_a", 0.01)), 12345, bool(d.get("random_non_queries", True)))
        mask, dist = mqar_key_distance(x, y, int(d["num_kv_pairs"]))
        return float(torch.median(dist[mask].double()))
    except Exception:  # noqa: BLE001 - the marker is optional
        return float("nan")


def cliff_table(recs: Sequence[dict], select: str = "best") -> List[dict]:
    """Window recall cliff rows: (seq_len, d_model, window) -> acc, acc_far, acc_near, frac_far of the selected
    validation (best ``val/acc``), best over lr; full-attention runs as ``window = -1`` (``variant`` = their
    name)."""
    recs = [r for r in recs if (r["window"] is not None or r["attention_kind"] == FULL)  # hybrids: their own report
            and not (r["layers"] and any(x != r["layers"][0] for x in r["layers"]))]
    flat = [{"seq_len": r["seq_len"], "d_model": r["d_model"], "window": r["window"] if r["window"] is not None else -1,
             "lr": r["lr"], "variant": r["attention"], "acc": p["val/acc"], "acc_far": _f(p.get("val/acc_far")),
             "acc_near": _f(p.get("val/acc_near")), "frac_far": _f(p.get("val/frac_far")), "step": p["step"],
             "max_steps": r["max_steps"], **_status(r)} for r, p in _picked(recs, "val/acc", select)]
    return best_over_lr(flat, ["seq_len", "d_model", "max_steps", "window", "variant"], "acc")


CLIFF_METRICS = (("acc_far", "val/acc_far: key beyond the window", "tab:red", "v", "-"),
                 ("acc_near", "val/acc_near: key within the window", "tab:blue", "^", "-"),
                 ("acc", "val/acc: all queries", "black", "o", "--"))


def plot_cliff(rows: Sequence[dict], base: str, caption: str, recs: Sequence[dict]) -> List[str]:
    """Accuracy on far / near / all queries vs the window, one panel per (seq_len, d_model); full attention a grey
    dotted line, the median query-key distance a green one (:mod:`eval.figspec`). Adds ``median_key_distance`` to
    ``rows``."""
    from eval import figspec

    cells = sorted({(int(r["seq_len"]), int(r["d_model"])) for r in rows})
    multi_d = len({d for _, d in cells}) > 1
    full, dist = {"color": "gray", "ls": ":", "lw": 1.4}, {"color": "tab:green", "ls": "-.", "lw": 1.2}
    marks, panels = {}, []
    for n, d in cells:
        here = [r for r in rows if int(r["seq_len"]) == n and int(r["d_model"]) == d]
        sel = sorted([r for r in here if r["window"] >= 0], key=lambda r: r["window"])
        ws = [r["window"] for r in sel]
        md = median_key_distance(sel)
        if not math.isfinite(md):
            cfgs = [x["cfg"] for x in recs if x["seq_len"] == n]
            md = generated_key_distance(cfgs[0]) if cfgs else float("nan")
        marks[(n, d)] = md
        p = figspec.Panel(f"seq_len {n}" + (f", d_model {d}" if multi_d else ""),
                          "left window size (attention.window_size[0])", "MQAR accuracy", ylim=(0, 1.03),
                          xlog=2 if ws and min(ws) > 0 else 0, xticks=ws if ws and min(ws) > 0 else None,
                          hlines=[(_f(r["acc"]), full) for r in here if r["window"] < 0],
                          vlines=[(md, dist)] if math.isfinite(md) else [])
        for col, label, color, marker, ls in CLIFF_METRICS:
            pts = [(r["window"], _f(r[col])) for r in sel if math.isfinite(_f(r.get(col)))]
            if pts:
                p.traces.append(figspec.Trace(label, [x for x, _ in pts], [y for _, y in pts],
                                              {"color": color, "marker": marker, "ls": ls}))
        panels.append(p)
    legend = [(lab, {"color": c, "marker": m, "ls": ls}) for _, lab, c, m, ls in CLIFF_METRICS]
    if any(r["window"] < 0 for r in rows):
        legend.append(("full attention (no window), val/acc", full))
    if any(math.isfinite(v) for v in marks.values()):
        legend.append(("median query-key distance (larger windows see most keys)", dist))
    for row in rows:
        row["median_key_distance"] = marks.get((int(row["seq_len"]), int(row["d_model"])), float("nan"))
    return figspec.to_png(figspec.Figure(
        "How much recall does a sliding window lose for keys it cannot see? (window recall cliff)\n"
        "validation with the best val/acc, best over optim.lr · " + caption, panels, legend=legend, ncols=3,
        panel_w=4.4, panel_h=3.5, sharey=True), base)


# --------------------------------------------------------------------------------------------- hybrid
def hybrid_layout(r: dict) -> Optional[dict]:
    """``{k, L, base, layers}`` of a run: ``k`` = entries of ``model.layers`` equal to ``flash``, ``L`` = layers,
    ``base`` = the other entries' name (``None`` when every layer is flash); a run without ``model.layers`` is
    ``k = L`` (attention.name flash) or ``k = 0`` with base ``attention.name``."""
    if r["layers"]:
        k = sum(1 for x in r["layers"] if x == FULL)
        others = sorted({x for x in r["layers"] if x != FULL})
        return {"k": k, "L": len(r["layers"]), "base": "+".join(others) if others else None,
                "layers": ",".join(r["layers"])}
    name = r["attention"]
    if not name or r["n_layer"] <= 0:
        return None
    full = name == FULL
    return {"k": r["n_layer"] if full else 0, "L": r["n_layer"], "base": None if full else str(name),
            "layers": ",".join([str(name)] * r["n_layer"])}


def hybrid_table(recs: Sequence[dict], select: str = "best") -> List[dict]:
    """Hybrid rows: (base, seq_len, L, k, layers) -> accuracy, best over lr; the all-flash rows are repeated for
    every base (``shared_endpoint``)."""
    flat = []
    for r in recs:
        lay = hybrid_layout(r)
        p = pick(r["vals"], "val/acc", select)
        if lay is None or not p:
            continue
        flat.append({"base": lay["base"] or "", "seq_len": r["seq_len"], "d_model": r["d_model"],
                     "max_steps": r["max_steps"], "n_layer": lay["L"], "k": lay["k"], "layers": lay["layers"],
                     "lr": r["lr"], "acc": p["val/acc"], "step": p["step"], **_status(r)})
    rows = best_over_lr(flat, ["base", "seq_len", "d_model", "max_steps", "n_layer", "k", "layers"], "acc")
    bases = sorted({r["base"] for r in rows if r["base"]})
    out = [dict(r, shared_endpoint=False) for r in rows if r["base"]]
    for r in rows:
        if not r["base"]:
            out += [dict(r, base=b, shared_endpoint=True) for b in bases]
    return sorted(out, key=lambda r: (r["base"], r["seq_len"], r["n_layer"], r["k"], r["layers"]))


def bench_setup(path: str, backend: str) -> str:
    """What an ``eval.bench_model`` CSV measured, for a caption: backend, model size, vocabulary and tokens per step
    of its rows of ``backend`` (a setting with several values lists them)."""
    import pandas as pd

    df = pd.read_csv(path)
    df = df[df["backend"] == backend] if "backend" in df.columns else df
    parts = [f"backend {backend}"]
    for col, name in (("size", "size"), ("vocab", "vocab"), ("tokens_per_step", "tokens/step")):
        if col in df.columns:
            vals = sorted({str(v) for v in df[col].dropna()})
            if vals:
                parts.append(f"{name} {'/'.join(vals)}")
    return ", ".join(parts)


def attach_speed(rows: List[dict], bench) -> List[str]:
    """Tokens/s of the benchmark row of each hybrid row (``variant`` = the layers joined by ``+``; the pure base /
    flash variant at ``k = 0`` / ``k = L``) at its seq_len; returns caption notes on what the CSV lacks."""
    index = {(str(v), int(n)): (t, m) for v, n, t, m in zip(bench["variant"], bench["seq_len"], bench["tokens_per_s"],
                                                           bench["peak_mem_mb"])}
    for r in rows:
        names = ["+".join(r["layers"].split(","))]
        if r["k"] == 0:
            names.append(r["base"])
        if r["k"] == r["n_layer"]:
            names.append(FULL)
        hit = next((index[(nm, int(r["seq_len"]))] for nm in names if (nm, int(r["seq_len"])) in index), None)
        r["tokens_per_s"], r["peak_mem_mb"] = hit if hit else (float("nan"), float("nan"))
        r["speed_source"] = "bench_model" if hit else "none"
    notes = []
    mid = [r for r in rows if 0 < r["k"] < r["n_layer"]]
    if mid and not any(math.isfinite(_f(r["tokens_per_s"])) for r in mid):
        notes.append("the speed CSV has no hybrid rows (0 < k < L): speed shown only where it has the pure model")
    if not any(math.isfinite(_f(r["tokens_per_s"])) for r in rows):
        notes.append("the speed CSV has no row of these variants at these lengths: no speed shown")
    return notes


def plot_hybrid(rows: Sequence[dict], base: str, caption: str, with_speed: bool) -> List[str]:
    """Accuracy vs k (full-attention layers), one line per base mixer, best placement of the k layers; with
    ``with_speed`` a speed panel beside each (measured points only: a gap where a k has no row)
    (:mod:`eval.figspec`)."""
    from eval import figspec
    from eval.plots import variant_style

    lens, bases = sorted({int(r["seq_len"]) for r in rows}), sorted({r["base"] for r in rows})
    k_label = "k = full-attention (flash) layers"
    panels = []
    for n in lens:
        Ls = sorted({int(r["n_layer"]) for r in rows if int(r["seq_len"]) == n})
        acc = figspec.Panel(f"seq_len {n}, L = {'/'.join(map(str, Ls))} layers", k_label, "MQAR accuracy",
                            xticks=list(range(0, max(Ls) + 1)), ylim=(0, 1.03))
        speed = figspec.Panel("", k_label, "training tokens / s (eval.bench_model)", ylog="auto",
                              note="no speed rows at this length")
        for b in bases:
            sel = [r for r in rows if int(r["seq_len"]) == n and r["base"] == b]
            ks = sorted({r["k"] for r in sel})
            best = [max(_f(r["acc"]) for r in sel if r["k"] == k) for k in ks]  # best placement of the k layers
            acc.traces.append(figspec.Trace(b, ks, best, dict(variant_style(b), ms=6), meta={"base": b}))
            xs, ys = [], []
            for k in ks:  # measured points only; no line across a k without a row (nothing interpolated)
                t = max(_f(r["tokens_per_s"]) for r in sel if r["k"] == k) if with_speed else float("nan")
                if math.isfinite(t):
                    gap = [float("nan")] if xs and k - xs[-1] > 1 else []
                    xs, ys = xs + gap + [k], ys + gap + [t]
            if xs:
                speed.title = f"seq_len {n}: speed"
                speed.traces.append(figspec.Trace(b, xs, ys, dict(variant_style(b), ms=7), meta={"base": b}))
        panels += [acc, speed] if with_speed else [acc]
    return figspec.to_png(figspec.Figure(
        "How many full-attention layers does a linear / window model need to recall? (hybrids)\n"
        "best placement of the k layers, best over optim.lr; k = L: all layers flash (shared by every line) · "
        + caption, panels, legend=[(f"base: {b}", variant_style(b)) for b in bases], legend_ncol=min(4, len(bases)),
        ncols=2 if with_speed else 3, panel_w=4.6 if with_speed else 4.4, panel_h=3.4, sharex=True), base)


# --------------------------------------------------------------------------------------------- lm
def _text_name(r: dict) -> str:
    """The text data set's label; packed runs (``data.pack``) add ``(packed, doc_mask)`` / ``(packed, no doc_mask)``,
    so runs with and without the document mask are separate rows, not two tries of one."""
    d = r["cfg"].get("data") or {}
    suffix = ""
    if d.get("pack"):
        suffix = " (packed, doc_mask)" if d.get("doc_mask", True) else " (packed, no doc_mask)"
    if d.get("hub_name"):
        return str(d["hub_name"]) + (f"/{d['hub_config']}" if d.get("hub_config") else "") + suffix
    path = d.get("path")
    if isinstance(path, (list, tuple)):
        path = path[0] if path else None
    if path:
        p = os.path.normpath(str(path))
        stem = os.path.splitext(os.path.basename(p))[0]
        return (os.path.basename(os.path.dirname(p)) if stem in ("input", "train", "data") else stem) + suffix
    return r["dataset"] + suffix


def token_budget(r: dict) -> float:
    """``trainer.max_steps * data.batch_size * data.seq_len`` (the steps trained when max_steps is not set)."""
    steps = r["max_steps"] if _f(r["max_steps"]) > 0 else r["steps_done"]
    return _f(steps) * _f(r["batch_size"]) * r["seq_len"]


def lm_table(recs: Sequence[dict], select: str = "best") -> List[dict]:
    """LM rows: (data set, variant, seq_len) -> val/bpb (min over validations, or the last), best (lowest) over lr;
    with the token budget and the parameter count."""
    flat = [{"data": _text_name(r), "variant": r["label"], "seq_len": r["seq_len"], "lr": r["lr"], "bpb": p["val/bpb"],
             "step": p["step"], "n_params": r["n_params"], "tokens": token_budget(r), **_status(r)}
            for r, p in _picked(recs, "val/bpb", select, higher=False)]
    return best_over_lr(flat, ["data", "variant", "seq_len", "tokens"], "bpb", higher=False)


def _params_label(variant: str, params: Sequence[float]) -> str:
    ps = sorted({int(p) for p in params if math.isfinite(_f(p))})
    what = {"flash": "MHA, "}.get(variant, "")
    if not ps:
        return variant + (" (MHA)" if what else "")
    num = f"{ps[0]:,}" if len(ps) == 1 else f"{ps[0]:,}-{ps[-1]:,}"
    return f"{variant} ({what}{num} params)"


def plot_lm(rows: Sequence[dict], base: str, caption: str) -> List[str]:
    """Validation bits per byte vs context, one panel per data set (:func:`eval.figspec.lines`)."""
    from eval import figspec

    return figspec.to_png(figspec.lines(
        rows, "data", "seq_len", "bpb", "What does each variant cost in language-modelling quality as the context "
        "grows?\n" + caption, "context length (data.seq_len)", "validation bits per byte (lower is better)",
        label=lambda v: _params_label(v, [r["n_params"] for r in rows if r["variant"] == v]), ncols=2, panel_w=5.2,
        panel_h=3.8), base)


# --------------------------------------------------------------------------------------------- ablation
ABLATION_GROUP = "mqar_change"  # the swept config group of experiment=mqar_old_recipe (conf/mqar_change/<option>.yaml)
CONTROL = "old"                 # its option that changes nothing: the old recipe
TARGET_ACC = 0.99               # the early-stop threshold of mqar_base: "learned recall"
CHANGE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", ABLATION_GROUP)


def hydra_yaml(run_dir: str, name: str):
    """``<run_dir>/.hydra/<name>`` parsed, or None when it is missing or not YAML."""
    import yaml

    try:
        with open(os.path.join(run_dir, ".hydra", name)) as f:
            return yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return None


def group_choice(run_dir: str, group: str = ABLATION_GROUP) -> Optional[str]:
    """The option of config group ``group`` a run was composed with: ``hydra.runtime.choices.<group>`` of
    ``.hydra/hydra.yaml``, else a ``+<group>=<option>`` / ``<group>=<option>`` entry of ``.hydra/overrides.yaml``;
    ``None`` when neither names one (the run is not part of that sweep)."""
    choice = _get(hydra_yaml(run_dir, "hydra.yaml") or {}, f"hydra.runtime.choices.{group}")
    if choice is not None:
        return str(choice)
    for line in hydra_yaml(run_dir, "overrides.yaml") or []:
        key, _, value = str(line).lstrip("+~").partition("=")
        if key == group and value:
            return value
    return None


def setting_changes(cfg: dict, ref: dict, ignore=()) -> List[tuple]:
    """``[(key, ref value, cfg value)]`` of the settings (:func:`eval.quality.result_settings`) where ``cfg`` differs
    from ``ref``, sorted by key; keys in ``ignore`` are left out."""
    a, b = result_settings(ref), result_settings(cfg)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if k not in set(ignore) and a.get(k) != b.get(k)]


def option_settings(option: str) -> Optional[dict]:
    """The settings ``conf/mqar_change/<option>.yaml`` sets (``{dotted key: value}``); ``None`` without that file."""
    import yaml

    path = os.path.join(CHANGE_DIR, f"{option}.yaml")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return flat_config(yaml.safe_load(f) or {})


def describe_change(rec: dict, ref: Optional[dict], ignore=()) -> dict:
    """What one option run changes: ``setting`` (keys), ``old_value`` / ``value`` (``;``-joined, in key order),
    ``change`` (``model.n_layer: 4 -> 2``) and ``label`` (the figure's, ``n_layer 4 -> 2``). Against ``ref``, the
    control run's config, when there is one; else the keys of ``conf/mqar_change/<option>.yaml`` with the run's
    values (``old_value`` empty, ``change`` ``model.n_layer = 2``)."""
    option = rec["option"]
    if option == CONTROL:
        return {"setting": "", "old_value": "", "value": "", "change": "none (control: the old recipe)",
                "label": f"{CONTROL} (control)"}
    if ref is not None:
        diffs = setting_changes(rec["cfg"], ref, ignore)
        if not diffs:
            return {"setting": "", "old_value": "", "value": "", "change": f"no setting differs from {CONTROL}",
                    "label": f"{option} (no change)"}
    else:
        keys = option_settings(option)
        if keys is None:
            return {"setting": "", "old_value": "", "value": "",
                    "change": f"unknown: no {CONTROL} run and no conf/{ABLATION_GROUP}/{option}.yaml",
                    "label": option}
        diffs = [(k, None, _get(rec["cfg"], k)) for k in sorted(keys)]
    keys = [k for k, _, _ in diffs]
    old = [fmt_value(o) if ref is not None else "" for _, o, _ in diffs]
    new = [fmt_value(n) for _, _, n in diffs]
    says = [f"{o} -> {n}" if ref is not None else f"= {n}" for o, n in zip(old, new)]
    change = [f"{k}: {x}" if ref is not None else f"{k} {x}" for k, x in zip(keys, says)]
    labels = dict.fromkeys(f"{k.rsplit('.', 1)[-1]} {x}" for k, x in zip(keys, says))  # data. / model.vocab_size: one
    return {"setting": "; ".join(keys), "old_value": "; ".join(old), "value": "; ".join(new),
            "change": "; ".join(change), "label": ", ".join(labels)}


def ablation_table(recs: Sequence[dict], select: str = "best") -> List[dict]:
    """One row per option of the ablation (``recs`` carry ``option``, see :func:`group_choice`): what it changes
    (:func:`describe_change`, against the first control run; settings that differ between control runs, e.g.
    seeds, do not count), ``acc`` (the selected validation's ``val/acc``; runs of one option averaged, as
    :func:`best_over_lr` does), its ``step``, ``steps_run``, ``finished``, ``chance`` = 1 / ``num_kv_pairs`` and
    ``delta_vs_old`` (NaN without a control row). Order: the control first, then by ``acc`` descending. Runs that
    never logged ``val/acc`` have no row."""
    controls = [r for r in recs if r["option"] == CONTROL]
    ref = controls[0]["cfg"] if controls else None
    varying = {k for r in controls[1:] for k, _, _ in setting_changes(r["cfg"], ref)}
    changes = {}
    for r in recs:
        changes.setdefault(r["option"], describe_change(r, ref, varying))
    flat = [{"option": r["option"], "lr": r["lr"], "acc": p["val/acc"], "step": p["step"], "max_steps": r["max_steps"],
             "num_kv_pairs": r["num_kv_pairs"], **_status(r)} for r, p in _picked(recs, "val/acc", select)]
    by_option = {r["option"]: r for r in best_over_lr(flat, ["option"], "acc")}
    old_acc = _f(by_option[CONTROL]["acc"]) if CONTROL in by_option else float("nan")
    rows = []
    for option, r in by_option.items():
        rows.append({"option": option, **changes[option], "acc": r["acc"], "step": r["step"],
                     "steps_run": r["steps_run"], "finished": r["finished"], "max_steps": r["max_steps"],
                     "chance": _chance(r["num_kv_pairs"]), "delta_vs_old": _f(r["acc"]) - old_acc,
                     "lr": r["best_lr"], "n_runs": r["n_runs"], "acc_from": _acc_from(select)})
    return sorted(rows, key=lambda r: (r["option"] != CONTROL, -_f(r["acc"]), r["option"]))


def plot_ablation(rows: Sequence[dict], base: str, caption: str, select: str = "best") -> List[str]:
    """Horizontal bars of ``acc`` per option (:func:`ablation_table` order, top down), the control in its own
    colour, unfinished runs hatched and hollow; dashed line at chance, solid at :data:`TARGET_ACC`
    (:mod:`eval.figspec`)."""
    from eval import figspec

    colors = {"control": "tab:gray", "change": "tab:blue"}
    p = figspec.Panel(f"one change of the old recipe per bar ({ABLATION_GROUP}=<option>)", "MQAR accuracy (val/acc)",
                      "", xlim=(0, 1.55), xticks=[0, 0.2, 0.4, 0.6, 0.8, 1.0], ylabels=[r["label"] for r in rows],
                      vlines=sorted({_f(r["chance"]) for r in rows if math.isfinite(_f(r["chance"]))})
                      + [(TARGET_ACC, {"color": "tab:green", "ls": "-", "lw": 1.2})])
    for what in ("control", "change"):
        sel = [(y, r) for y, r in enumerate(rows) if (r["option"] == CONTROL) == (what == "control")]
        notes = [f"{_f(r['acc']):.3f}" + (f" ({_f(r['delta_vs_old']):+.3f} vs {CONTROL})" if r["option"] != CONTROL
                                          and math.isfinite(_f(r["delta_vs_old"])) else "")
                 + ("" if _f(r["finished"]) >= 1 else f", cut at step {_f(r['steps_run']):,.0f}") for _, r in sel]
        if sel:
            p.traces.append(figspec.Trace(what, [_f(r["acc"]) for _, r in sel], [y for y, _ in sel],
                                          {"color": colors[what]}, lines=False, bars=True, text=notes, hover=notes,
                                          hollow=[_f(r["finished"]) < 1 for _, r in sel]))
    bar = {"marker": "s", "ls": "none", "ms": 10, "alpha": 1}
    legend = [(f"{CONTROL}: the old recipe (control)", dict(bar, color=colors["control"])),
              ("one setting changed", dict(bar, color=colors["change"]))]
    if any(_f(r["finished"]) < 1 for r in rows):
        legend.append(("hatched: run cut off before max_steps", dict(bar, color="gray", hollow=True)))
    legend += [(figspec.CHANCE[0], dict(figspec.CHANCE[1], lw=1)),
               (f"target: val/acc {TARGET_ACC}", {"color": "tab:green", "ls": "-", "lw": 1.2})]
    acc = "best validation (max)" if select == "best" else "last validation"
    return figspec.to_png(figspec.Figure(
        "Which single change makes the old MQAR recipe learn recall? (experiment mqar_old_recipe)\n"
        f"accuracy: {acc} · " + caption, [p], legend=legend, legend_ncol=3, ncols=1, panel_w=7.5,
        panel_h=max(2.6, 0.42 * len(rows) + 1.0)), base)


# --------------------------------------------------------------------------------------------- curves
MAX_CURVE_PANELS = 12


def _run_name(run_dir: str) -> str:
    """``<sweep folder>/<job folder>``: jobs of two sweeps with the same overrides have the same job folder name."""
    d = os.path.normpath(run_dir)
    return f"{os.path.basename(os.path.dirname(d))}/{os.path.basename(d)}"


def curves_table(recs: Sequence[dict]) -> List[dict]:
    """Learning curves, long format: one row per (run, validation) with ``val/acc``: ``variant, seq_len, d_model,
    lr, max_steps, step, acc, finished, steps_run, chance, run`` (``run``: ``<sweep folder>/<job folder>``)."""
    rows = []
    for r in recs:
        chance = _chance(r["num_kv_pairs"])
        for p in r["vals"]:
            if math.isfinite(_f(p.get("val/acc"))):
                rows.append({"variant": r["label"], "seq_len": r["seq_len"], "d_model": r["d_model"],
                             "lr": r["lr"], "max_steps": r["max_steps"], "step": p["step"], "acc": p["val/acc"],
                             **_status(r), "chance": chance, "run": _run_name(r["run_dir"])})
    return sorted(rows, key=lambda x: (x["variant"], x["seq_len"], x["d_model"], x["lr"], x["max_steps"],
                                       x["run"], x["step"]))


def plot_curves(rows: Sequence[dict], base: str, caption: str) -> List[str]:
    """One panel per (variant, seq_len, d_model): val/acc vs training step, colour = ``optim.lr``, line style =
    ``trainer.max_steps`` (the cosine schedule spans it, so a longer budget keeps a higher lr for longer); a
    hollow end marker for a run cut off before its max_steps (:mod:`eval.figspec`)."""
    import matplotlib.pyplot as plt

    from eval import figspec

    def known(x) -> float:  # a run config without optim.lr / trainer.max_steps: -1 ("?"), one key for all of them
        x = _f(x)
        return x if math.isfinite(x) else -1.0

    cells = sorted({(r["variant"], int(r["seq_len"]), int(r["d_model"])) for r in rows})
    lrs = sorted({known(r["lr"]) for r in rows})
    budgets = sorted({known(r["max_steps"]) for r in rows})
    colors = {lr: plt.get_cmap("viridis")(0.85 * i / max(1, len(lrs) - 1)) for i, lr in enumerate(lrs)}
    styles = {b: ("-", ":", "--", "-.")[i % 4] for i, b in enumerate(reversed(budgets))}  # longest: solid
    target = {"color": "tab:red", "ls": "-.", "lw": 0.9}
    panels = []
    for v, n, d in cells:
        sel = [r for r in rows if (r["variant"], int(r["seq_len"]), int(r["d_model"])) == (v, n, d)]
        p = figspec.Panel(f"{v} · seq_len {n} · d_model {d}", "training step", "MQAR accuracy (val/acc)",
                          ylim=(0, 1.03), hlines=sorted({_f(r["chance"]) for r in sel if math.isfinite(_f(r["chance"]))})
                          + [(0.99, target)])
        for run in sorted({r["run"] for r in sel}):
            pts = [r for r in sel if r["run"] == run]
            lr, b = known(pts[0]["lr"]), known(pts[0]["max_steps"])
            p.traces.append(figspec.Trace(run, [r["step"] for r in pts], [r["acc"] for r in pts],
                                          {"color": colors[lr], "ls": styles[b], "marker": "o"},
                                          hollow=[False] * (len(pts) - 1) + [_f(pts[0].get("finished", 1)) < 1],
                                          hover=[f"{run}: step {r['step']}, acc {r['acc']:.3f}" for r in pts]))
        panels.append(p)
    legend = [(f"lr {lr:g}" if lr >= 0 else "lr ?", {"color": colors[lr]}) for lr in lrs]
    if len(budgets) > 1:
        legend += [(f"max_steps {b:,.0f}" if b >= 0 else "max_steps ?", {"color": "gray", "ls": styles[b]})
                   for b in budgets]
    legend += [figspec.CHANCE, ("0.99 (early-stop target)", target)]
    if any(_f(r.get("finished", 1)) < 1 for r in rows):
        legend.append(figspec.CUT_OFF)
    return figspec.to_png(figspec.Figure(
        "When does recall form? MQAR val/acc over training, per learning rate and step budget\n" + caption, panels,
        legend=legend, ncols=3, panel_w=4.4, panel_h=3.3, sharey=True), base)


# --------------------------------------------------------------------------------------------- driver
def run(cfg: dict) -> dict:
    """Make one report. ``cfg``: ``kind`` (fig2 | cliff | hybrid | lm | ablation | curves), ``runs`` (roots),
    ``out_dir``, ``select`` (best | last), ``seq_len`` (cliff / hybrid / curves: only this length), ``d_model`` /
    ``variant`` (curves: only this width / line label), ``speed`` / ``speed_backend`` /
    ``speed_size`` (hybrid: an eval.bench_model CSV), ``formats``. Returns ``{rows, csv, png, figures}``."""
    from eval import plots

    kind = cfg.get("kind")
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: allowed values: {', '.join(KINDS)} (python -m eval.recall <kind> runs=[...])")
    select = cfg.get("select") or "best"
    if select not in ("best", "last"):
        raise ValueError(f"select={select!r}: allowed values: best, last")
    for key, kinds in FILTER_KINDS.items():
        if cfg.get(key) is not None and kind not in kinds:
            raise ValueError(f"{key}={cfg[key]!r} applies to kind {' / '.join(kinds)} only, not kind={kind} "
                             f"(leave it out)")
    cfg = dict(cfg)
    for key, field in (("seq_len", "data.seq_len"), ("d_model", "model.d_model")):
        if cfg.get(key) is not None:
            try:
                if isinstance(cfg[key], bool) or float(cfg[key]) != int(float(cfg[key])):
                    raise ValueError
                cfg[key] = int(float(cfg[key]))
            except (TypeError, ValueError, OverflowError):
                raise ValueError(f"{key}={cfg[key]!r}: must be an integer (a {field} of the runs), or left out "
                                 f"for all") from None
    out_dir = cfg.get("out_dir") or "results/recall"
    check_out_dir(out_dir, "out_dir")
    roots = cfg.get("runs")
    recs = load_runs(roots)
    plots.set_formats(cfg.get("formats") or ["png"])
    base = os.path.join(out_dir, kind)
    notes: List[str] = []
    if kind in MQAR_KINDS:  # the MQAR runs, narrowed by the filters this kind takes (any other is None here)
        recs = _mqar(recs, kind, roots)
        for key in ("seq_len", "d_model", "variant"):
            recs = _only(recs, key, cfg.get(key), kind, roots)
    if kind == "fig2":
        rows = fig2_table(recs, select)
        if not rows:
            raise ValueError(f"fig2: no MQAR run under runs={roots} logged val/acc")
        cov = _coverage(recs, rows, "val/acc", notes)
        paths = plot_fig2(rows, base, _setup(recs, cov), select)
    elif kind == "cliff":
        rows = cliff_table(recs, select)
        if not any(r["window"] >= 0 for r in rows):
            raise ValueError(f"cliff: no MQAR run with a sliding window (attention.window_size) and val/acc under "
                             f"runs={roots}")
        if not any(math.isfinite(_f(r["acc_far"])) for r in rows):
            notes.append("no run logged val/acc_far (callback RecallByDistance): only val/acc / acc_near drawn")
        cov = _coverage(recs, rows, "val/acc", notes)
        paths = plot_cliff(rows, base, _setup(recs, "; ".join(notes)), recs)
    elif kind == "hybrid":
        rows = hybrid_table(recs, select)
        if not any(r["base"] for r in rows):
            raise ValueError(f"hybrid: no MQAR run with a non-flash layer (model.layers=[linear, flash, ...] or "
                             f"attention=linear / sliding_window) and val/acc under runs={roots}")
        cov = _coverage(recs, rows, "val/acc", notes)
        speed = cfg.get("speed")
        if speed:
            from eval.quality import load_bench_speed

            notes += attach_speed(rows, load_bench_speed(speed, cfg.get("speed_backend") or "triton",
                                                         cfg.get("speed_size")))
            notes.insert(0, f"speed: {os.path.basename(str(speed))} (eval.bench_model, "
                            f"{bench_setup(speed, cfg.get('speed_backend') or 'triton')})")
        paths = plot_hybrid(rows, base, _setup(recs, "\n" + "; ".join(notes) if notes else ""), bool(speed))
    elif kind == "curves":
        rows = curves_table(recs)
        if not rows:
            raise ValueError(f"curves: no MQAR run under runs={roots} logged val/acc")
        cells = sorted({(r["variant"], r["seq_len"], r["d_model"]) for r in rows})
        if len(cells) > MAX_CURVE_PANELS:
            raise ValueError(f"curves: {len(cells)} (variant, seq_len, d_model) cells under runs={roots}, more than "
                             f"{MAX_CURVE_PANELS} panels: narrow them with seq_len=, d_model= or variant= (variants "
                             f"there: {sorted({c[0] for c in cells})})")
        cov = _coverage(recs, rows, "val/acc", notes)
        paths = plot_curves(rows, base, _setup(recs, cov))
    elif kind == "ablation":
        recs_a = [dict(r, option=group_choice(r["run_dir"])) for r in recs]
        recs_a = [r for r in recs_a if r["option"] is not None]
        if not recs_a:
            raise ValueError(f"ablation: no {ABLATION_GROUP} run under runs={roots}: no run has "
                             f"hydra.runtime.choices.{ABLATION_GROUP} in .hydra/hydra.yaml or "
                             f"+{ABLATION_GROUP}=<option> in .hydra/overrides.yaml "
                             f"(python train.py -m experiment=mqar_old_recipe)")
        rows = ablation_table(recs_a, select)
        if not rows:
            raise ValueError(f"ablation: no {ABLATION_GROUP} run under runs={roots} logged val/acc")
        if len(recs_a) < len(recs):
            notes.append(f"{len(recs) - len(recs_a)} run(s) without a {ABLATION_GROUP} option left out")
        if not any(r["option"] == CONTROL for r in recs_a):
            notes.append(f"no '{CONTROL}' (control) run: no delta_vs_old; changes named from "
                         f"conf/{ABLATION_GROUP}/<option>.yaml")
        elif CONTROL not in {r["option"] for r in rows}:
            notes.append(f"the '{CONTROL}' (control) run never logged val/acc: no delta_vs_old")
        cov = _coverage(recs_a, rows, "val/acc", notes)
        paths = plot_ablation(rows, base, _setup(recs_a, "; ".join(notes)), select)
    else:
        recs_t = [r for r in recs if str(r["dataset"]).startswith("text")]
        if not recs_t:
            raise ValueError(f"lm: no language-modelling run (data=text) under runs={roots}; found data sets "
                             f"{sorted({r['dataset'] for r in recs})}")
        rows = lm_table(recs_t, select)
        if not rows:
            raise ValueError(f"lm: no text run under runs={roots} logged val/bpb")
        budgets = sorted({token_budget(r) for r in recs_t if math.isfinite(token_budget(r))})
        if len(budgets) > 1:
            msg = (f"token budget differs across runs: {budgets[0]:,.0f} ... {budgets[-1]:,.0f} tokens "
                   f"(max_steps x batch_size x seq_len)")
            warnings.warn(msg)
            print(f"lm: warning: {msg}")
            tb = f"UNEQUAL token budget {budgets[0] / 1e6:.1f}M-{budgets[-1] / 1e6:.1f}M tokens"
        else:
            tb = f"equal token budget {budgets[0] / 1e6:,.1f}M tokens per run" if budgets else "token budget unknown"
        which = "lowest val/bpb over validations" if select == "best" else "last validation"
        cov = _coverage(recs_t, rows, "val/bpb")
        paths = plot_lm(rows, base, f"{tb} · {which}, best over optim.lr · " + _setup(recs_t, cov))
        notes.append(tb)
        notes += [cov] if cov else []
    csv_path = write_csv(rows, base + ".csv")
    print(f"{kind}: wrote {csv_path} and {paths[0]}" + (f" ({'; '.join(notes)})" if notes else ""))
    return {"rows": rows, "csv": csv_path, "png": paths[0], "figures": paths, "notes": notes}


def argv_with_kind(argv: Sequence[str]) -> List[str]:
    """``python -m eval.recall fig2 runs=[...]``: a first argument without ``=`` becomes ``kind=<it>``."""
    argv = list(argv)
    if len(argv) > 1 and "=" not in argv[1] and not argv[1].startswith("-"):
        argv[1] = f"kind={argv[1]}"
    return argv


if __name__ == "__main__":  # pragma: no cover - exercised through the CLI
    from eval import hydra_cli

    sys.argv = argv_with_kind(sys.argv)
    hydra_cli("recall", run, prog="eval.recall")  # bad arguments / no matching run: the message, not a traceback
