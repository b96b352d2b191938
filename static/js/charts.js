// Plotly helpers shared by the charts (window.Plotly from /vendor/plotly.min.js), and the chart of
// the current row over token index. SVG traces only: they need no eval, so the page's CSP holds.
// The layers x heads charts of the analytics panel are in analytics.js.

import { chartTable, drawingHidden, hideTable } from "./chart-table.js";
import { plotlyScale } from "./colormaps.js";
import { fmt } from "./overlay.js";
import { headLabel, prefixLabel } from "./state.js";

export const CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d"] };
export const FONT = { family: "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", size: 12, color: "#cbd5e1" };
export const AXIS = { gridcolor: "rgba(148,163,184,0.15)", zerolinecolor: "rgba(148,163,184,0.25)", linecolor: "rgba(148,163,184,0.3)" };
// Plotly's toolbar (the mode bar) sits in the top right corner of a chart while the pointer is on
// it: every chart keeps this much room above its plot, with no legend in it, so the toolbar never
// covers a legend or a heat map's top row. Phones and touch screens get no toolbar at all.
export const TOOLBAR_PX = 30;
/** A horizontal legend under the x axis (its title included), left-aligned: clear of the toolbar. */
export const LEGEND_BELOW = { orientation: "h", x: 0, xanchor: "left", y: -0.2, yanchor: "top", font: { size: 11 } };

/**
 * Plotly's config for chart `el` on this screen: no toolbar on a phone or a touch screen; the
 * toolbar's camera saves it as headscope_<chart>.png (Plotly's own name, plot-image.png, was one
 * name for every chart).
 */
export function plotConfig(el = null) {
  const touch = typeof window.matchMedia === "function" && window.matchMedia("(max-width: 640px), (pointer: coarse)").matches;
  const name = el && el.dataset && (el.dataset.testid || el.id);
  const config = name ? { ...CONFIG, toImageButtonOptions: { filename: `headscope_${name}` } } : CONFIG;
  return touch ? { ...config, displayModeBar: false } : config;
}

export function base(extra = {}) {
  const margin = { l: 48, r: 12, b: 40, ...(extra.margin || {}) };
  return {
    font: FONT, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", height: 300, ...extra,
    margin: { ...margin, t: Math.max(TOOLBAR_PX, margin.t || 0) },
  };
}

export function plotlyReady() {
  return typeof window.Plotly === "object" && typeof window.Plotly.react === "function";
}

// Plotly is 4.8 MB of script: parsed before the page's own modules, it held the page up by about a
// second on a slow machine. It is loaded once the page is up (loadPlotly from main.js, at the
// first idle moment) or when a chart first has something to draw, whichever comes first; a chart
// asked for meanwhile says so and is drawn when it arrives (the CHARTS_READY event).
export const CHARTS_READY = "headscope:charts-ready";
let plotlyLoad = null; // the <script> load's promise, once started
let plotlyFailed = false;

/** Load /vendor/plotly.min.js once; resolves when window.Plotly is there, then CHARTS_READY fires. */
export function loadPlotly() {
  if (plotlyLoad) return plotlyLoad;
  plotlyLoad = new Promise((resolve, reject) => {
    if (plotlyReady()) return resolve();
    const script = document.createElement("script");
    script.src = "/vendor/plotly.min.js";
    script.async = true;
    script.onload = () => (plotlyReady() ? resolve() : reject(new Error("no window.Plotly")));
    script.onerror = () => reject(new Error("/vendor/plotly.min.js did not load"));
    document.head.append(script);
  }).then(
    () => { document.dispatchEvent(new Event(CHARTS_READY)); },
    () => { plotlyFailed = true; document.dispatchEvent(new Event(CHARTS_READY)); },
  );
  return plotlyLoad;
}

/** A chart that cannot be drawn without Plotly: "loading" while it comes, else why it is missing. */
export function unavailable(el) {
  if (!plotlyFailed) {
    loadPlotly();
    note(el, "Loading the charts…", "charts-loading");
    return;
  }
  if (el.dataset.unavailable) return;
  clear(el);
  el.dataset.unavailable = "1";
  el.textContent = "Charts are unavailable: /vendor/plotly.min.js did not load.";
}

export function clear(el) {
  if (plotlyReady() && el.classList.contains("js-plotly-plot")) window.Plotly.purge(el);
  waiting.delete(el);
  el.style.minHeight = "";
  hideTable(el);
  el.replaceChildren();
  delete el.dataset.rendered;
  delete el.dataset.key;
  delete el.dataset.marks;
  delete el.dataset.bound; // purge drops the Plotly event handlers too
}

