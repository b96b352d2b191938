// "Inside a head": one head's whole computation for the query token, with the model's own
// tensors from GET /api/v1/attention/{id}/explain, stage by stage: X -> Q_h, K_h, V_h ->
// scores -> softmax (at the page's temperature) -> o_h = sum_j a_j v_j -> the H heads
// concatenated -> W_O -> the block's attention output, every head's share as a bar.
//
// The answer is fetched once per (image, model, layer, head, query) and kept here; the
// temperature slider recomputes the softmax, entropy, top tokens and o_h from `scores` and `v`
// in the browser, in the same frame, with no request. The temperature is state.temperature:
// releasing the slider also re-tempers the attention maps of the other view (one cached GET).
//
// Windowed models (Swin, learn-window.js): the keys are the query's window (`key_tokens`: the stage
// cell of each place, -1 for padding); the maps are drawn on the layer's stage grid with the window
// outlined, and the temperature recomputes the softmax over the window's places.

import { getExplain } from "./api.js";
import { drawComposite, fit, fmt, sizeCanvas, cellAt } from "./overlay.js";
import { apiQuery, markerAt, parseQuery, prefixLabel, state, tokensAt } from "./state.js";
import {
  drawWindowScores, drawWindowWeights, isWindowAnswer, placeLabel, placeOf, windowNotes,
} from "./learn-window.js";
import { isWindowed, stageOf } from "./windows.js";

const $ = (id) => document.getElementById(id);

const answers = new Map();  // key -> explain answer
const loading = new Set();  // keys being fetched
const failed = new Map();   // key -> error (not retried automatically)
let hoverToken = null;      // key token under the pointer (transient, not state); windowed: the stage
                            // cell, or -(j + 1) for padding place j (learn-window.js placeOf)

// ------------------------------------------------------------------ the maths of the row
/** softmax(scores / T) as a Float64Array (the max is subtracted first: any T > 0 stays finite). */
export function temperedSoftmax(scores, T) {
  const n = scores.length;
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (scores[i] > max) max = scores[i];
  const out = new Float64Array(n);
  let sum = 0;
  for (let i = 0; i < n; i++) {
    out[i] = Math.exp((scores[i] - max) / T);
    sum += out[i];
  }
  for (let i = 0; i < n; i++) out[i] /= sum;
  return out;
}

/** Entropy of a distribution in nats. */
export function entropy(p) {
  let h = 0;
  for (let i = 0; i < p.length; i++) if (p[i] > 0) h -= p[i] * Math.log(p[i]);
  return h;
}

/** Indices of the k largest values, largest first. */
export function topK(p, k) {
  const idx = Array.from(p.keys());
  idx.sort((a, b) => p[b] - p[a]);
  return idx.slice(0, k);
}

/** sum_j a_j v_j for weights a [N] and values v [N][d]. */
function weightedSum(a, v) {
  const d = v[0].length;
  const o = new Float64Array(d);
  for (let j = 0; j < a.length; j++) {
    const w = a[j];
    const vj = v[j];
    for (let c = 0; c < d; c++) o[c] += w * vj[c];
  }
  return o;
}

// ------------------------------------------------------------------ fetching
/** The (layer, head, query) the view explains: a numeric head, or head 0 for an aggregate. */
function target() {
  const head = /^\d+$/.test(state.head) ? Number(state.head) : 0;
  if (isWindowed(state.meta)) { // swin: the stage's cell under the page's stage-0 query (cell 0 by default)
    const s = stageOf(state.meta, state.layer);
    const cell = markerAt(state.meta, state.query, state.layer) || { r: 0, c: 0 };
    return { layer: state.layer, head: Math.min(head, s.heads - 1), query: `patch:${cell.r},${cell.c}` };
  }
  return { layer: state.layer, head, query: apiQuery(state.query, state.meta.tokens) };
}

function keyOf(t) {
  return [state.imageId, state.model, t.layer, t.head, t.query].join("|");
}

