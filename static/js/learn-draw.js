// "Inside a head": the drawings. Vectors as strips and matrices as heat pictures in a diverging
// map (blue below zero, white at zero, red above), and the scores and the softmax row over the
// picture. Each function takes what it draws as arguments and writes only its canvas.

import { drawComposite, fit, sizeCanvas } from "./overlay.js";

// A diverging map (ColorBrewer RdBu, reversed): blue below zero, white at zero, red above.
const RDBU = ["#053061", "#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7",
  "#fddbc7", "#f4a582", "#d6604d", "#b2182b", "#67001f"].map((h) => {
  const v = parseInt(h.slice(1), 16);
  return [(v >> 16) & 255, (v >> 8) & 255, v & 255];
});

/** RGB of t in [-1, 1] on the diverging map. */
export function diverging(t) {
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
export function drawStrip(canvas, values, marks = null) {
  const n = values.length;
  paintCells(canvas, values, 1, n, maxAbs(values));
  canvas.style.width = `${Math.min(640, Math.max(160, n * 4))}px`;
  canvas.dataset.length = String(n);
  if (marks) canvas.dataset.marks = marks;
}

/** A matrix [N][d] as a heat picture (N rows of d cells), with the query's row and the hovered one marked. */
export function drawMatrix(canvas, m, query, hover) {
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

export function mapSize(image) {
  return fit(image.naturalWidth, image.naturalHeight, 300, 300);
}

/**
 * Scores over the patch grid in diverging colours centred on their mean (softmax ignores a
 * shift of the whole row, so above or below the mean is what decides), query and hover marked.
 * Returns {centre, spread}.
 */
export function drawScores(canvas, image, tokens, scores, q, hover) {
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

/** The softmax row over the picture, like the main view (its colour map and opacity, at least 0.55). */
export function drawWeights(canvas, image, tokens, weights, q, hover, colormap, opacity) {
  const { w, h } = mapSize(image);
  const dpr = sizeCanvas(canvas, w, h);
  const ctx = canvas.getContext("2d");
  const range = drawComposite(ctx, canvas.width, canvas.height, {
    image, row: asRow(weights), tokens, colormap, opacity: Math.max(0.55, opacity), px: dpr,
  });
  markCells(ctx, tokens, canvas.width, canvas.height, q, hover, dpr);
  return range;
}
