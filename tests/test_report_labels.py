"""The labels of the report's n* sliders (``eval.report.slider_rows``, the options of ``#sl-row``): one per
crossover, none repeated. The page shows them as built here (``eval/report.js`` appends the measured n*)."""

import os
import shutil
from collections import Counter

from eval import report
from eval.crossover import CROSSOVER_COLUMNS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = os.path.join(ROOT, "results", "h200", "crossover_speed_h200")


def test_committed_slider_labels_are_unique_and_name_the_pair():
    """Each crossover of the committed sweep against its five baselines (exact, naive, FA2, cuDNN, Flex) had the label
    ``variant/backend metric (d=...)``: 120 options, 24 labels, each shown five times."""
    rows = report.slider_rows(ROOT)
    labels = [r["label"] for r in rows]
    assert len(rows) >= 100 and not [lab for lab, n in Counter(labels).items() if n > 1]
    assert "linear/fla vs flash/sdpa_cudnn fwd_bwd_ms (d=128)" in labels
    assert "linear/fla vs flash/triton fwd_bwd_ms (d=128)" in labels


def test_labels_that_still_match_get_what_tells_them_apart(tmp_path):
    """Rows equal but for causality / KV heads get those; two sweeps' copies get their folders; identical rows (the
    same folder twice cannot happen, a copy of a row can) a count."""
    import csv

    base = dict.fromkeys(CROSSOVER_COLUMNS, "")
    base.update(reference="exact", baseline="flash/triton", variant="linear", backend="triton", head_dim="128",
                causal="True", n_kv_heads="16", metric="fwd_ms", c0="0.01", c2="1e-5", c_lin="0.05", n_star="5000")
    rows = [base, dict(base, causal="False"), dict(base, n_kv_heads="4"), dict(base, n_kv_heads="4")]
    for d in ("a", "b"):
        os.makedirs(tmp_path / "results" / d)
        with open(tmp_path / "results" / d / "crossover.csv", "w", newline="") as f:
            w = csv.DictWriter(f, CROSSOVER_COLUMNS)
            w.writeheader()
            w.writerows(rows)
    labels = [r["label"] for r in report.slider_rows(str(tmp_path))]
    assert len(labels) == 8 and len(set(labels)) == 8, labels
    assert labels[0] == "linear/triton vs flash/triton fwd_ms (d=128, causal, Hkv=16, a)"
    assert labels[1] == "linear/triton vs flash/triton fwd_ms (d=128, non-causal, Hkv=16, a)"
    assert labels[3] == "linear/triton vs flash/triton fwd_ms (d=128, causal, Hkv=4, a) #2"
    shutil.rmtree(tmp_path / "results" / "b")  # one table of distinct rows: the short labels stay short
    labels = [r["label"] for r in report.slider_rows(str(tmp_path))]
    assert labels[1] == "linear/triton vs flash/triton fwd_ms (d=128, non-causal, Hkv=16)"
