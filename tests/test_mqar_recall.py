"""MQAR recall: the generator at Zoology's sizes, the key-distance split of the window cliff, resumable multiruns,
and a tiny model that really learns recall on the CPU (a regression of the recipe shows here)."""

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf

from harness.callbacks import RecallByDistance, mqar_key_distance
from harness.data import MQARDataModule, _distinct_ints, generate_mqar
from harness.lit import LitLM
from attn_zoo.model import spec_to_dict
from harness.runs import finished_run, result_config
from attn_zoo.spec import AttentionSpec

ROOT = Path(__file__).resolve().parents[1]


def test_distinct_ints_are_distinct_in_range_and_deterministic():
    g = torch.Generator().manual_seed(3)
    a = _distinct_ints(2000, 16, 1, 4096, g)
    assert a.shape == (2000, 16) and int(a.min()) >= 1 and int(a.max()) < 4096
    assert all(len(set(r)) == 16 for r in a.tolist())
    # dense draw (every value of the range): still distinct, a permutation per row
    b = _distinct_ints(50, 7, 0, 7, torch.Generator().manual_seed(0))
    assert all(sorted(r) == list(range(7)) for r in b.tolist())
    c = _distinct_ints(2000, 16, 1, 4096, torch.Generator().manual_seed(3))
    assert torch.equal(a, c)
    # uniform-ish: no value of a small range is starved
    counts = torch.bincount(_distinct_ints(4000, 4, 0, 8, torch.Generator().manual_seed(1)).flatten(), minlength=8)
    assert counts.min() > 0.8 * counts.float().mean()


def test_zoology_vocab_is_cheap_and_labels_point_at_bound_values():
    x, y = generate_mqar(64, 256, 8192, 16, seed=0, random_non_queries=False)
    assert x.shape == y.shape == (64, 256)
    mask = y != -100
    assert (mask.sum(1) == 16).all()
    for b in range(4):
        keys, values = x[b, 0:32:2], x[b, 1:32:2]
        assert len(set(keys.tolist())) == 16 and (keys < 4096).all() and (values >= 4096).all()
        for p in mask[b].nonzero().flatten().tolist():
            assert y[b, p] == values[(keys == x[b, p]).nonzero()[0, 0]]
        # filler-free query region: zeros except the queries
        region = x[b, 32:]
        assert set(region[region != 0].tolist()) <= set(keys.tolist())


def test_key_distance_matches_a_brute_force_search():
    x, y = generate_mqar(8, 64, 64, 4, seed=1, random_non_queries=True)
    mask, dist = mqar_key_distance(x, y, 4)
    assert torch.equal(mask, y != -100)
    for b in range(8):
        for p in range(64):
            if not mask[b, p]:
                assert dist[b, p] == 0
                continue
            j = next(j for j in range(0, 8, 2) if x[b, j] == x[b, p])
            assert dist[b, p] == p - j > 0


def _lit(window, n_layer=1):
    spec = AttentionSpec(kind="sliding_window", causal=True, window_size=(window, 0))
    cfg = dict(vocab_size=32, n_layer=n_layer, n_head=2, d_model=16, max_seq_len=32)
    return LitLM(model_config=cfg, layer_specs=[spec_to_dict(spec)] * n_layer, backend="torch", lr=1e-3,
                 total_steps=2, warmup_steps=1)


def test_recall_by_distance_logs_the_split_at_the_window():
    torch.manual_seed(0)
    dm = MQARDataModule(vocab_size=32, seq_len=32, num_kv_pairs=4, num_train=64, num_val=48, batch_size=16)
    lit = _lit(window=9)
    cb = RecallByDistance()  # window from the model: 9
    trainer = L.Trainer(max_steps=1, limit_val_batches=3, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[cb], accelerator="cpu")
    trainer.fit(lit, datamodule=dm)
    m = trainer.validate(lit, datamodule=dm, verbose=False)[0]
    x, y = dm.val_set.tensors
    mask, dist = mqar_key_distance(x, y, 4)
    far = (mask & (dist > 9)).sum().item() / mask.sum().item()
    assert m["val/frac_far"] == pytest.approx(far)
    with torch.no_grad():
        lit.eval()
        pred = lit.model(x).argmax(-1)
    ok = (pred == y) & mask
    near_mask = mask & (dist <= 9)
    assert m["val/acc_near"] == pytest.approx(ok[near_mask].float().mean().item(), abs=1e-6)
    assert m["val/acc_far"] == pytest.approx(ok[mask & (dist > 9)].float().mean().item(), abs=1e-6)