/** Fetch the explain answer the view shows, if it is missing; onDone re-renders the page. */
export function needLearn(onDone, onError) {
  if (state.view !== "learn" || !state.imageId || !state.meta) return;
  const t = target();
  const key = keyOf(t);
  if (answers.has(key) || loading.has(key) || failed.has(key)) return;
  loading.add(key);
  getExplain(state.imageId, { model: state.model, layer: t.layer, head: t.head, query: t.query })
    .then((ans) => answers.set(key, ans))
    .catch((e) => {
      failed.set(key, e);
      onError(e);
    })
    .finally(() => {
      loading.delete(key);
      onDone();
    });
}

// ------------------------------------------------------------------ colours and strips
// A diverging map (ColorBrewer RdBu, reversed): blue below zero, white at zero, red above.
const RDBU = ["#053061", "#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7",
  "#fddbc7", "#f4a582", "#d6604d", "#b2182b", "#67001f"].map((h) => {
  const v = parseInt(h.slice(1), 16);
  return [(v >> 16) & 255, (v >> 8) & 255, v & 255];
});

/** RGB of t in [-1, 1] on the diverging map. */
function diverging(t) {
  const x = (Math.max(-1, Math.min(1, t)) + 1) / 2 * (RDBU.length - 1);
  const k = Math.min(RDBU.length - 2, Math.floor(x));
  const f = x - k;
  return RDBU[k].map((c, i) => Math.round(c + (RDBU[k + 1][i] - c) * f));
}

function maxAbs(values) {
  let m = 0;
  for (const v of values) m = Math.max(m, Math.abs(v));
  return m || 1;
}

/** Paint rows x cols values (row-major) into a canvas, one pixel per value, diverging colours. */
function paintCells(canvas, values, rows, cols, scale) {
  canvas.width = cols;
  canvas.height = rows;
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(cols, rows);
  for (let i = 0; i < rows * cols; i++) {
    const [r, g, b] = diverging(values[i] / scale);
    img.data.set([r, g, b, 255], 4 * i);
  }
  ctx.putImageData(img, 0, 0);
}

/** A vector as a strip of coloured cells (one per number), symmetric around 0. */
function drawStrip(canvas, values, marks = null) {
  const n = values.length;
  paintCells(canvas, values, 1, n, maxAbs(values));
  canvas.style.width = `${Math.min(640, Math.max(160, n * 4))}px`;
  canvas.dataset.length = String(n);
  if (marks) canvas.dataset.marks = marks;
}

/** A matrix [N][d] as a heat picture (N rows of d cells), with the query's row and the hovered one marked. */
function drawMatrix(canvas, m, query, hover) {
  const rows = m.length;
  const cols = m[0].length;
  const flat = new Float64Array(rows * cols);
  for (let i = 0; i < rows; i++) flat.set(m[i], i * cols);
  paintCells(canvas, flat, rows, cols, maxAbs(flat));
  const ctx = canvas.getContext("2d");
  for (const [row, colour] of [[query, "#ff3b6b"], [hover, "#fbbf24"]]) {
    if (row === null || row === undefined) continue;
    ctx.fillStyle = colour;
    ctx.fillRect(0, row, Math.max(2, Math.round(cols / 16)), 1);
  }
}

// ------------------------------------------------------------------ patch maps
/** The per-token values of a row as the Float32Array the overlay drawer reads. */
function asRow(values) {
  return Float32Array.from(values);
}

function mapSize(image) {
  return fit(image.naturalWidth, image.naturalHeight, 300, 300);
}

/**
 * Scores over the patch grid in diverging colours centred on their mean (softmax ignores a
 * shift of the whole row, so above or below the mean is what decides), query and hover marked.
 * Returns {centre, spread}.
 */
function drawScores(canvas, image, tokens, scores, q, hover) {
  const { w, h } = mapSize(image);
  const dpr = sizeCanvas(canvas, w, h);
  const ctx = canvas.getContext("2d");
  const [R, C] = tokens.grid;
  const patch = scores.slice(tokens.num_prefix, tokens.num_prefix + R * C);
  const centre = patch.reduce((s, v) => s + v, 0) / patch.length;
  const shifted = patch.map((v) => v - centre);
  const spread = maxAbs(shifted);
  const grid = document.createElement("canvas");
  paintCells(grid, shifted, R, C, spread);
  ctx.save();
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(grid, 0, 0, canvas.width, canvas.height);
  ctx.restore();
  markCells(ctx, tokens, canvas.width, canvas.height, q, hover, dpr);
  canvas.dataset.centre = String(centre);
  return { centre, spread };
}