/** Before a chart is given traces: a note (any state but drawn or waiting) is cleared away. */
function clearNote(el) {
  const state = el.dataset.rendered;
  if (state && state !== "1" && state !== "waiting") clear(el);
}

/** Replace a chart by a line of text (a loading state, or why there is nothing to plot). */
export function note(el, text, state = "note") {
  if (el.dataset.rendered === state && el.textContent === text) return;
  clear(el);
  const p = document.createElement("p");
  p.className = "chart-note";
  p.textContent = text;
  el.replaceChildren(p);
  el.dataset.rendered = state;
}

const handlers = new WeakMap();

/** Call fn(point) on a click on a point of the chart (bound once; the latest fn wins). */
export function onClick(el, fn) {
  handlers.set(el, fn);
  bindClick(el);
}

// Plotly gives a chart its .on() when it first draws it: a chart still waiting to be drawn is
// bound when it is.
function bindClick(el) {
  if (el.dataset.bound || !handlers.has(el) || typeof el.on !== "function") return;
  el.dataset.bound = "1";
  el.on("plotly_click", (ev) => {
    const p = ev && ev.points && ev.points[0];
    const h = handlers.get(el);
    if (p && h) h(p);
  });
}

// A chart out of sight (under the fold, or in a closed panel) is drawn when it comes within
// SIGHT_MARGIN_PX of the viewport, not when its numbers arrive: each new picture drew all seven
// charts of the analytics panel, none of them on the first screen (half the browser's main-thread
// time of an upload on a 2-core machine: bench/page_cpu.py). Its table, the screen readers' twin,
// is current at once; data-rendered says "waiting" until the drawing is.
const SIGHT_MARGIN_PX = 300;
const waiting = new Map(); // chart element -> {traces, layout} to draw when it comes in sight
let sight = null; // the IntersectionObserver of every chart drawn so far

function inSight(el) {
  const r = el.getBoundingClientRect();
  if (!r.width && !r.height) return false; // display: none (a closed panel, a hidden view)
  return r.bottom > -SIGHT_MARGIN_PX && r.top < window.innerHeight + SIGHT_MARGIN_PX;
}

function drawWaiting(el, now = false) {
  const w = waiting.get(el);
  if (w && plotlyReady()) draw(el, w.traces, w.layout, now);
}

// a printed page (or one saved as a PDF) has every chart of the shown view, in sight or not
if (typeof window !== "undefined" && typeof window.addEventListener === "function") {
  window.addEventListener("beforeprint", () => {
    for (const el of [...waiting.keys()]) if (el.getClientRects().length) drawWaiting(el, true);
  });
}

/** Plotly.react now if the chart is in sight (or `now`), else once it comes in sight. */
function draw(el, traces, layout, now = false) {
  if (!now && typeof IntersectionObserver === "function") {
    if (!sight) {
      sight = new IntersectionObserver(
        (entries) => { for (const e of entries) if (e.isIntersecting) drawWaiting(e.target); },
        { rootMargin: `${SIGHT_MARGIN_PX}px 0px` },
      );
    }
    sight.observe(el); // a second observe of the same element is a no-op
    if (!inSight(el)) {
      waiting.set(el, { traces, layout });
      el.dataset.rendered = "waiting";
      // the drawing's height kept for it: nothing on the page moves when it comes
      if (layout.height) el.style.minHeight = `${layout.height}px`;
      return;
    }
  }
  waiting.delete(el);
  el.style.minHeight = "";
  window.Plotly.react(el, traces, layout, plotConfig(el));
  el.dataset.rendered = "1";
  drawingHidden(el);
  bindClick(el);
}

/**
 * Draw `key` (now or when in sight) unless the chart shows or awaits it. `marks` names what the
 * layout's shapes mark (the selected head's box, the shown layer's line): a chart drawn with the
 * same `key` and other marks has only its shapes moved (Plotly.relayout, under 1 ms), where
 * Plotly.react redraws the whole chart for a moved shape (about 25 ms a chart on a 2-core
 * machine, four charts at every click on a head). Returns true when it drew or moved something.
 */
