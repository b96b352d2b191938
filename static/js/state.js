// The one state object of the page, pure helpers that read it, and its sync with the URL
// (?image=&model=&view=&layer=&head=&q=&t=, and what differs from the defaults: &drop=&rollout=
// &ablate=&method=&target=&labels=&steps= in the API's spellings, &compare=&a=&b= for compare mode).
//
// Everything the page knows lives in `state`: what is shown, the data of the shown image
// (state.store), the images compare mode holds, the requests in flight (state.requests) and the
// error. Writers: actions.js (user intent), fetching.js (answers) and intake.js (new images);
// render() and the views only read it. The helpers below take what they read as arguments
// (tokens, meta), so a view can call them with another image's layout (compare mode does).
//
// head:  "0".."H-1" | "mean" | "max" | "rollout"
// query: "cls" | "patch:R,C" | "I" (a prefix token other than CLS): the API's spelling (queryRows)
// drop:  "none" | "prefix" | "artifacts" | "prefix,artifacts" (the API's spelling of `drop`)
// Windowed models (Swin, meta.stages): layers have their stage's grid and heads; "patch:R,C" is a
// cell of stage 0 and each layer shows the stage's cell under it (see windows.js). The helpers
// that depend on the layer (dims, headChoices, tokensAt, markerAt) take it as an argument.

import { COLORMAPS } from "./colormaps.js";
import { headsAt, isWindowed, layerTokens, numLayers, stageCell } from "./windows.js";

export const AGGREGATES = ["mean", "max", "rollout"];
export const DROPS = ["none", "prefix", "artifacts", "prefix,artifacts"];
export const FUSIONS = ["mean", "max", "min"];
// The Why view's relevance methods, in the faithfulness test's order (why.js)
export const RELEVANCE_METHODS = ["chefer", "grad_attention", "rollout", "attention", "random", "chefer2021", "attnlrp", "legrad"];
const DEFAULT_ROLLOUT = { start: 0, fusion: "mean", discard: 0 };
export const COMPARE_MODES = ["heads", "layers", "images"];
// The analytics charts' modes ([value, label]; controls.js) and the importance methods (ablation.js)
export const ENTROPY_KINDS = [["query", "this query row"], ["cls", "CLS row"], ["all", "all rows (mean)"]];
export const SINK_KINDS = [["prefix-query", "prefix tokens · this query row"], ["prefix-all", "prefix tokens · all rows"],
  ["artifacts", "artifact tokens · all rows"]];
export const SIM_KINDS = [["js", "1 − JS divergence (all rows)"], ["cos", "cosine of CLS rows"]];
export const IMPORTANCE_METHODS = ["ablation", "gradient"];
export const MASS_RANGE = [0.1, 0.95]; // the mass mask's slider
// The display choices a link carries where they differ from these (syncUrl/readChoices)
const DISPLAY = { colormap: "viridis", opacity: 0.6, showGrid: false, smooth: false, mask: false, massFraction: 0.6,
  entropyKind: "query", sinkKind: "prefix-query", simKind: "js" };
