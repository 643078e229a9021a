"""lab.decode_profile (the ncu profile of decode against SDPA) without a GPU: argument checking, the ncu raw-page
reader (lab.ncu) and hbm_probe's details-page sum on it, matching profiled kernels to methods, the CSV / markdown
writer on a fake ncu report, the driver's plumbing with a fake ``ncu`` executable, and a CPU dry run of the worker."""
import csv
import json
import os
import stat
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from lab import decode_profile as prof  # noqa: E402
from lab.hbm_probe import parse_ncu_csv  # noqa: E402
from lab.ncu import raw_rows, table_lines, to_number, unit_scale  # noqa: E402

# ----------------------------------------------------------------------------------------------- a fake run
KV = 2 * 8 * 65536 * 128 * 2  # K/V bytes of GQA 32:8, batch 1, 64k, D 128, bf16
COPY = 4000.0
SDPA_K = ("void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, "
          "cutlass::bfloat16_t>, true>(Flash_fwd_params)")
SDPA_C = "void pytorch_flash::flash_fwd_splitkv_combine_kernel<Traits, 4, 7>(Flash_fwd_params)"
# (method, kernel name, stream, duration ns, dram read bytes, grid, regs, achieved occ %, waves) per launch
LAUNCHES = [
    ("sdpa", SDPA_K, "13", 70_000, 268_500_000, 1056, 255, 11.9, 8.0),
    ("sdpa", SDPA_C, "13", 3_000, 1_200_000, 32, 64, 40.0, 0.06),
    ("sdpa", SDPA_K, "13", 72_000, 268_400_000, 1056, 255, 12.1, 8.0),
    ("sdpa", SDPA_C, "13", 3_200, 1_100_000, 32, 64, 41.0, 0.06),
    ("ours", "_decode_fwd", "14", 74_000, 268_600_000, 392, 166, 17.5, 0.99),
    ("ours", "_decode_merge", "14", 6_000, 3_000_000, 32, 40, 30.0, 0.02),
    ("ours", "_decode_fwd", "14", 76_000, 268_700_000, 392, 166, 17.9, 0.99),
    ("ours", "_decode_merge", "14", 6_400, 3_100_000, 32, 40, 31.0, 0.02),
    ("ours_deep", "_decode_fwd", "15", 71_000, 268_300_000, 192, 170, 20.0, 0.73),
    ("ours_deep", "_decode_merge", "15", 4_000, 1_500_000, 32, 40, 30.0, 0.02),
    ("ours_deep", "_decode_fwd", "15", 71_500, 268_300_000, 192, 170, 20.0, 0.73),
    ("ours_deep", "_decode_merge", "15", 4_200, 1_500_000, 32, 40, 30.0, 0.02),
]
GRAPH_US = {"sdpa": 74.0, "ours": 79.0, "ours_deep": 75.5}


def _case(name="gqa32:8_b1_64k", tracer="ncu", kernels=()):
    segs = [dict(method="sdpa", kind="sdpa", calls=2, graph_us=GRAPH_US["sdpa"], sdpa_backend="FLASH_ATTENTION",
                 err=0.0)]
    for m, s in (("ours", 49), ("ours_deep", 24)):
        segs.append(dict(method=m, kind="ours", calls=2, graph_us=GRAPH_US[m], num_splits=s, block_n=64, block_m=16,
                         num_stages=3 if m == "ours" else 4, num_warps=4, merge="kernel", max_registers=None,
                         grid=[s, 8, 1], kernels_per_call=2, err=1e-4))
    return dict(case=name, B=1, Hq=32, Hkv=8, context=65536, Nq=1, D=128, dtype="bfloat16", kv_bytes=KV,
                copy_gbps=COPY, sm_count=132, tracer=tracer, calls=2, graph_calls=10,
                env=dict(gpu="NVIDIA H200", torch="2.11", triton="3.6.0", date="2026-12-04"), segments=segs,
                kernels=list(kernels))


