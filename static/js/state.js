// The one state object of the page, pure helpers that read it, and its sync with the URL
// (?image=&model=&view=&layer=&head=&q=&t=).
//
// Everything the page knows lives in `state`: what is shown, the data of the shown image
// (state.store), the images compare mode holds, the requests in flight (state.requests) and the
// error. Writers: actions.js (user intent), fetching.js (answers) and intake.js (new images);
// render() and the views only read it. The helpers below take what they read as arguments
// (tokens, meta), so a view can call them with another image's layout (compare mode does).
//
// head:  "0".."H-1" | "mean" | "max" | "rollout"
// query: "cls" | "patch:R,C" | "tok:I" (a prefix token other than CLS)
// drop:  "none" | "prefix" | "artifacts" | "prefix,artifacts" (the API's spelling of `drop`)
// Windowed models (Swin, meta.stages): layers have their stage's grid and heads; "patch:R,C" is a
// cell of stage 0 and each layer shows the stage's cell under it (see windows.js). The helpers
// that depend on the layer (dims, headChoices, tokensAt, markerAt) take it as an argument.

import { headsAt, isWindowed, layerTokens, numLayers, stageCell } from "./windows.js";

export const AGGREGATES = ["mean", "max", "rollout"];
export const DROPS = ["none", "prefix", "artifacts", "prefix,artifacts"];
export const FUSIONS = ["mean", "max", "min"];

export const state = {
  view: "viewer",      // the shown view: a [data-view-panel] of the page (see views.js)
  models: [],          // from /api/v1/models
  model: null,         // model id
  imageId: null,
  filename: null,
  meta: null,          // the shown answer's metadata: tokens, image_size, input_size, layers, heads
  image: null,         // HTMLImageElement of /api/v1/images/{id}
  store: null,         // AttentionStore (data.js) of the shown image and model
  layer: 0,
  head: "0",
  query: "cls",
  lastPatch: null,     // the last patch query, for the query-mode select
  hover: false,
  opacity: 0.6,
  colormap: "viridis",
  showGrid: false,
  smooth: false,
  busy: null,          // text while an image is being computed
  error: null,         // {title, message, code, retry: function | null}
  summary: "",         // status line once an image is shown
  // head analytics
  entropyKind: "query",   // entropy chart: "query" (this row) | "cls" (CLS row) | "all" (mean over rows)
  sinkKind: "prefix-query", // sinks chart: "prefix-query" | "prefix-all" | "artifacts"
  simKind: "js",          // similarity matrix: "js" (1 - JS/log 2) | "cos" (cosine of CLS rows)
  mask: false,            // outline the DINO mass-threshold mask on the overlay
  massFraction: 0.6,
  drop: "none",
  rollout: { start: 0, fusion: "mean", discard: 0 },
  // compare mode: sides {image, layer, head}; the other images' data, keyed `${model}|${imageId}`
  compare: {
    on: false, mode: "heads", a: null, b: null,
    others: new Map(),   // key -> {store, image, tokens, filename}
    loading: new Map(),  // key (or "sample:URL") -> promise
    failed: new Set(),   // keys of images that could not be opened (not retried)
  },
  session: [],            // images opened in this session: [{id, filename, sample}]
  temperature: 1,         // softmax temperature of every map: softmax(scores / T) (?t=, learn.js's slider)
  ablation: { off: [], method: "ablation" }, // ablation view (#16): heads off ("l:h"), importance method
  // requests in flight: `gen` bumps on every new image or model load, so late answers of an
  // older one are dropped; the controllers cancel the image load and the statistics.
  requests: { gen: 0, load: null, stats: null },
};

/** A temperature from the URL: a finite number > 0, else 1. */
export function readTemperature(text) {
  const t = Number(text);
  return text && Number.isFinite(t) && t > 0 ? t : 1;
}

/**
 * Layers, heads and tokens of an answer's metadata ({0, 0, 0} before an image); for a windowed
 * model the heads and tokens of `layer`'s stage.
 */
export function dims(meta, layer = 0) {
  if (!meta) return { L: 0, H: 0, N: 0 };
  if (isWindowed(meta)) return { L: numLayers(meta), H: headsAt(meta, layer), N: layerTokens(meta, layer).count };
  return { L: meta.layers.length, H: meta.heads.length, N: meta.tokens.count };
}

/** The list of selectable "heads": indices then the aggregates (windowed: of `layer`'s stage, no rollout). */
export function headChoices(meta, layer = 0) {
  const { H } = dims(meta, layer);
  if (!H) return [];
  const heads = Array.from({ length: H }, (_, i) => String(i));
  return isWindowed(meta) ? [...heads, "mean", "max"] : [...heads, ...AGGREGATES];
}

/** The token layout of a layer's maps: the answer's, or its stage's grid for a windowed model. */
export function tokensAt(meta, layer) {
  return layerTokens(meta, layer);
}

