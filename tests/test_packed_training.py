"""Packed documents in training (issue 27 items 1 and 5): TextDataModule(pack=True), GPT.forward(doc_ids, positions),
LitLM feeding them, a train.py run through Hydra, and the errors of bad options."""

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from attn_zoo import make_spec
from attn_zoo.mixers import MixerSpec
from attn_zoo.model import GPT, GPTConfig
from harness.data import TextDataModule, looks_like_wikitext, row_positions

ROOT = Path(__file__).resolve().parents[1]
import train as train_mod  # noqa: E402
from tests.test_train import COMMON, make_cfg  # noqa: E402


def _wiki(n_articles=12, seed=0):
    """A small WikiText-like corpus: articles of random length with sections."""
    rng = np.random.default_rng(seed)
    parts = []
    for a in range(n_articles):
        parts.append(f" \n = Article {a} = \n \n")
        for s in range(int(rng.integers(1, 4))):
            parts.append(f" = = Section {s} = = \n \n")
            parts.append(" ".join(f"w{int(x)}" for x in rng.integers(0, 50, int(rng.integers(5, 60)))) + " \n \n")
    return "".join(parts)


@pytest.fixture
def wiki_files(tmp_path):
    tr, va = tmp_path / "wiki.train.txt", tmp_path / "wiki.valid.txt"
    tr.write_text(_wiki(16, 0))
    va.write_text(_wiki(6, 1))
    return tr, va


def test_packed_batches_ids_positions_counts(wiki_files):
    tr, va = wiki_files
    dm = TextDataModule(path=str(tr), val_path=str(va), pack=True, seq_len=64, batch_size=4)
    dm.setup()
    assert dm.doc_split_used == "wikitext"  # auto: the headings say WikiText
    text = tr.read_text()
    n_docs = text.count(" = \n") - text.count(" = = \n")  # article title lines
    st = dm.pack_stats
    assert st["data/train_docs_kept"] + st["data/train_docs_dropped"] == n_docs
    assert st["data/train_tokens_kept"] + st["data/train_tokens_dropped"] + st["data/bytes_between_docs"] == \
        len(text.encode()), "every byte is kept, dropped (tail) or a separator, each counted"
    assert 0 < st["data/bytes_between_docs"] <= 8  # the whitespace before the first title
    assert st["data/train_tokens_kept"] == st["data/train_rows"] * 65
    assert 0 <= st["data/train_tokens_dropped"] < 65 and 0 <= st["data/val_tokens_dropped"] < 65
    assert st["data/val_tokens_kept"] + st["data/val_tokens_dropped"] + st["data/val_bytes_between_docs"] == \
        len(va.read_text().encode())
    x, y, d, p = next(iter(dm.train_dataloader()))
    assert x.shape == y.shape == d.shape == p.shape == (4, 64)
    assert (d[:, 1:] >= d[:, :-1]).all(), "document ids are nondecreasing along every row"
    starts = torch.ones_like(d, dtype=torch.bool)
    starts[:, 1:] = d[:, 1:] != d[:, :-1]
    assert (p[starts] == 0).all() and (p[~starts] > 0).all(), "positions restart at each document (and row) start"
    assert (p[:, 1:][~starts[:, 1:]] == p[:, :-1][~starts[:, 1:]] + 1).all()
    assert starts[:, 1:].any(), "the small articles put boundaries inside rows"
    # the rows are the stream: targets are the inputs shifted by one
    assert torch.equal(x[:, 1:], y[:, :-1])
    # the printed line names the kept and dropped counts
    dm2 = TextDataModule(path=str(tr), pack=True, seq_len=64, batch_size=4, val_fraction=0.25, doc_split="blank_line")
    dm2.setup()
    assert dm2.doc_split_used == "blank_line"
    n2 = len(text.encode())
    total = sum(dm2.pack_stats[f"data/{s}_tokens_{k}"] for s in ("train", "val") for k in ("kept", "dropped"))
    assert dm2.pack_stats["data/bytes_between_docs"] > 0  # the blank lines
    assert total + dm2.pack_stats["data/bytes_between_docs"] == n2, "the val_fraction cut keeps every token in one split or the other"


