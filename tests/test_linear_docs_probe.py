"""lab/linear_docs_probe.py on the CPU: the grid it builds, its argument checks, the warm-output parser, the
supervisor's resume after a worker dies (a fake worker), and one tiny worker run under the Triton interpreter."""

import json
import os
import sys
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import lab.linear_docs_probe as P  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _grid(**kw):
    args = dict(tokens=[65536, 16384], dists=["fixed:2048", "geometric:256"], heads=16, dim=128)
    args.update(kw)
    return P.build_grid(**args)


def test_grid_is_small_ordered_and_its_segments_hit_the_targets():
    g = _grid()
    assert 20 <= len(g) <= 40
    assert len({p["id"] for p in g}) == len(g)
    phases = [P.PHASES.index(p["phase"]) for p in g]
    assert phases == sorted(phases)  # default points first, fla last
    assert [p["phase"] for p in g[:4]] == ["default"] * 4 and g[-1]["kind"] == "fla"
    default = {(p["N"], p["docs"]): p for p in g if p["variant"] == "default"}
    assert len(default) == 4 and all(p["segment_size"] is None and p["chunk"] == 64 for p in default.values())
    for (N, d), p0 in default.items():
        segs = [p for p in g if p["phase"] == "segment" and p["N"] == N and p["docs"] == d]
        assert 2 <= len(segs) <= 4
        lens = [p["seg_len"] for p in segs]
        assert len(set(lens)) == len(lens) and p0["seg_len"] not in lens  # the heuristic's L is not repeated
        for p in segs:
            assert p["seg_len"] == p["segment_size"] and p["seg_len"] % 64 == 0
            k = float(p["variant"][3:])  # ppsK: about K forward programs per SM, never more
            assert 0.5 * k <= p["fwd_progs_per_sm"] <= k
    # the heuristic on 132 SMs, H 16, BV 128: 16 segments at both lengths (L 4096 at 64k, 1024 at 16k)
    assert default[(65536, "fixed:2048")]["seg_len"] == 4096 and default[(16384, "geometric:256")]["seg_len"] == 1024


def test_grid_tiles_come_from_the_kernels_list_and_only_at_tile_tokens():
    from kernels.linear import LinearConfig, tile_configs

    g = _grid()
    tiles = [p for p in g if p["phase"] == "tile"]
    assert tiles and {p["N"] for p in tiles} == {65536}
    for p in tiles:
        (kind, cfgs), = p["tiles"].items()
        allowed = [list(c) for c in tile_configs(kind, torch.bfloat16, True, 128, 128, LinearConfig())]
        assert len(cfgs) == 1 and cfgs[0] in allowed[1:]  # one entry (no fallback), not the default
    assert not [p for p in _grid(tile_tokens=[]) if p["phase"] == "tile"]
    assert not [p for p in _grid(fla=False, nodocs=False) if p["kind"] in ("fla", "ours_nodocs")]
    chunks = [p for p in g if p["phase"] == "chunk"]
    assert len(chunks) == 4 and all(p["chunk"] == 128 for p in chunks)


@pytest.mark.parametrize("argv, match", [
    (["--tokens", "0"], "--tokens"), (["--tokens", "a,b"], "--tokens"), (["--chunks", "64,96"], "--chunks"),
    (["--docs", "fixed:256,poisson:3"], "poisson:3"), (["--tile-tokens", "1024"], "--tile-tokens"),
    (["--tile-alts", "seg_bogus:1"], "seg_bogus"), (["--pps", "1,-2"], "--pps"), (["--dtype", "int8"], "int8"),
    (["--check-heads", "32"], "--check-heads"), (["--budget-s", "0"], "--budget-s"), (["--dim", "512"], "--dim"),
])
def test_bad_arguments_raise_value_errors_naming_them(argv, match):
    with pytest.raises(ValueError, match=match):
        P.parse_args(argv)
    with pytest.raises(SystemExit, match=match):
        P.main(argv + ["--dry-run"])


def test_defaults_parse_and_dry_run_prints_the_grid(capsys):
    a = P.parse_args([])
    assert a.tokens == [65536, 16384] and a.chunks == [64, 128] and a.tile_alts == P.TILE_ALTS
    assert P.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "65536/geometric:256/default" in out and "compile groups" in out


def test_warm_output_names_failed_points_and_the_one_a_crash_was_on():
    text = "start a\nok a\nstart b\nfail b OutOfResources: shared memory\nstart c\nRuntimeError: illegal memory\n"
    errs = P.parse_warm_output(text, 3)
    assert set(errs) == {"b", "c"} and "OutOfResources" in errs["b"] and "rc 3" in errs["c"]
    assert set(P.parse_warm_output(text, None)) == {"b"}  # killed at the time limit: c is not blamed
    assert P.parse_warm_output("start a\nok a\n", 0) == {}