/** The cell of a patch query on a layer's grid ({kind, r, c, token}); null for other queries. */
export function markerAt(meta, q, layer) {
  const p = meta && parseQuery(q, meta.tokens);
  return p && p.kind === "patch" ? stageCell(meta, p, layer) : null;
}

export function hasCls(tokens) {
  return !!(tokens && tokens.prefix.some((p) => p.kind === "cls"));
}

/** The query used when nothing else is chosen: CLS, or the centre patch without one. */
export function defaultQuery(tokens) {
  if (hasCls(tokens)) return "cls";
  const [rows, cols] = tokens.grid;
  return `patch:${Math.floor(rows / 2)},${Math.floor(cols / 2)}`;
}

/**
 * The one query parser: {kind: "cls" | "patch" | "token", token, r?, c?}, or null when `q` does
 * not fit the token layout `tokens` (an answer's `tokens`).
 */
export function parseQuery(q, tokens) {
  if (!tokens || typeof q !== "string") return null;
  if (q === "cls") {
    const p = tokens.prefix.find((x) => x.kind === "cls");
    return p ? { kind: "cls", token: p.index } : null;
  }
  let m = /^patch:(\d+),(\d+)$/.exec(q);
  if (m) {
    const r = Number(m[1]);
    const c = Number(m[2]);
    if (r >= tokens.grid[0] || c >= tokens.grid[1]) return null;
    return { kind: "patch", r, c, token: tokens.num_prefix + r * tokens.grid[1] + c };
  }
  m = /^tok:(\d+)$/.exec(q);
  if (m) {
    const i = Number(m[1]);
    return i < tokens.num_prefix ? { kind: "token", token: i } : null;
  }
  return null;
}

/** The API's spelling of a query (the `query` parameter): "cls", "patch:R,C" or a token index. */
export function apiQuery(q, tokens) {
  const p = parseQuery(q, tokens);
  if (!p || p.kind === "cls") return "cls";
  if (p.kind === "patch") return `patch:${p.r},${p.c}`;
  return String(p.token);
}

/** The same query on another token grid: CLS and prefix tokens as they are, a patch at the same place. */
export function mapQuery(q, from, to) {
  const p = parseQuery(q, from);
  if (!p || p.kind !== "patch") return q;
  const [R, C] = from.grid;
  const [R2, C2] = to.grid;
  if (R === R2 && C === C2) return q;
  const r = Math.min(R2 - 1, Math.floor(((p.r + 0.5) * R2) / R));
  const c = Math.min(C2 - 1, Math.floor(((p.c + 0.5) * C2) / C));
  return `patch:${r},${c}`;
}

/** The API's `query` for a windowed model's stage: the stage's cell under a stage-0 `patch:R,C`. */
export function stageQuery(meta, query, stage) {
  const p = parseQuery(query, meta.tokens);
  if (!p || p.kind !== "patch") return query;
  const cell = stageCell(meta, p, stage.layers[0]);
  return `patch:${cell.r},${cell.c}`;
}

/** A short human label for a query token. */
export function queryLabel(q, tokens) {
  const p = parseQuery(q, tokens);
  if (!p) return "?";
  if (p.kind === "cls") return "CLS";
  if (p.kind === "patch") return `patch (row ${p.r}, col ${p.c})`;
  return prefixLabel(p.token, tokens);
}

export function prefixLabel(index, tokens) {
  const p = tokens.prefix[index];
  if (!p) return `token ${index}`;
  if (p.kind === "cls") return "CLS";
  if (p.kind === "dist") return "distillation";
  const regs = tokens.prefix.filter((x) => x.kind === "reg");
  return `register ${regs.indexOf(p) + 1}`;
}

export function headLabel(head, short = false) {
  if (head === "mean") return short ? "mean" : "mean of heads";
  if (head === "max") return short ? "max" : "max of heads";
  if (head === "rollout") return "rollout";
  return short ? `h${head}` : `head ${head}`;
}

/** The key tokens a `drop` value removes: {prefix, artifacts} (booleans). */
export function dropParts(drop) {
  const parts = String(drop || "none").split(",");
  return { prefix: parts.includes("prefix"), artifacts: parts.includes("artifacts") };
}

/** Write the shareable part of a state to the address bar (no new history entry). */
export function syncUrl(s) {
  const p = new URLSearchParams();
  if (s.imageId) p.set("image", s.imageId);
  if (s.model) p.set("model", s.model);
  if (s.view && s.view !== "viewer") p.set("view", s.view);
  if (s.imageId) {
    p.set("layer", String(s.layer));
    p.set("head", s.head);
    p.set("q", s.query);
  }
  if (s.temperature !== 1) p.set("t", String(s.temperature));
  const qs = p.toString();
  const url = `${location.pathname}${qs ? `?${qs}` : ""}`;
  if (url !== `${location.pathname}${location.search}`) history.replaceState(null, "", url);
}

/** What the address bar asks for, unvalidated: {image, model, layer, head, q, view}. */
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