def test_recall_by_distance_errors_name_the_argument():
    with pytest.raises(ValueError, match="window"):
        RecallByDistance(window=-1)
    lit = LitLM(model_config=dict(vocab_size=32, n_layer=1, n_head=2, d_model=16, max_seq_len=32),
                layer_specs=[spec_to_dict(AttentionSpec(kind="flash", causal=True))], backend="torch")
    dm = MQARDataModule(vocab_size=32, seq_len=32, num_kv_pairs=4, num_train=32, num_val=16, batch_size=16)
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[RecallByDistance()], accelerator="cpu",
                        limit_val_batches=1)
    with pytest.raises(ValueError, match="callbacks.recall.window"):
        trainer.validate(lit, datamodule=dm, verbose=False)


def test_finished_run_reads_final_metrics_only(tmp_path):
    assert finished_run(tmp_path) is None
    (tmp_path / "final_metrics.json").write_text("{trunc")
    assert finished_run(tmp_path) is None  # a truncated file: the job runs again
    (tmp_path / "final_metrics.json").write_text(json.dumps({"steps": 5, "metrics": {"val/acc": 0.5}}))
    assert finished_run(tmp_path)["steps"] == 5
    cfg = OmegaConf.create({"model": {"d_model": 16}, "paths": {"output_dir": "a"}, "trainer": {"max_steps": 5}})
    assert finished_run(tmp_path, cfg) is None  # no stored config: the job runs again
    rec = {"steps": 5, "result_config": result_config(cfg)}
    (tmp_path / "final_metrics.json").write_text(json.dumps(rec))
    moved = OmegaConf.create({"model": {"d_model": 16}, "paths": {"output_dir": "b"}, "trainer": {"max_steps": 5}})
    assert finished_run(tmp_path, moved)["steps"] == 5  # paths do not change a result
    with pytest.raises(ValueError, match=r"trainer\.max_steps"):
        finished_run(tmp_path, OmegaConf.create({"model": {"d_model": 16}, "trainer": {"max_steps": 9}}))


def test_experiment_configs_resolve_pairs_and_sweeps():
    from hydra import compose, initialize_config_dir

    import train  # noqa: F401  (registers the attn_zoo.* resolvers)

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for name in ("mqar_recall", "mqar_fig2", "mqar_window_cliff", "mqar_hybrid", "mqar_ablation"):
            cfg = compose(config_name="train", overrides=[f"experiment={name}", "data.seq_len=128"],
                          return_hydra_config=True)
            assert cfg.data.num_kv_pairs == 8 and cfg.model.n_layer in (2, 4) and cfg.skip_finished
            assert cfg.hydra.sweeper.params, name
            assert cfg.data.vocab_size == 8192 and not cfg.data.random_non_queries
        cfg = compose(config_name="train", overrides=["experiment=lm_wikitext", "data.seq_len=2048"])
        assert cfg.data.batch_size * cfg.data.seq_len == 16384