def test_resume_refuses_another_doc_mask_and_recall_labels():
    from attn_zoo.model import ModelConfig
    from eval.recall import _text_name
    from harness.lit import LitLM

    mc = ModelConfig(GPTConfig(vocab_size=256, n_layer=1, n_head=2, d_model=16, max_seq_len=16),
                     (make_spec(kind="flash", causal=True),))
    on, off = LitLM(mc, doc_mask=True), LitLM(mc, doc_mask=False)
    with pytest.raises(ValueError, match="data.doc_mask=true"):
        off.check_checkpoint_hparams(dict(on.hparams))
    with pytest.raises(ValueError, match="data.doc_mask=false"):
        on.check_checkpoint_hparams(dict(off.hparams))
    on.check_checkpoint_hparams(dict(on.hparams))
    with pytest.raises(ValueError, match="doc_mask"):
        LitLM(mc, doc_mask="yes")
    # eval.recall lm: runs with and without the mask are different rows
    names = {_text_name({"cfg": {"data": {"path": "a/valid.txt", "pack": True, "doc_mask": m}}}) for m in (True, False)}
    assert len(names) == 2 and _text_name({"cfg": {"data": {"path": "a/valid.txt"}}}) == "valid"


def test_row_positions_and_wikitext_detection():
    d = torch.tensor([[3, 3, 4, 4, 4, 7], [7, 7, 7, 8, 9, 9]])
    assert row_positions(d).tolist() == [[0, 1, 0, 1, 2, 0], [0, 1, 2, 0, 0, 1]]
    assert looks_like_wikitext(_wiki(2)) and not looks_like_wikitext("a\n\nb = c = d\n")


def _docs(lens):
    return torch.cat([torch.full((n,), i) for i, n in enumerate(lens)]).view(1, -1)


@pytest.mark.parametrize("spec", [
    make_spec(kind="flash", causal=True),
    make_spec(kind="sliding_window", causal=True, window_size=(3, 0)),
    make_spec(kind="linear", causal=True),
    MixerSpec("mamba2", (("d_state", 8), ("headdim", 8), ("chunk_size", 4), ("kernel", "torch"))),
], ids=lambda s: s.label)
def test_gpt_with_doc_ids_equals_each_document_alone(spec):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=32, n_layer=2, n_head=2, d_model=16, max_seq_len=32, short_conv=4)
    model = GPT(cfg, spec, backend="torch").eval()
    lens = [5, 1, 9, 3, 6]
    doc = _docs(lens).repeat(2, 1)
    idx = torch.randint(0, 32, doc.shape)
    out = model(idx, doc_ids=doc)
    starts = np.cumsum([0] + lens[:-1])
    alone = torch.cat([model(idx[:, s:s + n]) for s, n in zip(starts, lens)], 1)
    torch.testing.assert_close(out, alone, atol=1e-5, rtol=1e-4)
    assert (out - model(idx)).abs().max() > 1e-3, "without doc_ids the documents see each other"
    # explicit positions: the same as the default (the position inside each document)
    pos = row_positions(doc)
    torch.testing.assert_close(model(idx, doc_ids=doc, positions=pos), out)
    # gradients flow and stay inside: the loss of document 2 has no gradient from document 0's tokens' embeddings
    m2 = GPT(cfg, spec, backend="torch")
    emb = m2.wte.weight
    logits = m2(idx[:1], doc_ids=doc[:1])
    logits[0, starts[2]:starts[2] + lens[2]].sum().backward()
    assert emb.grad is not None and emb.grad.abs().sum() > 0


