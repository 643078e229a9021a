"""The interactive report (``python -m eval.report``) in a real browser: headless Chromium through Playwright.

Every chart renders, the console shows no error, the crossover sliders move n* to the value of
:func:`eval.crossover.constants_crossover`, and the page's cost bill and KV-cache numbers equal
:mod:`attn_zoo.cost_model` / :mod:`attn_zoo.decode.memory` exactly (same doubles). Needs the ``playwright`` package
and a Chromium (``/usr/bin/chromium``; ``.ci/run`` installs it); skipped without them, except under CI.
"""

import math
import os
import shutil

import pytest

from attn_zoo.decode import memory as dm
from eval import report
from eval.crossover import constants_crossover

CHROMIUM = os.environ.get("ATTN_ZOO_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

if sync_playwright is None or not CHROMIUM:
    if os.environ.get("CI") or os.environ.get("ATTN_ZOO_REQUIRE_BROWSER"):
        raise RuntimeError("tests/test_report_browser.py needs playwright and chromium (.ci/run installs them)")
    pytest.skip("playwright or chromium missing", allow_module_level=True)

CHARTS = ["chart-crossover", "chart-quality", "chart-bill", "chart-sliders", "chart-kv", "chart-bubble0",
          "chart-bubble1", "chart-bubble2", "chart-bubble3", "chart-fig2", "chart-doclen"]


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    html = report.write(str(tmp_path_factory.mktemp("report") / "report.html"))
    messages = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        pg = browser.new_page(viewport={"width": 1300, "height": 900})
        pg.on("console", lambda m: messages.append(f"{m.type}: {m.text}") if m.type == "error" else None)
        pg.on("pageerror", lambda e: messages.append(f"pageerror: {e}"))
        pg.goto("file://" + html)
        pg.wait_for_function(f"window.attnZoo && Object.keys(window.attnZoo.rendered).length >= {len(CHARTS)}",
                             timeout=120_000)
        pg.messages = messages
        yield pg
        browser.close()


def test_every_chart_renders_and_the_console_is_clean(page):
    assert sorted(page.evaluate("Object.keys(window.attnZoo.rendered)")) == sorted(CHARTS)
    for c in CHARTS:
        n = page.evaluate(f"document.querySelectorAll('#{c} .scatterlayer .trace, #{c} .barlayer .trace').length")
        assert n > 0, f"{c} drew no trace"
    for sec in report.SECTIONS:
        assert page.locator(f"#sec-{sec}").is_visible()
    assert page.messages == []


def _fmt(x: float) -> str:
    """Python twin of the page's fmtN: 4 significant digits, thousands separated, at most 3 decimals."""
    if not math.isfinite(x):
        return "-"
    return f"{float(f'{x:.4g}'):,.3f}".rstrip("0").rstrip(".")


def test_moving_a_slider_moves_n_star_to_the_python_value(page):
    before = page.inner_text("#nstar-const")
    page.evaluate("(() => { const s = document.getElementById('sl-c2'); s.value = '-5.3';"
                  " s.dispatchEvent(new Event('input')); })()")
    c2, c_lin, c0 = page.evaluate("[10 ** +document.getElementById('sl-c2').value,"
                                  " 10 ** +document.getElementById('sl-clin').value,"
                                  " +document.getElementById('sl-c0').value]")
    # points on exact lines: the fit recovers c0, c2 and c_lin (the variant's constant per-token time)
    ns = [1024.0, 2048.0, 4096.0, 8192.0]
    py = constants_crossover(ns, [c0 + c2 * n for n in ns], ns, [c_lin] * 4)
    shown = page.inner_text("#nstar-const")
    assert shown == _fmt(py["n_star_const"]) and shown != before
    assert page.inner_text("#nstar-fit") == _fmt(py["n_star_fit"])
    js = page.evaluate(f"window.attnZoo.nStar({c0}, {c2}, {c_lin})")
    assert js["n_star_const"] == c_lin / c2


@pytest.mark.parametrize("p", [
    dict(B=64, H=16, N=1024, D=64, mode="fwd_bwd", causal=True, machine="a100", loop_order="fa1", blocks="sram"),
    dict(B=1, H=32, N=8192, D=128, mode="fwd", causal=False, machine="h200", loop_order="fa2", blocks="128x64"),
    dict(B=3, H=5, N=777, D=96, mode="bwd", causal=True, machine="h100", loop_order="fa2", blocks="sram"),
])
def test_cost_bill_equals_the_cost_model(page, p):
    js = page.evaluate("p => window.attnZoo.costBill(p)", dict(p, dtype_bytes=2))
    py = report.cost_bill(**p)
    for method in ("standard", "flash"):
        for k, v in py[method].items():
            assert js[method][k] == v, (method, k, js[method][k], v)


def test_kv_cache_numbers_equal_decode_memory(page):
    for name, L, H, D in report.KV_MODELS:
        presets = dm.variant_presets(L, H, window=report.KV_WINDOW)
        for variant, specs in presets.items():
            for ctx, batch, dt, budget in ((1, 1, 2, 2 ** 30), (5000, 3, 2, 40 * 2 ** 30), (131072, 16, 1, 80e9)):
                js = page.evaluate("([m, v, c, b, dt, bud]) => { const M = DATA.kv[m], Ls = M.presets[v]; return ["
                                   "window.attnZoo.cacheBytes(Ls, M.head_dim, c, b, dt),"
                                   "window.attnZoo.maxContext(Ls, M.head_dim, bud, b, dt)]; }",
                                   [name, variant, ctx, batch, dt, budget])
                assert js[0] == dm.cache_bytes(specs, H, D, ctx, batch, dt), (name, variant, ctx)
                assert js[1] == dm.max_context(specs, H, D, budget, batch, dt), (name, variant, budget)
    # the table follows the batch slider
    page.evaluate("(() => { const s = document.getElementById('kv-batch'); s.value = '8';"
                  " s.dispatchEvent(new Event('input')); })()")
    name, L, H, D = report.KV_MODELS[0]
    mc = dm.max_context(dm.variant_presets(L, H, window=report.KV_WINDOW)["mha"], H, D, 40 * 2 ** 30, 8, 2)
    assert page.inner_text("#kv-max-mha") == f"{mc:,}"


def test_filters_hide_other_implementations(page):
    page.select_option("#xf-backend", "triton")
    vis = page.evaluate("document.getElementById('chart-crossover').data.map(t => [t.visible, t.meta.backend])")
    assert any(v is not False for v, _ in vis)
    assert all((v is not False) == (b == "triton") for v, b in vis)
    page.select_option("#xf-backend", "*")


def test_slider_start_options_are_unique(page):
    """The n* sliders' "start from" list showed each crossover five times under one label (one per baseline)."""
    texts = page.evaluate("[...document.querySelectorAll('#sl-row option')].map(o => o.textContent)")
    assert len(texts) == len(report.slider_rows()) > 0 and len(set(texts)) == len(texts)
