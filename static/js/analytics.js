// The analytics panel: what each head does, in numbers. Layers x heads heat maps of entropy,
// mean attention distance and attention to sinks; mean attention distance against depth (one
// dot per head, as in fig. 7 of the ViT paper); the head similarity matrix of the current layer;
// numerical and effective rank per layer. The numbers come from GET …/stats (fetched once per
// image and model), except the "this query row" modes, computed here from the rows in the page.
// A click on a cell, a dot or a row opens that layer and head in the main view.

import {
  AXIS, LEGEND_BELOW, base, clear, layerHeadHeatmap, note, onClick, plotKeyed, plotlyReady, selectionBox, unavailable,
} from "./charts.js";
import { plotlyScale } from "./colormaps.js";
import { normEntropy, prefixMass } from "./data.js";
import { $, setText } from "./dom.js";
import { keyCount } from "./windows.js";

// One colour per head (cycled) for the scatter: bright enough on the dark panel.
const HEAD_COLOURS = ["#38bdf8", "#fbbf24", "#34d399", "#f472b6", "#a78bfa", "#fb923c",
  "#22d3ee", "#facc15", "#4ade80", "#e879f9", "#f87171", "#cbd5e1"];

export function analyticsEls() {
  return {
    panel: $("analytics"), status: $("analytics-status"),
    entropy: $("chart-entropy"), sinks: $("chart-prefix"), distance: $("distance-heatmap"),
    scatter: $("distance-scatter"), similarity: $("similarity-matrix"), rank: $("rank-chart"),
  };
}

function charts(els) {
  return [els.entropy, els.sinks, els.distance, els.scatter, els.similarity, els.rank];
}

function ints(n) {
  return Array.from({ length: n }, (_, i) => i);
}

/** Per-head values of the current query row, [L][H], from the rows in the page (windowed models:
 * each layer has its stage's heads, the rest null; fn gets the layer's tokens too). */
function fromRows(store, query, fn) {
  const out = [];
  for (let l = 0; l < store.L; l++) {
    const r = [];
    for (let h = 0; h < store.H; h++) {
      const row = store.row(query, l, String(h));
      r.push(row ? fn(row, store.tokensAt ? store.tokensAt(l) : null) : null);
    }
    out.push(r);
  }
  return out;
}

function headIndex(head) {
  return typeof head === "string" && /^\d+$/.test(head) ? Number(head) : null;
}

/**
 * view: null before an image, else {store, query, layer, head, tokens, colormap, entropyKind,
 * sinkKind, simKind}. onPick(layer, head) opens a head.
 */
export function renderAnalytics(els, view, onPick) {
  if (!view) {
    charts(els).forEach(clear);
    return;
  }
  if (!plotlyReady()) {
    charts(els).forEach(unavailable);
    return;
  }
  const { store } = view;
  const st = store.stats;
  const id = `${store.imageId}|${store.model}`;
  const common = { L: store.L, H: store.H, layer: view.layer, head: view.head, colormap: view.colormap };
  const waiting = store.isLoading("stats") ? "Computing the statistics of every layer and head…"
    : "The statistics could not be computed (see the message above).";

  // Entropy: of this query row (client-side), of the CLS row or the mean over all rows (stats).
  const ek = view.entropyKind;
  if (ek === "query") {
    if (store.rows.has(view.query)) {
      const ent = (row, t) => normEntropy(row, keyCount(t));
      layerHeadHeatmap(els.entropy, `q|${id}|${view.query}`, fromRows(store, view.query, ent), {
        ...common, title: store.windowed ? "H / log W²" : "H / log N", zmin: 0, zmax: 1,
        hover: "layer %{y}, head %{x}<br>entropy of this row %{z:.3f}<extra></extra>",
      }, onPick);
    }
  } else if (!st) {
    note(els.entropy, waiting, "loading");
  } else if (ek === "cls" && !st.entropy_cls) {
    note(els.entropy, "This model has no CLS token.");
  } else {
    layerHeadHeatmap(els.entropy, `${ek}|${id}`, ek === "cls" ? st.entropy_cls : st.entropy, {
      ...common, title: st.entropy_over === "window" ? "H / log W²" : "H / log N", zmin: 0, zmax: 1,
      hover: `layer %{y}, head %{x}<br>entropy ${ek === "cls" ? "of the CLS row" : "(mean over rows)"} %{z:.3f}<extra></extra>`,
    }, onPick);
  }

  renderSinks(els.sinks, view, st, id, common, waiting, onPick);

  if (!st) {
    for (const el of [els.distance, els.scatter, els.similarity, els.rank]) note(el, waiting, "loading");
    return;
  }
  const dmax = Math.max(...st.distance_px.flat());
  layerHeadHeatmap(els.distance, `d|${id}`, st.distance_px, {
    ...common, title: "px", zmin: 0, zmax: dmax,
    hover: "layer %{y}, head %{x}<br>mean distance %{z:.1f} px<extra></extra>",
  }, onPick);
  renderScatter(els.scatter, view, st, id, onPick);
  renderSimilarity(els.similarity, view, st, id, onPick);
  renderRank(els.rank, view, st, id, onPick);
}

