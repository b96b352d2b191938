// "Inside a head": the stages of one head's computation for the query token, drawn from the
// explain answer (GET /api/v1/attention/{id}/explain) at the page's temperature: X -> Q_h, K_h,
// V_h -> scores -> softmax -> o_h = sum_j a_j v_j -> the H heads concatenated -> W_O, every
// head's share as a bar; and the numbers of the key under the pointer. Reads the state, writes
// the DOM.

import { $, fmtTemperature, setText } from "./dom.js";
import { diverging, drawMatrix, drawScores, drawStrip, drawWeights, mapSize } from "./learn-draw.js";
import { entropy, temperedSoftmax, topK, weightedSum } from "./learn-math.js";
import {
  drawWindowScores, drawWindowWeights, isWindowAnswer, placeLabel, placeOf,
} from "./learn-window.js";
import { notes, tokenLabel } from "./learn-words.js";
import { describeCanvas, gridWords, mapWords } from "./map-text.js";
import { fmt } from "./overlay.js";
import { prefixLabel } from "./state.js";

/**
 * Draw one head's computation: the explain answer `ans` at softmax temperature `T` (the slider's,
 * while it moves), with the key under the pointer `s.learn.hover` marked; onHover(token) as the
 * pointer enters or leaves a listed key.
 */
export function renderAnswer(s, ans, T, onHover) {
  const root = $("learn-view");
  const tokens = ans.tokens;
  const win = isWindowAnswer(ans); // swin: the keys are the query's window, not every token
  const N = win ? ans.key_tokens.length : tokens.count; // keys of the row
  const { head_dim: d, num_heads: H, embed_dim: D } = ans;
  const weights = temperedSoftmax(ans.scores, T);
  const ent = entropy(weights);
  const top = topK(weights, 5);
  const o = T === 1 ? ans.head_output : weightedSum(weights, ans.v);
  const q = ans.query;
  const hover = s.learn.hover !== null && s.learn.hover < tokens.count ? s.learn.hover : null;
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
      + "ones below it; the picture shows through where a cell is no key. Hover or tap a cell for its numbers.");
  } else {
    const where = win ? "every key of its window" : "every key";
    setText("learn-scores-text", `The query's q is compared with ${where} by a dot product and scaled by `
      + `1/√d = 1/√${sd} = ${fmt(scale)}: score_j = q·k_j/√${sd}${ans.bias ? " + b_j" : ""}${mask}. Softmax only cares `
      + "how much higher one score is than another: red keys score above the row's mean and win weight, blue ones "
      + `below it.${win ? " The picture shows through where a cell is no key." : ""} Hover or tap a patch for its numbers.`);
  }
  const { centre, spread } = win
    ? drawWindowScores($("learn-scores"), s.image, ans, mapSize(s.image), hover, diverging)
    : drawScores($("learn-scores"), s.image, tokens, ans.scores, q, hover);
  setText("learn-scores-range", `blue ${fmt(centre - spread)} … white ${fmt(centre)} (${win
    ? "the mean of the window's keys in the query's region" : "the patches' mean"}) … red ${fmt(centre + spread)}`
    + (ans.mask && ans.mask.some((m) => m < 0) ? " · masked keys (−100) darkest blue" : ""));
  describeCanvas($("learn-scores"), scoresWords(ans, win, centre));

  // 4. softmax
  setText("learn-softmax-shape", `a = softmax(scores / T): 1 × ${N}, sums to 1`);
  setText("learn-softmax-text", `softmax makes the ${N} scores positive and sum to 1: a_j = e^(s_j/T) / Σ_i e^(s_i/T). `
    + "Slide the temperature: below 1 the head looks at fewer tokens, above 1 at more; T = 1 is the model."
    + (win ? " Over the window only: every other cell keeps weight 0 at any T." : ""));
  const wr = win
    ? drawWindowWeights($("learn-weights"), s.image, ans, weights, mapSize(s.image), hover, s.colormap,
      Math.max(0.55, s.opacity))
    : drawWeights($("learn-weights"), s.image, tokens, weights, q, hover, s.colormap, s.opacity);
  setText("learn-weights-range", `${s.colormap}: the patches' smallest weight ${fmt(wr.min)} … largest ${fmt(wr.max)}`);
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
    hoverable(li, -(j + 1), onHover);
    chips.push(li);
  }
  for (let j = 0; j < tokens.num_prefix; j++) {
    const li = document.createElement("li");
    li.dataset.token = String(j);
    li.textContent = `${prefixLabel(j, tokens)}: score ${fmt(ans.scores[j])} → weight ${fmt(weights[j])}`;
    hoverable(li, j, onHover);
    chips.push(li);
  }
  $("learn-prefix").replaceChildren(...chips);
  $("learn-prefix").hidden = !chips.length;
  renderHover(s, ans, weights, T);

  // 5. weighted sum
  setText("learn-o-shape", `o_h = a · V_h: 1 × ${d}`);
  setText("learn-o-text", `The head's output for the query is the weighted average of all ${N} value vectors${win
    ? " of its window" : ""}, `
    + `o_h = Σ_j a_j v_j: ${d} numbers that mostly come from the tokens with the largest weights`
    + (T === 1 ? "." : ` (recomputed here at T = ${fmtTemperature(T)}; the stages below show the model, T = 1).`));
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

