"""The crossover / quality figures are readable: small multiples, one colour per backend across panels, labelled
n* (legend, table) without text on the plot, identical memory curves merged, setup in the title, a bubble-size key.
Every figure is built from small synthetic result rows (matplotlib Agg)."""

import json
import math
import os

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

from eval import figspec, plots  # noqa: E402
from eval.crossover import detect_crossovers  # noqa: E402

NS = [256, 512, 1024, 2048, 4096]
TOKENS = 4096
ENV = {"gpu": "NVIDIA H200", "date": "2026-12-24", "torch": "2.11.0", "triton": "3.6.0"}


def _row(variant, backend, n, t_ms, mem, hkv=4, kind=None, status="ok", D=64):
    b = TOKENS // n
    fl = 4.0 * b * 4 * n * n * D
    return {"sweep": "synth", "variant": variant, "kind": kind or variant, "backend": backend, "seq_len": n,
            "head_dim": D, "causal": True, "n_kv_heads": hkv, "n_heads": 4, "batch": b, "dtype": "bfloat16",
            "device": "cuda", "status": status, "error": "" if status == "ok" else "boom",
            "fwd_ms": t_ms / 3 if status == "ok" else "", "fwd_bwd_ms": t_ms if status == "ok" else "",
            "peak_mem_bytes": mem * b if status == "ok" else "", "fwd_tflops": 10.0, "fwd_bwd_tflops": 20.0 + n / 1e3,
            "flops_fwd": fl, "flops_fwd_bwd": 3.5 * fl, "model_hbm_bytes": fl / 10, "model_min_bytes": fl / 100,
            "model_footprint_bytes": mem * b, "tokens": TOKENS, "timestamp": "2026-12-24T10:00:00"}


def kernel_rows():
    rows = []
    for n in NS:
        exact = 1e-3 * n  # fixed tokens: exact time per step grows like n
        rows += [_row("flash", "triton", n, exact, 1000 * n),
                 _row("flash", "sdpa_flash", n, 1.3 * exact, 2000 * n),
                 _row("flash", "naive", n, 5 * exact, 50 * n * n),
                 _row("linear", "triton", n, 2.048, 3000 * n, kind="linear"),  # flat: crosses exact at n = 2048
                 _row("linear", "torch", n, 8.0, 9000 * n, kind="linear"),  # crosses at 8192: beyond the range
                 _row("sliding_window", "triton", n, 0.5 + 1e-4 * n, 1000 * n * 1.005),  # memory = exact's
                 _row("gqa", "triton", n, exact, 600 * n, hkv=2, kind="flash")]
    rows.append(_row("sliding_window", "torch", 256, 0, 0, status="error"))
    return rows


def crossovers(rows):
    return detect_crossovers(rows, {"exact": {"variant": "flash", "backend": "triton"}}, modes=("fwd", "fwd_bwd"))


def _legend_texts(legend):
    return [t.get_text() for t in legend.get_texts()] if legend is not None else []


def _panels(fig):
    return {ax.get_title(loc="left"): ax for ax in fig.axes if ax.get_title(loc="left")}


def _line_color(ax, label_start):
    for ln in ax.get_lines():
        if ln.get_label().startswith(label_start):
            return mcolors.to_hex(ln.get_color())
    raise AssertionError(f"no line labelled {label_start!r}: {[ln.get_label() for ln in ax.get_lines()]}")


