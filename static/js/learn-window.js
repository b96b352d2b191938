// "Inside a head" for windowed models (Swin): the explain answer's keys are the query's window,
// W x W places of the (rolled, padded) stage grid, `key_tokens[j]` the stage cell at place j or -1
// for padding. The maps are drawn on the layer's stage grid: the window's cells coloured, every
// other cell left as the picture (it is no key of this query), the query's window outlined (in
// shifted blocks as the pieces that wrap round the edges) like the main view does.

import { drawWindows, layerTokens } from "./windows.js";
import { drawComposite, fmt, sizeCanvas } from "./overlay.js";

/** Whether an explain answer is a windowed model's (its keys are a window). */
export function isWindowAnswer(ans) {
  return !!(ans && ans.window && Array.isArray(ans.stages));
}

/** The layer's stage tokens of an answer: grid, window, shift and extent (windows.js layerTokens). */
export function answerTokens(ans) {
  return layerTokens(ans, ans.layer);
}

/** The key place of a hovered thing: a stage cell (>= 0), or a padding place -(j + 1); -1 if none. */
export function placeOf(ans, hover) {
  if (hover === null || hover === undefined) return -1;
  if (hover < 0) return -hover - 1;
  return ans.key_tokens.indexOf(hover);
}

/** A label for key place j: its stage cell, or padding. */
export function placeLabel(ans, j) {
  const t = ans.key_tokens[j];
  if (t < 0) return `padding (place ${j})`;
  const C = ans.tokens.grid[1];
  return `cell (${Math.floor(t / C)}, ${t % C})`;
}

/** Values over the window's places, scattered onto the stage grid (0 outside the window, and for padding). */
export function scatter(ans, values) {
  const [R, C] = ans.tokens.grid;
  const out = new Float32Array(R * C);
  ans.key_tokens.forEach((t, j) => {
    if (t >= 0) out[t] = values[j];
  });
  return out;
}

/** The keys the query's own region keeps: real cells that the shift mask did not push to -100. */
function kept(ans, j) {
  return ans.key_tokens[j] >= 0 && !(ans.mask && ans.mask[j] < 0);
}

function box(ctx, cell, C, cw, ch, colour, px) {
  const x = (cell % C) * cw;
  const y = Math.floor(cell / C) * ch;
  ctx.lineWidth = 3 * px;
  ctx.strokeStyle = "rgba(0,0,0,0.85)";
  ctx.strokeRect(x, y, cw, ch);
  ctx.lineWidth = 1.5 * px;
  ctx.strokeStyle = colour;
  ctx.strokeRect(x, y, cw, ch);
}

function marks(ctx, ans, lt, ew, eh, hover, px) {
  const [R, C] = lt.grid;
  const cw = ew / C;
  const ch = eh / R;
  const marker = { r: Math.floor(ans.query / C), c: ans.query % C };
  drawWindows(ctx, lt, marker, ew, eh, px);
  box(ctx, ans.query, C, cw, ch, "#ff3b6b", px);
  if (hover !== null && hover >= 0) box(ctx, hover, C, cw, ch, "#fbbf24", px);
}

/**
 * The window's scores on the stage grid over the picture, diverging colours centred on the mean of
 * the keys in the query's own region (masked keys, at -100, are clamped to the darkest blue; they
 * would flatten every other colour). Returns {centre, spread}.
 */