function markCells(ctx, tokens, w, h, q, hover, px) {
  const [R, C] = tokens.grid;
  const box = (token, colour) => {
    const p = token - tokens.num_prefix;
    if (p < 0 || p >= R * C) return;
    const x = ((p % C) * w) / C;
    const y = (Math.floor(p / C) * h) / R;
    ctx.lineWidth = 3 * px;
    ctx.strokeStyle = "rgba(0,0,0,0.85)";
    ctx.strokeRect(x, y, w / C, h / R);
    ctx.lineWidth = 1.5 * px;
    ctx.strokeStyle = colour;
    ctx.strokeRect(x, y, w / C, h / R);
  };
  if (q !== null) box(q, "#ff3b6b");
  if (hover !== null) box(hover, "#fbbf24");
}

/** The softmax row over the picture, like the main view (same colour map and opacity). */
function drawWeights(canvas, image, tokens, weights, q, hover) {
  const { w, h } = mapSize(image);
  const dpr = sizeCanvas(canvas, w, h);
  const ctx = canvas.getContext("2d");
  const range = drawComposite(ctx, canvas.width, canvas.height, {
    image, row: asRow(weights), tokens, colormap: state.colormap, opacity: Math.max(0.55, state.opacity), px: dpr,
  });
  markCells(ctx, tokens, canvas.width, canvas.height, q, hover, dpr);
  return range;
}

// ------------------------------------------------------------------ words
function tokenLabel(tokens, t) {
  if (tokens.window) return `cell (${Math.floor(t / tokens.grid[1])}, ${t % tokens.grid[1]})`; // swin: a stage cell
  if (t < tokens.num_prefix) return `${prefixLabel(t, tokens)} (token ${t})`;
  const p = t - tokens.num_prefix;
  return `patch (${Math.floor(p / tokens.grid[1])}, ${p % tokens.grid[1]})`;
}

/** What this model's attention does differently from the textbook ViT, one item per difference. */
function notes(ans) {
  if (isWindowAnswer(ans)) return windowNotes(ans);
  const t = ans.tokens;
  const kinds = t.prefix.map((p) => p.kind);
  const regs = kinds.filter((k) => k === "reg").length;
  const out = [];
  if (!kinds.includes("cls")) {
    out.push(["no-cls", `No CLS token: every one of the ${t.count} tokens is an image patch, so the query `
      + "defaults to the first patch; pick any other on the left or click the maps."]);
  }
  if (regs) {
    out.push(["registers", `${regs} register token${regs > 1 ? "s" : ""} (tokens ${kinds.indexOf("reg")}…`
      + `${kinds.lastIndexOf("reg")}): extra learned tokens that take part in attention like patches but have no `
      + "place on the picture; their scores and weights are listed beside the maps."]);
  }
  if (kinds.includes("dist")) {
    out.push(["dist", "A distillation token (DeiT) sits next to CLS: it attends and is attended to like any token."]);
  }
  if (ans.steps.rope) {
    out.push(["rope", "RoPE: q and k are rotated by their patch position after the projections (prefix tokens are "
      + "not rotated), so the q and k shown here, and their dot products, already carry position."]);
  }
  if (ans.steps.relative_bias) {
    out.push(["bias", "Relative position bias: a learned number per head and relative offset between two patches is "
      + "added to every score, score = q·k/√d + b. Hover a patch to see it."]);
  }
  if (ans.steps.qk_norm) out.push(["qk-norm", "QK-norm: q and k are normalised per head before the dot product."]);
  if (ans.steps.inner_norm) {
    out.push(["inner-norm", "A norm sits between the concatenated heads and W_O here: W_O multiplies the normalised "
      + "concatenation, so each share below is W_O's columns times the normalised slice of the head."]);
  }
  if (!ans.steps.rope && !ans.steps.relative_bias && ans.steps.absolute_pos) {
    out.push(["abs-pos", "Position enters as embeddings added to the tokens before the first block: nothing in "
      + "this layer's attention knows where a patch is except through X."]);
  }
  return out;
}

function setText(id, text) {
  const el = $(id);
  if (el.textContent !== text) el.textContent = text;
}

