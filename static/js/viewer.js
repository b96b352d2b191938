// The main view: the overlay canvas, its loading state, colour bar, title, explanation,
// pointer readout, and the list of prefix tokens with the attention the current row gives them.
// Every function here takes the state as its argument `s` and only reads it.

import { $, setText } from "./dom.js";
import { drawComposite, fit, fmt, sizeCanvas } from "./overlay.js";
import { paintColorbar } from "./colormaps.js";
import { normEntropy } from "./data.js";
import { artifactTokens, droppedTokens, patchSum, shownRow } from "./sinks.js";
import {
  ablatedPairs, dims, dropParts, headLabel, markerAt, parseQuery, prefixLabel, prefixQuery, queryLabel, tokensAt,
} from "./state.js";
import { keyCount, stageCell, windowNote } from "./windows.js";

/** What to show of the shown image: the selection shownRow() needs, from the state. */
export function selection(s, over = {}) {
  const layer = over.layer ?? s.layer;
  return {
    query: s.query, layer, head: s.head, tokens: s.meta && tokensAt(s.meta, layer), drop: s.drop,
    rollout: s.rollout, ...over,
  };
}

const MIN_MAP_H = 200;   // the map is never shorter than this (CSS pixels)
const UNDER_MAP_PX = 52; // the colour bar under the map, and a margin under it
let lastBox = null;      // how large the map could be when the viewer was last on screen

/**
 * How large the map may be: the viewer's width, and the height left on the screen under the
 * viewer's top once an image is shown (the page's top; on a narrow screen the status line, where
 * intake.js scrolls), less the colour bar and, on a phone, the dock of layer and head controls.
 * While the panel is hidden (another view is shown) it measures 0: the last size stands.
 */
function mapBox() {
  const box = $("viewer");
  const maxW = box.clientWidth;
  if (!maxW) return lastBox || { maxW: 640, maxH: 480 };
  const docTop = (el) => el.getBoundingClientRect().top + window.scrollY;
  const narrow = window.matchMedia("(max-width: 860px)").matches;
  const origin = narrow ? docTop($("status")) : 0;
  const dock = $("view-dock");
  const docked = dock && getComputedStyle(dock).position === "fixed" ? dock.offsetHeight : 0;
  const maxH = Math.max(MIN_MAP_H, Math.floor(window.innerHeight - (docTop(box) - origin) - UNDER_MAP_PX - docked));
  lastBox = { maxW, maxH };
  return lastBox;
}

/** The two figure downloads (PNG, SVG): on once the shown map is drawn. */
function renderFigureButtons(ready) {
  for (const id of ["download-png", "download-svg"]) $(id).disabled = !ready;
}

/**
 * Draw the overlay for the state. While the row of the shown selection is on its way (another
 * query, the heads switched off in the Ablation view, another temperature) the last drawing
 * stays, at the size the map has now, and the figure downloads wait for the row.
 */