export function plotKeyed(el, key, traces, layout, marks = "") {
  const state = el.dataset.rendered;
  const drawn = state === "1" && el.classList.contains("js-plotly-plot");
  if (el.dataset.key === key && (drawn || state === "waiting")) {
    if (el.dataset.marks === marks) return false;
    if (drawn) {
      el.dataset.marks = marks;
      window.Plotly.relayout(el, { shapes: layout.shapes || [] });
      return true;
    }
  }
  clearNote(el);
  el.dataset.key = key;
  el.dataset.marks = marks;
  chartTable(el, traces, layout);
  draw(el, traces, layout);
  return true;
}

export function selectionBox(layer, head) {
  return [{ type: "rect", xref: "x", yref: "y", x0: head - 0.5, x1: head + 0.5, y0: layer - 0.5, y1: layer + 0.5,
    line: { color: "#ff3b6b", width: 2 } }];
}

/**
 * A layers x heads heat map (head across, layer down, layer 0 at the top).
 * opts: {L, H, layer, head, colormap, title, zmin, zmax, hover}; onPick(layer, head) on a click.
 */
export function layerHeadHeatmap(el, key, z, opts, onPick) {
  const { L, H, layer, head, colormap, title, zmin, zmax, hover } = opts;
  // Windowed models (Swin) have fewer heads in early stages: their rows end early; pad with gaps.
  z = z.map((r) => (r.length < H ? [...r, ...Array(H - r.length).fill(null)] : r));
  const x = Array.from({ length: H }, (_, i) => i);
  const y = Array.from({ length: L }, (_, i) => i);
  const h = typeof head === "string" && /^\d+$/.test(head) ? Number(head) : null;
  const layout = base({
    xaxis: { ...AXIS, title: { text: "head" }, tickvals: x, ticktext: x.map((i) => `h${i}`) },
    yaxis: { ...AXIS, title: { text: "layer" }, tickvals: y, autorange: "reversed" },
    shapes: h === null ? [] : selectionBox(layer, h),
  });
  const trace = {
    type: "heatmap", z, x, y, zmin, zmax, colorscale: plotlyScale(colormap === "grey" ? "viridis" : colormap),
    colorbar: { title: { text: title, side: "right" }, thickness: 12, outlinewidth: 0 },
    hovertemplate: hover, xgap: 1, ygap: 1,
  };
  plotKeyed(el, `${key}|${colormap}`, [trace], layout, `${layer}|${head}`);
  onClick(el, (p) => onPick(Number(p.y), String(p.x)));
}

/** The current row over token index; view: {rowOf, query, layer, head, tokens, queryToken}. */
export function renderRow(el, view) {
  if (!view) return clear(el);
  const { layer, head, tokens, queryToken } = view;
  const row = view.rowOf(layer, head);
  if (!row) return undefined;
  if (!plotlyReady()) return unavailable(el);
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
      pt.push(prefixLabel(i, tokens));
    }
    traces.push({
      type: "scatter", mode: "markers", x: px, y: py, text: pt, name: "prefix tokens",
      marker: { color: "#fbbf24", size: 9, symbol: "diamond" },
      hovertemplate: "token %{x} · %{text}<br>%{y:.4g}<extra></extra>",
    });
  }
  const layout = base({
    height: 290,
    margin: { l: 56, r: 12, b: np > 0 ? 66 : 40 },
    showlegend: np > 0, legend: { ...LEGEND_BELOW, y: -0.32 },
    xaxis: { ...AXIS, title: { text: "token index" }, range: [-1, N] },
    yaxis: { ...AXIS, title: { text: "attention" }, rangemode: "tozero", exponentformat: "e" },
    shapes: [{ type: "line", xref: "x", yref: "paper", x0: queryToken, x1: queryToken, y0: 0, y1: 1,
      line: { color: "#ff3b6b", width: 1.5, dash: "dot" } }],
    annotations: [{ xref: "x", yref: "paper", x: queryToken, y: 1, yanchor: "bottom", showarrow: false,
      text: `query ${queryToken}`, font: { color: "#ff3b6b", size: 11 } }],
  });
  clearNote(el);
  el.dataset.layer = String(layer);
  el.dataset.head = head;
  // the table in token order: the prefix tokens (indices 0…) first, then the patches
  chartTable(el, [...traces].reverse(), layout, `Attention row of ${headLabel(head)} at layer ${layer}; max ${fmt(Math.max(...ys))}`);
  draw(el, traces, layout);
  return undefined;
}

export function resizeCharts(els) {
  if (!plotlyReady()) return;
  for (const el of Object.values(els)) {
    if (el && el.classList.contains("js-plotly-plot")) window.Plotly.Plots.resize(el);
  }
}