// ------------------------------------------------------------------ render
/** Bring the view up to date with state and the fetched answer (reads state, writes the DOM only). */
export function renderLearn() {
  renderTemperature();
  const root = $("learn-view");
  if (!root || root.hidden) return;
  const status = $("learn-status");
  const stages = $("learn-stages");
  if (!state.imageId || !state.meta || !state.image) {
    // While the first image is computed, say so (not "bring an image").
    setText("learn-status", state.busy || "Bring an image to start: the view walks one head of the model through it.");
    stages.hidden = true;
    $("learn-notes").replaceChildren();
    root.dataset.state = state.busy ? "loading" : "empty";
    return;
  }
  // Another image (or model) is on its way: the shown head stays until it is in, and says so.
  const coming = state.requests.load && state.busy ? `${state.busy} Until it is in, this is the previous image. ` : "";
  const t = target();
  const key = keyOf(t);
  const ans = answers.get(key);
  if (!ans) {
    const err = failed.get(key);
    setText("learn-status", coming + (err ? `Could not load this head: ${err.message}` : "Loading this head's tensors…"));
    root.dataset.state = err ? "error" : "loading";
    stages.hidden = !stages.dataset.key; // keep the last picture while the next one loads
    return;
  }
  root.dataset.state = "ready";
  stages.hidden = false;
  stages.dataset.key = key;
  const aggregateNote = /^\d+$/.test(state.head) ? "" : ` The maps view shows the ${state.head} of the heads; `
    + "this view follows one head, head 0: pick another on the left.";
  const where = isWindowAnswer(ans) ? ` of stage ${ans.stage}` : "";
  const seen = state.session.find((x) => x.id === ans.image_id); // state.filename is already the next image's
  status.textContent = `${coming}Layer ${ans.layer}, head ${ans.head}, query ${tokenLabel(ans.tokens, ans.query)}${where}: `
    + `the model's own numbers for ${(seen && seen.filename) || "this image"}.${aggregateNote}`;
  renderAnswer(ans);
}

function renderTemperature() {
  const T = state.temperature;
  const slider = $("temperature");
  if (document.activeElement !== slider || Math.abs(Number(slider.value) - Math.log10(T)) > 0.006) {
    slider.value = String(Math.log10(T));
  }
  setText("temperature-out", fmtT(T));
  $("temperature-reset").disabled = T === 1;
  const maps = $("map-temperature");
  if (maps) {
    if (document.activeElement !== maps) maps.value = String(Math.log10(T));
    setText("map-temperature-out", fmtT(T));
  }
}

function fmtT(T) {
  return T >= 10 || T === Math.round(T) ? String(Number(T.toPrecision(3))) : T.toFixed(2);
}

