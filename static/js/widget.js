// The notebook view of one picture's attention (`att.show()`, `att.to_html()`): the overlay,
// layer / head / colour controls, the heads of the layer at a glance, a click on a patch makes
// it the query, the softmax temperature. It draws with the page's own overlay.js and
// colormaps.js. Its data: `logp`, every row of the shown layers as log-probabilities at
// temperature 1 less the row's largest, float16 [layers, heads, N, N] (0 at the row's peak, where
// float16 is finest), and `logp_max`, each row's largest log p, float32 [layers, heads, N]; a row
// at temperature T is softmax(logp / T) (the same as softmax(scores / T): log p differs from the
// scores by a constant per row, where the row holds all of its softmax; `complete` false: a Swin
// stage padded to whole windows, whose rows miss the padding keys, drawn at T = 1 only).
//
// `render({ model, el })` is anywidget's entry point; `model` is an anywidget model (get, set,
// save_changes, on, off) or, in a standalone file, `localModel(state)`.

import { COLORMAPS, paintColorbar } from "./colormaps.js";
import { fmtTemperature, sliderTemperature } from "./dom.js";
import { temperedSoftmax } from "./learn-math.js";
import { cellAt, drawComposite, fit, fmt, sizeCanvas } from "./overlay.js";

const MAIN_PX = 440; // the overlay's longer side, CSS pixels
const TILE_PX = 96;

const CSS = `
.hs-view { font: 13px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: inherit; max-width: 760px; }
.hs-view .hs-bar { display: flex; flex-wrap: wrap; gap: 6px 14px; align-items: center; margin-bottom: 8px; }
.hs-view label { display: inline-flex; gap: 4px; align-items: center; }
.hs-view select, .hs-view button { font: inherit; }
.hs-view .hs-main { display: flex; gap: 10px; align-items: flex-start; }
.hs-view .hs-overlay { cursor: crosshair; border-radius: 4px; }
.hs-view .hs-legend { display: flex; flex-direction: column; gap: 4px; font-size: 12px; min-width: 120px; }
.hs-view .hs-colorbar { width: 120px; height: 10px; image-rendering: pixelated; }
.hs-view .hs-strip { display: flex; flex-wrap: wrap; gap: 4px; margin-top: 8px; }
.hs-view .hs-tile { padding: 2px; border: 2px solid transparent; background: none; cursor: pointer; display: flex;
  flex-direction: column; align-items: center; font-size: 11px; color: inherit; }
.hs-view .hs-tile.selected { border-color: #ff3b6b; border-radius: 4px; }
.hs-view .hs-caption { margin-top: 6px; font-size: 12px; color: #64748b; }
`;

/** Float16 bits -> float32 values, one table for all. */
let HALF = null;
function halfTable() {
  if (HALF) return HALF;
  HALF = new Float32Array(65536);
  for (let h = 0; h < 65536; h++) {
    const s = h & 0x8000 ? -1 : 1;
    const e = (h >> 10) & 31;
    const f = h & 1023;
    HALF[h] = e === 0 ? s * f * 2 ** -24 : e === 31 ? (f ? NaN : s * Infinity) : s * (1 + f / 1024) * 2 ** (e - 15);
  }
  return HALF;
}

/** A DataView's bytes as little-endian values of a typed array (copied where the offset is not aligned). */
function typed(view, Type) {
  const size = Type.BYTES_PER_ELEMENT;
  if (view.byteOffset % size === 0) return new Type(view.buffer, view.byteOffset, view.byteLength / size);
  return new Type(new Uint8Array(view.buffer, view.byteOffset, view.byteLength).slice().buffer);
}

/** The rows of the shown layers: rowAt(layerIndex, head, query, T) -> Float64Array of N. */
function makeRows(model) {
  const [L, H, N] = model.get("shape");
  const bits = typed(model.get("logp"), Uint16Array);
  const tops = typed(model.get("logp_max"), Float32Array);
  const table = halfTable();
  return {
    L, H, N,
    rowAt(li, h, q, T) {
      const off = ((li * H + h) * N + q) * N;
      const scores = new Float32Array(N);
      for (let i = 0; i < N; i++) scores[i] = table[bits[off + i]];
      if (T !== 1) return temperedSoftmax(scores, T);
      // T = 1: the weights themselves, not renormalised over the N tokens (a padded window's row
      // sums to less than 1: its padding keys hold the rest)
      const p = new Float64Array(N);
      const top = tops[(li * H + h) * N + q];
      for (let i = 0; i < N; i++) p[i] = Math.exp(scores[i] + top);
      return p;
    },
  };
}

