"""The end of a run speaks to a newcomer: the headline metric beside its baseline in words, the learning curve in a
line, what to try next; final_metrics.json keeps the baseline (issue 28, items 1 and 5)."""

from types import SimpleNamespace

import train as train_mod
from harness.data import MQARDataModule


def test_mqar_baseline_is_guessing_among_the_examples_values():
    dm = MQARDataModule(vocab_size=16, seq_len=16, num_kv_pairs=2, num_train=32, num_val=8, batch_size=8)
    base = train_mod.baseline_of(dm, {"val/acc": 0.9})
    assert base == {"metric": "val/acc", "value": 0.5, "higher_is_better": True,
                    "what": "guessing one of the example's 2 values"}
    assert train_mod.baseline_of(dm, {"val/loss": 1.0}) is None  # no val/acc measured: nothing to compare


def test_text_baseline_is_the_unigram_bpb():
    dm = SimpleNamespace(unigram_bits_per_byte=lambda: 4.5)
    base = train_mod.baseline_of(dm, {"val/bpb": 2.0, "val/acc": 0.4})
    assert base["metric"] == "val/bpb" and base["value"] == 4.5 and not base["higher_is_better"]


def test_the_verdict_is_said_in_words_beside_the_baseline(capsys):
    base = {"metric": "val/acc", "value": 0.5, "higher_is_better": True, "what": "guessing one of the example's 2 values"}
    curve = [[100, {"val/acc": 0.5}], [200, {"val/acc": 0.6}], [300, {"val/acc": 0.97}]]
    train_mod._print_curve_and_verdict(curve, base, {"val/acc": 0.97})
    out = capsys.readouterr().out
    assert "learned: val/acc 0.97 vs 0.50 by guessing one of the example's 2 values" in out
    assert "100: 0.50" in out and "300: 0.97" in out and "▁" in out and "█" in out
    assert "next:" in out and "trainer=gpu" in out
    train_mod._print_curve_and_verdict(curve[:1], base, {"val/acc": 0.52})  # within 10 % of the baseline
    out = capsys.readouterr().out  # it says why, past the baseline as it is (the bare verdict read as a contradiction)
    assert "not learned yet: val/acc 0.52 vs 0.50 by guessing one of the example's 2 values (past the baseline by " \
           "0.02, under the 10% of it (0.05) that 'learned' needs)" in out
    train_mod._print_curve_and_verdict(curve[:1], base, {"val/acc": 0.40})  # behind it: no such note
    assert "not learned yet: val/acc 0.40 vs 0.50 by guessing one of the example's 2 values\n" in capsys.readouterr().out
    bpb = {"metric": "val/bpb", "value": 4.5, "higher_is_better": False, "what": "unigram"}
    train_mod._print_curve_and_verdict([], bpb, {"val/bpb": 2.5})
    assert "learned: val/bpb 2.50 vs 4.50 by unigram" in capsys.readouterr().out
    # a diverged run (non-finite loss) said "not learned yet" first, the divergence only in a later warning
    train_mod._print_curve_and_verdict(curve, base, {"val/acc": 0.97, "train/loss": float("nan")},
                                       diverged=train_mod._nonfinite_losses({"train/loss": float("nan")}))
    out = capsys.readouterr().out
    assert "diverged (train/loss=nan): val/acc 0.97 vs 0.50" in out and "learned:" not in out
    nan = float("nan")  # a diverged LM run: its headline metric is NaN too; it printed no verdict at all
    train_mod._print_curve_and_verdict([], bpb, {"val/bpb": nan, "val/loss": nan, "train/loss": nan},
                                       diverged=["train/loss", "val/loss"])
    out = capsys.readouterr().out
    assert "diverged (train/loss=nan, val/loss=nan): val/bpb nan vs 4.50 by unigram" in out
    assert "next: the same run with a lower optim.lr" in out and "trainer=gpu" not in out  # not a GPU run


def test_the_gpu_hint_says_where_it_runs(capsys, monkeypatch):
    """On a machine without CUDA the next-step hint offered trainer=gpu, which is refused there."""
    base = {"metric": "val/acc", "value": 0.5, "higher_is_better": True, "what": "guessing"}
    for cuda, want in ((False, ", on a CUDA machine, a GPU run (python train.py trainer=gpu)\n"),  # last
                       (True, "next: a GPU run (python train.py trainer=gpu), ")):  # first: it runs here
        monkeypatch.setattr(train_mod.torch.cuda, "is_available", lambda c=cuda: c)
        train_mod._print_curve_and_verdict([], base, {"val/acc": 0.9})
        assert want in capsys.readouterr().out