/**
 * The panel's state and status line: drawn with every render, not with the charts, which wait
 * until the pointer rests (a stream of updates would otherwise keep the line behind the requests).
 */
export function renderAnalyticsStatus(els, view) {
  const panel = els.panel;
  let s = "idle";
  let text = "Per-head statistics appear here once an image is loaded.";
  if (view) {
    const { store } = view;
    if (store.stats) {
      const st = store.stats;
      const [ih, iw] = st.input_size;
      s = "ready";
      text = st.entropy_over === "window"
        ? `Swin: statistics over every cell of each stage's grid · entropy over each query's window (log W²) · `
          + `distances in pixels of the ${iw} × ${ih} model input · no prefix tokens, no CLS token, no rollout `
          + "(its stages have different grids)."
        : `Statistics over all ${store.N} query rows of every head · distances in pixels of the `
          + `${iw} × ${ih} model input · rank of the concatenated head outputs (at most ${st.rank.max}).`;
    } else if (store.isLoading("stats")) {
      s = "loading";
      text = "Computing the statistics of every layer and head…";
    } else if (store.hasFailed("stats")) {
      s = "error";
      text = "The statistics could not be computed.";
    } else {
      s = "loading";
      text = "Waiting for the statistics…";
    }
  }
  panel.dataset.state = s;
  setText(els.status, text);
}

function renderSinks(el, view, st, id, common, waiting, onPick) {
  const { store, tokens } = view;
  const sk = view.sinkKind;
  const hint = $("sinks-hint");
  if (store.windowed) { // swin: no prefix tokens; high-norm tokens only on the last stage's grid
    hint.textContent = "Attention sinks are prefix tokens and high-norm patches.";
    note(el, st && st.unavailable ? `${st.unavailable.prefix_mass} ${st.unavailable.artifact_mass}`
      : "Swin has no prefix tokens, and its high-norm tokens are cells of the last stage only.", "none");
    return;
  }
  if (sk === "artifacts") {
    if (!st) {
      note(el, waiting, "loading");
      return;
    }
    const n = (st.artifacts.tokens || []).length;
    hint.textContent = n
      ? `Share of each row (mean over rows) that goes to the ${n} high-norm artifact token${n > 1 ? "s" : ""} (orange rings on the map).`
      : "This image has no high-norm artifact tokens, so no head attends to any: the mass is 0 everywhere.";
    layerHeadHeatmap(el, `a|${id}`, st.artifact_mass, {
      ...common, title: "mass", zmin: 0, zmax: 1,
      hover: "layer %{y}, head %{x}<br>on artifact tokens %{z:.3f}<extra></extra>",
    }, onPick);
    return;
  }
  hint.textContent = sk === "prefix-query"
    ? "Share of the query row that goes to the prefix tokens (CLS, registers…)."
    : "Share of each row that goes to the prefix tokens, averaged over all query rows.";
  if (tokens.num_prefix === 0) {
    note(el, "This model has no prefix tokens: every token is a patch.", "none");
    return;
  }
  if (sk === "prefix-query") {
    if (!store.rows.has(view.query)) return;
    layerHeadHeatmap(el, `pq|${id}|${view.query}`, fromRows(store, view.query, (r) => prefixMass(r, tokens.num_prefix)), {
      ...common, title: "mass", zmin: 0, zmax: 1,
      hover: "layer %{y}, head %{x}<br>on prefix tokens %{z:.3f}<extra></extra>",
    }, onPick);
  } else if (!st) {
    note(el, waiting, "loading");
  } else {
    layerHeadHeatmap(el, `pa|${id}`, st.prefix_mass, {
      ...common, title: "mass", zmin: 0, zmax: 1,
      hover: "layer %{y}, head %{x}<br>on prefix tokens (mean over rows) %{z:.3f}<extra></extra>",
    }, onPick);
  }
}