function renderAnswer(ans) {
  const root = $("learn-view");
  const tokens = ans.tokens;
  const win = isWindowAnswer(ans); // swin: the keys are the query's window, not every token
  const N = win ? ans.key_tokens.length : tokens.count; // keys of the row
  const { head_dim: d, num_heads: H, embed_dim: D } = ans;
  const T = state.temperature;
  const weights = temperedSoftmax(ans.scores, T);
  const ent = entropy(weights);
  const top = topK(weights, 5);
  const o = T === 1 ? ans.head_output : weightedSum(weights, ans.v);
  const q = ans.query;
  const hover = hoverToken !== null && hoverToken < tokens.count ? hoverToken : null;
  const qRow = win ? ans.window.query_place : q; // the query's row in K and V
  const hoverRow = win ? (placeOf(ans, hover) >= 0 ? placeOf(ans, hover) : null) : hover;
  const keyLabel = (j) => (win ? placeLabel(ans, j) : tokenLabel(tokens, j));
  Object.assign(root.dataset, {
    layer: String(ans.layer), head: String(ans.head), query: String(q), temperature: String(T),
    entropy: ent.toFixed(6), top: top.join(","), model: ans.model, image: ans.image_id,
  });
  setText("learn-title", `· layer ${ans.layer} · head ${ans.head} · query ${tokenLabel(tokens, q)}`);

  const list = $("learn-notes");
  const items = notes(ans);
  list.replaceChildren(...items.map(([id, text]) => {
    const li = document.createElement("li");
    li.dataset.note = id;
    li.textContent = text;
    return li;
  }));
  list.hidden = !items.length;

  // 1. X
  const [R, C] = tokens.grid;
  const prefix = tokens.prefix.map((p) => prefixLabel(p.index, tokens)).join(", ");
  setText("learn-x-shape", `X: ${N} × ${D}`);
  if (win) {
    const [wh, ww] = ans.window.size;
    const pad = ans.window.padding ? `, ${ans.window.padding} of them padding (zero tokens past the grid's edge)` : "";
    setText("learn-x-text", `Layer ${ans.layer} works on stage ${ans.stage}'s ${R} × ${C} grid of ${tokens.patch_size[0]} × `
      + `${tokens.patch_size[1]} px cells, each a vector of D = ${D} numbers (${ans.steps.cosine ? "Swin v2: as they "
        + "come, its LayerNorm follows the attention" : "after the block's LayerNorm"}), cut into ${wh} × ${ww} `
      + `windows. The query only meets its own window: X here is that window's N = ${N} tokens${pad}.`);
  } else {
    setText("learn-x-text", `Layer ${ans.layer} gets every token as a vector of D = ${D} numbers (after the block's `
      + `LayerNorm): ${tokens.num_prefix ? `${tokens.num_prefix} prefix token${tokens.num_prefix > 1 ? "s" : ""} (${prefix}) and ` : ""}`
      + `${R} × ${C} = ${R * C} image patches of ${tokens.patch_size[0]} × ${tokens.patch_size[1]} pixels, N = ${N} in all.`);
  }

  // 2. Q, K, V
  setText("learn-qkv-shape", `Q_h, K_h, V_h: ${N} × ${d} each = X · W (${D} × ${d})`);
  setText("learn-qkv-text", `Head ${ans.head} multiplies every token by its own three matrices W_Q, W_K and W_V `
    + `(${D} × ${d} each): a query q (what this token looks for), a key k (what it offers to be found by) and `
    + `a value v (what it passes on), ${d} numbers each${ans.steps.rope ? ", then rotates q and k by position (RoPE)" : ""}.`);
  drawStrip($("learn-q"), ans.q);
  drawMatrix($("learn-k"), ans.k, qRow, hoverRow);
  drawMatrix($("learn-v"), ans.v, qRow, hoverRow);
  setText("learn-q-caption", win
    ? `q of the query (${tokenLabel(tokens, q)}, place ${qRow} of its window): ${d} numbers`
      + `${ans.steps.cosine ? ", normalised to |q| = 1 (cosine attention)" : `, |q| = ${fmt(Math.hypot(...ans.q))}`}`
    : `q of the query (token ${q}): ${d} numbers, |q| = ${fmt(Math.hypot(...ans.q))}`);

  // 3. scores
  const scale = ans.scale;
  const sd = Math.round(1 / (scale * scale));
  setText("learn-scores-shape", `scores: 1 × ${N}`);
  const mask = ans.mask ? " + m_j" : "";
  if (win && ans.steps.cosine) {
    setText("learn-scores-text", `The query's q is compared with every key of its window by their cosine, times the `
      + `head's learned scale τ = ${fmt(scale)}: score_j = τ·cos(q, k_j) + b_j${mask}. Softmax only cares how much `
      + "higher one score is than another: red keys score above the mean of the query's region and win weight, blue "
      + "ones below it; the picture shows through where a cell is no key. Hover a cell for its numbers.");
  } else {
    const where = win ? "every key of its window" : "every key";
    setText("learn-scores-text", `The query's q is compared with ${where} by a dot product and scaled by `
      + `1/√d = 1/√${sd} = ${fmt(scale)}: score_j = q·k_j/√${sd}${ans.bias ? " + b_j" : ""}${mask}. Softmax only cares `
      + "how much higher one score is than another: red keys score above the row's mean and win weight, blue ones "
      + `below it.${win ? " The picture shows through where a cell is no key." : ""} Hover a patch for its numbers.`);
  }
  const { centre, spread } = win
    ? drawWindowScores($("learn-scores"), state.image, ans, mapSize(state.image), hover, diverging)
    : drawScores($("learn-scores"), state.image, tokens, ans.scores, q, hover);
  setText("learn-scores-range", `blue ${fmt(centre - spread)} … white ${fmt(centre)} (${win
    ? "the mean of the window's keys in the query's region" : "the patches' mean"}) … red ${fmt(centre + spread)}`
    + (ans.mask && ans.mask.some((m) => m < 0) ? " · masked keys (−100) darkest blue" : ""));

  // 4. softmax
  setText("learn-softmax-shape", `a = softmax(scores / T): 1 × ${N}, sums to 1`);
  setText("learn-softmax-text", `softmax makes the ${N} scores positive and sum to 1: a_j = e^(s_j/T) / Σ_i e^(s_i/T). `
    + "Slide the temperature: below 1 the head looks at fewer tokens, above 1 at more; T = 1 is the model."
    + (win ? " Over the window only: every other cell keeps weight 0 at any T." : ""));
  const wr = win
    ? drawWindowWeights($("learn-weights"), state.image, ans, weights, mapSize(state.image), hover, state.colormap,
      Math.max(0.55, state.opacity))
    : drawWeights($("learn-weights"), state.image, tokens, weights, q, hover);
  setText("learn-weights-range", `${state.colormap}: the patches' smallest weight ${fmt(wr.min)} … largest ${fmt(wr.max)}`);
  setText("learn-entropy", `entropy ${ent.toFixed(3)} nats = ${(ent / Math.log(N)).toFixed(3)} of the uniform row's `
    + `log ${N} · about ${Math.exp(ent).toFixed(1)} tokens' worth of attention`);
  $("learn-top").replaceChildren(...top.map((j) => {
    const li = document.createElement("li");
    li.dataset.token = String(j);
    li.textContent = `${keyLabel(j)} · ${fmt(weights[j])}`;
    return li;
  }));
  const chips = [];
  for (let j = 0; win && j < N; j++) { // swin: padding keys have no place on the picture
    if (ans.key_tokens[j] >= 0) continue;
    const li = document.createElement("li");
    li.dataset.token = String(-(j + 1));
    li.textContent = `${placeLabel(ans, j)}: score ${fmt(ans.scores[j])} → weight ${fmt(weights[j])}`;
    li.addEventListener("pointerenter", () => setHover(-(j + 1)));
    li.addEventListener("pointerleave", () => setHover(null));
    chips.push(li);
  }
  for (let j = 0; j < tokens.num_prefix; j++) {
    const li = document.createElement("li");
    li.dataset.token = String(j);
    li.textContent = `${prefixLabel(j, tokens)}: score ${fmt(ans.scores[j])} → weight ${fmt(weights[j])}`;
    li.addEventListener("pointerenter", () => setHover(j));
    li.addEventListener("pointerleave", () => setHover(null));
    chips.push(li);
  }
  $("learn-prefix").replaceChildren(...chips);
  $("learn-prefix").hidden = !chips.length;
  renderHover(ans, weights);

  // 5. weighted sum
  setText("learn-o-shape", `o_h = a · V_h: 1 × ${d}`);
  setText("learn-o-text", `The head's output for the query is the weighted average of all ${N} value vectors${win
    ? " of its window" : ""}, `
    + `o_h = Σ_j a_j v_j: ${d} numbers that mostly come from the tokens with the largest weights`
    + (T === 1 ? "." : ` (recomputed here at T = ${fmtT(T)}; the stages below show the model, T = 1).`));
  drawStrip($("learn-o"), o);

  // 6. concatenation
  setText("learn-concat-shape", `concat(o_1 … o_${H}): 1 × ${H * d}`);
  setText("learn-concat-text", `All ${H} heads of the layer do the same with their own W_Q, W_K and W_V; their outputs `
    + `for this token are put side by side into ${H} × ${d} = ${H * d} numbers (head ${ans.head}'s part outlined).`);
  const cat = $("learn-concat");
  drawStrip(cat, ans.proj_input, `${ans.head * d},${(ans.head + 1) * d}`);
  const frame = $("learn-concat-head");
  frame.style.left = `${(100 * ans.head) / H}%`;
  frame.style.width = `${100 / H}%`;

  // 7. W_O: every head's share of the output
  setText("learn-proj-shape", `y = W_O · concat + b: W_O ${D} × ${H * d} → 1 × ${D}`);
  setText("learn-proj-text", `W_O mixes the heads back into D = ${D} numbers. Each head's share is W_O's columns for `
    + "that head times its output; the shares plus W_O's bias add up to the block's attention output y, which "
    + "is then scaled (layer scale, where the model has it) and added to the token's residual stream.");
  renderShares(ans);
  drawStrip($("learn-out"), ans.attn_output);
  setText("learn-out-caption", `y: ${D} numbers, |y| = ${fmt(Math.hypot(...ans.attn_output))}`);
}

