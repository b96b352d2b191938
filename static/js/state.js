// The one state object of the page, and its sync with the URL (?image=&model=&layer=&head=&q=).
//
// head:  "0".."H-1" | "mean" | "max" | "rollout"
// query: "cls" | "patch:R,C" | "tok:I" (a prefix token other than CLS)
// drop:  "none" | "prefix" | "artifacts" | "both" (key tokens zeroed, rows renormalised)
// Windowed models (Swin, meta.stages): layers have their stage's grid and heads; "patch:R,C" is a
// cell of stage 0 and each layer shows the stage's cell under it (see windows.js).

import { headsAt, isWindowed, layerTokens, numLayers, stageCell } from "./windows.js";

export const AGGREGATES = ["mean", "max", "rollout"];

export const state = {
  view: "viewer",      // the shown view: a [data-view-panel] of the page (see views.js)
  models: [],          // from /api/v1/models
  model: null,         // model id
  imageId: null,
  filename: null,
  meta: null,          // the first answer's metadata: tokens, image_size, input_size, layers, heads
  image: null,         // HTMLImageElement of /api/v1/images/{id}
  layer: 0,
  head: "0",
  query: "cls",
  hover: false,
  opacity: 0.6,
  colormap: "viridis",
  showGrid: false,
  smooth: false,
  busy: null,          // text while something is computing
  error: null,         // {title, message, retry}
  // head analytics
  entropyKind: "query",   // entropy chart: "query" (this row) | "cls" (CLS row) | "all" (mean over rows)
  sinkKind: "prefix-query", // sinks chart: "prefix-query" | "prefix-all" | "artifacts"
  simKind: "js",          // similarity matrix: "js" (1 - JS/log 2) | "cos" (cosine of CLS rows)
  mask: false,            // outline the DINO mass-threshold mask on the overlay
  massFraction: 0.6,
  drop: "none",
  rollout: { start: 0, fusion: "mean", discard: 0 },
  compare: { on: false, mode: "heads", a: null, b: null }, // sides: {image, layer, head}
  session: [],            // images opened in this session: [{id, filename, sample}]
  temperature: 1,         // softmax temperature of every map: softmax(scores / T) (learn.js sets it)
  ablation: { off: [], method: "ablation" }, // ablation view (#16): heads off ("l:h"), importance method
};

/** A temperature from the URL: a finite number > 0, else 1. */
export function readTemperature(text) {
  const t = Number(text);
  return text && Number.isFinite(t) && t > 0 ? t : 1;
}

export const DROPS = ["none", "prefix", "artifacts", "both"];
export const FUSIONS = ["mean", "max", "min"];

/** Layers and heads of the loaded answer (0 before an image); windowed: heads and tokens of the shown layer. */
export function dims() {
  const m = state.meta;
  if (!m) return { L: 0, H: 0, N: 0 };
  if (isWindowed(m)) return { L: numLayers(m), H: headsAt(m, state.layer), N: tokensAt(state.layer).count };
  return { L: m.layers.length, H: m.heads.length, N: m.tokens.count };
}

/** The list of selectable "heads": indices then the aggregates (windowed: of `layer`'s stage, no rollout). */
export function headChoices(layer = state.layer) {
  const m = state.meta;
  if (m && isWindowed(m)) {
    return [...Array.from({ length: headsAt(m, layer) }, (_, i) => String(i)), "mean", "max"];
  }
  const { H } = dims();
  return [...Array.from({ length: H }, (_, i) => String(i)), ...AGGREGATES];
}

/** The token layout of a layer's maps: the answer's, or its stage's grid for a windowed model. */
export function tokensAt(layer) {
  return layerTokens(state.meta, layer);
}

/** The cell of a patch query on a layer's grid ({kind, r, c, token}); null for other queries. */
export function markerAt(q, layer) {
  const p = parseQuery(q);
  return p && p.kind === "patch" ? stageCell(state.meta, p, layer) : null;
}

export function hasCls() {
  return !!(state.meta && state.meta.tokens.prefix.some((p) => p.kind === "cls"));
}

/** The query used when nothing else is chosen: CLS, or the centre patch without one. */
export function defaultQuery() {
  if (hasCls()) return "cls";
  const [rows, cols] = state.meta.tokens.grid;
  return `patch:${Math.floor(rows / 2)},${Math.floor(cols / 2)}`;
}

/** Parse a query string; null when it does not fit the loaded layout. */
export function parseQuery(q) {
  if (!state.meta || typeof q !== "string") return null;
  const t = state.meta.tokens;
  if (q === "cls") {
    const p = t.prefix.find((x) => x.kind === "cls");
    return p ? { kind: "cls", token: p.index } : null;
  }
  let m = /^patch:(\d+),(\d+)$/.exec(q);
  if (m) {
    const r = Number(m[1]);
    const c = Number(m[2]);
    if (r >= t.grid[0] || c >= t.grid[1]) return null;
    return { kind: "patch", r, c, token: t.num_prefix + r * t.grid[1] + c };
  }
  m = /^tok:(\d+)$/.exec(q);
  if (m) {
    const i = Number(m[1]);
    return i < t.num_prefix ? { kind: "token", token: i } : null;
  }
  return null;
}

/** The API's spelling of a query (the `query` parameter). */
export function apiQuery(q) {
  const p = parseQuery(q);
  if (!p) return "cls";
  if (p.kind === "cls") return "cls";
  if (p.kind === "patch") return `patch:${p.r},${p.c}`;
  return String(p.token);
}

/** A short human label for a query token. */
export function queryLabel(q) {
  const p = parseQuery(q);
  if (!p) return "?";
  if (p.kind === "cls") return "CLS";
  if (p.kind === "patch") return `patch (row ${p.r}, col ${p.c})`;
  return prefixLabel(p.token);
}

export function prefixLabel(index) {
  const t = state.meta.tokens;
  const p = t.prefix[index];
  if (!p) return `token ${index}`;
  if (p.kind === "cls") return "CLS";
  if (p.kind === "dist") return "distillation";
  const regs = t.prefix.filter((x) => x.kind === "reg");
  return `register ${regs.indexOf(p) + 1}`;
}

export function headLabel(head, short = false) {
  if (head === "mean") return short ? "mean" : "mean of heads";
  if (head === "max") return short ? "max" : "max of heads";
  if (head === "rollout") return "rollout";
  return short ? `h${head}` : `head ${head}`;
}

/** Write the shareable part of the state to the address bar (no new history entry). */
export function syncUrl() {
  const p = new URLSearchParams();
  if (state.imageId) p.set("image", state.imageId);
  if (state.model) p.set("model", state.model);
  if (state.view && state.view !== "viewer") p.set("view", state.view);
  if (state.imageId) {
    p.set("layer", String(state.layer));
    p.set("head", state.head);
    p.set("q", state.query);
  }
  if (state.temperature !== 1) p.set("t", String(state.temperature));
  const qs = p.toString();
  const url = `${location.pathname}${qs ? `?${qs}` : ""}`;
  if (url !== `${location.pathname}${location.search}`) history.replaceState(null, "", url);
}

/** What the address bar asks for, unvalidated: {image, model, layer, head, q}. */
export function readUrl() {
  const p = new URLSearchParams(location.search);
  const image = p.get("image");
  return {
    image: image && /^[0-9a-f]{8,64}$/.test(image) ? image : null,
    model: p.get("model"),
    layer: p.has("layer") ? Number(p.get("layer")) : null,
    head: p.get("head"),
    q: p.get("q"),
    view: p.get("view"),
    temperature: readTemperature(p.get("t")),
  };
}