/** Mean attention distance against depth: one dot per head (ViT paper, fig. 7). */
function renderScatter(el, view, st, id, onPick) {
  const L = st.layers;
  const H = st.heads;
  const layers = ints(L);
  const traces = ints(H).map((h) => ({
    type: "scatter", mode: "markers", name: `h${h}`, x: layers, y: layers.map((l) => st.distance_px[l][h] ?? null),
    customdata: layers.map(() => h),
    marker: { color: HEAD_COLOURS[h % HEAD_COLOURS.length], size: 8, opacity: 0.9, line: { width: 0 } },
    hovertemplate: `layer %{x}, head ${h}<br>%{y:.1f} px<extra></extra>`,
  }));
  traces.push({
    type: "scatter", mode: "lines", name: "mean", x: layers,
    y: layers.map((l) => st.distance_px[l].reduce((a, b) => a + b, 0) / st.distance_px[l].length),
    line: { color: "rgba(203,213,225,0.55)", width: 1.5, dash: "dot" }, hoverinfo: "skip",
  });
  // the shown head's dot ringed by a shape of 15 px, not a trace: a click on a head moves only the
  // shapes (plotKeyed's marks), it does not redraw the chart
  const h = headIndex(view.head);
  const shown = h === null ? [] : [{
    type: "circle", xref: "x", yref: "y", xsizemode: "pixel", ysizemode: "pixel",
    xanchor: view.layer, yanchor: st.distance_px[view.layer][h], x0: -7.5, x1: 7.5, y0: -7.5, y1: 7.5,
    line: { color: "#ff3b6b", width: 2.5 },
  }];
  const [ih, iw] = st.input_size;
  const layout = base({
    margin: { l: 52, r: 8, b: 40 },
    showlegend: true, legend: { x: 1.01, xanchor: "left", y: 1, font: { size: 10.5 } },
    xaxis: { ...AXIS, title: { text: "layer (network depth)" }, tickvals: layers, range: [-0.6, L - 0.4] },
    yaxis: { ...AXIS, title: { text: "mean attention distance (px)" },
      range: [0, Math.max(Math.hypot(ih, iw) * 0.5, ...st.distance_px.flat()) * 1.05] },
    height: 330, shapes: shown,
  });
  plotKeyed(el, id, traces, layout, `${view.layer}|${view.head}`);
  onClick(el, (p) => {
    if (p.customdata !== undefined && p.customdata !== null) onPick(Number(p.x), String(p.customdata));
  });
}

