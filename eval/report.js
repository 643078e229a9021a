// The report's logic (inlined by eval/report.py). The cost functions are attn_zoo.cost_model and
// attn_zoo.decode.memory written again, formula for formula and in the same order of operations, so their doubles
// equal Python's; tests/test_report_browser.py checks them.
"use strict";
(function () {
const C = DATA.cost.constants;
const PLOT_CFG = {responsive: true, displaylogo: false};

// ------------------------------------------------------------------ cost model (attn_zoo/cost_model.py)
function standardCost(B, H, N, D, o) {
  o = o || {};
  const Nk = o.Nk == null ? N : o.Nk, Dv = o.Dv == null ? D : o.Dv, e = o.dtype_bytes || 2;
  const mode = o.mode || "fwd_bwd";
  const M = N * Nk;
  let fr = 0, fw = 0, fl = 0;
  if (mode === "fwd" || mode === "fwd_bwd") {
    fl += 2.0 * M * (D + Dv) + C.SOFTMAX_STABLE_FLOPS * M;
    fr += (N * D + Nk * D) * e;
    fw += M * e;
    if (o.mask_pass) { fr += M * e; fw += M * e; }
    fr += M * e; fw += M * e;
    if (o.dropout) { fr += M * e; fw += M * e + M; fl += C.DROPOUT_FLOPS * M; }
    fr += M * e + Nk * Dv * e;
    fw += N * Dv * e;
  }
  if (mode === "bwd" || mode === "fwd_bwd") {
    fl += 2.0 * M * Dv * 2 + 2.0 * M * D * 2 + C.SOFTMAX_BWD_FLOPS * M;
    fr += M * e + N * Dv * e; fw += Nk * Dv * e;
    fr += N * Dv * e + Nk * Dv * e; fw += M * e;
    if (o.dropout) { fr += M * e + M; fw += M * e; fl += C.DROPOUT_FLOPS * M; }
    fr += 2 * M * e; fw += M * e;
    if (o.mask_pass) { fr += M * e; fw += M * e; }
    fr += M * e + Nk * D * e; fw += N * D * e;
    fr += M * e + N * D * e; fw += Nk * D * e;
  }
  const nSaved = 2 + (o.dropout ? 1 : 0);
  const footprint = (nSaved + (mode !== "fwd" ? 2 : 0)) * M * e + (N * Dv) * e;
  return scaleCost({flops: fl, hbm_read: fr, hbm_write: fw, footprint_bytes: footprint, min_bytes: 0}, B * H);
}

function scaleCost(c, f) {
  const s = {flops: c.flops * f, hbm_read: c.hbm_read * f, hbm_write: c.hbm_write * f,
             footprint_bytes: c.footprint_bytes * f, min_bytes: c.min_bytes * f};
  s.hbm_bytes = s.hbm_read + s.hbm_write;
  return s;
}

function flashBlockSizes(D, sram, e) {
  const M = sram / e;
  const bc = Math.ceil(M / (4 * D));
  return [Math.min(bc, D), bc];
}

function causalVisitedFraction(N, Nk, bm, bn) {
  const off = Nk - N;
  const Tr = Math.ceil(N / bm), Tc = Math.ceil(Nk / bn);
  let visited = 0;
  for (let i = 0; i < Tr; i++) {
    const lastRow = Math.min((i + 1) * bm, N) - 1 + off;
    if (lastRow < 0) continue;
    visited += Math.min(Tc, Math.floor(lastRow / bn) + 1);
  }
  return visited / (Tr * Tc);
}

function flashCost(B, H, N, D, o) {
  o = o || {};
  const Nk = o.Nk == null ? N : o.Nk, Dv = o.Dv == null ? D : o.Dv, dt = o.dtype_bytes || 2;
  const mode = o.mode || "fwd_bwd", loop = o.loop_order || "fa2";
  let bm = o.block_m == null ? null : o.block_m, bn = o.block_n == null ? null : o.block_n;
  if (bm === null || bn === null) {
    const [m, n] = o.sram_bytes == null ? [128, 64] : flashBlockSizes(D, o.sram_bytes, dt);
    if (bm === null) bm = m;
    if (bn === null) bn = n;
  }
  const f = o.visited_fraction != null ? o.visited_fraction : (o.causal ? causalVisitedFraction(N, Nk, bm, bn) : 1.0);
  const e = dt, s = C.STAT_BYTES;
  const Tr = Math.ceil(N / bm), Tc = Math.ceil(Nk / bn);
  const M = N * Nk * f;
  let fr = 0, fw = 0, fl = 0;
  if (mode === "fwd" || mode === "fwd_bwd") {
    fl += 2.0 * M * (D + Dv) + C.SOFTMAX_STABLE_FLOPS * M + 2.0 * N * Dv * f * Tc;
    if (o.dropout) fl += C.DROPOUT_FLOPS * M;
    if (loop === "fa1") {
      fw += N * Dv * e + 2 * N * s;
      fr += Nk * (D + Dv) * e;
      fr += f * Tc * (N * D * e + N * Dv * e + 2 * N * s);
      fw += f * Tc * (N * Dv * e + 2 * N * s);
    } else {
      fr += N * D * e + f * Tr * Nk * (D + Dv) * e;
      fw += N * Dv * e + N * s;
    }
  }
  if (mode === "bwd" || mode === "fwd_bwd") {
    fl += 2.0 * M * (2 * D + 3 * Dv) + (C.FLASH_RECOMPUTE_FLOPS + C.FLASH_BWD_DS_FLOPS) * M + 2.0 * N * Dv;
    if (o.dropout) fl += 2 * C.DROPOUT_FLOPS * M;
    if (loop === "fa1") {
      fw += (N * D + Nk * D + Nk * Dv) * e;
      fr += Nk * (D + Dv) * e;
      fr += f * Tc * (N * D * e + 2 * N * Dv * e + N * D * e + 2 * N * s);
      fw += f * Tc * N * D * e;
      fw += Nk * (D + Dv) * e;
    } else {
      fr += 2 * N * Dv * e; fw += N * s;
      fr += Nk * (D + Dv) * e;
      fr += f * Tc * (N * D * e + N * Dv * e + 2 * N * s);
      fr += f * Tc * N * D * s; fw += f * Tc * N * D * s;
      fw += Nk * (D + Dv) * e + N * D * e;
    }
  }
  const footprint = N * Dv * e + N * s + (mode !== "fwd" ? (N * D + Nk * D + Nk * Dv) * e : 0.0);
  const ioF = (N * D + Nk * (D + Dv) + N * Dv) * e + N * s;
  const ioB = (N * D + Nk * (D + Dv) + 2 * N * Dv) * e + N * s + (N * D + Nk * (D + Dv)) * e;
  const comp = (mode !== "bwd" ? ioF : 0.0) + (mode !== "fwd" ? ioB : 0.0);
  const out = scaleCost({flops: fl, hbm_read: fr, hbm_write: fw, footprint_bytes: footprint, min_bytes: comp}, B * H);
  out.block_m = bm; out.block_n = bn; out.visited_fraction = f;
  return out;
}

function boundTime(c, m) { return Math.max(c.flops / m.peak_flops, c.hbm_bytes / m.bandwidth); }

// p: {B, H, N, D, mode, causal, dtype_bytes, machine, loop_order, blocks} -> eval.report.cost_bill
function costBill(p) {
  const m = DATA.cost.machines[p.machine || "h200"];
  const o = {mode: p.mode || "fwd_bwd", causal: p.causal !== false, dtype_bytes: p.dtype_bytes || 2};
  const std = standardCost(p.B, p.H, p.N, p.D, o);
  const fl = flashCost(p.B, p.H, p.N, p.D, Object.assign({}, o, {loop_order: p.loop_order || "fa2",
    sram_bytes: p.blocks === "sram" ? m.sram_bytes : null}));
  const row = c => ({flops: c.flops, hbm_bytes: c.hbm_bytes, footprint_bytes: c.footprint_bytes, time_s: boundTime(c, m)});
  return {standard: row(std), flash: row(fl), blocks: [fl.block_m, fl.block_n]};
}

// ------------------------------------------------------------------ decode memory (attn_zoo/decode/memory.py)
function layerBytes(L, headDim, context, batch, dtypeBytes, stateBytes) {
  if (L.state != null) return batch * L.hkv * L.state * stateBytes;
  const kept = L.window == null ? context : Math.min(context, L.window);
  return batch * 2 * L.hkv * headDim * dtypeBytes * kept;
}
function cacheBytes(layers, headDim, context, batch, dtypeBytes, stateBytes) {
  stateBytes = stateBytes || 4;
  let s = 0;
  for (const L of layers) s += layerBytes(L, headDim, context, batch, dtypeBytes, stateBytes);
  return s;
}
function bytesPerToken(layers, headDim, dtypeBytes) {
  let s = 0;
  for (const L of layers) if (L.state == null && L.window == null) s += 2 * L.hkv * headDim * dtypeBytes;
  return s;
}
// the longest context that fits (null: the cache stops growing and fits at any length), as max_context
function maxContext(layers, headDim, budget, batch, dtypeBytes, stateBytes) {
  const fits = n => cacheBytes(layers, headDim, n, batch, dtypeBytes, stateBytes) <= budget;
  const search = (lo, hi) => {
    if (fits(hi)) return hi;
    while (hi - lo > 1) { const mid = Math.floor((lo + hi) / 2); if (fits(mid)) lo = mid; else hi = mid; }
    return lo;
  };
  if (!fits(1)) return 0;
  if (bytesPerToken(layers, headDim, dtypeBytes) === 0) {
    const sat = Math.max(1, ...layers.filter(L => L.window != null).map(L => L.window));
    return fits(sat) ? null : search(1, sat);
  }
  return search(1, 2 ** 40);
}

// ------------------------------------------------------------------ crossover constants (eval/crossover.py)
function nStar(c0, c2, cLin) {
  return {n_star_const: c2 > 0 ? cLin / c2 : NaN, n_star_fit: c2 > 0 && cLin > c0 ? (cLin - c0) / c2 : NaN};
}

window.attnZoo = {standardCost, flashCost, costBill, cacheBytes, maxContext, bytesPerToken, nStar,
                  rendered: {}};

// ------------------------------------------------------------------ helpers
const $ = id => document.getElementById(id);
function si(x, unit) {
  if (x == null || !isFinite(x)) return "-";
  const units = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  for (const [v, s] of units) if (Math.abs(x) >= v) return (x / v).toPrecision(4) + " " + s + unit;
  return x.toPrecision(4) + " " + unit;
}
function fmtN(x) { return x == null || !isFinite(x) ? "-" : Number(x.toPrecision(4)).toLocaleString("en-US"); }
function plot(id, fig) {
  return Plotly.newPlot(id, fig.data, fig.layout, PLOT_CFG).then(() => { window.attnZoo.rendered[id] = true; });
}
function option(sel, value, text) { const o = document.createElement("option"); o.value = value; o.textContent = text; sel.appendChild(o); }

// ------------------------------------------------------------------ crossover explorer
function crossoverExplorer() {
  const fig = DATA.charts.crossover;
  if (fig) {
    const box = $("xfilters");
    const keys = [["head_dim", "head dim"], ["gpu", "GPU"], ["backend", "implementation"], ["variant", "variant"]];
    const sels = {};
    for (const [k, label] of keys) {
      const vals = [...new Set(fig.data.map(t => String(t.meta[k])))].sort();
      const lab = document.createElement("label"); lab.textContent = label + " ";
      const sel = document.createElement("select"); sel.id = "xf-" + k;
      option(sel, "*", "all"); vals.forEach(v => option(sel, v, v));
      lab.appendChild(sel); box.appendChild(lab); sels[k] = sel;
      sel.addEventListener("change", () => {
        const vis = fig.data.map(t => keys.every(([kk]) => sels[kk].value === "*" || String(t.meta[kk]) === sels[kk].value));
        Plotly.restyle("chart-crossover", {visible: vis});
      });
    }
    plot("chart-crossover", fig);
  }
  if (DATA.charts.quality) plot("chart-quality", DATA.charts.quality);
  if (DATA.charts.doclen) plot("chart-doclen", DATA.charts.doclen);
}

// ------------------------------------------------------------------ cost bill
function billParams() {
  return {B: +$("bill-B").value, H: +$("bill-H").value, N: +$("bill-N").value, D: +$("bill-D").value,
          mode: $("bill-mode").value, causal: $("bill-causal").checked, dtype_bytes: 2,
          machine: $("bill-machine").value, loop_order: $("bill-loop").value, blocks: $("bill-blocks").value};
}
function updateBill() {
  const p = billParams(), b = costBill(p);
  const rows = [["FLOPs", "flops", "FLOP"], ["HBM traffic", "hbm_bytes", "B"], ["extra device memory", "footprint_bytes", "B"],
                ["time bound (roofline)", "time_s", "s"]];
  let h = "<tr><th></th><th>standard</th><th>flash (tiles " + b.blocks.join(" x ") + ")</th><th>flash / standard</th></tr>";
  for (const [label, k, u] of rows)
    h += `<tr><td>${label}</td><td id="bill-standard-${k}">${si(b.standard[k], u)}</td><td id="bill-flash-${k}">${si(b.flash[k], u)}</td><td>${(b.flash[k] / b.standard[k]).toFixed(3)}</td></tr>`;
  $("bill-table").innerHTML = h;
  const cats = ["GFLOPs", "HBM GB", "time ms"];
  const val = c => [c.flops / 1e9, c.hbm_bytes / 1e9, c.time_s * 1e3];
  const data = [{type: "bar", name: "standard", x: cats, y: val(b.standard), marker: {color: "#d62728"}},
                {type: "bar", name: "flash", x: cats, y: val(b.flash), marker: {color: "#1f77b4"}}];
  const layout = {barmode: "group", height: 330, yaxis: {type: "log"}, margin: {t: 40},
                  title: {text: `B=${p.B} H=${p.H} N=${p.N} d=${p.D}, ${p.mode}, ${DATA.cost.machines[p.machine].name}`, font: {size: 12}}};
  Plotly.react("chart-bill", data, layout, PLOT_CFG).then(() => { window.attnZoo.rendered["chart-bill"] = true; });
}
function costBillSection() {
  const ms = $("bill-model");
  for (const name of Object.keys(DATA.cost.models)) option(ms, name, name);
  for (const [k, m] of Object.entries(DATA.cost.machines)) option($("bill-machine"), k, m.name);
  $("bill-machine").value = "h200";
  ms.addEventListener("change", () => {
    const [B, H, N, D] = DATA.cost.models[ms.value];
    $("bill-B").value = B; $("bill-H").value = H; $("bill-N").value = N; $("bill-D").value = D; updateBill();
  });
  for (const id of ["bill-B", "bill-H", "bill-N", "bill-D", "bill-mode", "bill-causal", "bill-machine", "bill-loop", "bill-blocks"])
    $(id).addEventListener("input", updateBill);
  updateBill();
}

// ------------------------------------------------------------------ crossover sliders
function sliderValues() {
  return {c2: 10 ** +$("sl-c2").value, c_lin: 10 ** +$("sl-clin").value, c0: +$("sl-c0").value};
}
function updateSliders() {
  const v = sliderValues(), r = nStar(v.c0, v.c2, v.c_lin);
  $("sl-c2-v").textContent = v.c2.toExponential(3); $("sl-clin-v").textContent = v.c_lin.toExponential(3);
  $("sl-c0-v").textContent = v.c0.toFixed(3);
  $("nstar-const").textContent = fmtN(r.n_star_const); $("nstar-fit").textContent = fmtN(r.n_star_fit);
  const ns = []; for (let e = 6; e <= 22; e += 0.25) ns.push(2 ** e);
  const data = [{name: "exact: c0 + c2 N", x: ns, y: ns.map(n => v.c0 + v.c2 * n), line: {color: "black", width: 3}},
                {name: "variant: c_lin", x: ns, y: ns.map(() => v.c_lin), line: {color: "#d62728", dash: "dot"}}];
  if (isFinite(r.n_star_const)) data.push({name: "n* = c_lin / c2", x: [r.n_star_const], y: [v.c_lin], mode: "markers",
                                           marker: {symbol: "star", size: 16, color: "#d62728"}});
  const layout = {height: 330, margin: {t: 30}, xaxis: {type: "log", title: {text: "N"}},
                  yaxis: {type: "log", title: {text: "time per token (us)"}}};
  Plotly.react("chart-sliders", data, layout, PLOT_CFG).then(() => { window.attnZoo.rendered["chart-sliders"] = true; });
}
function slidersSection() {
  const sel = $("sl-row");
  DATA.crossovers.forEach((c, i) => option(sel, i, c.label + (c.n_star ? ` (measured n* ${fmtN(c.n_star)})` : "")));
  const load = () => {
    const c = DATA.crossovers[+sel.value] || {c0: 0.01, c2: 3e-5, c_lin: 0.05};
    $("sl-c2").value = Math.log10(c.c2); $("sl-clin").value = Math.log10(c.c_lin); $("sl-c0").value = Math.max(0, c.c0 || 0);
    updateSliders();
  };
  sel.addEventListener("change", load);
  for (const id of ["sl-c2", "sl-clin", "sl-c0"]) $(id).addEventListener("input", updateSliders);
  load();
}

// ------------------------------------------------------------------ KV-cache growth
function updateKv() {
  const model = DATA.kv[$("kv-model").value], batch = +$("kv-batch").value, dt = +$("kv-dtype").value;
  const budget = +$("kv-budget").value * 2 ** 30;
  $("kv-batch-v").textContent = batch; $("kv-budget-v").textContent = $("kv-budget").value;
  const ctx = []; for (let e = 10; e <= 20; e += 0.25) ctx.push(Math.round(2 ** e));
  let h = "<tr><th>variant</th><th>bytes / token (long context)</th><th>cache at 32k</th><th>longest context in budget</th></tr>";
  const data = [];
  for (const [name, layers] of Object.entries(model.presets)) {
    const mc = maxContext(layers, model.head_dim, budget, batch, dt);
    h += `<tr><td>${name}</td><td>${si(bytesPerToken(layers, model.head_dim, dt), "B")}</td>` +
         `<td>${si(cacheBytes(layers, model.head_dim, 32768, batch, dt), "B")}</td>` +
         `<td id="kv-max-${name}">${mc === null ? "any" : mc.toLocaleString("en-US")}</td></tr>`;
    data.push({name, x: ctx, y: ctx.map(n => cacheBytes(layers, model.head_dim, n, batch, dt) / 2 ** 30), mode: "lines"});
  }
  data.push({name: "budget", x: [ctx[0], ctx[ctx.length - 1]], y: [budget / 2 ** 30, budget / 2 ** 30], mode: "lines",
             line: {color: "gray", dash: "dash"}});
  $("kv-table").innerHTML = h;
  const layout = {height: 380, margin: {t: 30}, xaxis: {type: "log", title: {text: "context (tokens)"}},
                  yaxis: {type: "log", title: {text: "KV cache / state (GiB)"}},
                  title: {text: `${$("kv-model").value}: ${model.n_layer} layers, ${model.n_head} heads, d ${model.head_dim}; batch ${batch}`, font: {size: 12}}};
  Plotly.react("chart-kv", data, layout, PLOT_CFG).then(() => { window.attnZoo.rendered["chart-kv"] = true; });
}
function kvSection() {
  for (const name of Object.keys(DATA.kv)) option($("kv-model"), name, name);
  for (const id of ["kv-model", "kv-batch", "kv-budget", "kv-dtype"]) $(id).addEventListener("input", updateKv);
  updateKv();
}

// ------------------------------------------------------------------ bubble, fig2
function staticCharts() {
  const box = $("bubbles");
  Object.keys(DATA.charts).filter(k => k.startsWith("bubble")).forEach(k => {
    const d = document.createElement("div"); d.className = "chart"; d.id = "chart-" + k; box.appendChild(d); plot(d.id, DATA.charts[k]);
  });
  if (DATA.charts.fig2) plot("chart-fig2", DATA.charts.fig2);
}

crossoverExplorer(); costBillSection(); slidersSection(); kvSection(); staticCharts();
})();