/** Bars: each head's share of y along y (c_h·y / |y|^2, summing with the bias to 1) and |c_h|. */
function renderShares(ans) {
  const y = ans.attn_output;
  const yy = y.reduce((s, v) => s + v * v, 0) || 1;
  const dot = (a) => a.reduce((s, v, i) => s + v * y[i], 0);
  const rows = ans.head_contributions.map((c, h) => ({
    label: `head ${h}`, share: dot(c) / yy, norm: Math.hypot(...c), mine: h === ans.head,
  }));
  rows.push({ label: "bias", share: dot(ans.proj_bias) / yy, norm: Math.hypot(...ans.proj_bias), mine: false });
  const span = Math.max(...rows.map((r) => Math.abs(r.share))) || 1;
  $("learn-bars").replaceChildren(...rows.map((r) => {
    const row = document.createElement("div");
    row.className = `bar-row${r.mine ? " mine" : ""}`;
    row.dataset.share = r.share.toFixed(6);
    const name = document.createElement("span");
    name.className = "bar-name";
    name.textContent = r.label;
    const track = document.createElement("span");
    track.className = "bar-track";
    const bar = document.createElement("span");
    bar.className = `bar ${r.share < 0 ? "neg" : "pos"}`;
    bar.style.width = `${(50 * Math.abs(r.share)) / span}%`;
    bar.style.left = r.share < 0 ? `${50 - (50 * Math.abs(r.share)) / span}%` : "50%";
    track.append(bar);
    const val = document.createElement("span");
    val.className = "bar-val";
    val.textContent = `${(100 * r.share).toFixed(1)}% · |c| ${fmt(r.norm)}`;
    row.append(name, track, val);
    return row;
  }));
}