async function pictureOf(model) {
  const view = model.get("image");
  const blob = new Blob([new Uint8Array(view.buffer, view.byteOffset, view.byteLength)], { type: "image/png" });
  return createImageBitmap(blob);
}

/** A thumbnail-sized copy of the picture, so that the strip's tiles draw quickly. */
function thumbnail(image, side) {
  const { w, h } = fit(image.width, image.height, side, side);
  const c = document.createElement("canvas");
  c.width = w;
  c.height = h;
  c.getContext("2d").drawImage(image, 0, 0, w, h);
  return c;
}

function el(tag, props = {}, children = []) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "testid") e.dataset.testid = v;
    else if (k === "class") e.className = v;
    else e[k] = v;
  }
  e.append(...children);
  return e;
}

function options(select, items) {
  select.replaceChildren(...items.map(([value, text]) => el("option", { value: String(value), textContent: text })));
}

/** The query token as the API writes it: cls, a prefix token's kind and index, patch:R,C. */
export function queryText(q, tokens) {
  if (q < tokens.num_prefix) {
    const p = tokens.prefix.find((x) => x.index === q);
    return p && p.kind === "cls" ? "cls" : `${p ? p.kind : "prefix"} ${q}`;
  }
  const C = tokens.grid[1];
  const i = q - tokens.num_prefix;
  return `patch:${Math.floor(i / C)},${i % C}`;
}

