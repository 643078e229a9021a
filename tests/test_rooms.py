"""Three rooms with one-way doors (issue 28 item 4): the attention library ``attn_zoo`` stands apart from the
training harness ``harness`` (Lightning, Hydra, W&B), and configs stored before the harness moved still read."""

import json
from pathlib import Path

from harness.runs import RENAMED_TARGETS, finished_run, renamed_targets, result_config

ROOT = Path(__file__).resolve().parents[1]
STORED = (ROOT / "results/h200/quality/runs/mqar_fig2_long/"
          "attention=flash,model.d_model=512,data.seq_len=512,optim.lr=0.0003/final_metrics.json")


def test_old_target_names_are_mapped_to_the_harness():
    for old, new in RENAMED_TARGETS.items():
        assert old.startswith("attn_zoo.") and new.startswith("harness."), (old, new)
        assert old.split(".", 1)[1] == new.split(".", 1)[1]
    c = {"data": {"_target_": "attn_zoo.data.MQARDataModule"},
         "callbacks": {"recall": {"_target_": "attn_zoo.callbacks.RecallByDistance"}},
         "optim": {"_target_": "torch.optim.Adam"}, "layers": [{"_target_": "attn_zoo.data.TextDataModule"}]}
    r = renamed_targets(c)
    assert r["data"]["_target_"] == "harness.data.MQARDataModule"
    assert r["callbacks"]["recall"]["_target_"] == "harness.callbacks.RecallByDistance"
    assert r["optim"]["_target_"] == "torch.optim.Adam"  # not in the table: kept
    assert r["layers"][0]["_target_"] == "harness.data.TextDataModule"
    assert c["data"]["_target_"] == "attn_zoo.data.MQARDataModule"  # the input is not changed


def test_a_committed_result_stored_under_the_old_names_compares_equal(tmp_path):
    done = json.loads(STORED.read_text())
    stored = done["result_config"]
    assert stored["data"]["_target_"] == "attn_zoo.data.MQARDataModule"  # written before the move
    today = json.loads(json.dumps(stored).replace('"attn_zoo.data.', '"harness.data.')
                       .replace('"attn_zoo.callbacks.', '"harness.callbacks.'))
    assert today != stored
    assert result_config(stored) == result_config(today)
    (tmp_path / "final_metrics.json").write_text(json.dumps(done))
    assert finished_run(tmp_path, today)["metrics"] == done["metrics"]  # skip_finished still finds it
    other = json.loads(json.dumps(today))
    other["data"]["_target_"] = "harness.data.TextDataModule"
    assert result_config(stored) != result_config(other)


def test_import_attn_zoo_loads_no_training_stack():
    """The library's door is one-way: ``import attn_zoo`` (and its model) pulls in neither Lightning, Hydra nor W&B."""
    import subprocess
    import sys

    code = ("import attn_zoo, attn_zoo.model, attn_zoo.cost_model, attn_zoo.decode, sys; "
            "bad = sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'pytorch_lightning', 'hydra', "
            "'wandb', 'omegaconf', 'harness'}); print(bad); assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_library_sources_import_no_harness():
    """No module of ``attn_zoo`` imports the harness or the training stack, even lazily inside a function."""
    import re

    pattern = re.compile(r"^\s*(?:from|import)\s+(harness|lightning|pytorch_lightning|hydra|wandb|omegaconf)\b", re.M)
    found = [f"{p.relative_to(ROOT)}: {m.group(0).strip()}" for p in sorted((ROOT / "attn_zoo").rglob("*.py"))
             for m in pattern.finditer(p.read_text())]
    assert found == []
    assert not any((ROOT / "attn_zoo" / f"{name}.py").exists() for name in ("lit", "callbacks", "runs", "data", "tracking"))
