"""Training through the libraries (issue 15, item 5): the optimiser from ``cfg.optim`` by ``hydra.utils.instantiate``
(``_partial_: true``), ``train/lr`` by Lightning's ``LearningRateMonitor``, validation means by torchmetrics, and
``result_config`` (what ``skip_finished`` compares) unchanged by the instantiate-only keys."""

import json
import math
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from omegaconf import OmegaConf, open_dict

import train as train_mod  # noqa: F401  (registers the attn_zoo.* resolvers the experiment configs use)
from harness.lit import LitLM, build_optimizer, cosine_with_warmup, optimizer_factory, split_optim_config
from harness.runs import result_config
from test_train import FAST, ROOT, column, make_cfg, read_csv

TINY = dict(vocab_size=16, n_layer=1, n_head=2, d_model=16, max_seq_len=8)
FLASH = [dict(kind="flash", causal=True)]


class OptimizerSpy(L.Callback):
    """Records the class of the optimiser a run trains with (``+callbacks.spy._target_=test_train_libraries...``)."""

    seen = []

    def on_train_start(self, trainer, pl_module):
        OptimizerSpy.seen.append(type(trainer.optimizers[0]).__name__)


# ------------------------------------------------------------------------------------------ validation means
def test_val_loss_and_acc_are_token_weighted_over_scored_positions():
    """val/loss and val/acc: means over every scored position (target != -100) of all batches, not means of
    per-batch means; batches here score 16, 3 and 1 positions."""
    torch.manual_seed(0)
    lit = LitLM(TINY, FLASH, backend="torch", bytes_per_token=1.0)
    g = torch.Generator().manual_seed(1)
    batches = []
    for scored in (16, 3, 1):
        x = torch.randint(0, 16, (2, 8), generator=g)
        y = torch.randint(0, 16, (2, 8), generator=g)
        y.view(-1)[scored:] = -100
        batches.append((x, y))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    out = trainer.validate(lit, dataloaders=torch.utils.data.DataLoader(batches, batch_size=None), verbose=False)[0]

    lit.eval()
    ce, ok, n, per_batch = 0.0, 0.0, 0, []
    with torch.no_grad():
        for x, y in batches:
            logits, mask = lit.model(x), y != -100
            loss = torch.nn.functional.cross_entropy(logits[mask], y[mask], reduction="sum").item()
            ce += loss
            ok += (logits[mask].argmax(-1) == y[mask]).sum().item()
            n += int(mask.sum())
            per_batch.append(loss / int(mask.sum()))
    assert out["val/loss"] == pytest.approx(ce / n, rel=1e-6)
    assert out["val/acc"] == pytest.approx(ok / n, abs=1e-7)
    assert out["val/ppl"] == pytest.approx(math.exp(ce / n), rel=1e-5)
    assert out["val/bpb"] == pytest.approx(ce / n / math.log(2), rel=1e-6)
    assert abs(sum(per_batch) / len(per_batch) - ce / n) > 1e-3, "the batches must tell the two means apart"
    # a second validation starts from zero (the metrics are reset)
    again = trainer.validate(lit, dataloaders=torch.utils.data.DataLoader(batches, batch_size=None), verbose=False)[0]
    assert again["val/loss"] == pytest.approx(out["val/loss"], rel=1e-6)


# ------------------------------------------------------------------------------------------ optimiser
def test_optimizer_config_is_instantiated_as_a_partial(tmp_path):
    cfg = make_cfg(tmp_path, [])
    optimizer, schedule = split_optim_config(OmegaConf.to_container(cfg.optim, resolve=True))
    assert optimizer == {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 3e-3, "weight_decay": 0.1,
                         "betas": [0.9, 0.95]}
    assert schedule == {"warmup_steps": 50, "min_lr_ratio": 0.1}
    w, b = torch.nn.Parameter(torch.randn(4, 4)), torch.nn.Parameter(torch.randn(4))
    opt = build_optimizer(optimizer, [{"params": [w]}, {"params": [b], "weight_decay": 0.0}], impl="fused")
    assert type(opt) is torch.optim.AdamW and opt.defaults["fused"] is True
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0] and opt.defaults["betas"] == (0.9, 0.95)
    # the config's own fused / foreach choice wins; a class without a `fused` argument gets none
    opt = build_optimizer(dict(optimizer, foreach=True), [{"params": [w]}], impl="fused")
    assert opt.defaults["foreach"] is True and not opt.defaults["fused"]
    opt = build_optimizer({"_target_": "torch.optim.RMSprop", "_partial_": True, "lr": 1e-3}, [{"params": [w]}],
                          impl="fused")
    assert type(opt) is torch.optim.RMSprop