export function renderViewer(s) {
  const canvas = $("overlay");
  const empty = $("empty");
  const cbar = $("colorbar-wrap");
  const store = s.store;
  // Computing a new image (or the image with another model): say so on the map itself.
  const loading = $("viewer-loading");
  loading.hidden = !s.busy;
  setText("viewer-loading-text", s.busy || ""); // the live regions here: only new words
  $("viewer").classList.toggle("is-loading", !!s.busy);
  if (!s.image || !store) {
    canvas.hidden = true;
    empty.hidden = !!s.busy;
    cbar.hidden = true;
    $("view-title").textContent = "Attention map";
    setText("mass-count", "");
    renderFigureButtons(false);
    return;
  }
  const tokens = tokensAt(s.meta, s.layer); // windowed models: the layer's stage grid
  const row = shownRow(store, selection(s));
  const { maxW, maxH } = mapBox();
  const { w, h } = fit(s.image.naturalWidth, s.image.naturalHeight, maxW, maxH);
  canvas.dataset.pending = row ? "0" : "1";
  renderFigureButtons(!!row);
  if (!row) {
    if (!canvas.hidden) { // the last drawing, scaled to the size the map has now
      canvas.style.width = `${w}px`;
      canvas.style.height = `${h}px`;
    }
    return;
  }
  const dropped = droppedTokens(store, tokens, s.drop);
  const rings = artifactTokens(store);
  empty.hidden = true;
  canvas.hidden = false;
  const dpr = sizeCanvas(canvas, w, h);
  const q = parseQuery(s.query, s.meta.tokens);
  const marker = markerAt(s.meta, s.query, s.layer);
  const range = drawComposite(canvas.getContext("2d"), canvas.width, canvas.height, {
    image: s.image, row, tokens, colormap: s.colormap, opacity: s.opacity,
    grid: s.showGrid, smooth: s.smooth, marker, px: dpr,
    mask: s.mask ? s.massFraction : null, rings,
  });
  Object.assign(canvas.dataset, {
    image: s.imageId, model: store.model, layer: String(s.layer), head: s.head,
    query: s.query, token: String(marker ? marker.token : q.token), marked: marker ? `${marker.r},${marker.c}` : "",
    cells: tokens.grid.join(","), stage: tokens.window ? String(tokens.stage) : "",
    window: tokens.window ? tokens.window.join(",") : "", shift: tokens.window ? tokens.shift.join(",") : "",
    min: String(range.min), max: String(range.max), colormap: s.colormap,
    opacity: String(s.opacity), grid: s.showGrid ? "1" : "0",
    drop: s.drop, dropped: dropped.join(","), patchSum: String(patchSum(row, tokens)),
    artifacts: rings.join(","),
    temperature: String(s.temperature), ablate: store.ablate || "",
    rollout: s.head === "rollout" ? `${s.rollout.start},${s.rollout.fusion},${s.rollout.discard}` : "",
  });
  if (s.mask) {
    canvas.dataset.maskPatches = String(range.maskCount);
    canvas.dataset.maskFraction = String(s.massFraction);
    setText("mass-count", `${range.maskCount} of ${tokens.grid[0] * tokens.grid[1]} patches`);
  } else {
    delete canvas.dataset.maskPatches;
    delete canvas.dataset.maskFraction;
    setText("mass-count", "");
  }
  cbar.hidden = false;
  paintColorbar($("colorbar"), s.colormap);
  $("cb-min").textContent = fmt(range.min);
  $("cb-max").textContent = fmt(range.max);
  const stage = tokens.window ? ` (stage ${tokens.stage})` : "";
  $("view-title").textContent = `Layer ${s.layer}${stage} · ${headLabel(s.head)} · query ${queryLabel(s.query, s.meta.tokens)}`;
  $("explain").textContent = explanation(s, q, row, tokens, marker) + windowNote(s.meta, s.layer, marker)
    + extras(s, dropped, range.maskCount, rings)
    + (s.temperature === 1 ? "" : ` Softmax temperature T = ${s.temperature}: every map is `
      + "softmax(QKᵀ/(√d·T)), sharper below 1, flatter above (set it here or in Inside a head).");
}

/** The maps' note while heads are off in the Ablation view: which, and which layers changed. */
export function renderMapsAblated(s) {
  const el = $("maps-ablated");
  const pairs = ablatedPairs(s.meta, s.ablation.off);
  el.hidden = !pairs.length;
  if (pairs.length) setText("maps-ablated-text", ablatedNote(pairs, dims(s.meta).L));
}

/**
 * The maps view's words for the heads switched off ([layer, head] pairs, sorted): a removed head's
 * output is zeroed after its own layer's attention, so the maps up to the first layer with a head
 * off are the model's own and the later ones change.
 */
export function ablatedNote(pairs, L) {
  const n = pairs.length;
  const list = n <= 6 ? ` (${pairs.map(([l, h]) => `layer ${l} head ${h}`).join(", ")})` : "";
  const first = pairs[0][0];
  const where = first >= L - 1
    ? `The maps are the model's own: removing a head acts after its layer's attention, and layer ${first} is the last.`
    : `Layers 0–${first} are unchanged (removing a head acts after its layer's attention); `
      + `from layer ${first + 1} on, the maps are those of the model without ${n > 1 ? "these heads" : "it"}.`;
  return `Maps of the model with ${n} head${n > 1 ? "s" : ""} off${list}, switched off in the Ablation view. ${where}`;
}