/** The numbers of the key under the pointer: q·k_j, the scaled score, the bias and the weight. */
function renderHover(ans, weights) {
  const el = $("learn-hover");
  if (isWindowAnswer(ans)) {
    renderWindowHover(el, ans, weights);
    return;
  }
  const j = hoverToken;
  if (j === null || j >= ans.tokens.count) {
    el.textContent = "Hover a patch (or a prefix token) to see its numbers.";
    delete el.dataset.token;
    return;
  }
  const bias = ans.bias ? ans.bias[j] : null;
  const scaled = ans.scale * ans.dot[j];
  el.dataset.token = String(j);
  el.dataset.dot = String(ans.dot[j]);
  el.dataset.score = String(ans.scores[j]);
  el.dataset.weight = String(weights[j]);
  el.textContent = `key ${tokenLabel(ans.tokens, j)}: q·k = ${fmt(ans.dot[j])} · scaled ×${fmt(ans.scale)} = `
    + `${fmt(scaled)}${bias !== null ? ` · + bias ${fmt(bias)}` : ""} · score ${fmt(ans.scores[j])} · `
    + `weight ${fmt(weights[j])}${state.temperature === 1 ? "" : ` (T = ${fmtT(state.temperature)})`}`;
}

/** The same for a windowed answer: the hovered cell's place in the query's window, or why it is no key. */
function renderWindowHover(el, ans, weights) {
  const h = hoverToken;
  const j = placeOf(ans, h);
  delete el.dataset.place;
  if (h === null || (h >= 0 && h >= ans.tokens.count)) {
    el.textContent = "Hover a cell of the query's window (or a padding key below) to see its numbers.";
    delete el.dataset.token;
    return;
  }
  el.dataset.token = String(h);
  if (j < 0) {
    for (const k of ["dot", "score", "weight"]) delete el.dataset[k];
    el.textContent = `${tokenLabel(ans.tokens, h)} is outside the query's window: no key of this query, weight 0.`;
    return;
  }
  const mask = ans.mask ? ans.mask[j] : 0;
  el.dataset.place = String(j);
  el.dataset.dot = String(ans.dot[j]);
  el.dataset.score = String(ans.scores[j]);
  el.dataset.weight = String(weights[j]);
  el.dataset.bias = String(ans.bias[j]);
  const dot = ans.steps.cosine ? "cos(q, k)" : "q·k";
  el.textContent = `key ${placeLabel(ans, j)}, place ${j} of the window: ${dot} = ${fmt(ans.dot[j])} · scaled `
    + `×${fmt(ans.scale)} = ${fmt(ans.scale * ans.dot[j])} · + bias ${fmt(ans.bias[j])}`
    + `${ans.mask ? ` · + mask ${mask < 0 ? `${mask} (another region of the rolled grid)` : "0"}` : ""}`
    + ` · score ${fmt(ans.scores[j])} · weight ${fmt(weights[j])}`
    + `${state.temperature === 1 ? "" : ` (T = ${fmtT(state.temperature)})`}`;
}

