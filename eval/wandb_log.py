"""Weights & Biases logging of sweep / quality results, offline-safe.

Each call is one W&B run (``job_type`` ``sweep`` or ``quality``) in a ``group`` so sweeps of several machines
or dates sit side by side; every table is a ``wandb.Table``, the tables a chart can be drawn from also native W&B
charts (:func:`charts`: ``wandb.plot.line_series`` with x = N and one line per variant, scatter for the bubble
chart; the same :mod:`eval.figspec` definitions as the PNGs) and every figure a ``wandb.Image`` (the fallback). Mode ``auto``
is ``offline`` unless ``WANDB_API_KEY`` is set and the W&B server answers (``WANDB_MODE`` can force it; :func:`harness.tracking.wandb_mode`): nothing needs the
network, and an offline run can be uploaded later with ``wandb sync <dir>/wandb/offline-run-*``. Without the
``wandb`` package the call logs nothing and returns ``None`` (the CSV / JSON results never depend on W&B).
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Dict, Optional, Sequence


def resolve_mode(mode: str = "auto") -> str:
    """``online`` / ``offline`` / ``disabled`` by the project's one rule (:func:`harness.tracking.wandb_mode`)."""
    from harness.tracking import wandb_mode

    return wandb_mode(mode)


def _table(rows: Sequence[dict]):
    import wandb

    cols = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)

    def cell(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, (list, tuple, dict)):
            return str(v)
        return v

    # CSV rows are strings: numbers become floats where the whole column parses, else the column is text
    # (mixed types in one column break wandb.Table typing)
    data = [[cell(r.get(c)) for c in cols] for r in rows]
    for j in range(len(cols)):
        vals = [row[j] for row in data if row[j] not in (None, "")]
        try:
            [float(v) for v in vals if not isinstance(v, bool)]
            numeric = bool(vals) and not any(isinstance(v, bool) for v in vals)
        except (TypeError, ValueError):
            numeric = False
        for row in data:
            v = row[j]
            if v in (None, ""):
                row[j] = None
            elif numeric:
                row[j] = float(v)
            else:
                row[j] = str(v)
    return wandb.Table(columns=cols, data=data)


MODEL_METRICS = (("train_tokens_per_s", "training tokens/s"), ("infer_tokens_per_s", "inference tokens/s"),
                 ("train_peak_mem_bytes", "training peak memory (MiB)"))


def figures(tables: Dict[str, Sequence[dict]]) -> Dict[str, object]:
    """The :mod:`eval.figspec` figures drawn from the logged tables, by table name: ``kernel`` (+ ``crossover``:
    n*) -> :func:`eval.figspec.crossover`; ``model`` -> the model-level speed / memory vs N; ``quality`` (the long
    form of :mod:`eval.quality`) -> :func:`eval.figspec.quality_vs_n`; ``runs`` with a speed column -> one
    :func:`eval.figspec.bubble` per dataset. Tables without the needed columns draw nothing."""
    from eval import figspec

    def has(rows, *cols):
        return bool(rows) and all(c in rows[0] for c in cols)

    t = {k: list(v) for k, v in tables.items()}
    out = {}
    if has(t.get("kernel"), "variant", "seq_len"):
        out["kernel"] = figspec.crossover([r for r in t["kernel"] if r.get("status", "ok") == "ok"],
                                          t.get("crossover") or [])
    if has(t.get("model"), "variant", "seq_len"):
        ok = [r for r in t["model"] if r.get("status", "ok") == "ok"]
        out["model"] = figspec.crossover(ok, metrics=[m for m in MODEL_METRICS if m[0] in t["model"][0]])
    if has(t.get("quality"), "dataset", "variant", "seq_len", "metric", "value"):
        out["quality"] = figspec.quality_vs_n(t["quality"])
    if has(t.get("runs"), "dataset", "variant", "seq_len", "tokens_per_s"):
        for ds in sorted({r["dataset"] for r in t["runs"]}):
            rows = [r for r in t["runs"] if r["dataset"] == ds]
            q = next((m for m in ("val_bpb", "val_acc") if any(_finite(r.get(m)) for r in rows)), None)
            if q:
                out[f"bubble_{ds}"] = figspec.bubble(rows, q)
    return out


def _finite(v) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def charts(tables: Dict[str, Sequence[dict]]) -> dict:
    """Native W&B charts of :func:`figures`, keyed ``chart/<figure>/<panel>`` (:func:`eval.figspec.to_wandb`)."""
    from eval import figspec

    out = {}
    for name, fig in figures(tables).items():
        out.update(figspec.to_wandb(fig, f"chart/{name}"))
    return out


def log_results(name: str, group: str, tables: Dict[str, Sequence[dict]], images: Optional[Dict[str, str]] = None,
                config: Optional[dict] = None, project: str = "attn-zoo", mode: str = "auto",
                dir: Optional[str] = None, job_type: str = "sweep", summary: Optional[dict] = None) -> Optional[str]:
    """Log ``tables`` (name -> list of row dicts) and ``images`` (name -> PNG path) as one run.

    Returns the run's local directory (``<dir>/wandb/<offline-|>run-...``) or ``None`` when W&B is missing or
    the run could not start (a warning says why; results on disk are unaffected).
    """
    try:
        import wandb
    except ImportError:
        warnings.warn("wandb is not installed: skipping W&B logging (results are in CSV / JSON)")
        return None
    m = resolve_mode(mode)
    if m == "disabled":
        return None
    os.makedirs(dir or ".", exist_ok=True)
    try:
        run = wandb.init(project=project, group=group, name=name, job_type=job_type, dir=dir, mode=m,
                         config=config or {}, reinit="finish_previous", settings=wandb.Settings(silent=True))
    except Exception as e:  # noqa: BLE001 - never lose a sweep to a logging failure
        warnings.warn(f"wandb.init failed ({type(e).__name__}: {e}); skipping W&B logging")
        return None
    try:
        payload = {}
        for tname, rows in tables.items():
            rows = list(rows)
            if rows:
                payload[f"{tname}_table"] = _table(rows)
        try:
            payload.update(charts(tables))
        except Exception as e:  # noqa: BLE001 - the tables and images still go
            warnings.warn(f"W&B charts skipped ({type(e).__name__}: {e})")
        for iname, path in (images or {}).items():
            if path and os.path.exists(path):
                payload[f"fig/{iname}"] = wandb.Image(path)
        run.log(payload)
        for k, v in (summary or {}).items():
            run.summary[k] = v
        run_dir = os.path.dirname(run.dir)  # .../wandb/<run>/files -> .../wandb/<run>
    finally:
        run.finish()
    return run_dir


if __name__ == "__main__":  # a library module: running it would do nothing, so say what to run instead
    raise SystemExit("eval.wandb_log is a library module, not a command; run python -m eval.crossover "
                     "sweep=<sweep> (it logs to W&B unless wandb.enabled=false)")
