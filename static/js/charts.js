// Plotly charts (window.Plotly from /vendor/plotly.min.js): entropy per head, attention to the
// prefix tokens per head (layers x heads heat maps of the current query row), and the current
// row over token index. SVG traces only: they need no eval, so the page's CSP holds.

import { normEntropy, prefixMass } from "./data.js";
import { plotlyScale } from "./colormaps.js";
import { fmt } from "./overlay.js";
import { headLabel, prefixLabel } from "./state.js";

const CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d"] };
const FONT = { family: "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", size: 12, color: "#cbd5e1" };
const AXIS = { gridcolor: "rgba(148,163,184,0.15)", zerolinecolor: "rgba(148,163,184,0.25)", linecolor: "rgba(148,163,184,0.3)" };

function base(extra = {}) {
  return {
    font: FONT, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    margin: { l: 48, r: 12, t: 8, b: 40 }, height: 300, ...extra,
  };
}

export function plotlyReady() {
  return typeof window.Plotly === "object" && typeof window.Plotly.react === "function";
}

function unavailable(el) {
  if (el.dataset.unavailable) return;
  el.dataset.unavailable = "1";
  el.textContent = "Charts are unavailable: /vendor/plotly.min.js did not load.";
}

function clear(el) {
  if (plotlyReady() && el.classList.contains("js-plotly-plot")) window.Plotly.purge(el);
  el.replaceChildren();
  delete el.dataset.rendered;
}

function selectionBox(layer, head) {
  return [{ type: "rect", xref: "x", yref: "y", x0: head - 0.5, x1: head + 0.5, y0: layer - 0.5, y1: layer + 0.5,
    line: { color: "#ff3b6b", width: 2 } }];
}

function heatmap(el, z, view, { title, zmin, zmax, hover }, onPick) {
  const H = view.store.H;
  const x = Array.from({ length: H }, (_, i) => i);
  const y = Array.from({ length: view.store.L }, (_, i) => i);
  const h = typeof view.head === "string" && /^\d+$/.test(view.head) ? Number(view.head) : null;
  const layout = base({
    xaxis: { ...AXIS, title: { text: "head" }, tickvals: x, ticktext: x.map((i) => `h${i}`) },
    yaxis: { ...AXIS, title: { text: "layer" }, tickvals: y, autorange: "reversed" },
    shapes: h === null ? [] : selectionBox(view.layer, h),
  });
  const trace = {
    type: "heatmap", z, x, y, zmin, zmax, colorscale: plotlyScale(view.colormap === "grey" ? "viridis" : view.colormap),
    colorbar: { title: { text: title, side: "right" }, thickness: 12, outlinewidth: 0 },
    hovertemplate: hover, xgap: 1, ygap: 1,
  };
  window.Plotly.react(el, [trace], layout, CONFIG);
  if (!el.dataset.bound) {
    el.dataset.bound = "1";
    el.on("plotly_click", (ev) => {
      const p = ev && ev.points && ev.points[0];
      if (p) onPick(Number(p.y), String(p.x));
    });
  }
  el.dataset.rendered = "1";
}

/** Render the three charts; view is null before an image. onPick(layer, head) from heat maps. */
export function renderCharts(els, view, onPick) {
  if (!plotlyReady()) {
    Object.values(els).forEach(unavailable);
    return;
  }
  if (!view) {
    Object.values(els).forEach(clear);
    return;
  }
  const { store, query, tokens } = view;
  const L = store.L;
  const H = store.H;
  const has = store.rows.has(query);
  if (has) {
    const ent = [];
    const mass = [];
    for (let l = 0; l < L; l++) {
      const er = [];
      const mr = [];
      for (let h = 0; h < H; h++) {
        const row = store.row(query, l, String(h));
        er.push(normEntropy(row));
        mr.push(prefixMass(row, tokens.num_prefix));
      }
      ent.push(er);
      mass.push(mr);
    }
    heatmap(els.entropy, ent, view, {
      title: "H / log N", zmin: 0, zmax: 1,
      hover: "layer %{y}, head %{x}<br>entropy %{z:.3f}<extra></extra>",
    }, onPick);
    if (tokens.num_prefix > 0) {
      heatmap(els.prefix, mass, view, {
        title: "mass", zmin: 0, zmax: 1,
        hover: "layer %{y}, head %{x}<br>on prefix tokens %{z:.3f}<extra></extra>",
      }, onPick);
    } else if (els.prefix.dataset.rendered !== "none") {
      clear(els.prefix);
      const p = document.createElement("p");
      p.className = "chart-note";
      p.textContent = "This model has no prefix tokens: every token is a patch.";
      els.prefix.replaceChildren(p);
      els.prefix.dataset.rendered = "none";
    }
  }
  renderRow(els.row, view);
}

function renderRow(el, view) {
  const { store, query, layer, head, tokens, queryToken } = view;
  const row = store.row(query, layer, head);
  if (!row) return;
  const N = row.length;
  const np = tokens.num_prefix;
  const cols = tokens.grid[1];
  const xs = [];
  const ys = [];
  const text = [];
  for (let i = np; i < N; i++) {
    xs.push(i);
    ys.push(row[i]);
    const p = i - np;
    text.push(`patch (${Math.floor(p / cols)}, ${p % cols})`);
  }
  const traces = [{
    type: "scatter", mode: "lines", x: xs, y: ys, text, name: "patches",
    line: { color: "#38bdf8", width: 1.4 }, fill: "tozeroy", fillcolor: "rgba(56,189,248,0.12)",
    hovertemplate: "token %{x} · %{text}<br>%{y:.4g}<extra></extra>",
  }];
  if (np > 0) {
    const px = [];
    const py = [];
    const pt = [];
    for (let i = 0; i < np; i++) {
      px.push(i);
      py.push(row[i]);
      pt.push(prefixLabel(i));
    }
    traces.push({
      type: "scatter", mode: "markers", x: px, y: py, text: pt, name: "prefix tokens",
      marker: { color: "#fbbf24", size: 9, symbol: "diamond" },
      hovertemplate: "token %{x} · %{text}<br>%{y:.4g}<extra></extra>",
    });
  }
  const layout = base({
    height: 260,
    margin: { l: 56, r: 12, t: 28, b: 40 },
    showlegend: np > 0, legend: { orientation: "h", x: 1, xanchor: "right", y: 1.12, font: { size: 11 } },
    xaxis: { ...AXIS, title: { text: "token index" }, range: [-1, N] },
    yaxis: { ...AXIS, title: { text: "attention" }, rangemode: "tozero", exponentformat: "e" },
    shapes: [{ type: "line", xref: "x", yref: "paper", x0: queryToken, x1: queryToken, y0: 0, y1: 1,
      line: { color: "#ff3b6b", width: 1.5, dash: "dot" } }],
    annotations: [{ xref: "x", yref: "paper", x: queryToken, y: 1, yanchor: "bottom", showarrow: false,
      text: `query ${queryToken}`, font: { color: "#ff3b6b", size: 11 } }],
  });
  window.Plotly.react(el, traces, layout, CONFIG);
  el.dataset.rendered = "1";
  el.dataset.layer = String(layer);
  el.dataset.head = head;
  el.setAttribute("aria-label", `Attention row of ${headLabel(head)} at layer ${layer}; max ${fmt(Math.max(...ys))}`);
}

export function resizeCharts(els) {
  if (!plotlyReady()) return;
  for (const el of Object.values(els)) {
    if (el.classList.contains("js-plotly-plot")) window.Plotly.Plots.resize(el);
  }
}