export function drawWindowScores(canvas, image, ans, size, hover, diverging) {
  const lt = answerTokens(ans);
  const { w, h } = size;
  const px = sizeCanvas(canvas, w, h);
  const ctx = canvas.getContext("2d");
  const [R, C] = lt.grid;
  const ew = canvas.width * lt.extent[1];
  const eh = canvas.height * lt.extent[0];
  const keep = ans.scores.map((_, j) => j).filter((j) => kept(ans, j));
  const centre = keep.reduce((s, j) => s + ans.scores[j], 0) / Math.max(1, keep.length);
  const spread = keep.reduce((m, j) => Math.max(m, Math.abs(ans.scores[j] - centre)), 0) || 1;
  const grid = document.createElement("canvas");
  grid.width = C;
  grid.height = R;
  const g = grid.getContext("2d");
  const img = g.createImageData(C, R);
  ans.key_tokens.forEach((t, j) => {
    if (t < 0) return;
    const [r, gg, b] = diverging((ans.scores[j] - centre) / spread);
    img.data.set([r, gg, b, 255], 4 * t);
  });
  g.putImageData(img, 0, 0);
  ctx.save();
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.globalAlpha = 0.45; // the picture, faint: cells outside the window are no keys of this query
  ctx.drawImage(image, 0, 0, canvas.width, canvas.height);
  ctx.globalAlpha = 1;
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(grid, 0, 0, C, R, 0, 0, ew, eh);
  ctx.imageSmoothingEnabled = true;
  marks(ctx, ans, lt, ew, eh, hover, px);
  ctx.restore();
  canvas.dataset.centre = String(centre);
  canvas.dataset.keys = String(keep.length);
  return { centre, spread };
}

/** The tempered softmax over the window on the stage grid, like the main view's overlay. */
export function drawWindowWeights(canvas, image, ans, weights, size, hover, colormap, opacity) {
  const lt = answerTokens(ans);
  const px = sizeCanvas(canvas, size.w, size.h);
  const ctx = canvas.getContext("2d");
  const [R, C] = lt.grid;
  const marker = { r: Math.floor(ans.query / C), c: ans.query % C };
  const range = drawComposite(ctx, canvas.width, canvas.height, {
    image, row: scatter(ans, weights), tokens: lt, colormap, opacity, px, marker,
  });
  if (hover !== null && hover >= 0) {
    box(ctx, hover, C, (canvas.width * lt.extent[1]) / C, (canvas.height * lt.extent[0]) / R, "#fbbf24", px);
  }
  return range;
}

/** What a windowed layer does differently, one item per difference ([id, text]). */
export function windowNotes(ans) {
  const lt = answerTokens(ans);
  const [R, C] = lt.grid;
  const [wh, ww] = ans.window.size;
  const [sh, sw] = ans.window.shift;
  const A = ans.key_tokens.length;
  const out = [["window", `Swin: windowed attention. Layer ${ans.layer} is in stage ${ans.stage}, a ${R} × ${C} grid of `
    + `${lt.patch_size[1]} × ${lt.patch_size[0]} px cells; the query attends only to the ${wh} × ${ww} = ${A} places of `
    + "its window (outlined on the maps), so K, V, the scores and the softmax have one entry per place, not one per "
    + "cell. Cells outside the window are no keys of this query: their weight is 0. There is no CLS token."]];
  if (sh || sw) {
    out.push(["shift-mask", `Shifted windows: this block rolls the grid by ${sh} × ${sw} cells first, so a window at an `
      + "edge holds cells from the opposite edge too (the dashed pieces). The block adds a mask m = -100 to the scores "
      + "between cells that the roll brought together, so they get (almost) no weight: score = … + m."]);
  }
  if (ans.window.padding) {
    out.push(["padding", `${ans.window.padding} of the window's places are padding: the grid is not a multiple of `
      + `${wh} × ${ww}, so the block adds zero tokens at the bottom and right. They have no cell on the picture, but `
      + "they are keys like any other: their scores and weights are listed below the maps, and the row over the "
      + "picture sums to 1 less their weight."]);
  }
  if (ans.steps.cosine) {
    out.push(["cosine", `Swin v2: cosine attention. q and k are normalised to length 1, so q·k is their cosine (−1 … 1), `
      + `multiplied by a learned scale per head, here ×${fmt(ans.scale)} (at most 100), instead of 1/√d.`]);
  }
  out.push(["bias", ans.steps.cosine
    ? "Relative position bias: a small MLP of the offset between two places of the window gives a number per head, "
      + "16·sigmoid of which is added to every score, score = τ·cos(q, k) + b. Hover or tap a cell to see it."
    : "Relative position bias: a learned number per head and offset between two places of the window is added to "
      + "every score, score = q·k/√d + b. Hover or tap a cell to see it."]);
  return out;
}