const HEAD_TEXT = /^(?:\d{1,4}|mean|max|rollout)$/;

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
  opacity: DISPLAY.opacity,
  colormap: DISPLAY.colormap,
  showGrid: DISPLAY.showGrid,
  smooth: DISPLAY.smooth,
  busy: null,          // text while an image is being computed
  error: null,         // {title, message, code, retry: function | null}
  summary: "",         // status line once an image is shown
  // head analytics
  entropyKind: DISPLAY.entropyKind, // entropy chart: "query" (this row) | "cls" (CLS row) | "all" (mean over rows)
  sinkKind: DISPLAY.sinkKind, // sinks chart: "prefix-query" | "prefix-all" | "artifacts"
  simKind: DISPLAY.simKind, // similarity matrix: "js" (1 - JS/log 2) | "cos" (cosine of CLS rows)
  mask: DISPLAY.mask, // outline the DINO mass-threshold mask on the overlay
  massFraction: DISPLAY.massFraction,
  drop: "none",
  rollout: { ...DEFAULT_ROLLOUT },
  // compare mode: sides {image, layer, head}; the other images' data, keyed `${model}|${imageId}`
  compare: {
    on: false, mode: "heads", a: null, b: null,
    others: new Map(),   // key -> {store, image, tokens, filename}
    loading: new Map(),  // key (or "sample:URL") -> promise
    failed: new Set(),   // keys of images that could not be opened (not retried)
  },
  session: [],            // images opened in this session: [{id, filename, sample}]
  temperature: 1,         // softmax temperature of every map: softmax(scores / T) (?t=, both sliders)
  // "Inside a head" (learn.js): explain answers by "image|model|layer|head|query", the requests on
  // their way and the failed ones, the key under the pointer, the slider's T while it is dragged
  learn: { answers: new Map(), loading: new Set(), failed: new Map(), hover: null, previewT: null },
  // the Ablation view (ablation.js): heads off ("l:h"), the importance method, importance asked for
  // ("image|model|method"), a method to try again; `data`: the server's answers for the shown image
  ablation: { off: [], method: "ablation", asked: [], retry: null, data: null },
  // the Why view (why.js): the relevance method, the target ("" = the model's default, "box" = `box`,
  // [x0, y0, x1, y1] in output-map pixels), the test's fractions, the tests asked for
  // ("image|model|ablate"); `data`: the server's answers for the shown image, model and heads off
  // (CLIP-style models: target "text" with the typed `phrase`, zero-shot `labels` comma-separated)
  why: { method: "chefer", target: "", box: null, steps: "quick", asked: [], data: null, phrase: "", labels: "" },
  // requests in flight: `gen` bumps on every new image or model load, so late answers of an
  // older one are dropped; the controllers cancel the image load and the statistics.
  requests: { gen: 0, load: null, stats: null },
};

/**
 * A temperature from the URL: a finite number > 0, else 1, within the slider's range 0.1 … 10 (a
 * link with t=0.0001 drew maps at 0.0001 while the readout said 0.00).
 */