def test_gpt_documents_errors():
    cfg = GPTConfig(vocab_size=32, n_layer=1, n_head=2, d_model=16, max_seq_len=16)
    m = GPT(cfg, make_spec(kind="flash", causal=True), backend="torch")
    idx = torch.zeros(1, 8, dtype=torch.long)
    with pytest.raises(ValueError, match="doc_ids must have shape"):
        m(idx, doc_ids=torch.zeros(1, 7, dtype=torch.long))
    with pytest.raises(ValueError, match="positions must lie in"):
        m(idx, positions=torch.full((1, 8), 16))
    with pytest.raises(ValueError, match="doc_ids"):
        m(idx, doc_ids=torch.zeros(1, 8, dtype=torch.long), caches=m.init_cache(1))
    # Lightning validates under torch.inference_mode: inference tensors track no version, so their checks are not
    # cached (they were a RuntimeError), and a bad one is still caught on every call
    with torch.inference_mode():
        good = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2]])
        m(idx, doc_ids=good)
        m(idx, doc_ids=good)
        good[0, 0] = 5  # the same tensor, now decreasing
        with pytest.raises(ValueError, match="nondecreasing"):
            m(idx, doc_ids=good)


def test_bad_options_name_the_option(wiki_files):
    tr, va = wiki_files
    for kw, key in ((dict(pack="yes"), "data.pack"), (dict(pack=True, doc_split="lines"), "data.doc_split"),
                    (dict(pack=True, doc_mask=1), "data.doc_mask"), (dict(pack=True, eos=300), "data.eos"),
                    (dict(eos=0), "data.eos"), (dict(doc_split="blank_line"), "data.doc_split=.blank_line.*data.pack=true"),
                    (dict(doc_mask=False), "data.doc_mask=false .*it needs data.pack=true")):
        with pytest.raises(ValueError, match=key):
            TextDataModule(path=str(tr), **kw)
    with pytest.raises(ValueError, match="allowed values: auto, rows, wikitext, blank_line, whole"):
        TextDataModule(path=str(tr), pack=True, doc_split="lines")
    with pytest.raises(FileNotFoundError, match="data.val_path"):
        TextDataModule(path=str(tr), val_path=str(tr) + ".missing")
    dm = TextDataModule(path=str(tr), pack=True, eos=ord("w"))  # 'w' is in the text
    with pytest.raises(ValueError, match="data.eos=119 occurs in the text"):
        dm.setup()
    with pytest.raises(ValueError, match="data.seq_len=4096 is too long"):
        TextDataModule(path=str(tr), val_path=str(va), pack=True, seq_len=4096, batch_size=4).setup()


