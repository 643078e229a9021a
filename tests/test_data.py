"""Data modules: MQAR construction (Zoology) and byte-level packed text."""

import math
import os

import pytest
import torch

from harness.data import (MQARDataModule, PackedDataset, TextDataModule, generate_mqar, max_text_seq_len,
                           mqar_memory_bytes, unigram_entropy_bits)


# ---------------------------------------------------------------------------------------------- MQAR
def test_mqar_structure():
    V, N, P = 64, 64, 8
    x, y = generate_mqar(200, N, V, P, seed=1)
    assert x.shape == y.shape == (200, N) and x.dtype == y.dtype == torch.long
    assert x.min() >= 0 and x.max() < V
    for b in range(200):
        keys, values = x[b, 0:2 * P:2], x[b, 1:2 * P:2]
        assert ((keys >= 1) & (keys < V // 2)).all(), "keys come from the lower half (0 reserved)"
        assert ((values >= V // 2) & (values < V)).all(), "values come from the upper half"
        assert len(set(keys.tolist())) == P, "keys are distinct"
        assert (y[b, :2 * P] == -100).all(), "no loss inside the kv context"
        kv = dict(zip(keys.tolist(), values.tolist()))
        qpos = (y[b] != -100).nonzero().flatten()
        assert len(qpos) == P, "every key is queried once; loss only there"
        assert set(x[b, qpos].tolist()) == set(kv), "queries refer to the context's keys"
        for p in qpos.tolist():
            assert p >= 2 * P and (p - 2 * P) % 2 == 0
            assert y[b, p].item() == kv[x[b, p].item()], "label at a query is the value bound to its key"


def test_mqar_gaps_follow_power_law():
    x, y = generate_mqar(3000, 64, 64, 4, power_a=0.01, seed=0)
    qpos = (y != -100).nonzero()[:, 1] - 8
    counts = torch.bincount(qpos // 2, minlength=28).float()
    assert counts[0] > counts[5] > counts[20], "short gaps are more frequent than long ones"
    # a larger exponent flattens the distribution
    _, y2 = generate_mqar(3000, 64, 64, 4, power_a=1.0, seed=0)
    c2 = torch.bincount(((y2 != -100).nonzero()[:, 1] - 8) // 2, minlength=28).float()
    assert c2[0] / c2[20] < counts[0] / counts[20]


def test_mqar_deterministic_by_seed():
    a = generate_mqar(50, 32, 32, 4, seed=7)
    b = generate_mqar(50, 32, 32, 4, seed=7)
    c = generate_mqar(50, 32, 32, 4, seed=8)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    dm1, dm2 = MQARDataModule(32, 32, 4, num_train=64, num_val=16, seed=3), MQARDataModule(32, 32, 4, num_train=64, num_val=16, seed=3)
    dm1.setup(), dm2.setup()
    assert torch.equal(dm1.train_set.tensors[0], dm2.train_set.tensors[0])
    assert not torch.equal(dm1.train_set.tensors[0][:16], dm1.val_set.tensors[0]), "val differs from train"
    xb, yb = next(iter(dm1.train_dataloader()))
    assert xb.shape == (dm1.batch_size, 32)


@pytest.mark.parametrize("kw,name", [
    (dict(seq_len=33), "seq_len"), (dict(num_kv_pairs=20), "num_kv_pairs"), (dict(vocab_size=8), "vocab_size"),
    (dict(power_a=0.0), "power_a"),
])
def test_mqar_bad_sizes(kw, name):
    args = dict(vocab_size=64, seq_len=64, num_kv_pairs=8)
    args.update(kw)
    with pytest.raises(ValueError, match=name):
        MQARDataModule(**args)


@pytest.mark.parametrize("kw,name", [
    (dict(batch_size=1.5), "data.batch_size=1.5"), (dict(num_kv_pairs=2.5), "data.num_kv_pairs=2.5"),
    (dict(num_train="abc"), "data.num_train='abc'"), (dict(seq_len=64.0), "data.seq_len=64.0"),
    (dict(vocab_size=True), "data.vocab_size=True"), (dict(num_val=8.9), "data.num_val=8.9"),
])
def test_mqar_sizes_must_be_integers(kw, name):
    """A fractional size was truncated by int() (data.batch_size=1.5 trained with batches of 1, the config recording
    1.5) and a string failed with int()'s message, naming no key."""
    args = dict(vocab_size=64, seq_len=64, num_kv_pairs=8, num_train=64, num_val=8, batch_size=8)
    args.update(kw)
    with pytest.raises(ValueError, match=name.replace(".", r"\.") + ".*integer"):
        MQARDataModule(**args)


def test_mqar_size_limits_name_argument_and_limit():
    # memory: the message names data.seq_len and the longest seq_len that fits; that one is accepted
    with pytest.raises(ValueError, match=r"data.seq_len=100000 .*data.max_memory_gb=8.*longest data.seq_len that fits is (\d+)") as e:
        MQARDataModule(seq_len=100000, num_train=20000, num_val=1000)
    longest = int(e.value.args[0].split("fits is ")[1].split(".")[0])
    assert mqar_memory_bytes(20000, 1000, longest) <= 8 * 2**30 < mqar_memory_bytes(20000, 1000, longest + 2)
    MQARDataModule(seq_len=longest, num_train=20000, num_val=1000)  # no error, nothing generated yet
    with pytest.raises(ValueError, match="data.max_memory_gb=0.001"):
        MQARDataModule(vocab_size=32, seq_len=64, num_kv_pairs=4, num_train=4096, max_memory_gb=0.001)
    # fewer examples than one batch: no training step at all
    with pytest.raises(ValueError, match=r"data.num_train=16 .*data.batch_size=32"):
        MQARDataModule(vocab_size=32, seq_len=32, num_kv_pairs=4, num_train=16, batch_size=32)


def test_mqar_chance_levels_match_the_generator():
    V, N, P = 64, 64, 8
    dm = MQARDataModule(V, N, P, num_train=64, num_val=400, batch_size=8, seed=5)
    dm.setup()
    x, y = dm.val_set.tensors
    chance = dm.chance_levels()
    assert chance == {"context": 1 / P, "uniform": 1 / (V - V // 2)}
    # every query's answer is one of the example's P distinct context values, and the value vocabulary has V - V//2
    g = torch.Generator().manual_seed(0)
    hits_ctx = hits_uni = n = 0
    for b in range(x.shape[0]):
        values = x[b, 1:2 * P:2]
        assert len(set(values.tolist())) == P
        for p in (y[b] != -100).nonzero().flatten().tolist():
            assert y[b, p] in values
            hits_ctx += int(values[torch.randint(P, (1,), generator=g)] == y[b, p])
            hits_uni += int(torch.randint(V // 2, V, (1,), generator=g) == y[b, p])
            n += 1
    assert abs(hits_ctx / n - chance["context"]) < 0.03 and abs(hits_uni / n - chance["uniform"]) < 0.015


# ---------------------------------------------------------------------------------------------- text
@pytest.fixture
def text_file(tmp_path):
    text = "".join(f"line {i}: the quick brown fox é{i % 7}\n" for i in range(300))
    p = tmp_path / "corpus.txt"
    p.write_text(text, encoding="utf-8")
    return p, text


def test_text_packing_split_and_bytes(text_file, tmp_path):
    path, text = text_file
    raw = text.encode("utf-8")
    dm = TextDataModule(path=str(path), seq_len=32, batch_size=4, val_fraction=0.2, cache_dir=str(tmp_path / "cache"))
    dm.setup()
    n_val = round(len(raw) * 0.2)
    assert dm.bytes_per_token == 1.0 and dm.vocab_size == 256
    all_tokens = torch.cat([dm.train_tokens, dm.val_tokens])
    assert all_tokens.numel() == len(raw), "one token per UTF-8 byte (é is two tokens)"
    assert bytes(all_tokens.tolist()) == raw
    assert dm.val_tokens.numel() == n_val and bytes(dm.val_tokens.tolist()) == raw[-n_val:], "val is the contiguous tail"
    assert len(dm.train_set) == (dm.train_tokens.numel() - 1) // 32
    x, y = dm.train_set[3]
    assert x.shape == y.shape == (32,)
    assert torch.equal(x[1:], y[:-1]), "targets are inputs shifted by one"
    assert bytes(x.tolist()) == raw[3 * 32: 4 * 32]
    xb, yb = next(iter(dm.train_dataloader()))
    assert xb.shape == (4, 32) and xb.dtype == torch.long
    # cached token array is reused, and invalidated when the file changes
    files = list((tmp_path / "cache").glob("tokens-*.pt"))
    assert len(files) == 1
    dm2 = TextDataModule(path=str(path), seq_len=16, batch_size=4, val_fraction=0.2, cache_dir=str(tmp_path / "cache"))
    dm2.setup()
    assert torch.equal(torch.cat([dm2.train_tokens, dm2.val_tokens]), all_tokens)
    path.write_text(text + "more text\n", encoding="utf-8")
    os.utime(path, (1e9, 1e9))
    dm3 = TextDataModule(path=str(path), seq_len=16, val_fraction=0.2, cache_dir=str(tmp_path / "cache"))
    dm3.setup()
    assert dm3.train_tokens.numel() + dm3.val_tokens.numel() == len(raw) + 10
    assert len(list((tmp_path / "cache").glob("tokens-*.pt"))) == 2


def test_text_missing_path_names_data_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="data.path"):
        TextDataModule(path=str(tmp_path / "nope.txt"))
    with pytest.raises(ValueError, match="data.path"):
        TextDataModule(path=None)
    with pytest.raises(ValueError, match="tokenizer"):
        TextDataModule(path=str(tmp_path), tokenizer="gpt2")


def test_text_too_small_for_seq_len(tmp_path):
    p = tmp_path / "small.txt"
    p.write_text("abc" * 10)
    dm = TextDataModule(path=str(p), seq_len=64)
    with pytest.raises(ValueError, match="seq_len"):
        dm.setup()


def test_unigram_entropy():
    t = torch.arange(8).repeat(100)
    assert math.isclose(unigram_entropy_bits(t), 3.0, rel_tol=1e-9)
    assert unigram_entropy_bits(torch.zeros(10, dtype=torch.long)) == 0.0


def test_packed_dataset_drops_partial_tail():
    ds = PackedDataset(torch.arange(10), 4)
    assert len(ds) == 2  # windows [0..4], [4..8]; 8..10 cannot hold 5 tokens
    x, y = ds[1]
    assert x.tolist() == [4, 5, 6, 7] and y.tolist() == [5, 6, 7, 8]


def test_text_longest_seq_len_is_exact(text_file, tmp_path):
    path, text = text_file
    n = len(text.encode("utf-8"))
    n_val = round(n * 0.2)
    limit = max_text_seq_len(n - n_val, n_val, 8)
    assert limit == min((n - n_val - 1) // 8, n_val - 1) > 0
    ok = TextDataModule(path=str(path), seq_len=limit, batch_size=8, val_fraction=0.2)
    ok.setup()
    assert len(ok.train_dataloader()) >= 1 and len(ok.val_dataloader()) >= 1
    with pytest.raises(ValueError, match=rf"data.seq_len={limit + 1} .* longest data.seq_len it can train is {limit} "):
        TextDataModule(path=str(path), seq_len=limit + 1, batch_size=8, val_fraction=0.2).setup()


def test_mqar_loaders_give_the_per_example_loaders_batches():
    """MQARDataModule's loaders (one gather per batch, BatchedTensorDataset) yield the batches of a plain
    TensorDataset loader with the same seed, over two epochs (shuffle) and for validation (in order, partial tail)."""
    from torch.utils.data import DataLoader, TensorDataset

    dm = MQARDataModule(vocab_size=64, seq_len=32, num_kv_pairs=4, num_train=100, num_val=30, batch_size=16, seed=3)
    dm.setup()
    plain = DataLoader(TensorDataset(*dm.train_set.tensors), batch_size=16, shuffle=True, drop_last=True,
                       generator=torch.Generator().manual_seed(3))
    ours = dm.train_dataloader()
    for _ in range(2):
        a, b = list(plain), list(ours)
        assert len(a) == len(b) == 6
        assert all(torch.equal(u, v) for x, y in zip(a, b) for u, v in zip(x, y))
    a = list(DataLoader(TensorDataset(*dm.val_set.tensors), batch_size=16))
    b = list(dm.val_dataloader())
    assert [x[0].shape[0] for x in b] == [16, 14]
    assert all(torch.equal(u, v) for x, y in zip(a, b) for u, v in zip(x, y))


def test_ddp_validation_sampler_repeats_no_example():
    """In a distributed run the validation loader's sampler gives each example to one rank once (Lightning's
    DistributedSampler padded 33 examples to 34, repeating example 0); a set smaller than the ranks is refused,
    naming data.num_val. One process: no sampler (in order)."""
    from types import SimpleNamespace

    dm = MQARDataModule(vocab_size=32, seq_len=32, num_kv_pairs=4, num_train=64, num_val=33, batch_size=16)
    dm.setup()
    assert dm.val_dataloader().sampler.__class__.__name__ == "SequentialSampler"
    seen = []
    for rank in range(2):
        dm.trainer = SimpleNamespace(world_size=2, distributed_sampler_kwargs={"num_replicas": 2, "rank": rank})
        seen += [int(i) for i in dm.val_dataloader().sampler]
    assert sorted(seen) == list(range(33))
    small = MQARDataModule(vocab_size=32, seq_len=32, num_kv_pairs=4, num_train=64, num_val=1, batch_size=16)
    small.setup()
    small.trainer = SimpleNamespace(world_size=2, distributed_sampler_kwargs={"num_replicas": 2, "rank": 0})
    with pytest.raises(ValueError, match=r"data.num_val: the validation set has 1 examples, fewer than the 2"):
        small.val_dataloader()


@pytest.mark.parametrize("content, match", [
    (b"", r"data.path=.* is too small to train: 0 tokens.*pass a larger corpus"),
    (b"hello\n", r"data.path=.* is too small to train: 6 tokens.*pass a larger corpus"),
    (b"ok text " * 100 + b"\xff\xfe bad", r"data.path=.* is not UTF-8 text \(byte 800: invalid start byte\)"),
])
def test_text_file_that_cannot_train_names_data_path(tmp_path, content, match):
    """An empty or tiny corpus said 'pass data.seq_len<=0'; a non-UTF-8 file failed inside datasets with a
    DatasetGenerationError naming neither the file nor the cause."""
    path = tmp_path / "corpus.txt"
    path.write_bytes(content)
    dm = TextDataModule(path=str(path), seq_len=32, batch_size=4, val_fraction=0.2, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=match):
        dm.setup("fit")


@pytest.mark.parametrize("train, val, kw, match", [
    (b"ok text " * 100, b"", {}, r"these files are too small to train: .*data.val_path \(0 tokens\); pass larger files"),
    (b"", None, dict(pack=True), r"data.path=.* is too small to train packed .*0 tokens.*pass a larger corpus"),
    (b"\n\n\n\n", None, dict(pack=True), r"data.path=.* is too small to train packed .*0 documents, 0 tokens"),
    (b"ok text " * 100, b"", dict(pack=True), r"data.val_path=.* is too small to train packed .*pass a larger corpus"),
], ids=["empty_val_path", "packed_empty", "packed_blank_lines", "packed_empty_val_path"])
def test_files_too_small_for_any_seq_len_say_so(tmp_path, train, val, kw, match):
    """With data.val_path, an empty validation file said "the longest data.seq_len they can train is 0 ... pass
    data.seq_len<=1"; packed (data.pack=true), an empty corpus said "pass a smaller data.seq_len". No seq_len trains
    on these files: the error says the file is too small."""
    path = tmp_path / "corpus.txt"
    path.write_bytes(train)
    val_path = None
    if val is not None:
        val_path = tmp_path / "val.txt"
        val_path.write_bytes(val)
    dm = TextDataModule(path=str(path), seq_len=32, batch_size=4, val_path=str(val_path) if val_path else None,
                        cache_dir=str(tmp_path / "cache"), **kw)
    with pytest.raises(ValueError, match=match) as e:
        dm.setup("fit")
    assert "seq_len<=" not in str(e.value) and "smaller data.seq_len" not in str(e.value)


def test_mqar_random_non_queries_must_be_a_bool():
    """data.random_non_queries=maybe counted as true."""
    with pytest.raises(ValueError, match=r"data.random_non_queries must be true or false, got 'maybe'"):
        MQARDataModule(32, 32, 4, num_train=64, num_val=16, random_non_queries="maybe")


@pytest.mark.parametrize("value", [-1, 0, 2.5, "abc"])
def test_text_max_bytes_must_be_null_or_a_positive_integer(tmp_path, value):
    """data.max_bytes=-1 silently dropped the corpus' last byte (data[:-1]); 0 kept the whole corpus."""
    path = tmp_path / "corpus.txt"
    path.write_text("abc " * 100)
    with pytest.raises(ValueError, match=r"data.max_bytes must be null \(the whole corpus\) or an integer >= 1"):
        TextDataModule(path=str(path), seq_len=8, batch_size=2, max_bytes=value)


@pytest.mark.parametrize("kw,name", [(dict(batch_size=1.5), "data.batch_size=1.5"), (dict(seq_len="abc"), "data.seq_len='abc'"),
                                     (dict(seq_len=32.5), "data.seq_len=32.5"), (dict(batch_size=True), "data.batch_size=True")])
def test_text_sizes_must_be_integers(text_file, kw, name):
    with pytest.raises(ValueError, match=name.replace(".", r"\.") + ".*integer"):
        TextDataModule(path=str(text_file), **kw)


def _pack_sum(dm) -> int:
    st = dm.pack_stats
    return int(sum(st[f"data/{s}_tokens_{k}"] for s in ("train", "val") for k in ("kept", "dropped"))
               + st["data/bytes_between_docs"] + st["data/bytes_normalised"])


def test_packed_counts_add_up_with_carriage_returns(tmp_path):
    """datasets' text loader reads "\\r\\n" / "\\r" as "\\n": the bytes that removes are counted (and warned about),
    so kept + dropped tokens + separators + normalised bytes are the file's size, and no byte 13 reaches a token."""
    body = "".join(f"speech {i}: the quick brown fox\r\nand more words here\r\n\r\n" for i in range(120))
    p = tmp_path / "crlf.txt"
    p.write_bytes(body.encode("utf-8"))
    dm = TextDataModule(path=str(p), seq_len=32, batch_size=2, pack=True, cache_dir=None)
    n = body.count("\r\n")
    with pytest.warns(UserWarning, match=rf"holds {n} \\r\\n line endings and 0 bare \\r, which datasets' text loader "
                                         rf"reads as \\n \({n} bytes fewer\)"):
        dm.setup()
    assert dm.pack_stats["data/bytes_normalised"] == body.count("\r") > 0
    assert _pack_sum(dm) == p.stat().st_size
    assert not (dm.train_packed["tokens"] == 13).any()


def test_packed_max_bytes_reads_the_first_bytes_and_counts_their_separators(tmp_path):
    """data.max_bytes with pack=true keeps the first max_bytes bytes of the text, separators included: the counts
    (kept + dropped + between) add up to them, not to the whole file (the separators of the unread part were
    counted before)."""
    body = "".join(f"speech number {i}: the quick brown fox jumps\n\n\n" for i in range(400))
    p = tmp_path / "blank.txt"
    p.write_text(body, encoding="utf-8")
    full = TextDataModule(path=str(p), seq_len=32, batch_size=2, pack=True, doc_split="blank_line", cache_dir=None)
    full.setup()
    assert _pack_sum(full) == len(body)
    cap = 3001
    dm = TextDataModule(path=str(p), seq_len=32, batch_size=2, pack=True, doc_split="blank_line", cache_dir=None,
                        max_bytes=cap)
    dm.setup()
    assert _pack_sum(dm) == cap
    assert 0 < dm.pack_stats["data/bytes_between_docs"] < full.pack_stats["data/bytes_between_docs"] / 5


def test_packed_split_into_one_document_is_refused(tmp_path):
    """data.doc_split=wikitext on a file with no ' = Title = ' line made the whole file one document, shown only in
    the stats line: with the document mask asked for (data.doc_mask=true) it would mask nothing, refused naming the
    split, the file and what to pass; with data.doc_mask=false a warning; data.doc_split=whole asks for one."""
    p = tmp_path / "plain.txt"
    p.write_text("".join(f"line {i} of a play without headings\n" for i in range(300)), encoding="utf-8")
    for split, found in (("wikitext", "no article heading"), ("blank_line", "no blank line"),
                         ("auto", r"\(-> blank_line\) found no blank line")):
        dm = TextDataModule(path=str(p), seq_len=16, batch_size=2, pack=True, doc_split=split, cache_dir=None)
        with pytest.raises(ValueError, match=rf"^data.doc_split={split}.* {found} .*data.path='.*plain.txt' .*one "
                                             rf"document, so the document mask \(data.doc_mask=true\) would separate "
                                             rf"nothing; .*allowed values: auto, rows, wikitext, blank_line, whole"):
            dm.setup()
    dm = TextDataModule(path=str(p), seq_len=16, batch_size=2, pack=True, doc_split="wikitext", doc_mask=False,
                        cache_dir=None)
    with pytest.warns(UserWarning, match=r"doc_split=wikitext found no article heading"):
        dm.setup()
    whole = TextDataModule(path=str(p), seq_len=16, batch_size=2, pack=True, doc_split="whole", cache_dir=None)
    whole.setup()  # one document on purpose
    # a file of one row (seq_len + 1 tokens) cannot hold several: not refused (the validation file here)
    small = tmp_path / "small.txt"
    small.write_text("x" * 32 + "\n", encoding="utf-8")
    body = "".join(f"speech {i}: the quick brown fox\n\n" for i in range(100))
    big = tmp_path / "speeches.txt"
    big.write_text(body, encoding="utf-8")
    TextDataModule(path=str(big), val_path=str(small), seq_len=32, batch_size=2, pack=True, doc_split="blank_line",
                   cache_dir=None).setup()
    # the validation file is checked too, named as data.val_path
    dm = TextDataModule(path=str(big), val_path=str(p), seq_len=16, batch_size=2, pack=True,
                        doc_split="blank_line", cache_dir=None)
    with pytest.raises(ValueError, match=r"found no blank line between documents in data.val_path='.*plain.txt'"):
        dm.setup()


def test_val_path_same_as_path_warns(tmp_path):
    """data.val_path equal to data.path (the same file, however spelled) validated on the training text silently."""
    p = tmp_path / "corpus.txt"
    p.write_text("".join(f"To be or not to be, line {i}.\n" for i in range(400)), encoding="utf-8")
    other = tmp_path / "other.txt"
    other.write_text("".join(f"Another text, line {i}.\n" for i in range(100)), encoding="utf-8")
    spelled = str(tmp_path / "." / "corpus.txt")
    for path, val in ((str(p), spelled), ([str(other), str(p)], str(p))):
        with pytest.warns(UserWarning, match=r"data.val_path=.* is the same file as data.path .*validates on its own "
                                             r"training text.*data.val_path=null"):
            TextDataModule(path=path, val_path=val, seq_len=16, batch_size=2, cache_dir=None)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TextDataModule(path=str(p), val_path=str(other), seq_len=16, batch_size=2, cache_dir=None)


def test_hub_unreachable_names_hub_name(monkeypatch, tmp_path):
    """data.path=null data.hub_name=wikitext without network printed datasets' ConnectionError traceback."""
    import datasets

    from harness.errors import ConfigConnectionError

    def offline(*a, **k):
        raise ConnectionError("Couldn't reach 'wikitext' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    for pack in (False, True):
        dm = TextDataModule(path=None, hub_name="wikitext", seq_len=16, batch_size=2, pack=pack,
                            cache_dir=str(tmp_path))
        with pytest.raises(ConnectionError, match=r"^data.hub_name='wikitext': the Hugging Face Hub could not be "
                                                  r"reached.*Couldn't reach.*data.path=<file>") as e:
            dm.setup()
        assert isinstance(e.value, ConfigConnectionError) and e.value.__cause__ is None
    from harness.errors import config_errors

    with pytest.raises(ConfigConnectionError):  # train.py's checks print it as the message alone
        with config_errors():
            TextDataModule(path=None, hub_name="wikitext", seq_len=16, batch_size=2, cache_dir=None).setup()