# --------------------------------------------------------------------------------------------- time vs N
def test_time_vs_n_small_multiples_labels_and_stars():
    rows = kernel_rows()
    cross = crossovers(rows)
    fig = plots.time_vs_n_figure(rows, cross, "fwd_bwd", env=ENV, title="synth")
    panels = _panels(fig)
    assert set(panels) == {"flash", "gqa", "linear", "sliding_window", "n* vs flash/triton (fwd_bwd_ms)"}
    for name, ax in panels.items():
        texts = _legend_texts(ax.get_legend())
        assert len(texts) <= 5, (name, texts)
        assert not [t for t in ax.texts], "no free text on the data (labels live in legends / the table)"
    lin = _legend_texts(panels["linear"].get_legend())
    assert "ours (Triton): n*≈2.0k" in lin and "torch backend: slower at every N" in lin
    flash = _legend_texts(panels["flash"].get_legend())
    assert flash[0] == "ours (Triton): exact baseline" and "SDPA FlashAttention-2: slower at every N" in flash
    assert any("ERROR at N=256" in t for t in _legend_texts(panels["sliding_window"].get_legend()))
    # the star sits on the linear curve at n*, a dotted line marks it
    stars = [ln for ln in panels["linear"].get_lines() if ln.get_marker() == "*"]
    assert len(stars) == 1 and stars[0].get_xdata()[0] == pytest.approx(2048, rel=1e-6)
    assert stars[0].get_ydata()[0] == pytest.approx(2.048, rel=1e-6)
    assert any(ln.get_linestyle() == ":" and ln.get_xdata()[0] == pytest.approx(2048, rel=1e-6)
               for ln in panels["linear"].get_lines())
    # one colour per backend in every panel; the baseline thick black everywhere
    assert _line_color(panels["linear"], "ours (Triton)") == _line_color(panels["sliding_window"], "ours (Triton)") \
        == mcolors.to_hex("tab:blue")
    assert _line_color(panels["flash"], "SDPA FlashAttention-2") == mcolors.to_hex("tab:orange")
    assert any(mcolors.to_hex(ln.get_color()) == "#000000" and ln.get_linewidth() > 2
               for ln in panels["gqa"].get_lines())
    # figure legend: baseline, star, dotted line
    fl = _legend_texts(fig.legends[0])
    assert fl[0].startswith("flash/triton: exact baseline") and any(t.startswith("n*:") for t in fl)
    assert any("dotted" in t for t in fl)
    # the setup is in the title
    title = fig._suptitle.get_text()
    for part in ("NVIDIA H200", "bfloat16", "causal", "H = 4", "D = 64", "4,096 tokens per step", "2026-12-24"):
        assert part in title.replace("\n", " "), (part, title)
    # the table panel lists every n* (and the statuses), baseline excluded
    table = [c for c in panels["n* vs flash/triton (fwd_bwd_ms)"].get_children()
             if isinstance(c, matplotlib.table.Table)][0]
    cells = {table[i, 2].get_text().get_text() for i in range(1, len(table.get_celld()) // 3)}
    assert "2.0k" in cells and "slower at every N" in cells
    # a variant with fewer K / V heads than the baseline is labelled with its Hkv, whatever its name; others are not
    names = {table[i, 0].get_text().get_text() for i in range(1, len(table.get_celld()) // 3)}
    assert "gqa Hkv=2" in names and "linear" in names and not any("Hkv" in n for n in names if "gqa" not in n)
    plt.close(fig)


def test_nstar_table_names_shared_kv_heads_by_count_not_by_variant_name():
    rows = [r if r["variant"] != "gqa" else dict(r, variant="grouped") for r in kernel_rows()]
    fig = plots.time_vs_n_figure(rows, crossovers(rows), "fwd_bwd", env=ENV, title="synth")
    table = [c for c in _panels(fig)["n* vs flash/triton (fwd_bwd_ms)"].get_children()
             if isinstance(c, matplotlib.table.Table)][0]
    names = {table[i, 0].get_text().get_text() for i in range(1, len(table.get_celld()) // 3)}
    assert "grouped Hkv=2" in names, names
    plt.close(fig)


def test_family_panels_cap_series_and_baseline_first():
    keys = [("flash", b, 64, True, 4) for b in ("a", "b", "c", "d", "e", "f", "triton")]
    keys.append(("linear", "x", 64, True, 4))
    panels = plots.family_panels(keys, ("flash", "triton"), max_series=5)
    assert [p["title"] for p in panels] == ["flash [1]", "flash [2]", "linear"]
    assert panels[0]["keys"][0] == ("flash", "triton", 64, True, 4) and len(panels[0]["keys"]) == 5
    assert len(panels[1]["keys"]) == 2
    assert plots.fmt_n(3729.4) == "3.7k" and plots.fmt_n(860.2) == "860" and plots.fmt_n(float("nan")) == "-"


# --------------------------------------------------------------------------------------------- memory
def test_memory_groups_identical_curves():
    rows = kernel_rows()
    fig = plots.memory_vs_n_figure(rows, env=ENV, baseline=("flash", "triton"))
    panels = _panels(fig)
    assert set(panels) == {"flash", "gqa", "linear", "sliding_window"}
    sw = _legend_texts(panels["sliding_window"].get_legend())
    assert sw == ["flash/triton (exact baseline)\n= ours (Triton)\n(equal within 2%)"]  # one name a line
    data_lines = [ln for ln in panels["sliding_window"].get_lines() if ln.get_label() and not
                  ln.get_label().startswith("_")]
    assert len(data_lines) == 1  # two series, one curve
    flash = _legend_texts(panels["flash"].get_legend())
    assert len(flash) == 3 and not any(" = " in t for t in flash)  # different curves stay apart
    fl = _legend_texts(fig.legends[0])
    assert any("∝ n²" in t for t in fl) and any("∝ n·d" in t for t in fl)
    assert any(t.startswith("a = b") for t in fl)
    assert "measured peak" in fig._suptitle.get_text()
    plt.close(fig)


def test_group_identical():
    c = {"a": {1: 10.0, 2: 20.0, 4: 40.0}, "b": {1: 10.1, 2: 20.1}, "c": {1: 30.0, 2: 60.0}, "d": {8: 1.0}}
    assert plots.group_identical(c, 0.02) == [["a", "b"], ["c"], ["d"]]
    assert plots.group_identical(c, 0.02, first="b") == [["b", "a"], ["c"], ["d"]]


# --------------------------------------------------------------------------------------------- roofline, model
def test_roofline_panels_and_legend():
    from attn_zoo import cost_model as cm

    fig = plots.roofline_figure(kernel_rows(), cm.get_machine("h200"), env=ENV, baseline=("flash", "triton"))
    panels = _panels(fig)
    assert set(panels) == {"flash", "gqa", "linear", "sliding_window"}
    assert _legend_texts(panels["linear"].get_legend()) == ["ours (Triton)", "torch backend"]
    assert any("roof" in t for t in _legend_texts(fig.legends[0]))
    plt.close(fig)


def model_rows():
    out = []
    for v, tps, mem in (("flash", 1e6, 2.4e9), ("linear", 9e5, 2.4e9), ("gqa", 1.1e6, 2.2e9),
                        ("sliding_window", 1.2e6, 2.4e9)):
        for n in (2048, 8192):
            out.append({"sweep": "m", "variant": v, "backend": "auto", "seq_len": n, "batch": 16384 // n,
                        "d_model": 1024, "n_layer": 4, "n_heads": 8, "params": 50e6, "dtype": "bfloat16",
                        "device": "cuda", "status": "ok", "train_tokens_per_s": tps * (1 - n / 1e5),
                        "train_peak_mem_bytes": mem, "infer_tokens_per_s": 3 * tps,
                        "timestamp": "2026-12-24T10:00:00"})
    return out


def test_model_sweep_three_panels_memory_grouped():
    fig = plots.model_sweep_figure(model_rows(), env=ENV)
    axes = [ax for ax in fig.axes if ax.get_ylabel()]
    assert [ax.get_ylabel() for ax in axes] == ["training step: tokens / s", "inference (forward): tokens / s",
                                                "training peak memory (MiB)"]
    assert len(_legend_texts(axes[0].get_legend())) == 4
    mem = _legend_texts(axes[2].get_legend())
    assert mem == ["flash = linear = sliding_window (equal within 2%)", "gqa"]
    t = fig._suptitle.get_text().replace("\n", " ")
    assert "d_model 1024" in t and "16,384 tokens per step" in t and "backend auto" in t and "2026-12-24" in t
    plt.close(fig)


# --------------------------------------------------------------------------------------------- bubble
def bubble_rows():
    out = []
    for n in (64, 128, 256):
        for v, q, s, m in (("flash", 0.9, 1e5 / n, 400.0 + n), ("linear", 0.5, 900.0, 300.0),
                           ("gqa", 0.85, 1.1e5 / n, 350.0)):
            out.append({"dataset": "mqar", "variant": v, "seq_len": n, "val_acc": q, "tokens_per_s": s,
                        "peak_mem_mb": m})
    out.append({"dataset": "mqar", "variant": "sparse", "seq_len": 64, "val_acc": 0.7, "tokens_per_s": 800.0,
                "peak_mem_mb": float("nan")})
    return out


def test_bubble_has_a_size_key_and_a_panel_per_length():
    fig = plots.bubble_figure(bubble_rows(), "val_acc", caption="speed, memory: synthetic")
    panels = _panels(fig)
    assert set(panels) == {"seq_len 64", "seq_len 128", "seq_len 256"}
    legends = {lg.get_title().get_text(): _legend_texts(lg) for lg in fig.legends}
    assert legends[""] == ["flash", "gqa", "linear", "sparse"]
    key = legends["bubble area =\npeak memory"]
    assert key[:3] == ["160 MiB", "330 MiB", "660 MiB"] and key[3] == "memory not measured"
    # area proportional to memory: the 656 MiB bubble has 2x the area of a 328 MiB one
    sizes = sorted(s for c in panels["seq_len 256"].collections for s in c.get_sizes())
    assert sizes[-1] == pytest.approx(figspec.BUBBLE_MAX_AREA) and sizes[0] == pytest.approx(
        figspec.BUBBLE_MAX_AREA * 300 / 656)
    assert "synthetic" in fig._suptitle.get_text()
    plt.close(fig)
    lower = [dict(r, val_bpb=2 - r["val_acc"]) for r in bubble_rows()]
    fig = plots.bubble_figure(lower, "val_bpb")
    assert _panels(fig)["seq_len 64"].yaxis_inverted()  # quality up
    plt.close(fig)


# --------------------------------------------------------------------------------------------- files
def test_sweep_figures_write_every_file(tmp_path):
    from eval.bench_common import write_csv, write_json

    rows = kernel_rows()
    write_csv(rows, str(tmp_path / "kernel.csv"))
    write_json(crossovers(rows), str(tmp_path / "crossover.json"), env=ENV)
    write_csv(model_rows(), str(tmp_path / "model.csv"))
    out = plots.sweep_figures(str(tmp_path), str(tmp_path / "fig"), machine="h200", prefix="x_", formats=["png"])
    assert set(out) == {"time_vs_n_fwd_bwd", "time_vs_n_fwd", "memory_vs_n", "roofline", "model_tokens_per_s"}
    for paths in out.values():
        assert len(paths) == 1 and os.path.basename(paths[0]).startswith("x_") and os.path.getsize(paths[0]) > 20000
    assert plots.read_env(str(tmp_path))["gpu"] == "NVIDIA H200"
    # the re-read crossover.json (n* as JSON numbers / null) still labels the stars
    with open(tmp_path / "crossover.json") as f:
        cross = [dict(c, n_star=float("nan") if c["n_star"] is None else c["n_star"]) for c in json.load(f)["rows"]]
    fig = plots.time_vs_n_figure(rows, cross, "fwd", env=ENV)
    assert any("n*≈" in t for t in _legend_texts(_panels(fig)["linear"].get_legend()))
    plt.close(fig)
    q = plots.plot_bubble(bubble_rows(), str(tmp_path / "b"), "val_acc")
    assert os.path.getsize(q[0]) > 20000 and math.isfinite(os.path.getmtime(q[0]))


def test_grid_with_shared_x_labels_every_panel():
    """Five panels in rows of four with a shared x axis: panels 2-4 of the first row have no panel below them (or
    a table, in the crossover figure) and must keep their x tick labels, else those columns show no scale; every
    panel keeps them."""
    import matplotlib

    matplotlib.use("Agg")
    from eval.plots import grid

    fig, axes = grid(5, ncols=4, sharex=True)
    for ax in axes:
        ax.plot([1e6, 7e6], [0, 1])
    fig.canvas.draw()
    shown = [any(t.get_visible() and t.get_text() for t in ax.get_xticklabels()) for ax in axes]
    assert shown == [True] * 5


def test_crossover_note_gives_range_and_a_near_tie():
    """Legend / table text of a crossover row: a series shorter than the baseline's range says so, and a crossing
    that wins by under 5 % at the largest length says how little (the GQA case: 1 % at 32k is noise, not a win)."""
    from eval.plots import crossover_note

    base = dict(status="crossover", n_star=15500.0, n_min=512.0, n_max=32768.0, ratio_at_max=0.988)
    assert crossover_note(base, 32768) == "n*≈15.5k (only 1 % faster at 32.8k)"
    assert crossover_note(dict(base, ratio_at_max=0.5), 32768) == "n*≈15.5k"
    one = dict(status="no crossover in range (baseline faster)", n_star=float("nan"), n_min=512.0, n_max=512.0,
               ratio_at_max=5.6)
    assert crossover_note(one, 32768) == "slower at every N (N = 512 only)"
    short = dict(one, n_max=2048.0)
    assert crossover_note(short, 32768) == "slower at every N (N ≤ 2.0k)"
    assert crossover_note(dict(short, n_max=32768.0), 32768) == "slower at every N"
    assert crossover_note(None) == ""


RECURRENT = ["deltanet", "gated_deltanet", "mamba2", "mla"]


@pytest.mark.parametrize("order", [RECURRENT, RECURRENT[::-1], ["mamba2"], ["mla", "backend-first", "deltanet"]])
def test_recurrent_variant_styles_do_not_depend_on_draw_order(monkeypatch, order):
    """mamba2 / deltanet / gated_deltanet / mla keep one style whatever a process draws first (``eval.recall hybrid``
    alone meets only mamba2; ``eval.figures`` meets all four in its mqar_fig2 job first): the styles the committed
    figures have, i.e. the extra styles in the order eval.figures handed them out."""
    monkeypatch.setattr(plots, "_ASSIGNED", {})  # a fresh process
    for name in order:
        if name == "backend-first":
            plots.backend_style("some_new_backend")  # an extra style taken by something else first
        else:
            plots.variant_style(name)
    expected = {"deltanet": ("#17becf", "*"), "gated_deltanet": ("#bcbd22", "8"), "mamba2": ("#8c564b", "H"),
                "mla": ("#e377c2", "d")}
    for name, (color, marker) in expected.items():
        assert plots.variant_style(name) == {"color": color, "marker": marker, "ls": "-."}, name