@pytest.mark.parametrize("doc_mask", [True, False])
def test_train_packed_text_through_hydra(tmp_path, wiki_files, doc_mask, monkeypatch):
    tr, va = wiki_files
    seen = {}
    orig = GPT.forward

    def spy(self, idx, *a, **kw):
        seen.setdefault("doc_ids", kw.get("doc_ids") is not None)
        return orig(self, idx, *a, **kw)

    monkeypatch.setattr(GPT, "forward", spy)
    cfg = make_cfg(tmp_path, COMMON + ["data=text", f"data.path={tr}", f"data.val_path={va}", "data.pack=true",
                                       f"data.doc_mask={str(doc_mask).lower()}", "data.batch_size=4",
                                       "attention=sliding_window", "attention.window_size=[7,0]",
                                       "trainer.max_steps=6", "trainer.val_check_interval=3"])
    metrics = train_mod.train(cfg)
    assert seen["doc_ids"] is doc_mask, "the model gets the documents exactly when data.doc_mask is on"
    assert math.isfinite(metrics["val/bpb"])
    assert math.isclose(metrics["val/bpb"], metrics["val/loss"] / math.log(2), rel_tol=1e-5)
    with open(tmp_path / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    kept = [float(r["data/train_tokens_kept"]) for r in rows if r.get("data/train_tokens_kept")]
    assert kept and kept[0] > 0, "the kept token count is logged"
    assert any(r.get("data/val_tokens_dropped") not in (None, "") for r in rows)


def test_hub_dataset_rows_are_documents(monkeypatch):
    import datasets

    rows = [f"row {i} " + "x" * (i % 7) for i in range(200)] + [""]  # an empty row: a document dropped and counted
    calls = []

    def fake_load(name, config=None, split=None, **kw):
        calls.append((name, config, split))
        return datasets.Dataset.from_dict({"text": rows})

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    dm = TextDataModule(path=None, hub_name="someone/corpus", hub_split="train", pack=True, seq_len=32, batch_size=4)
    dm.setup()
    assert calls[0] == ("someone/corpus", None, "train")
    assert dm.doc_split_used == "rows"  # auto on a hub dataset without WikiText headings
    st = dm.pack_stats
    assert st["data/train_docs_kept"] + st["data/train_docs_dropped"] + st["data/val_docs_kept"] + \
        st["data/val_docs_dropped"] >= len(rows)  # the document at the val cut counts in both
    assert st["data/bytes_between_docs"] == 0
    kept = st["data/train_tokens_kept"] + st["data/train_tokens_dropped"] + st["data/val_tokens_kept"] + \
        st["data/val_tokens_dropped"]
    assert kept == sum(len(r) for r in rows)
    x, y, d, p = next(iter(dm.val_dataloader()))
    assert (d[:, 1:] > d[:, :-1]).any(), "short rows: several documents per packed row"


def test_packed_study_sweep_composes_and_runs(tmp_path):
    """conf/experiment/lm_wikitext_packed.yaml: every job of its sweep (doc_mask x variants) composes with the
    GPU-machine paths, and one mamba2 job trains two steps on CPU at small sizes."""
    from omegaconf import OmegaConf

    sweep = OmegaConf.load(ROOT / "conf" / "experiment" / "lm_wikitext_packed.yaml").hydra.sweeper.params
    variants = str(sweep.attention).split(",")
    assert set(variants) >= {"flash", "sliding_window", "linear", "mamba2"}
    assert str(sweep["data.doc_mask"]) in ("true,false", "True,False")
    tr = tmp_path / "valid.txt"
    va = tmp_path / "test.txt"
    tr.write_text(_wiki(30, 2))
    va.write_text(_wiki(10, 3))
    for v in variants:
        for dm in ("true", "false"):
            cfg = make_cfg(tmp_path, ["experiment=lm_wikitext_packed", f"attention={v}", f"data.doc_mask={dm}",
                                      "data.path=.data/wikitext-2/valid.txt", "data.val_path=.data/wikitext-2/test.txt"])
            assert cfg.data.pack is True and cfg.data.val_path.endswith("test.txt")
            assert len(train_mod.layer_specs(cfg)) == cfg.model.n_layer
    cfg = make_cfg(tmp_path / "run", ["experiment=lm_wikitext_packed", "attention=mamba2", "data.doc_mask=true",
                                      f"data.path={tr}", f"data.val_path={va}", "data.seq_len=64", "data.batch_size=4",
                                      "model.d_model=32", "model.n_layer=1", "attention.d_state=8", "attention.headdim=16",
                                      "attention.kernel=torch", "trainer.accelerator=cpu", "trainer.precision=32-true",
                                      "trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.limit_val_batches=2",
                                      "skip_finished=false"])
    metrics = train_mod.train(cfg)
    assert math.isfinite(metrics["val/bpb"])


def test_paragraph_study_splits_at_blank_lines_and_sweeps_the_mask(tmp_path):
    """conf/experiment/lm_wikitext_paragraphs.yaml: lm_wikitext_packed with blank-line documents, its own sweep
    folder (its jobs must not be taken for the article study's finished ones), doc_mask swept."""
    from omegaconf import OmegaConf

    raw = OmegaConf.load(ROOT / "conf" / "experiment" / "lm_wikitext_paragraphs.yaml")
    assert str(raw.hydra.sweeper.params["data.doc_mask"]) in ("true,false", "True,False")
    cfg = make_cfg(tmp_path, ["experiment=lm_wikitext_paragraphs", "attention=flash", "data.doc_mask=false"])
    assert cfg.data.doc_split == "blank_line" and cfg.data.pack is True and cfg.data.doc_mask is False
    assert cfg.data.val_path is not None and cfg.trainer.max_steps == 500
    packed = make_cfg(tmp_path, ["experiment=lm_wikitext_packed"])
    assert raw.hydra.sweep.dir != OmegaConf.load(ROOT / "conf" / "experiment" / "lm_wikitext_packed.yaml").hydra.sweep.dir
    assert packed.data.doc_split == "auto"