/** Draw the view into `root` from the model; returns a cleanup function (anywidget's contract). */
export function render({ model, el: root }) {
  const t0 = performance.now();
  const tokens = model.get("tokens");
  const layers = model.get("layers");
  const rows = makeRows(model);
  const [R, C] = tokens.grid;

  const layerSel = el("select", { testid: "hs-layer", title: "layer" });
  options(layerSel, layers.map((l) => [l, `layer ${l}`]));
  const headSel = el("select", { testid: "hs-head", title: "head" });
  options(headSel, Array.from({ length: rows.H }, (_, h) => [h, `head ${h}`]));
  const queryLabel = el("code", { testid: "hs-query" });
  const clsBtn = el("button", { type: "button", testid: "hs-cls", textContent: "first token" });
  const tSlider = el("input", { type: "range", min: "-1", max: "1", step: "0.01", testid: "hs-temperature",
    title: "softmax temperature (log scale)" });
  const tLabel = el("span", { testid: "hs-temperature-value" });
  if (model.get("complete") === false) {
    tSlider.disabled = true;
    tSlider.title = "T = 1 only: this stage's windows are padded, and its rows miss the padding keys' weights "
      + "(att.select(temperature=...) computes a tempered map)";
  }
  const cmapSel = el("select", { testid: "hs-colormap", title: "colour map" });
  options(cmapSel, COLORMAPS.map((c) => [c, c]));
  const canvas = el("canvas", { class: "hs-overlay", testid: "hs-overlay" });
  const bar = el("canvas", { class: "hs-colorbar" });
  const lo = el("span", { testid: "hs-legend-min" });
  const hi = el("span", { testid: "hs-legend-max" });
  const readout = el("div", { testid: "hs-readout" });
  const strip = el("div", { class: "hs-strip", testid: "hs-strip" });
  const caption = el("div", { class: "hs-caption", testid: "hs-caption" });
  const view = el("div", { class: "hs-view", testid: "hs-view" }, [
    el("style", { textContent: CSS }),
    el("div", { class: "hs-bar" }, [
      el("label", {}, [layerSel]), el("label", {}, [headSel]),
      el("span", {}, ["query ", queryLabel]), clsBtn,
      el("label", {}, ["T ", tSlider, tLabel]), el("label", {}, [cmapSel]),
    ]),
    el("div", { class: "hs-main" }, [
      canvas,
      el("div", { class: "hs-legend" }, [bar, el("div", {}, [lo, " – ", hi]), readout]),
    ]),
    strip, caption,
  ]);
  root.replaceChildren(view);
  caption.textContent = [model.get("model_name"), model.get("filename") || model.get("image_id")].join(" · ");

  let image = null;
  let thumb = null;
  const tiles = [];
  let stopped = false;

  function current() {
    const layer = model.get("layer");
    const li = Math.max(0, layers.indexOf(layer));
    return { li, layer: layers[li], head: model.get("head"), q: model.get("query"), T: model.get("temperature"),
      colormap: model.get("colormap"), opacity: model.get("opacity") };
  }

  function markerOf(q) {
    if (q < tokens.num_prefix) return null;
    const i = q - tokens.num_prefix;
    return { r: Math.floor(i / C), c: i % C };
  }

  function draw() {
    if (stopped) return;
    const s = current();
    layerSel.value = String(s.layer);
    headSel.value = String(s.head);
    cmapSel.value = s.colormap;
    tSlider.value = String(Math.log10(s.T));
    tLabel.textContent = fmtTemperature(s.T);
    queryLabel.textContent = queryText(s.q, tokens);
    paintColorbar(bar, s.colormap);
    if (!image) return;
    const marker = markerOf(s.q);
    const { w, h } = fit(image.width, image.height, MAIN_PX, MAIN_PX);
    const dpr = sizeCanvas(canvas, w, h);
    const row = rows.rowAt(s.li, s.head, s.q, s.T);
    const range = drawComposite(canvas.getContext("2d"), canvas.width, canvas.height, {
      image, row, tokens, colormap: s.colormap, opacity: s.opacity, marker, px: dpr,
    });
    lo.textContent = fmt(range.min);
    hi.textContent = fmt(range.max);
    readout.textContent = `layer ${s.layer}, head ${s.head}, query ${queryText(s.q, tokens)}`;
    const tw = fit(image.width, image.height, TILE_PX, TILE_PX);
    for (let hd = 0; hd < rows.H; hd++) {
      const tile = tiles[hd];
      const c = tile.firstChild;
      const tdpr = sizeCanvas(c, tw.w, tw.h);
      drawComposite(c.getContext("2d"), c.width, c.height, {
        image: thumb, row: rows.rowAt(s.li, hd, s.q, s.T), tokens, colormap: s.colormap,
        opacity: Math.max(s.opacity, 0.35), marker, px: tdpr * 0.6,
      });
      tile.classList.toggle("selected", hd === s.head);
      tile.setAttribute("aria-pressed", hd === s.head ? "true" : "false");
    }
  }

  for (let hd = 0; hd < rows.H; hd++) {
    const tile = el("button", { type: "button", class: "hs-tile", title: `head ${hd}` },
      [el("canvas"), el("span", { textContent: `head ${hd}` })]);
    tile.dataset.head = String(hd);
    tile.addEventListener("click", () => change({ head: hd }));
    tiles.push(tile);
  }
  strip.replaceChildren(...tiles);

  function change(values) {
    for (const [k, v] of Object.entries(values)) model.set(k, v);
    model.save_changes();
  }

  layerSel.addEventListener("change", () => change({ layer: Number(layerSel.value) }));
  headSel.addEventListener("change", () => change({ head: Number(headSel.value) }));
  cmapSel.addEventListener("change", () => change({ colormap: cmapSel.value }));
  tSlider.addEventListener("input", () => change({ temperature: sliderTemperature(tSlider) }));
  clsBtn.addEventListener("click", () => change({ query: 0 }));
  canvas.addEventListener("click", (ev) => {
    const cell = cellAt(canvas, ev, tokens);
    if (cell) change({ query: tokens.num_prefix + cell.r * C + cell.c });
  });

  const names = ["layer", "head", "query", "temperature", "colormap", "opacity"];
  for (const n of names) model.on(`change:${n}`, draw);
  draw();
  pictureOf(model).then((bitmap) => {
    image = bitmap;
    thumb = thumbnail(bitmap, 2 * TILE_PX);
    draw();
    // How long the first picture took, for the benchmark and the tests (no timing is asserted):
    // from render(), and from the document's start (a standalone file: parsing and decoding too).
    view.dataset.firstDrawMs = (performance.now() - t0).toFixed(1);
    view.dataset.sinceStartMs = performance.now().toFixed(1);
    view.dataset.drawn = "1";
  });
  return () => {
    stopped = true;
    for (const n of names) model.off(`change:${n}`, draw);
  };
}

/** An anywidget-like model over a plain state object (a standalone file: no kernel). Bytes
 * come as base64 strings under the names listed in `state.binary`. */
export function localModel(state) {
  const values = { ...state.values };
  for (const name of state.binary) {
    const text = atob(values[name]);
    const bytes = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    values[name] = new DataView(bytes.buffer);
  }
  const handlers = new Map();
  const changed = new Set();
  return {
    get: (k) => values[k],
    set(k, v) {
      if (values[k] !== v) changed.add(k);
      values[k] = v;
    },
    save_changes() {
      const names = [...changed];
      changed.clear();
      const fns = new Set(names.flatMap((k) => handlers.get(`change:${k}`) || []));
      for (const fn of fns) fn();
    },
    on(ev, fn) {
      handlers.set(ev, [...(handlers.get(ev) || []), fn]);
    },
    off(ev, fn) {
      handlers.set(ev, (handlers.get(ev) || []).filter((f) => f !== fn));
    },
    send() {},
  };
}
