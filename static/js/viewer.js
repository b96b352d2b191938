// The main view: the overlay canvas, its colour bar, title, explanation, pointer readout, and
// the list of prefix tokens with the attention the current row gives them.

import { drawComposite, fit, fmt, sizeCanvas } from "./overlay.js";
import { paintColorbar } from "./colormaps.js";
import { normEntropy } from "./data.js";
import { dims, headLabel, parseQuery, prefixLabel, queryLabel, state } from "./state.js";

const $ = (id) => document.getElementById(id);

/** Draw the overlay for the state; leaves the last drawing while the row is still loading. */
export function renderViewer(store) {
  const canvas = $("overlay");
  const empty = $("empty");
  const cbar = $("colorbar-wrap");
  if (!state.image || !store) {
    canvas.hidden = true;
    empty.hidden = false;
    cbar.hidden = true;
    $("view-title").textContent = "Attention map";
    return;
  }
  const row = store.row(state.query, state.layer, state.head);
  canvas.dataset.pending = row ? "0" : "1";
  if (!row) return;
  empty.hidden = true;
  canvas.hidden = false;
  const box = $("viewer");
  const maxW = Math.max(200, box.clientWidth);
  const maxH = Math.max(300, Math.round(window.innerHeight * 0.7));
  const { w, h } = fit(state.image.naturalWidth, state.image.naturalHeight, maxW, maxH);
  const dpr = sizeCanvas(canvas, w, h);
  const q = parseQuery(state.query);
  const range = drawComposite(canvas.getContext("2d"), canvas.width, canvas.height, {
    image: state.image, row, tokens: state.meta.tokens, colormap: state.colormap, opacity: state.opacity,
    grid: state.showGrid, smooth: state.smooth, marker: q && q.kind === "patch" ? q : null, px: dpr,
  });
  Object.assign(canvas.dataset, {
    image: state.imageId, model: store.model, layer: String(state.layer), head: state.head,
    query: state.query, token: String(q.token), marked: q.kind === "patch" ? `${q.r},${q.c}` : "",
    min: String(range.min), max: String(range.max), colormap: state.colormap,
    opacity: String(state.opacity), grid: state.showGrid ? "1" : "0",
  });
  cbar.hidden = false;
  paintColorbar($("colorbar"), state.colormap);
  $("cb-min").textContent = fmt(range.min);
  $("cb-max").textContent = fmt(range.max);
  $("view-title").textContent = `Layer ${state.layer} · ${headLabel(state.head)} · query ${queryLabel(state.query)}`;
  $("explain").textContent = explanation(q, row);
}

function explanation(q, row) {
  const { H } = dims();
  const who = `row q = ${queryLabel(state.query)} (token ${q.token})`;
  const l = state.layer;
  const tail = ` Colours run from the map's minimum to its maximum over the patches (colour bar); `
    + `normalised entropy of the row ${normEntropy(row).toFixed(3)}.`;
  if (state.head === "mean") {
    return `Mean over the ${H} heads of ${who} of softmax(QKᵀ/√d) for layer ${l}.${tail}`;
  }
  if (state.head === "max") {
    return `Element-wise maximum over the ${H} heads of ${who} of softmax(QKᵀ/√d) for layer ${l}.${tail}`;
  }
  if (state.head === "rollout") {
    return `Attention rollout (Abnar & Zuidema, 2020) of ${who} up to layer ${l}: the product over layers `
      + `0…${l} of ½·A + ½·I, with A the mean of the heads; it follows attention through the residual stream.${tail}`;
  }
  return `${who} of softmax(QKᵀ/√d) for layer ${l}, head ${state.head}: how much token q attends to each `
    + `patch (the row sums to 1 over all tokens, prefix tokens included).${tail}`;
}

/** The text under the pointer: cell, token and value of the shown row. */
export function renderReadout(store, cell) {
  const el = $("readout");
  if (!cell || !store) {
    el.textContent = "";
    return;
  }
  const t = state.meta.tokens;
  const token = t.num_prefix + cell.r * t.grid[1] + cell.c;
  const row = store.row(state.query, state.layer, state.head);
  el.textContent = `patch (${cell.r}, ${cell.c}) · token ${token} · ${row ? fmt(row[token]) : "…"}`;
}

/** Prefix tokens (CLS, registers, distillation) with the current row's value at their index. */
export function renderPrefixList(store, onPick) {
  const list = $("prefix-list");
  const total = $("prefix-total");
  if (!store || !state.meta) {
    list.replaceChildren();
    total.textContent = "";
    return;
  }
  const t = state.meta.tokens;
  const row = store.row(state.query, state.layer, state.head);
  if (t.num_prefix === 0) {
    const li = document.createElement("li");
    li.className = "prefix-none";
    li.textContent = "This model has no prefix tokens.";
    list.replaceChildren(li);
    total.textContent = "";
    return;
  }
  const q = parseQuery(state.query);
  let mass = 0;
  const items = t.prefix.map((p) => {
    const v = row ? row[p.index] : null;
    if (v !== null) mass += v;
    const li = document.createElement("li");
    const b = document.createElement("button");
    b.type = "button";
    b.className = "prefix-item";
    b.dataset.index = String(p.index);
    b.dataset.kind = p.kind;
    b.dataset.value = v === null ? "" : String(v);
    b.title = `Use ${prefixLabel(p.index)} as the query row`;
    const isQuery = q && q.kind !== "patch" && q.token === p.index;
    b.classList.toggle("is-query", !!isQuery);
    const name = document.createElement("span");
    name.className = "prefix-name";
    name.textContent = prefixLabel(p.index);
    const idx = document.createElement("span");
    idx.className = "prefix-idx";
    idx.textContent = `#${p.index}`;
    const val = document.createElement("span");
    val.className = "prefix-val";
    val.textContent = v === null ? "…" : fmt(v);
    const bar = document.createElement("span");
    bar.className = "prefix-bar";
    const fill = document.createElement("span");
    fill.style.width = `${v === null ? 0 : Math.round(100 * v)}%`;
    bar.append(fill);
    b.append(name, idx, val, bar);
    b.addEventListener("click", () => onPick(p.kind === "cls" ? "cls" : `tok:${p.index}`));
    li.append(b);
    return li;
  });
  list.replaceChildren(...items);
  total.textContent = row
    ? `Together ${(100 * mass).toFixed(1)}% of this row; the ${t.grid[0] * t.grid[1]} patches get ${(100 * (1 - mass)).toFixed(1)}%.`
    : "";
}