export function readTemperature(text) {
  const t = Number(text);
  return text && Number.isFinite(t) && t > 0 ? Math.min(10, Math.max(0.1, t)) : 1;
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

// ---------------------------------------------------------------- queries
// The page speaks the API's query grammar (app/engine/selection.py parse_query): "cls", "all",
// token indices "0,17,200" (negative counts from the end), "patch:R,C" (";" between cells,
// negative from the far edge). The page shows one row at a time: its `state.query` is always one
// row, spelled the one way canonicalQuery() gives: "cls", a prefix token's index ("2") or
// "patch:R,C". tests/fixtures/parity.json holds parse_query's answers for queryRows().

const MAX_SPEC = 4096; // selection.MAX_SPEC
const mod = (v, n) => ((v % n) + n) % n;

/**
 * The rows a query spec asks for, as the API reads it: {rows: [token, ...]} (duplicates
 * dropped, in the spec's order), {rows: null} for "all" (every row), or {error} with the API's
 * message where the API answers 422.
 */
export function queryRows(spec, tokens) {
  const text = String(spec || "cls").trim().toLowerCase();
  const n = tokens.count;
  if (text.length > MAX_SPEC) return { error: "query: specification too long" };
  if (text === "all") return { rows: null };
  if (text === "cls") {
    const p = tokens.prefix.find((x) => x.kind === "cls");
    return p ? { rows: [p.index] }
      : { error: "query: this model has no CLS token; ask for token indices, 'patch:R,C' or 'all'" };
  }
  const rows = [];
  if (text.startsWith("patch:")) {
    const [gh, gw] = tokens.grid;
    for (const cell of text.slice("patch:".length).replace(/ /g, "").split(";")) {
      const m = /^(-?[0-9]{1,6}),(-?[0-9]{1,6})$/.exec(cell);
      if (!m) return { error: `query: cannot read patch '${cell}'; use patch:ROW,COL` };
      const r = Number(m[1]);
      const c = Number(m[2]);
      if (!(r >= -gh && r < gh && c >= -gw && c < gw)) {
        return { error: `query: patch (${r}, ${c}) is outside the ${gh} x ${gw} grid` };
      }
      rows.push(tokens.num_prefix + mod(r, gh) * gw + mod(c, gw));
    }
    return { rows: [...new Set(rows)] };
  }
  for (const raw of text.replace(/ /g, "").split(",")) {
    if (!/^-?[0-9]{1,7}$/.test(raw)) {
      return { error: `query: cannot read '${raw}'; use cls, all, token indices or patch:ROW,COL` };
    }
    const v = Number(raw);
    if (!(v >= -n && v < n)) return { error: `query: token ${v} is out of range for ${n} tokens` };
    rows.push(mod(v, n));
  }
  return { rows: [...new Set(rows)] };
}

/** What token `t` is: {kind: "cls" | "token" (another prefix token) | "patch", token, r?, c?}. */
export function tokenKind(t, tokens) {
  if (t < tokens.num_prefix) return { kind: tokens.prefix[t].kind === "cls" ? "cls" : "token", token: t };
  const p = t - tokens.num_prefix;
  const C = tokens.grid[1];
  return { kind: "patch", r: Math.floor(p / C), c: p % C, token: t };
}

/**
 * The one query parser of the page: the one row a query asks for, {kind: "cls" | "token" |
 * "patch", token, r?, c?}, or null when `q` asks for no single row of the layout `tokens` (an
 * answer's `tokens`). "tok:I", the page's spelling before it spoke the API's, is read as "I".
 */
export function parseQuery(q, tokens) {
  if (!tokens || typeof q !== "string") return null;
  const legacy = /^\s*tok:(\d+)\s*$/.exec(q);
  const { rows } = queryRows(legacy ? legacy[1] : q, tokens);
  return rows && rows.length === 1 ? tokenKind(rows[0], tokens) : null;
}

/** The one spelling of a one-row query: "cls", a prefix token's index, "patch:R,C"; null if none. */
export function canonicalQuery(q, tokens) {
  const p = parseQuery(q, tokens);
  if (!p) return null;
  if (p.kind === "cls") return "cls";
  return p.kind === "patch" ? `patch:${p.r},${p.c}` : String(p.token);
}

/** The API's `query` for the page's query: its canonical spelling ("cls" when it names no row). */
export function apiQuery(q, tokens) {
  return canonicalQuery(q, tokens) || "cls";
}

/** The query of prefix token `p` ({index, kind}): "cls" for CLS, else its index. */
export function prefixQuery(p) {
  return p.kind === "cls" ? "cls" : String(p.index);
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

/**
 * The heads switched off (state.ablation.off, "l:h") that the model of `meta` has, as sorted
 * [layer, head] pairs; none for a windowed model (the server has no head ablation for those).
 */
export function ablatedPairs(meta, off) {
  if (!meta || isWindowed(meta)) return [];
  const { L, H } = dims(meta);
  const pairs = [];
  for (const k of off) {
    const [l, h] = String(k).split(":").map(Number);
    if (Number.isInteger(l) && Number.isInteger(h) && l >= 0 && l < L && h >= 0 && h < H) pairs.push([l, h]);
  }
  return pairs.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
}

/** The heads switched off in the Ablation view, as the API's `ablate` text (they compose). */
export function ablateOf(s) {
  return ablateText(ablatedPairs(s.meta, s.ablation.off));
}

/** The API's `ablate` for [layer, head] pairs: "3:0,3:1" ("" for none). */
export function ablateText(pairs) {
  return pairs.map(([l, h]) => `${l}:${h}`).join(",");
}

/**
 * Whether a model switch is under way: the state names the new model while the shown maps, their
 * layout and the heads switched off are still the old one's. The views wait for its answer (a
 * request then would mix the two: the old model's head 5 asked of a 3-head model).
 */
export function switching(s) {
  return !!(s.store && s.store.model !== s.model);
}

/** An image's name: its file's, else "image" and the start of its id (two unnamed images differ). */
export function nameOf(filename, imageId) {
  return filename || `image ${String(imageId || "").slice(0, 8)}`.trim();
}

/** The key tokens a `drop` value removes: {prefix, artifacts} (booleans). */
export function dropParts(drop) {
  const parts = String(drop || "none").split(",");
  return { prefix: parts.includes("prefix"), artifacts: parts.includes("artifacts") };
}

/**
 * Write the shareable part of a state to the address bar (no new history entry): what is shown,
 * and each choice that changes what a view shows where it differs from the default, so a link
 * opens the same maps (heads switched off change every view's maps).
 */
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
  if (s.drop !== "none") p.set("drop", s.drop);
  const r = s.rollout;
  if (Object.keys(DEFAULT_ROLLOUT).some((k) => r[k] !== DEFAULT_ROLLOUT[k])) p.set("rollout", `${r.start},${r.fusion},${r.discard}`);
  // Before an image the model's heads are unknown: its pairs are written once they are.
  const ablate = s.meta ? ablateOf(s) : s.ablation.off.join(",");
  if (ablate) p.set("ablate", ablate);
  const w = s.why;
  if (w.method !== "chefer") p.set("method", w.method);
  const target = sharedTarget(w);
  if (target) p.set("target", target);
  if (w.labels) p.set("labels", w.labels);
  if (w.steps !== "quick") p.set("steps", w.steps);
  if (s.ablation.method !== IMPORTANCE_METHODS[0]) p.set("importance", s.ablation.method);
  if (s.colormap !== DISPLAY.colormap) p.set("cmap", s.colormap);
  if (s.opacity !== DISPLAY.opacity) p.set("opacity", String(s.opacity));
  if (s.showGrid) p.set("grid", "1");
  if (s.smooth) p.set("smooth", "1");
  if (s.mask) p.set("mask", String(s.massFraction));
  if (s.entropyKind !== DISPLAY.entropyKind) p.set("entropy", s.entropyKind);
  if (s.sinkKind !== DISPLAY.sinkKind) p.set("sinks", s.sinkKind);
  if (s.simKind !== DISPLAY.simKind) p.set("sim", s.simKind);
  const c = s.compare;
  if (c.on && c.a && c.b && s.imageId) {
    p.set("compare", c.mode);
    p.set("a", sideText(c.a, s.imageId));
    p.set("b", sideText(c.b, s.imageId));
  }
  const qs = p.toString();
  const url = `${location.pathname}${qs ? `?${qs}` : ""}`;
  if (url !== `${location.pathname}${location.search}`) history.replaceState(null, "", url);
}

/**
 * A compare side as "layer,head" and, for another image than the shown one, ",imageId". A sample
 * on its way ("sample:…") is written once it is an image of the server.
 */
function sideText(side, shown) {
  const other = side.image && side.image !== shown && !String(side.image).startsWith("sample:");
  return `${side.layer},${side.head}${other ? `,${side.image}` : ""}`;
}

/** A link's compare side ({layer, head, image: an id or null for the shown one}); null when malformed. */
function readSide(text) {
  const [layer, head, image, ...rest] = (text || "").split(",");
  if (rest.length || !/^\d{1,4}$/.test(layer) || !HEAD_TEXT.test(head || "")) return null;
  if (image !== undefined && !/^[0-9a-f]{8,64}$/.test(image)) return null;
  return { layer: Number(layer), head, image: image || null };
}

/** The Why view's chosen target in the API's spelling ("box:x0,y0,x1,y1", "text:…"); "" for the default. */
function sharedTarget(why) {
  if (why.target === "box") return why.box ? `box:${why.box.join(",")}` : "";
  if (why.target === "text") return why.phrase ? `text:${why.phrase}` : "";
  return why.target;
}

/**
 * What the address bar asks for: {image, model, layer, head, q, view, temperature} unvalidated
 * (the image's answer checks them), and `choices`, a patch of the state with the link's valid
 * display choices (unknown or malformed values are left out: the defaults stay).
 */
export function readUrl() {
  const p = new URLSearchParams(location.search);
  const image = p.get("image");
  return {
    image: image && /^[0-9a-f]{8,64}$/.test(image) ? image : null,
    model: p.get("model"),
    layer: /^\d{1,4}$/.test(p.get("layer") || "") ? Number(p.get("layer")) : null,
    head: p.get("head"),
    q: p.get("q"),
    view: p.get("view"),
    temperature: readTemperature(p.get("t")),
    choices: readChoices(p),
  };
}

/** The display choices of a link's parameters, as a patch of the state (see readUrl). */
export function readChoices(p) {
  const out = {};
  if (DROPS.includes(p.get("drop"))) out.drop = p.get("drop");
  const r = (p.get("rollout") || "").split(",");
  const start = Number(r[0]), discard = Number(r[2]);
  if (r.length === 3 && Number.isInteger(start) && start >= 0 && FUSIONS.includes(r[1])
      && Number.isFinite(discard) && discard >= 0 && discard <= 0.95) {
    out.rollout = { start, fusion: r[1], discard };
  }
  // "l:h" pairs; the ones the model lacks are left out once its answer is in (ablatedPairs)
  const off = (p.get("ablate") || "").split(",").filter((k) => /^\d{1,4}:\d{1,4}$/.test(k));
  if (off.length) out.ablation = { off: [...new Set(off)] };
  if (IMPORTANCE_METHODS.includes(p.get("importance"))) out.ablation = { ...out.ablation, method: p.get("importance") };
  Object.assign(out, readDisplay(p));
  const why = {};
  if (RELEVANCE_METHODS.includes(p.get("method"))) why.method = p.get("method");
  Object.assign(why, readTarget(p.get("target") || ""));
  const labels = (p.get("labels") || "").slice(0, 2000);
  if (labels.trim()) why.labels = labels;
  if (p.get("steps") === "full") why.steps = "full";
  if (Object.keys(why).length) out.why = why;
  // The sides follow the image once it is in (compare.js followImage: the shown one, layers and
  // heads the model has).
  const a = readSide(p.get("a")), b = readSide(p.get("b"));
  if (COMPARE_MODES.includes(p.get("compare")) && a && b) out.compare = { on: true, mode: p.get("compare"), a, b };
  return out;
}

/** A link's display choices: colour map, opacity, grid, smoothing, mass mask, the charts' modes. */
function readDisplay(p) {
  const out = {};
  if (COLORMAPS.includes(p.get("cmap"))) out.colormap = p.get("cmap");
  const opacity = share(p.get("opacity"), 0, 1);
  if (opacity !== null) out.opacity = opacity;
  if (p.get("grid") === "1") out.showGrid = true;
  if (p.get("smooth") === "1") out.smooth = true;
  const mass = share(p.get("mask"), ...MASS_RANGE);
  if (mass !== null) Object.assign(out, { mask: true, massFraction: mass });
  const kind = (name, kinds) => (kinds.some(([v]) => v === p.get(name)) ? p.get(name) : null);
  for (const [field, name, kinds] of [["entropyKind", "entropy", ENTROPY_KINDS], ["sinkKind", "sinks", SINK_KINDS], ["simKind", "sim", SIM_KINDS]]) {
    const v = kind(name, kinds);
    if (v) out[field] = v;
  }
  return out;
}

/** A number from a link within [lo, hi], else null (left out: the default stays). */
function share(text, lo, hi) {
  if (!/^\d(?:\.\d{1,4})?$/.test(text || "")) return null;
  const v = Number(text);
  return v >= lo && v <= hi ? v : null;
}

/** Put a link's choices (readChoices) into the state; an object (rollout, compare, a view's part) is patched. */
export function applyChoices(s, choices) {
  for (const [k, v] of Object.entries(choices)) {
    s[k] = v && typeof v === "object" && !Array.isArray(v) ? { ...s[k], ...v } : v;
  }
}

/** A link's Why target as the view's state ({target, box} or {target, phrase}); {} when malformed. */
function readTarget(t) {
  if (["output", "top", "embedding"].includes(t) || /^class:\d{1,6}$/.test(t)) return { target: t };
  const box = /^box:(\d{1,5}),(\d{1,5}),(\d{1,5}),(\d{1,5})$/.exec(t);
  if (box) {
    const [x0, y0, x1, y1] = box.slice(1).map(Number);
    return x0 < x1 && y0 < y1 ? { target: "box", box: [x0, y0, x1, y1] } : {};
  }
  if (t.startsWith("text:") && t.slice(5).trim()) return { target: "text", phrase: t.slice(5).trim().slice(0, 2000) };
  return {};
}