def test_bad_optimizer_configs_name_the_key():
    base = {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3}
    with pytest.raises(ValueError, match=r"optim.momentum is not an argument of torch.optim.AdamW; allowed: lr, betas"):
        optimizer_factory(dict(base, momentum=0.9))
    with pytest.raises(ValueError, match=r"optim._target_='torch.optim.Nope'"):
        optimizer_factory(dict(base, _target_="torch.optim.Nope"))
    with pytest.raises(ValueError, match=r"optim._partial_=False: must be true"):
        optimizer_factory(dict(base, _partial_=False))
    with pytest.raises(ValueError, match="optim.momentum"):  # at construction, before anything trains
        LitLM(TINY, FLASH, optimizer=dict(base, momentum=0.9))


def test_lit_shorthands_fold_into_the_optimizer_config():
    """``lr`` / ``weight_decay`` / ``betas`` keyword arguments (older calls, checkpoints of older runs) override the
    optimizer config and are not kept on their own."""
    lit = LitLM(TINY, FLASH, lr=1e-2, weight_decay=0.0, betas=(0.8, 0.9))
    assert lit.hparams.optimizer == {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-2,
                                     "weight_decay": 0.0, "betas": [0.8, 0.9]}
    assert not {"lr", "weight_decay", "betas"} & set(lit.hparams)
    json.dumps(dict(lit.hparams))  # plain data: a checkpoint holds the config, not a partial


def test_swap_the_optimizer_class_from_the_command_line(tmp_path):
    """``optim._target_=torch.optim.Adam`` trains with Adam, the checkpoint keeps the config (loadable), and the
    result config names the class (a run of another optimiser is another result)."""
    OptimizerSpy.seen.clear()
    cfg = make_cfg(tmp_path, FAST + ["trainer.max_steps=4", "trainer.val_check_interval=4", "optim._target_=torch.optim.Adam",
                                     "+callbacks.spy._target_=test_train_libraries.OptimizerSpy"])
    train_mod.train(cfg)
    assert OptimizerSpy.seen == ["Adam"]
    lit = LitLM.load_from_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert lit.hparams.optimizer["_target_"] == "torch.optim.Adam" and lit.hparams.optimizer["lr"] == 1e-2
    assert result_config(cfg)["optim"]["_target_"] == "torch.optim.Adam"
    stored = json.loads((tmp_path / "final_metrics.json").read_text())["result_config"]
    assert stored == result_config(cfg)
    with pytest.raises(ValueError, match="optim.momentum is not an argument of torch.optim.Adam"):
        train_mod.train(make_cfg(tmp_path / "b", FAST + ["optim._target_=torch.optim.Adam", "+optim.momentum=0.9"]))
    assert not (tmp_path / "b" / "csv").exists(), "a bad optimizer config fails before anything is written"


# ------------------------------------------------------------------------------------------ LearningRateMonitor
def test_learning_rate_monitor_logs_train_lr_of_each_step(tmp_path):
    """``callbacks.lr_monitor`` (Lightning's LearningRateMonitor) logs ``train/lr``: the LR each step trains with."""
    train_mod.train(make_cfg(tmp_path, FAST + ["trainer.max_steps=12", "trainer.val_check_interval=12"]))
    rows = read_csv(tmp_path)
    assert not [k for k in rows[0] if k.startswith("lr-")], "Lightning's default name (lr-AdamW) must not appear"
    lr = dict(column(rows, "train/lr"))
    assert sorted(lr) == list(range(12))
    for s, v in lr.items():
        assert v == pytest.approx(1e-2 * cosine_with_warmup(s, 5, 12, 0.1), rel=1e-6), s
    assert dict(column(rows, "train/lr_no_decay")) == lr


def test_no_logger_leaves_the_lr_monitor_out(tmp_path):
    cfg = make_cfg(tmp_path, FAST + ["trainer.max_steps=2", "trainer.val_check_interval=2", "~logger"])
    assert math.isfinite(train_mod.train(cfg)["val/loss"])


