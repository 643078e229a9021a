"""lab.decode_probe's ``--compare --set final`` (issue 29's decode targets in one run): the case list is well formed
and covers the targets, the variant options resolve per case, and a CPU dry run of compare() (tiny caches, the
interpreter, the GPU timing replaced) gives SDPA, new and deep per case in one pass, no old."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from lab import decode_probe as dp  # noqa: E402


def test_final_set_is_well_formed_and_covers_issue_29():
    cases = dp.FINAL_CASES
    names = [c[0] for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    for name, B, Hq, Hkv, ctx, ps, Nq in cases:
        assert isinstance(name, str) and name
        assert all(isinstance(x, int) and x >= 1 for x in (B, Hq, Hkv, ctx, Nq)), name
        assert Hq % Hkv == 0, name
        assert ps is None or (isinstance(ps, int) and ps >= 1 and ctx % ps == 0), name
        assert B <= 4 and ctx >= 16384, f"{name}: issue 29's decode targets are batch 1-4 at >= 16k"
        assert ("page" in name) == (ps is not None) and (f"nq{Nq}" in name) == (Nq > 1), name
    # every case of the pdl set, then Nq 2 / 4 / 8 contiguous and Nq 8 over pages of 16
    pdl_cases = dp.COMPARE_SETS["pdl"][0]
    assert set(getattr(dp, pdl_cases)) <= set(cases)
    shapes = {(B, Hq, Hkv, ctx, ps, Nq) for _, B, Hq, Hkv, ctx, ps, Nq in cases}
    for nq in (2, 4, 8):
        assert (1, 32, 8, 65536, None, nq) in shapes
    assert (1, 32, 8, 65536, 16, 8) in shapes
    case_list, old, variants = dp.COMPARE_SETS["final"]
    assert getattr(dp, case_list) is dp.FINAL_CASES and old is None
    assert [m for m, _ in getattr(dp, variants)] == ["deep"]
    assert dp.variant_opts(dict(getattr(dp, variants))["deep"], 49) == dict(num_splits=24, num_stages=4)
    assert "final" in dp.COMPARE_ONE_PASS and dp.COMPARE_VERSUS["final"] == ("deep", "new")
    for key, (cl, ol, vl) in dp.COMPARE_SETS.items():  # every set names lists that exist
        assert isinstance(getattr(dp, cl), list) and isinstance(getattr(dp, vl), list), key
        assert ol is None or isinstance(getattr(dp, ol), dict), key


def test_variant_opts():
    assert dp.variant_opts("x2", 12) == dict(num_splits=24)
    assert dp.variant_opts(dict(num_splits="half", num_stages=4), 1) == dict(num_splits=1, num_stages=4)
    assert dp.variant_opts(dict(num_splits="x3", block_n=128), 5) == dict(num_splits=15, block_n=128)
    assert dp.variant_opts(dict(num_splits="legacy"), 12, lambda: 33) == dict(num_splits=33)
    opts = dict(block_n=128, num_stages=2)
    assert dp.variant_opts(opts, 12) == opts and dp.variant_opts(opts, 12) is not opts  # copied, not resolved
    with pytest.raises(ValueError, match="num_splits='x5' is not supported; allowed values"):
        dp.variant_opts("x5", 12)
    with pytest.raises(ValueError, match="needs the new plan's split count"):
        dp.variant_opts("half")
    with pytest.raises(ValueError, match="needs the legacy split count"):
        dp.variant_opts("legacy", 12)


def _cpu_cache(B, Hkv, N, D, dtype, paged, page_size, gen):
    seqlens = torch.full((B,), N, dtype=torch.int32)
    if not paged:
        k = torch.randn(B, Hkv, N, D, dtype=dtype, generator=gen)
        return k, torch.randn_like(k), None, seqlens
    per = -(-N // page_size)
    k = torch.randn(B * per, Hkv, page_size, D, dtype=dtype, generator=gen)
    bt = torch.randperm(B * per, generator=gen).view(B, per).to(torch.int32)
    return k, torch.randn_like(k), bt, seqlens


def test_compare_final_dry_run_on_cpu(monkeypatch, tmp_path, capsys):
    """compare(case_set="final") on two tiny cases: per case sdpa, new, deep in that order (deep right after new:
    one pass), deep at half the new split count and 4 stages, outputs checked against SDPA; the summary ends with
    deep against new."""
    if torch.cuda.is_available():
        pytest.skip("a CPU dry run (the GPU runs the real thing)")
    tiny = [("gqa4:2_b1_1k", 1, 4, 2, 1024, None, 1), ("gqa4:2_b1_1k_page16_nq2", 1, 4, 2, 1024, 16, 2)]
    monkeypatch.setattr(dp, "FINAL_CASES", tiny)
    monkeypatch.setattr(dp, "_COMPARE_DEVICE", "cpu")
    monkeypatch.setattr(dp, "_COMPARE_DTYPE", torch.float32)
    monkeypatch.setattr(dp, "copy_bandwidth", lambda: 1000.0)
    monkeypatch.setattr(dp, "make_cache", _cpu_cache)
    calls_seen = []

    def fake_time(fn, calls=1):
        calls_seen.append(calls)
        fn()
        return 0.01

    monkeypatch.setattr(dp, "time_cuda_graph", fake_time)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    rows = dp.compare(str(tmp_path), budget_s=600, calls=10, case_set="final")
    assert set(calls_seen) == {10}
    assert not [r for r in rows if r.get("error")], [r["error"] for r in rows if r.get("error")]
    assert [(r["case"], r["method"]) for r in rows] == [(c[0], m) for c in tiny for m in ("sdpa", "new", "deep")]
    for name, *_ in tiny:
        new, deep = (next(r for r in rows if r["case"] == name and r["method"] == m) for m in ("new", "deep"))
        assert deep["num_splits"] == max(1, new["num_splits"] // 2) and deep["num_stages"] == 4
        assert new["num_splits"] >= 2, "the tiny cases must split, or half the splits tests nothing"
        assert new["err"] < 1e-4 and deep["err"] < 1e-4 and deep["replay_equal"] and deep["counter_zero"]
    assert os.path.exists(tmp_path / "decode_compare.csv")
    out = capsys.readouterr().out
    assert "deep - new: median" in out and "of 2 cases" in out


@pytest.mark.parametrize("argv,msg", [
    (["--compare", "--set", "final", "--cases", "mha_b1_16k,nope"], r"--cases: unknown name\(s\) nope in the set "
                                                                      r"'final'; allowed values: mha_b1_16k, "),
    (["--compare", "--set", "gqa", "--cases", "gqa32:8_b1_64k_nq8"], r"unknown name\(s\) gqa32:8_b1_64k_nq8 in the "
                                                                      r"set 'gqa'"),
    (["--set", "final"], r"--set: options of --compare \(add --compare\)"),
    (["--cases", "mha_b1_16k", "--no-variants"], r"--no-variants, --cases: options of --compare"),
])
def test_cli_refuses_unknown_cases_and_compare_options_alone(tmp_path, monkeypatch, capsys, argv, msg):
    """A misspelt --cases name ran nothing (or fewer cases) in silence, and --set / --cases / --no-variants /
    --calls-per-graph without --compare ran the default sweep instead: both refused before any GPU work."""
    import re

    compare = dp.compare
    for name in ("compare", "matrix", "copy_bandwidth"):
        monkeypatch.setattr(dp, name, lambda *a, **k: pytest.fail("GPU work despite a bad command line"))
    with pytest.raises(SystemExit) as e:
        dp.main(["--out", str(tmp_path / "o")] + argv)
    assert e.value.code == 2 and re.search(msg, capsys.readouterr().err)
    assert not (tmp_path / "o").exists()
    with pytest.raises(ValueError, match=r"cases: unknown name\(s\) nope"):
        compare(str(tmp_path / "o"), 1.0, cases={"nope"}, case_set="final")  # refused before copy_bandwidth