/** What the drop, mask and ring options add to the picture, in words. */
function extras(s, dropped, maskCount, rings) {
  let out = "";
  const parts = dropParts(s.drop);
  const noArtifacts = !rings.length && parts.artifacts;
  if (dropped.length) {
    const what = parts.prefix && parts.artifacts
      ? (noArtifacts ? "prefix; the image has no artifact tokens" : "prefix and artifacts") : s.drop;
    out += ` Key tokens ${dropped.join(", ")} are dropped (${what}) and the row is renormalised over the others.`;
  } else if (noArtifacts) {
    out += " This image has no artifact tokens to drop.";
  }
  if (s.mask) {
    out += ` The white outline holds the ${maskCount} patches that carry ${Math.round(s.massFraction * 100)}% `
      + "of the row's attention over the patches (DINO mass threshold).";
  }
  if (rings.length) out += ` Orange rings mark the ${rings.length} high-norm artifact token${rings.length > 1 ? "s" : ""}.`;
  return out;
}

function explanation(s, q, row, tokens, marker) {
  const { H } = dims(s.meta, s.layer);
  // the cell on the shown layer's grid (a Swin stage's, not the first stage's), with its token there
  const label = marker ? `patch (row ${marker.r}, col ${marker.c})` : queryLabel(s.query, s.meta.tokens);
  const who = `row q = ${label} (token ${marker ? marker.token : q.token})`;
  const l = s.layer;
  const over = tokens.window ? "over the window's cells" : "of the row";
  const tail = ` Colours run from the map's minimum to its maximum over the patches (colour bar); `
    + `normalised entropy ${over} ${normEntropy(row, keyCount(tokens)).toFixed(3)}.`;
  if (s.head === "mean") {
    return `Mean over the ${H} heads of ${who} of softmax(QKᵀ/√d) for layer ${l}.${tail}`;
  }
  if (s.head === "max") {
    return `Element-wise maximum over the ${H} heads of ${who} of softmax(QKᵀ/√d) for layer ${l}.${tail}`;
  }
  if (s.head === "rollout") {
    const { start, fusion, discard } = s.rollout;
    if (l < start) {
      return `Attention rollout of ${who} starts at layer ${start}; before it the product is empty (the identity), `
        + `so the query only "attends" to itself.${tail}`;
    }
    const cut = discard > 0 ? `, the smallest ${Math.round(discard * 100)}% of each row of A set to 0` : "";
    return `Attention rollout (Abnar & Zuidema, 2020) of ${who} up to layer ${l}: the product over layers `
      + `${start}…${l} of ½·A + ½·I (rows renormalised), with A the ${fusion} of the heads${cut}; `
      + `it follows attention through the residual stream.${tail}`;
  }
  if (tokens.window) {
    return `${who} of the windowed softmax for layer ${l}, head ${s.head}: how much cell q attends to each cell `
      + "of its window (the row sums to 1 over the window, less where the window hangs over the padded edge "
      + `of the grid: the rest went to the padding).${tail}`;
  }
  return `${who} of softmax(QKᵀ/√d) for layer ${l}, head ${s.head}: how much token q attends to each `
    + `patch (the row sums to 1 over all tokens, prefix tokens included).${tail}`;
}

/** The text under the pointer: cell, token and value of the shown row (cell: {r, c} or null). */
export function renderReadout(s, cell) {
  const el = $("readout");
  const store = s.store;
  if (!cell || !store) {
    el.textContent = "";
    return;
  }
  const t = tokensAt(s.meta, s.layer);
  const at = stageCell(s.meta, cell, s.layer); // windowed: the stage's cell under the pointer
  const token = t.num_prefix + at.r * t.grid[1] + at.c;
  const row = shownRow(store, selection(s));
  const what = t.window ? `cell (${at.r}, ${at.c}) of stage ${t.stage}` : `patch (${cell.r}, ${cell.c})`;
  el.textContent = `${what} · token ${token} · ${row ? fmt(row[token]) : "…"}`;
}

/**
 * Prefix tokens (CLS, registers, distillation) with the current row's value at their index;
 * onPick(query) on a click.
 */