# ------------------------------------------------------------------------------------------ result_config
def test_result_config_ignores_instantiate_only_keys(tmp_path):
    rc = result_config(make_cfg(tmp_path, []))
    assert "_target_" not in rc["optim"] and "_partial_" not in rc["optim"] and "_target_" not in rc["trainer"]
    assert "lr_monitor" not in rc["callbacks"] and "checkpoint" not in rc["callbacks"]  # logging / saving only
    assert "early_stop" in result_config(make_cfg(tmp_path, ["experiment=mqar_recall"]))["callbacks"]  # a result
    assert rc["optim"] == {"lr": 3e-3, "weight_decay": 0.1, "betas": [0.9, 0.95], "warmup_steps": 50,
                           "min_lr_ratio": 0.1}
    rc = result_config(make_cfg(tmp_path, ["optim._target_=torch.optim.Adam", "trainer._target_=my.Trainer"]))
    assert rc["optim"]["_target_"] == "torch.optim.Adam" and rc["trainer"]["_target_"] == "my.Trainer"


RUNS = ROOT / "results" / "h200" / "quality" / "runs"
COMMITTED = ["lm_wikitext/attention=flash,data.seq_len=1024", "mqar_recall", "mqar_window_cliff", "mqar_fig2",
             "mqar_hybrid", "mqar_ablation", "mqar_old_recipe"]


def _committed_run(entry):
    path = RUNS / entry
    if (path / ".hydra").is_dir():
        return path
    found = sorted(p.parent.parent for p in path.glob("*/.hydra/overrides.yaml"))
    return found[0] if found else None


@pytest.mark.parametrize("entry", COMMITTED)
def test_committed_runs_keep_their_result_config(tmp_path, entry):
    """A committed run's composed config (``.hydra/config.yaml``) and the config its own ``.hydra/overrides.yaml``
    composes now give the same :func:`result_config`: what ``skip_finished`` compares did not move with the new
    ``optim._target_`` / ``_partial_``, ``trainer._target_`` and ``callbacks.lr_monitor`` keys."""
    run = _committed_run(entry)
    if run is None:
        pytest.skip(f"no committed run under {RUNS / entry}")
    overrides = yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text())
    stored = OmegaConf.load(run / ".hydra" / "config.yaml")
    now = make_cfg(tmp_path, overrides)
    for c in (stored, now):
        with open_dict(c):
            c.paths = {"output_dir": str(tmp_path), "cache_dir": str(tmp_path / "cache")}
    assert result_config(now) == result_config(stored), run


def test_checkpoint_of_an_older_run_loads_and_resumes(tmp_path):
    """A checkpoint written before the optimiser became a config (flat ``lr`` / ``weight_decay`` / ``betas`` hparams,
    unnamed parameter groups) loads with its own settings and resumes logging ``train/lr``."""
    train_mod.train(make_cfg(tmp_path, FAST + ["trainer.max_steps=4", "trainer.val_check_interval=4"]))
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    ck = torch.load(ckpt, map_location="cpu", weights_only=False)
    hp = ck["hyper_parameters"]
    opt = hp.pop("optimizer")
    hp.update(lr=opt["lr"], weight_decay=0.05, betas=opt["betas"])
    for group in ck["optimizer_states"][0]["param_groups"]:
        del group["name"]
    torch.save(ck, ckpt)
    lit = LitLM.load_from_checkpoint(ckpt)
    assert lit.hparams.optimizer["weight_decay"] == 0.05 and lit.hparams.optimizer["_target_"] == "torch.optim.AdamW"
    with pytest.raises(ValueError, match=r"ckpt_path: .*optim.weight_decay: checkpoint 0.05, this run 0.1"):
        train_mod.train(make_cfg(tmp_path, FAST + ["trainer.max_steps=6", f"ckpt_path={ckpt}"]))
    train_mod.train(make_cfg(tmp_path, FAST + ["trainer.max_steps=6", "trainer.val_check_interval=4",
                                               f"ckpt_path={ckpt}", "optim.weight_decay=0.05"]))
    rows = read_csv(tmp_path)
    assert [s for s, _ in column(rows, "train/lr")] == list(range(6))
    assert not [k for k in rows[0] if "pg1" in k]