def test_multirun_skips_finished_jobs(tmp_path, train_py_in_process):
    sweep = tmp_path / "sweep"
    args = ["train.py", "-m", "experiment=mqar_recall", "trainer=default", "data.vocab_size=64", "data.num_train=64",
            "data.num_val=16", "data.batch_size=16", "model.d_model=16", "trainer.max_steps=2",
            "trainer.val_check_interval=2", f"hydra.sweep.dir={sweep}", "data.seq_len=32", "optim.lr=1e-3"]
    # the three launches in this interpreter (the first trains; the others are skipped, refused; a multirun's
    # process: test_train.py's W&B multirun)
    r = train_py_in_process(ROOT, *args[1:], env={"COLUMNS": "300"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    job = next(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    first = (job / "final_metrics.json").read_text()
    r = train_py_in_process(ROOT, *args[1:])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "already finished" in r.stdout + r.stderr
    assert (job / "final_metrics.json").read_text() == first  # not trained again
    # the same folders with another config: refused, naming what differs (never another config's numbers)
    r = train_py_in_process(ROOT, *args[1:], "model.d_model=32")
    assert r.returncode != 0 and "model.d_model" in r.stdout + r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    assert (job / "final_metrics.json").read_text() == first


def test_tiny_model_learns_recall_on_cpu(tmp_path):
    """The recipe of the mqar_* experiments, shrunk to a CPU: 2 layers, d_model 32, (seq_len, pairs) = (16, 2).
    Attention must reach 0.8 on the query positions, where guessing one of the example's two values gives 0.5: the
    model recalls the value bound to each key (the induction-head circuit forms within trainer.max_steps=3000; when
    it does depends on the seed: 300 / 1,000 / 600 / 1,400 / 1,600 / 1,900 steps at seed 3 / 4 / 2 / 0 / 1 / 5 on
    a shared 2-core CPU, 2026-12-06, all six learned; seed 3 here: the sooner the early stop, the shorter the test)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    import train as train_mod

    overrides = ["experiment=mqar_recall", "trainer=default", "model=tiny", "logger=csv", "data.seq_len=16", "data.num_kv_pairs=2",
                 "data.vocab_size=16", "data.num_train=20000", "data.num_val=256", "data.batch_size=256",
                 "model.d_model=32", "model.n_head=2", "optim.lr=1e-2", "optim.warmup_steps=30",
                 "trainer.max_steps=3000", "trainer.val_check_interval=100", "trainer.log_every_n_steps=100",
                 "callbacks.early_stop.stopping_threshold=0.8", "skip_finished=false", "seed=3"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path)
        cfg.paths.cache_dir = str(tmp_path / "cache")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: a second thread only adds contention (8x slower on a shared 2-core box)
    try:
        metrics = train_mod.train(cfg)
    finally:
        torch.set_num_threads(threads)
    final = json.loads((tmp_path / "final_metrics.json").read_text())
    assert metrics["val/acc"] >= 0.8, f"no recall: val/acc {metrics['val/acc']:.3f} after {final['steps']} steps"


def test_recall_by_distance_refuses_a_dilated_window_without_an_explicit_distance():
    from types import SimpleNamespace

    spec = AttentionSpec(kind="dilated_window", causal=True, window_size=(15, 0), dilation=2)
    module = SimpleNamespace(gpt=SimpleNamespace(specs=[spec]), model=None)
    trainer = SimpleNamespace(datamodule=SimpleNamespace(num_kv_pairs=4))
    with pytest.raises(ValueError, match="callbacks.recall.window"):
        RecallByDistance()._resolve(trainer, module)
    assert RecallByDistance(window=30)._resolve(trainer, module) == (4, 30)
    with pytest.raises(ValueError, match="callbacks.recall.window"):
        RecallByDistance(window="abc")


def test_sparse_targets_loss_equals_the_dense_loss():
    """GPT.forward(sparse_targets=True) (MQAR's training loss: the head on the scored rows only) gives the dense
    path's loss, the dense logits of the scored rows, and the same gradient for every parameter."""
    from attn_zoo.model import GPT, GPTConfig

    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=32, n_layer=2, max_seq_len=16), AttentionSpec(kind="flash", causal=True),
            backend="torch")
    x, y = generate_mqar(4, 16, 32, 2, seed=0)
    params = [p for p in m.parameters()]
    logits, dense = m(x, y)
    g_dense = torch.autograd.grad(dense, params)
    rows, sparse = m(x, y, sparse_targets=True)
    g_sparse = torch.autograd.grad(sparse, params)
    scored = y != -100
    assert rows.shape == (int(scored.sum()), 32) and 0 < rows.shape[0] < y.numel()
    assert torch.allclose(rows, logits[scored], atol=1e-6)
    assert torch.allclose(dense, sparse, atol=1e-6)
    for p, a, b in zip(params, g_dense, g_sparse):
        assert a.abs().sum() > 0 and torch.allclose(a, b, atol=1e-6), p.shape


def test_mqar_validation_scores_the_scored_rows_like_the_dense_head():
    """LitLM's MQAR validation (the head on the query rows only) gives the val/loss and val/acc of the dense head."""
    from harness.lit import LitLM
    from attn_zoo.model import spec_to_dict

    torch.manual_seed(0)
    lit = LitLM(model_config=dict(vocab_size=32, n_layer=1, max_seq_len=16, n_head=2, d_model=16),
                layer_specs=[spec_to_dict(AttentionSpec(kind="flash", causal=True))], backend="torch", task="mqar")
    assert lit._sparse_targets
    x, y = generate_mqar(8, 16, 32, 2, seed=1)
    out = {}
    for sparse in (True, False):
        lit._sparse_targets = sparse
        lit.on_validation_epoch_start()
        lit.validation_step((x, y), 0)
        out[sparse] = (lit.val_loss.compute().item(), lit.val_acc.compute().item())
    assert out[True] == pytest.approx(out[False], abs=1e-6)