/** H x H similarity of the heads of the current layer; a click opens the row's head. */
function renderSimilarity(el, view, st, id, onPick) {
  const kind = view.simKind;
  const l = view.layer;
  $("similarity-layer").textContent = `layer ${l}`;
  const z = kind === "cos" ? st.cls_cosine && st.cls_cosine[l] : st.similarity[l];
  if (!z) {
    note(el, "This model has no CLS token: choose the JS similarity.");
    return;
  }
  const H = z.length; // windowed models: the heads of this layer's stage
  const x = ints(H);
  const h = headIndex(view.head);
  const shapes = h === null ? [] : [{ type: "rect", xref: "x", yref: "y", x0: -0.5, x1: H - 0.5, y0: h - 0.5, y1: h + 0.5,
    line: { color: "#ff3b6b", width: 2 } }, ...selectionBox(h, h)];
  const layout = base({
    margin: { l: 48, r: 12, b: 40 },
    xaxis: { ...AXIS, title: { text: "head" }, tickvals: x, ticktext: x.map((i) => `h${i}`), constrain: "domain" },
    yaxis: { ...AXIS, title: { text: "head" }, tickvals: x, ticktext: x.map((i) => `h${i}`), autorange: "reversed",
      scaleanchor: "x", constrain: "domain" },
    shapes, height: 330,
  });
  const label = kind === "cos" ? "cosine of CLS rows" : "1 − JS / log 2";
  const trace = {
    type: "heatmap", z, x, y: x, zmin: 0, zmax: 1, colorscale: plotlyScale(view.colormap === "grey" ? "viridis" : view.colormap),
    colorbar: { title: { text: kind === "cos" ? "cos" : "sim", side: "right" }, thickness: 12, outlinewidth: 0 },
    hovertemplate: `layer ${l}: head %{y} vs head %{x}<br>${label} %{z:.3f}<extra></extra>`, xgap: 1, ygap: 1,
  };
  plotKeyed(el, `${id}|${kind}|${l}|${view.colormap}`, [trace], layout, view.head);
  onClick(el, (p) => onPick(view.layer, String(p.y)));
}

/** Numerical and effective rank of the concatenated head outputs per layer. */
function renderRank(el, view, st, id, onPick) {
  const L = st.layers;
  const layers = ints(L);
  const { numerical, effective, max } = st.rank;
  const traces = [
    { type: "scatter", mode: "lines+markers", name: "numerical rank", x: layers, y: numerical,
      line: { color: "#38bdf8", width: 2 }, marker: { size: 6 }, hovertemplate: "layer %{x}<br>numerical rank %{y}<extra></extra>" },
    { type: "scatter", mode: "lines+markers", name: "effective rank", x: layers, y: effective,
      line: { color: "#fbbf24", width: 2 }, marker: { size: 6 }, hovertemplate: "layer %{x}<br>effective rank %{y:.1f}<extra></extra>" },
  ];
  if (st.rank.max_per_layer) { // windowed models: min(cells, width) differs per stage
    traces.push({ type: "scatter", mode: "lines", name: "most possible", x: layers, y: st.rank.max_per_layer,
      line: { color: "rgba(203,213,225,0.6)", width: 1, dash: "dash", shape: "hvh" },
      hovertemplate: "layer %{x}<br>at most %{y}<extra></extra>" });
  }
  const layout = base({
    margin: { l: 52, r: 12, b: 70 }, height: 350,
    showlegend: true, legend: { ...LEGEND_BELOW, y: -0.24 },
    xaxis: { ...AXIS, title: { text: "layer" }, tickvals: layers, range: [-0.4, L - 0.6] },
    yaxis: { ...AXIS, title: { text: "rank" }, range: [0, max * 1.08] },
    shapes: [
      { type: "line", xref: "paper", yref: "y", x0: 0, x1: 1, y0: max, y1: max, line: { color: "rgba(203,213,225,0.5)", width: 1, dash: "dash" } },
      { type: "line", xref: "x", yref: "paper", x0: view.layer, x1: view.layer, y0: 0, y1: 1, line: { color: "#ff3b6b", width: 1.5, dash: "dot" } },
    ],
    annotations: [{ xref: "paper", yref: "y", x: 1, y: max, xanchor: "right", yanchor: "top", showarrow: false,
      text: `max ${max}`, font: { size: 10.5, color: "#94a3b8" } }],
  });
  plotKeyed(el, id, traces, layout, String(view.layer));
  onClick(el, (p) => onPick(Number(p.x), view.head));
}