function setHover(token) {
  if (token === hoverToken) return;
  hoverToken = token;
  renderLearn();
}

// ------------------------------------------------------------------ events
/**
 * Wire the view's controls.
 * onChange: the page's render (after the temperature is committed or the query changes);
 * setQuery: the page's query setter (a click on a map queries that patch).
 */
export function bindLearn(onChange, setQuery) {
  const fromSlider = (el) => Number(Math.pow(10, Number(el.value)).toPrecision(3));
  const slider = $("temperature");
  // While sliding: only this view, from the scores already here (no request).
  slider.addEventListener("input", () => {
    state.temperature = fromSlider(slider);
    renderLearn();
  });
  // Released: the whole page, whose maps follow the temperature (one cached GET).
  slider.addEventListener("change", () => {
    state.temperature = fromSlider(slider);
    onChange();
  });
  $("temperature-reset").addEventListener("click", () => {
    state.temperature = 1;
    onChange();
  });
  const maps = $("map-temperature");
  if (maps) {
    maps.addEventListener("input", () => setText("map-temperature-out", fmtT(fromSlider(maps))));
    maps.addEventListener("change", () => {
      state.temperature = fromSlider(maps);
      onChange();
    });
  }
  // The maps' grid: the image's tokens, or a windowed model's stage grid of the shown layer.
  const gridOf = () => (isWindowed(state.meta) ? tokensAt(state.meta, state.layer) : state.meta.tokens);
  for (const id of ["learn-scores", "learn-weights"]) {
    const canvas = $(id);
    canvas.addEventListener("pointermove", (e) => {
      if (!state.meta) return;
      const t = gridOf();
      const cell = cellAt(canvas, e, t);
      setHover(cell ? t.num_prefix + cell.r * t.grid[1] + cell.c : null);
    });
    canvas.addEventListener("pointerleave", () => setHover(null));
    canvas.addEventListener("click", (e) => {
      if (!state.meta) return;
      const t = gridOf();
      const cell = cellAt(canvas, e, t);
      if (!cell) return;
      // swin: the page's query is a cell of stage 0; the stage cell's top-left stage-0 cell maps back to it
      const s0 = t.window ? state.meta.stages[0].cell_size : t.patch_size;
      const q = `patch:${(cell.r * t.patch_size[0]) / s0[0]},${(cell.c * t.patch_size[1]) / s0[1]}`;
      if (parseQuery(q, state.meta.tokens)) setQuery(q);
    });
  }
}

/**
 * The view object (views.js). This module still keeps its answers and the hovered key in
 * module variables and its slider writes state.temperature itself (actions.update() re-tempers
 * the stores); render() returns early while the view is hidden.
 */
export const learnView = {
  name: "learn",
  render: () => renderLearn(),
  need: (s, app) => {
    needLearn(app.update, (e) => app.fail(e));
    return false;
  },
  bind: (act) => bindLearn(act.update, act.setQuery),
};

/** The temperature a log-scale slider stands at (3 significant digits). */
export function sliderTemperature(el) {
  return Number(Math.pow(10, Number(el.value)).toPrecision(3));
}