def _ncu_text(launches=LAUNCHES, streams=True):
    metrics = list(prof.METRICS)
    units = {"gpu__time_duration.sum": "nsecond", "dram__bytes_read.sum": "byte", "dram__bytes_write.sum": "byte",
             "dram__throughput.avg.pct_of_peak_sustained_elapsed": "%",
             "launch__registers_per_thread": "register/thread"}
    head = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
            "Grid Size", "Device", "CC"] + metrics
    lines = ["==PROF== Connected to process 4242 (/usr/bin/python3)", "decode worker output that is not CSV",
             ",".join(f'"{h}"' for h in head),
             ",".join(f'"{units.get(h, "")}"' if h in metrics else '""' for h in head)]
    for i, (m, name, stream, ns, rd, grid, regs, occ, waves) in enumerate(launches):
        vals = {"gpu__time_duration.sum": f"{ns:,}", "dram__bytes_read.sum": f"{rd:,}",
                "dram__bytes_write.sum": "1,024", "dram__throughput.avg.pct_of_peak_sustained_elapsed": "88.5",
                "launch__grid_size": str(grid), "launch__block_size": "128", "launch__registers_per_thread": str(regs),
                "launch__shared_mem_per_block_dynamic": "73,728",
                "sm__warps_active.avg.pct_of_peak_sustained_active": str(occ),
                "sm__maximum_warps_per_active_cycle_pct": "n/a", "launch__waves_per_multiprocessor": str(waves),
                "launch__occupancy_limit_registers": "3", "launch__occupancy_limit_shared_mem": "3"}
        ident = [str(i), "4242", "python3", "127.0.0.1", name, "1", stream if streams else "7", "(128, 1, 1)",
                 f"({grid}, 1, 1)", "0", "9.0"]
        lines.append(",".join(f'"{c}"' for c in ident + [vals[mm] for mm in metrics]))
    lines.append("==PROF== Disconnected from process 4242")
    return "\n".join(lines) + "\n"


def _write_run(out, case, ncu_text=None):
    sn = prof.safe_name(case["case"])
    (out / f"case_{sn}.json").write_text(json.dumps(case))
    if ncu_text is not None:
        (out / f"ncu_{sn}.csv").write_text(ncu_text)