/** A listed key shows its numbers while a mouse is over it, and after a tap until the next one:
 * a finger's pointerleave comes right after its tap. */
function hoverable(li, token, onHover) {
  li.addEventListener("pointerenter", () => onHover(token));
  li.addEventListener("pointerleave", (e) => { if (e.pointerType === "mouse") onHover(null); });
}

/** The numbers of the key under the pointer: q·k_j, the scaled score, the bias and the weight. */
function renderHover(s, ans, weights, T) {
  const el = $("learn-hover");
  if (isWindowAnswer(ans)) {
    renderWindowHover(el, ans, weights, s.learn.hover, T);
    return;
  }
  const j = s.learn.hover;
  if (j === null || j >= ans.tokens.count) {
    setText(el, "Hover or tap a patch (or a prefix token) to see its numbers."); // a live region: only new words
    delete el.dataset.token;
    return;
  }
  const bias = ans.bias ? ans.bias[j] : null;
  const scaled = ans.scale * ans.dot[j];
  el.dataset.token = String(j);
  el.dataset.dot = String(ans.dot[j]);
  el.dataset.score = String(ans.scores[j]);
  el.dataset.weight = String(weights[j]);
  setText(el, `key ${tokenLabel(ans.tokens, j)}: q·k = ${fmt(ans.dot[j])} · scaled ×${fmt(ans.scale)} = `
    + `${fmt(scaled)}${bias !== null ? ` · + bias ${fmt(bias)}` : ""} · score ${fmt(ans.scores[j])} · `
    + `weight ${fmt(weights[j])}${T === 1 ? "" : ` (T = ${fmtTemperature(T)})`}`);
}

/** The same for a windowed answer: the hovered cell's place in the query's window, or why it is no key. */
function renderWindowHover(el, ans, weights, h, T) {
  const j = placeOf(ans, h);
  delete el.dataset.place;
  if (h === null || (h >= 0 && h >= ans.tokens.count)) {
    setText(el, "Hover or tap a cell of the query's window (or a padding key below) to see its numbers.");
    delete el.dataset.token;
    return;
  }
  el.dataset.token = String(h);
  if (j < 0) {
    for (const k of ["dot", "score", "weight"]) delete el.dataset[k];
    setText(el, `${tokenLabel(ans.tokens, h)} is outside the query's window: no key of this query, weight 0.`);
    return;
  }
  const mask = ans.mask ? ans.mask[j] : 0;
  el.dataset.place = String(j);
  el.dataset.dot = String(ans.dot[j]);
  el.dataset.score = String(ans.scores[j]);
  el.dataset.weight = String(weights[j]);
  el.dataset.bias = String(ans.bias[j]);
  const dot = ans.steps.cosine ? "cos(q, k)" : "q·k";
  setText(el, `key ${placeLabel(ans, j)}, place ${j} of the window: ${dot} = ${fmt(ans.dot[j])} · scaled `
    + `×${fmt(ans.scale)} = ${fmt(ans.scale * ans.dot[j])} · + bias ${fmt(ans.bias[j])}`
    + `${ans.mask ? ` · + mask ${mask < 0 ? `${mask} (another region of the rolled grid)` : "0"}` : ""}`
    + ` · score ${fmt(ans.scores[j])} · weight ${fmt(weights[j])}`
    + `${T === 1 ? "" : ` (T = ${fmtTemperature(T)})`}`);
}

/**
 * The scores map in words (its accessible description): the keys on the picture with the highest
 * scores and the lowest, and the mean the colours are centred on.
 */
export function scoresWords(ans, win, centre) {
  const mean = ` Colours centred on the mean, ${fmt(centre)}.`;
  if (!win) {
    const { grid: [R, C], num_prefix: P } = ans.tokens; // a window's answer has no whole grid
    return `Scores. ${gridWords(ans.scores.slice(P, P + R * C), R, C)}${mean}`;
  }
  const keys = [];
  ans.key_tokens.forEach((t, j) => {
    if (t >= 0) keys.push({ name: placeLabel(ans, j), v: ans.scores[j] });
  });
  return `Scores of the ${keys.length} keys of the query's window on the picture. ${mapWords(keys)}${mean}`;
}