export function renderPrefixList(s, onPick) {
  const list = $("prefix-list");
  const total = $("prefix-total");
  const store = s.store;
  if (!store || !s.meta) {
    list.replaceChildren();
    total.textContent = "";
    renderArtifactList(s, onPick);
    return;
  }
  const t = tokensAt(s.meta, s.layer);
  const row = shownRow(store, selection(s));
  // While the row is on its way, the lists keep the numbers of the last one (like the map).
  const key = `${s.imageId}|${store.model}`;
  list.setAttribute("aria-busy", row ? "false" : "true");
  if (!row && list.dataset.image === key) return;
  list.dataset.image = row ? key : "";
  renderArtifactList(s, onPick, row);
  if (t.num_prefix === 0) {
    const li = document.createElement("li");
    li.className = "prefix-none";
    li.textContent = "This model has no prefix tokens.";
    list.replaceChildren(li);
    total.textContent = "";
    return;
  }
  const q = parseQuery(s.query, t);
  const dropped = droppedTokens(store, t, s.drop);
  let mass = 0;
  const items = t.prefix.map((p) => {
    const v = row ? row[p.index] : null;
    if (v !== null) mass += v;
    const isQuery = q && q.kind !== "patch" && q.token === p.index;
    const name = prefixLabel(p.index, t);
    const b = tokenButton({
      name, index: p.index, value: v, title: `Use ${name} as the query row`,
      onClick: () => onPick(prefixQuery(p)),
    });
    b.dataset.kind = p.kind;
    b.classList.toggle("is-query", !!isQuery);
    b.classList.toggle("is-dropped", dropped.includes(p.index));
    const li = document.createElement("li");
    li.append(b);
    return li;
  });
  list.replaceChildren(...items);
  total.textContent = row
    ? `Together ${(100 * mass).toFixed(1)}% of this row; the ${t.grid[0] * t.grid[1]} patches get ${(100 * (1 - mass)).toFixed(1)}%.`
    : "";
}

/** One button of the token lists: name, #index, value, a bar, and an optional extra line. */
function tokenButton({ name, index, value, title, onClick, extra = null }) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = "prefix-item";
  b.dataset.index = String(index);
  b.dataset.value = value === null ? "" : String(value);
  b.title = title;
  const n = document.createElement("span");
  n.className = "prefix-name";
  n.textContent = name;
  const idx = document.createElement("span");
  idx.className = "prefix-idx";
  idx.textContent = `#${index}`;
  const val = document.createElement("span");
  val.className = "prefix-val";
  val.textContent = value === null ? "…" : fmt(value);
  const bar = document.createElement("span");
  bar.className = "prefix-bar";
  const fill = document.createElement("span");
  fill.style.width = `${value === null ? 0 : Math.round(100 * Math.min(1, value))}%`;
  bar.append(fill);
  b.append(n, idx, val);
  if (extra) {
    const e = document.createElement("span");
    e.className = "prefix-extra";
    e.textContent = extra;
    b.append(e);
  }
  b.append(bar);
  b.addEventListener("click", onClick);
  return b;
}

/** High-norm artifact tokens of the last layer (from the stats), with their norm and row value. */
function renderArtifactList(s, onPick, row = null) {
  const list = $("artifact-list");
  const note = $("artifact-note");
  const store = s.store;
  if (!store || !s.meta) {
    list.replaceChildren();
    note.textContent = "";
    return;
  }
  const st = store.stats;
  if (store.windowed) {
    list.replaceChildren();
    note.textContent = "Not shown for Swin: high-norm tokens are found on the last stage's grid only.";
    return;
  }
  if (!st) {
    list.replaceChildren();
    note.textContent = store.isLoading("stats") ? "Looking for high-norm tokens…" : "";
    return;
  }
  const t = s.meta.tokens;
  const a = st.artifacts || {};
  const toks = artifactTokens(store);
  const norms = Array.isArray(a.norms) ? a.norms : [];
  const dropped = droppedTokens(store, t, s.drop);
  const thr = Number.isFinite(a.threshold) ? a.threshold.toFixed(1) : "?";
  note.textContent = toks.length
    ? `Patches whose output norm at layer ${a.layer} is above ${thr} (robust z-score > 6): register-like sinks.`
    : `None: no patch output at layer ${a.layer} has a norm above ${thr} (robust z-score > 6).`;
  const items = toks.map((tok, i) => {
    const p = tok - t.num_prefix;
    const r = Math.floor(p / t.grid[1]);
    const c = p % t.grid[1];
    const v = row ? row[tok] : null;
    const norm = Number(norms[i]);
    const b = tokenButton({
      name: `patch (${r}, ${c})`, index: tok, value: v, title: `Use patch (${r}, ${c}) as the query row`,
      extra: `norm ${Number.isFinite(norm) ? norm.toFixed(1) : "?"}`,
      onClick: () => onPick(`patch:${r},${c}`),
    });
    b.dataset.kind = "artifact";
    b.dataset.norm = String(norm);
    b.classList.add("artifact-item");
    b.classList.toggle("is-dropped", dropped.includes(tok));
    const li = document.createElement("li");
    li.append(b);
    return li;
  });
  list.replaceChildren(...items);
}