# ----------------------------------------------------------------------------------------------- arguments
@pytest.mark.parametrize("argv, message", [
    (["--calls", "0"], "--calls must be in 1-20, got 0"),
    (["--calls", "21"], "--calls must be in 1-20, got 21"),
    (["--graph-calls", "0"], "--graph-calls must be in 1-100"),
    (["--budget-s", "5"], "--budget-s must be >= 20"),
    (["--cases", "mha_b1_16k,nope"], "unknown or paged case(s) nope; allowed values: mha_b1_16k"),
    (["--cases", "gqa32:8_b1_64k_page16"], "unknown or paged case(s) gqa32:8_b1_64k_page16"),
    (["--cases", ","], "--cases is empty"),
    (["--cases", "mha_b1_16k,mha_b1_16k"], "lists a case twice"),
    (["--worker"], "--worker needs --case NAME"),
    (["--tracer", "nsys"], "invalid choice: 'nsys'"),
])
def test_bad_arguments_exit_with_a_message(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        prof.parse_args(["--out", str(tmp_path)] + argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir()), "nothing is written before the arguments are checked"


def test_parse_of_a_missing_or_empty_folder_says_so(capsys, tmp_path):
    """--parse of a folder that does not exist was a FileNotFoundError traceback, of an empty one a ValueError
    traceback ending in an empty reason: now an argument error, and a message saying what is missing (exit 1)."""
    with pytest.raises(SystemExit) as e:
        prof.parse_args(["--out", str(tmp_path / "nope"), "--parse"])
    assert e.value.code == 2 and "--parse reads an earlier run's --out folder" in capsys.readouterr().err
    assert prof.main(["--out", str(tmp_path), "--parse"]) == 1
    assert "no case_<name>.json in it" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_arguments_defaults_and_out_required(capsys, tmp_path):
    a = prof.parse_args(["--out", str(tmp_path)])
    assert a.case_list == list(prof.DEFAULT_CASES) and a.calls == 2 and a.graph_calls == 10 and not a.no_deep
    assert a.budget_s <= 150, "one GPU call of at most ~150 s"
    assert set(a.case_list) <= set(prof.known_cases())
    assert prof.parse_args(["--out", "d", "--worker", "--case", "mha_b1_16k"]).case_list == ["mha_b1_16k"]
    with pytest.raises(SystemExit):
        prof.parse_args([])
    assert "--out" in capsys.readouterr().err


def test_default_cases_are_the_three_of_the_brief():
    known = prof.known_cases()
    shapes = [known[c][1:] for c in prof.DEFAULT_CASES]
    assert shapes == [(1, 32, 32, 16384, None, 1), (1, 32, 8, 65536, None, 1), (1, 32, 8, 65536, None, 8)]


# ----------------------------------------------------------------------------------------------- ncu readers
def test_ncu_units_and_numbers():
    assert unit_scale("Mbyte") == 1e6 and unit_scale("usecond") == 1e-6 and unit_scale("Gbyte/second") == 1e9
    assert unit_scale("%") == 1.0 and unit_scale("register/thread") == 1.0
    assert to_number("10,240,000", "byte") == 10_240_000 and to_number("2.5", "msecond") == pytest.approx(2.5e-3)
    assert to_number("n/a") is None and to_number("") is None and to_number("abc") is None
    with pytest.raises(ValueError, match="no ncu CSV table"):
        table_lines("==ERROR== ERR_NVGPUCTRPERM\n")


def test_raw_rows_read_the_units_row_and_skip_other_output():
    rows = raw_rows(_ncu_text())
    assert len(rows) == len(LAUNCHES)
    r = rows[0]
    assert r["Kernel Name"] == SDPA_K and r["Stream"] == "13" and r["ID"] == "0"
    assert r["gpu__time_duration.sum"] == pytest.approx(70_000e-9)  # nsecond -> second
    assert r["dram__bytes_read.sum"] == 268_500_000 and r["launch__shared_mem_per_block_dynamic"] == 73_728
    assert r["sm__maximum_warps_per_active_cycle_pct"] is None  # n/a
    only = raw_rows(_ncu_text(), metrics=["launch__grid_size"])
    assert set(only[4]) - set(prof.METRICS) >= {"Kernel Name"} and only[4]["launch__grid_size"] == 392
    assert "dram__bytes_read.sum" not in only[4]


def test_hbm_probe_sums_the_details_page():
    head = '"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"'
    text = "\n".join(["==PROF== profiling", head,
                      '"0","a","s","dram__bytes_read.sum","Mbyte","1.50"',
                      '"0","a","s","dram__bytes_write.sum","byte","2,000"',
                      '"1","b","s","dram__bytes_read.sum","Kbyte","3"',
                      '"1","b","s","gpu__time_duration.sum","usecond","9"'])
    tot = parse_ncu_csv(text)
    assert tot["read"] == pytest.approx(1.5e6 + 3e3) and tot["write"] == 2000 and tot["kernels"] == 2
    assert tot["total"] == pytest.approx(tot["read"] + tot["write"])


def test_short_kernel_names():
    assert prof.short_kernel(SDPA_K) == "pytorch_flash::flash_fwd_splitkv_kernel"
    assert prof.short_kernel("_decode_fwd") == "_decode_fwd" and prof.is_ours("_decode_merge")
    assert not prof.is_ours(SDPA_C)


# ----------------------------------------------------------------------------------------------- rows -> methods
def test_assign_rows_by_stream_and_by_order():
    segs = _case()["segments"]
    by_stream = prof.assign_rows(raw_rows(_ncu_text()), segs)
    by_order = prof.assign_rows(raw_rows(_ncu_text(streams=False)), segs)  # one stream: falls back to order
    want = [[i for i, l in enumerate(LAUNCHES) if l[0] == s["method"]] for s in segs]
    assert [[int(r["ID"]) for r in run] for run in by_stream] == want
    assert [[int(r["ID"]) for r in run] for run in by_order] == want
    shuffled = list(reversed(raw_rows(_ncu_text())))  # the report's order is not trusted: sorted by ID
    assert [[int(r["ID"]) for r in run] for run in prof.assign_rows(shuffled, segs)] == want
    bad = [l if i != 6 else ("ours", SDPA_K) + l[2:] for i, l in enumerate(LAUNCHES)]  # an SDPA kernel among ours
    with pytest.raises(ValueError, match="segment ours: expected 4 kernels of ours"):
        prof.assign_rows(raw_rows(_ncu_text(bad, streams=False)), segs)
    with pytest.raises(ValueError, match="expected 4 kernels of ours"):  # a missing launch
        prof.assign_rows(raw_rows(_ncu_text(LAUNCHES[:-1], streams=False)), segs)


# ----------------------------------------------------------------------------------------------- writer
def test_outputs_from_a_fake_ncu_report(tmp_path):
    case = _case()
    _write_run(tmp_path, case, _ncu_text())
    res = prof.build_outputs(str(tmp_path), ["gqa32:8_b1_64k"])
    assert res["notes"] == []
    for f in ("decode_profile_kernels.csv", "decode_profile.csv", "decode_profile_methods.csv", "summary.md"):
        assert (tmp_path / f).exists(), f
    with open(tmp_path / "decode_profile_kernels.csv", newline="") as f:
        krecs = list(csv.DictReader(f))
    assert list(krecs[0]) == prof.KERNEL_COLUMNS and len(krecs) == len(LAUNCHES)
    assert [r["call"] for r in krecs[4:8]] == ["0", "0", "1", "1"]
    assert float(krecs[4]["duration_us"]) == pytest.approx(74.0)
    assert float(krecs[4]["dram_read_gbps"]) == pytest.approx(268_600_000 / 74e-6 / 1e9)

    def us(m, k):
        return sum(l[3] for l in LAUNCHES if l[0] == m and l[1] == k) / 1e3 / 2  # per call, 2 calls

    methods = {r["method"]: r for r in res["methods"]}
    o, s, d = methods["ours"], methods["sdpa"], methods["ours_deep"]
    split, merge = us("ours", "_decode_fwd"), us("ours", "_decode_merge")
    assert o["split_us_per_call"] == pytest.approx(split) and o["merge_us_per_call"] == pytest.approx(merge)
    assert o["merge_share"] == pytest.approx(merge / (split + merge))
    assert o["frac_split_alone"] == pytest.approx(KV / (split * 1e-6) / 1e9 / COPY)
    assert o["frac_kernels"] == pytest.approx(KV / ((split + merge) * 1e-6) / 1e9 / COPY)
    assert o["frac_graph"] == pytest.approx(KV / (GRAPH_US["ours"] * 1e-6) / 1e9 / COPY)
    rd = sum(l[4] for l in LAUNCHES if l[0] == "ours") / 2
    assert o["dram_read_over_kv"] == pytest.approx(rd / KV)
    assert d["num_splits"] == 24 and d["num_stages"] == 4 and d["frac_split_alone"] > o["frac_split_alone"]
    assert s["sdpa_backend"] == "FLASH_ATTENTION" and "merge_share" not in s
    assert s["kernels"] == "pytorch_flash::flash_fwd_splitkv_kernel + pytorch_flash::flash_fwd_splitkv_combine_kernel"
    per = {(r["method"], r["kernel"]): r for r in res["per_kernel"]}
    sk = per[("sdpa", "pytorch_flash::flash_fwd_splitkv_kernel")]
    assert sk["launches_per_call"] == 1 and sk["grid_size"] == 1056 and sk["registers"] == 255
    assert sk["achieved_occupancy_pct"] == pytest.approx(12.0) and sk["theoretical_occupancy_pct"] is None
    assert sum(r["share_of_method"] for r in res["per_kernel"] if r["method"] == "ours") == pytest.approx(1.0)
    md = (tmp_path / "summary.md").read_text()
    assert "## gqa32:8_b1_64k: batch 1, 32:8 heads, 64k context, Nq 1" in md
    assert f"{merge / (split + merge):.1%} of kernel time" in md
    assert f"split kernel alone {split:.1f} us = {o['frac_split_alone']:.3f} of copy" in md
    assert f"CUDA graph {GRAPH_US['ours']:.1f} us = {o['frac_graph']:.3f}" in md
    sdpa_main = us("sdpa", SDPA_K)
    assert f"our split kernel {split - sdpa_main:+.1f} us against its main kernel" in md
    assert f"ours_deep - ours: split kernel {us('ours_deep', '_decode_fwd') - split:+.1f} us" in md
    assert "| ours | `_decode_merge` | 1 |" in md and "No Nsight Compute counters" not in md


def test_outputs_from_torch_profiler_kernels_and_missing_cases(tmp_path):
    ks = []
    for idx, m in enumerate(("sdpa", "ours", "ours_deep")):
        for l in (l for l in LAUNCHES if l[0] == m):
            ks.append(dict(segment=idx, kernel_full=l[1], duration_us=l[3] / 1e3, grid_size=l[5], block_size=128,
                           registers=l[6], smem_dynamic_bytes=None, achieved_occupancy_pct=l[7], stream="7"))
    _write_run(tmp_path, dict(_case(tracer="torch", kernels=ks), errors=["sdpa_nomask: RuntimeError: no kernel"]))
    _write_run(tmp_path, _case(name="mha_b1_16k"))  # under ncu, but its report is missing
    res = prof.build_outputs(str(tmp_path), ["gqa32:8_b1_64k", "mha_b1_16k", "gqa32:8_b1_64k_nq8"])
    assert any(n.startswith("mha_b1_16k: ncu report not usable") for n in res["notes"])
    assert any(n.startswith("gqa32-8_b1_64k_nq8: no record") for n in res["notes"])
    o = next(r for r in res["methods"] if r["method"] == "ours")
    split = sum(l[3] for l in LAUNCHES if l[0] == "ours" and l[1] == "_decode_fwd") / 1e3 / 2
    assert o["split_us_per_call"] == pytest.approx(split) and o["dram_read_over_kv"] is None
    assert all(r["dram_read_bytes"] is None and r["tracer"] == "torch" for r in res["kernels"])
    md = (tmp_path / "summary.md").read_text()
    assert "No Nsight Compute counters" in md and "ncu report not usable" in md
    assert "- failed, left out: sdpa_nomask: RuntimeError: no kernel" in md
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no case could be read"):
        prof.build_outputs(str(empty), ["mha_b1_16k"])
    assert not list(empty.iterdir())


def test_choose_tracer_and_ncu_command(tmp_path):
    tracer, path, msg = prof.choose_tracer("auto", str(tmp_path / "no-ncu-here"))
    assert tracer == "torch" and path is None and "not found on PATH" in msg and "no DRAM counters" in msg
    assert prof.choose_tracer("ncu", "definitely-not-a-command-xyz")[0] == "torch"
    assert prof.choose_tracer("torch", "ncu") == ("torch", None, None)
    argv = prof.ncu_argv("/x/ncu", ["a", "b"], "/o/ncu.csv", "all", ["python", "-m", "w"])
    assert argv[:1] == ["/x/ncu"] and argv[-3:] == ["python", "-m", "w"]
    for flag, val in (("--page", "raw"), ("--profile-from-start", "off"), ("--metrics", "a,b"),
                      ("--log-file", "/o/ncu.csv"), ("--cache-control", "all"), ("--print-units", "base")):
        assert argv[argv.index(flag) + 1] == val
    assert "--csv" in argv


# ----------------------------------------------------------------------------------------------- driver plumbing
FAKE_NCU = r'''#!{python}
"""A stand-in for ncu: copies a prepared case record and report where the real run would write them. With
FAKE_NCU_REJECT set, the first run (the full metric set) fails as ncu does for a metric it does not know."""
import os, shutil, sys
a = sys.argv[1:]
log = a[a.index("--log-file") + 1]
metrics = a[a.index("--metrics") + 1]
case = a[a.index("--case") + 1]
out = a[a.index("--out") + 1]
assert a[a.index("--page") + 1] == "raw" and "--worker" in a and "--tracer" in a
src = os.environ["FAKE_NCU_SRC"]
if os.environ.get("FAKE_NCU_REJECT") and "launch__occupancy_limit_shared_mem" in metrics:
    open(log, "w").write("==ERROR== Failed to find metric launch__occupancy_limit_shared_mem\n")
    sys.exit(1)
safe = case.replace(":", "-")
shutil.copy(os.path.join(src, "case_" + safe + ".json"), os.path.join(out, "case_" + safe + ".json"))
shutil.copy(os.path.join(src, "ncu_" + safe + ".csv"), log)
open(os.path.join(src, "seen_" + safe), "w").write(metrics)
'''


@pytest.mark.parametrize("reject", [False, True])
def test_driver_with_a_fake_ncu(tmp_path, monkeypatch, capsys, reject):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    _write_run(src, _case(), _ncu_text())
    ncu = tmp_path / "ncu"
    ncu.write_text(FAKE_NCU.replace("{python}", sys.executable))
    ncu.chmod(ncu.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FAKE_NCU_SRC", str(src))
    if reject:
        monkeypatch.setenv("FAKE_NCU_REJECT", "1")
    rc = prof.main(["--out", str(out), "--ncu", str(ncu), "--cases", "gqa32:8_b1_64k", "--calls", "2",
                    "--budget-s", "60"])
    assert rc == 0
    seen = (src / "seen_gqa32-8_b1_64k").read_text().split(",")
    assert seen == (list(prof.MIN_METRICS) if reject else list(prof.METRICS))
    assert (out / "summary.md").exists() and (out / "ncu_gqa32-8_b1_64k.csv").exists()
    printed = capsys.readouterr().out
    assert "# Decode profile" in printed and ("ran with gpu__time_duration.sum" in printed) == reject


# ----------------------------------------------------------------------------------------------- worker dry run
def _cpu_cache(B, Hkv, N, D, dtype, paged, page_size, gen):
    k = torch.randn(B, Hkv, N, D, dtype=dtype, generator=gen)
    return k, torch.randn_like(k), None, torch.full((B,), N, dtype=torch.int32)


@pytest.mark.parametrize("fail_nomask", [False, True])
def test_worker_dry_run_on_cpu(monkeypatch, tmp_path, fail_nomask):
    """run_worker on a tiny GQA case with 2 new queries (the interpreter; the GPU timing, streams and profiler
    calls replaced): the segments in launch order, ours checked against SDPA, deep at half the splits x 4 stages;
    a method that fails is recorded and left out of the profiled segments."""
    if torch.cuda.is_available():
        pytest.skip("a CPU dry run (the GPU runs the real thing)")
    import eval.bench_common as bc
    import eval.bench_decode as bd
    from lab import decode_probe as dp

    monkeypatch.setattr(dp, "FINAL_CASES", dp.FINAL_CASES + [("tiny_nq2", 1, 4, 2, 1024, None, 2)])
    monkeypatch.setattr(prof, "_DEVICE", "cpu")
    monkeypatch.setattr(prof, "_DTYPE", "float32")
    monkeypatch.setattr(bd, "copy_bandwidth", lambda: 1000.0)
    monkeypatch.setattr(bd, "make_cache", _cpu_cache)
    timed = []
    monkeypatch.setattr(bc, "time_cuda_graph", lambda fn, calls=1: (timed.append(calls), fn(), 0.02)[2])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: object())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: __import__("contextlib").nullcontext())
    started = []
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: started.append(1))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: None)
    if fail_nomask:
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def no_unmasked(q, k, v, attn_mask=None, **kw):
            if attn_mask is None:
                raise RuntimeError("no kernel for this")
            return sdpa(q, k, v, attn_mask=attn_mask, **kw)

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", no_unmasked)
    rec = prof.run_worker(str(tmp_path), "tiny_nq2", calls=2, graph_calls=10, tracer="ncu", deep=True)
    want = ["sdpa", "ours", "ours_deep"] + ([] if fail_nomask else ["sdpa_nomask"])
    assert [s["method"] for s in rec["segments"]] == want
    assert timed == [10] * len(want) and len(started) == len(want)
    assert rec["errors"] == (["sdpa_nomask: RuntimeError: no kernel for this"] if fail_nomask else [])
    seg = {s["method"]: s for s in rec["segments"]}
    assert seg["ours"]["num_splits"] >= 2 and seg["ours"]["merge"] == "kernel" and seg["ours"]["kernels_per_call"] == 2
    assert seg["ours_deep"]["num_splits"] == seg["ours"]["num_splits"] // 2 and seg["ours_deep"]["num_stages"] == 4
    assert seg["ours"]["err"] < 1e-4 and seg["ours_deep"]["err"] < 1e-4
    assert fail_nomask or seg["sdpa_nomask"]["err"] is None
    assert seg["sdpa"]["sdpa_backend"] and seg["sdpa"]["graph_us"] == pytest.approx(20.0)
    assert rec["kv_bytes"] == 2 * 1 * 2 * 1024 * 128 * 2
    assert json.loads((tmp_path / "case_tiny_nq2.json").read_text())["segments"][1]["method"] == "ours"