_FAKE_WORKER = r"""
import json, os, sys
out, crash = sys.argv[1], sys.argv[2]
grid = json.load(open(os.path.join(out, "grid.json")))["grid"]
pf = os.path.join(out, "points.jsonl")
done = {json.loads(l)["id"] for l in open(pf)} if os.path.exists(pf) else set()
for p in grid:
    if p["id"] in done:
        continue
    json.dump({"id": p["id"]}, open(os.path.join(out, "current.json"), "w"))
    if p["id"] == crash:
        os._exit(139)  # a segfault: nothing recorded for this point
    with open(pf, "a") as f:
        f.write(json.dumps({"id": p["id"], "status": "ok", "fwd_bwd_ms": 1.0}) + "\n")
"""


def test_supervisor_records_the_crashed_point_and_resumes_after_it(tmp_path):
    grid = [{"id": f"p{i}"} for i in range(5)]
    (tmp_path / "grid.json").write_text(json.dumps({"grid": grid}))
    script = tmp_path / "fake_worker.py"
    script.write_text(_FAKE_WORKER)
    logs = []
    P.supervise(str(tmp_path), grid, time.time() + 60, 3, logs.append,
                cmd=[sys.executable, str(script), str(tmp_path), "p2"])
    rows = P.read_points(str(tmp_path / "points.jsonl"))
    assert set(rows) == {p["id"] for p in grid}
    assert rows["p2"]["status"] == "error" and "rc 139" in rows["p2"]["error"]
    assert all(rows[i]["status"] == "ok" for i in ("p0", "p1", "p3", "p4"))
    assert sum("attempt" in m and "points left" in m for m in logs) == 2  # one restart


def test_one_tiny_worker_run_checks_and_times_each_point(tmp_path, capsys):
    """The worker itself (no subprocess), interpreter-sized: B 1, H 2, N 128, D 16, fp32, chunk 16."""
    grid = P.build_grid([128], ["fixed:32"], 2, 16, "float32", chunks=[16], pps=[32], tile_tokens=[],
                        tile_alts={}, fla=False)
    assert [p["variant"] for p in grid] == ["default", "nodocs", "pps32"]
    args = dict(heads=2, dim=16, dtype="float32", check_heads=1, tol=1e-3, warmup_ms=1, rep_ms=1,
                anchor_csv="")
    meta = dict(args=args, env={}, t_start=time.time(), deadline=time.time() + 600, grid=grid)
    (tmp_path / "grid.json").write_text(json.dumps(meta))
    assert P.worker(str(tmp_path)) == 0
    rows = P.finish(str(tmp_path), grid, meta)
    assert [r["status"] for r in rows] == ["ok"] * 3
    for r in rows:
        assert r["ok"] is True and r["fwd_bwd_ms"] > 0
        assert max(r[f"rel_err_{n}"] for n in ("out", "dq", "dk", "dv")) < 1e-4
    assert rows[2]["seg_len"] == rows[2]["segment_size"] and rows[2]["x_default"] > 0
    assert (tmp_path / "linear_docs_probe.csv").exists()
    P.print_table(rows)
    assert "pps32" in capsys.readouterr().out


_FAKE_WARM = r"""
import sys, time
out, group = sys.argv[2], sys.argv[3]
ids = {"g1": ["a", "b"], "g2": ["c"], "slow": ["d"]}[group]
for i in ids:
    print("start", i, flush=True)
    if i == "b":
        print("fail b OutOfResources: out of resource: shared memory", flush=True)
    elif i == "c":
        print("RuntimeError: CUDA error: an illegal memory access was encountered", flush=True)
        sys.exit(3)
    elif i == "d":
        time.sleep(60)
    else:
        print("ok", i, flush=True)
"""


def test_warm_phase_records_failures_and_crashes_but_not_a_point_killed_at_its_deadline(tmp_path, monkeypatch):
    script = tmp_path / "fake_warm.py"
    script.write_text(_FAKE_WARM)
    monkeypatch.setattr(P, "_me", lambda: [sys.executable, str(script)])
    grid = [{"id": "a", "group": "g1"}, {"id": "b", "group": "g1"}, {"id": "c", "group": "g2"},
            {"id": "d", "group": "slow"}]
    logs = []
    t = time.time()
    P.warm_phase(str(tmp_path), grid, 2, time.time() + 4, logs.append)  # the quick groups end in well under 1 s
    assert time.time() - t < 30
    rows = P.read_points(str(tmp_path / "points.jsonl"))
    assert set(rows) == {"b", "c"} and all(r["where"] == "warm" for r in rows.values())
    assert "OutOfResources" in rows["b"]["error"] and "illegal memory access" in rows["c"]["error"]
    assert any("slow" in m and "killed" in m for m in logs)
    assert "==== group g2 rc 3" in (tmp_path / "warm.log").read_text()
