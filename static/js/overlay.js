// Canvas rendering of an attention row over the image: colour-mapped patch values stretched
// over the whole picture (the model input is a resize of the whole image, so grid cell (r, c)
// covers rows r/R..(r+1)/R and columns c/C..(c+1)/C of it at any aspect ratio).

import { lut } from "./colormaps.js";
import { drawMaskOutline, massMask } from "./mask.js";
import { drawWindows } from "./windows.js";

let scratch = null; // the small canvas the colour-mapped grid is painted into (made on first use)

/** The patch part of a row, with its min and max: {values, min, max} (values row-major). */
export function patchValues(row, tokens) {
  const [R, C] = tokens.grid;
  const values = row.subarray(tokens.num_prefix, tokens.num_prefix + R * C);
  let min = Infinity;
  let max = -Infinity;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v < min) min = v;
    if (v > max) max = v;
  }
  return { values, min, max };
}

/** Paint the colour-mapped grid (cols x rows pixels) into the scratch canvas. */
function paintGrid(values, R, C, min, max, colormap) {
  const table = lut(colormap);
  if (!scratch) scratch = document.createElement("canvas");
  if (scratch.width !== C || scratch.height !== R) {
    scratch.width = C;
    scratch.height = R;
  }
  const sctx = scratch.getContext("2d");
  const img = sctx.createImageData(C, R);
  const span = max - min;
  for (let i = 0; i < R * C; i++) {
    const t = span > 0 ? (values[i] - min) / span : 0.5;
    const k = 3 * Math.max(0, Math.min(255, Math.round(t * 255)));
    img.data[4 * i] = table[k];
    img.data[4 * i + 1] = table[k + 1];
    img.data[4 * i + 2] = table[k + 2];
    img.data[4 * i + 3] = 255;
  }
  sctx.putImageData(img, 0, 0);
  return scratch;
}

/** Small rings on the cells of the given tokens (artifact tokens): dark halo, orange ring. */
function drawRings(ctx, indices, tokens, w, h, px) {
  const [R, C] = tokens.grid;
  const cw = w / C;
  const ch = h / R;
  const rad = Math.max(2.5 * px, 0.36 * Math.min(cw, ch));
  ctx.save();
  for (const [width, colour] of [[3.5 * px, "rgba(0,0,0,0.8)"], [1.6 * px, "#fb923c"]]) {
    ctx.lineWidth = width;
    ctx.strokeStyle = colour;
    ctx.beginPath();
    for (const t of indices) {
      const p = t - tokens.num_prefix;
      if (p < 0 || p >= R * C) continue;
      const x = (p % C + 0.5) * cw;
      const y = (Math.floor(p / C) + 0.5) * ch;
      ctx.moveTo(x + rad, y);
      ctx.arc(x, y, rad, 0, 2 * Math.PI);
    }
    ctx.stroke();
  }
  ctx.restore();
}

/**
 * Draw image + attention overlay into ctx over (0, 0, w, h).
 * opts: {image, row, tokens, colormap, opacity, grid, smooth, marker: {r, c} | null, px: line width unit,
 *        mask: fraction | null (outline the mass-threshold set of patches), rings: [token] | null}
 * Returns {min, max, maskCount} of the shown map (null without a row).
 */
export function drawComposite(ctx, w, h, opts) {
  const { image, row, tokens, colormap = "viridis", opacity = 0.6, grid = false, smooth = false,
    marker = null, px = 1, mask = null, rings = null } = opts;
  ctx.save();
  ctx.clearRect(0, 0, w, h);
  ctx.imageSmoothingEnabled = true;
  ctx.imageSmoothingQuality = "high";
  if (image) ctx.drawImage(image, 0, 0, w, h);
  let range = null;
  const [R, C] = tokens.grid;
  // The grid's extent on the canvas: the picture, or more where a windowed model's patch merging
  // padded an odd grid (its last cells reach past the picture's edge and are clipped).
  const ew = w * (tokens.extent ? tokens.extent[1] : 1);
  const eh = h * (tokens.extent ? tokens.extent[0] : 1);
  if (row) {
    const { values, min, max } = patchValues(row, tokens);
    range = { min, max };
    const map = paintGrid(values, R, C, min, max, colormap);
    ctx.globalAlpha = opacity;
    ctx.imageSmoothingEnabled = smooth;
    ctx.drawImage(map, 0, 0, C, R, 0, 0, ew, eh);
    ctx.globalAlpha = 1;
    ctx.imageSmoothingEnabled = true;
    if (mask) {
      const m = massMask(values, mask);
      range.maskCount = m.count;
      drawMaskOutline(ctx, m.mask, R, C, ew, eh, px);
    }
  }
  if (grid) {
    ctx.strokeStyle = "rgba(255,255,255,0.35)";
    ctx.lineWidth = px;
    ctx.beginPath();
    for (let c = 1; c < C; c++) {
      const x = Math.round((c * ew) / C) + 0.5 * (px % 2);
      ctx.moveTo(x, 0);
      ctx.lineTo(x, h);
    }
    for (let r = 1; r < R; r++) {
      const y = Math.round((r * eh) / R) + 0.5 * (px % 2);
      ctx.moveTo(0, y);
      ctx.lineTo(w, y);
    }
    ctx.stroke();
  }
  if (tokens.window) drawWindows(ctx, tokens, marker, ew, eh, px);
  if (rings && rings.length) drawRings(ctx, rings, tokens, ew, eh, px);
  if (marker) {
    const x0 = (marker.c * ew) / C;
    const y0 = (marker.r * eh) / R;
    const cw = ew / C;
    const ch = eh / R;
    ctx.lineWidth = 3 * px;
    ctx.strokeStyle = "rgba(0,0,0,0.85)";
    ctx.strokeRect(x0, y0, cw, ch);
    ctx.lineWidth = 1.5 * px;
    ctx.strokeStyle = "#ff3b6b";
    ctx.strokeRect(x0, y0, cw, ch);
  }
  ctx.restore();
  return range;
}

/** Fit (iw x ih) into (maxW x maxH) keeping the aspect ratio. */
export function fit(iw, ih, maxW, maxH) {
  const s = Math.min(maxW / iw, maxH / ih);
  return { w: Math.max(1, Math.round(iw * s)), h: Math.max(1, Math.round(ih * s)) };
}

/** Size a canvas to CSS (w x h) at the device pixel ratio; returns the ratio used. */
export function sizeCanvas(canvas, w, h) {
  const dpr = Math.min(3, window.devicePixelRatio || 1);
  const pw = Math.round(w * dpr);
  const ph = Math.round(h * dpr);
  if (canvas.width !== pw) canvas.width = pw;
  if (canvas.height !== ph) canvas.height = ph;
  canvas.style.width = `${w}px`;
  canvas.style.height = `${h}px`;
  return dpr;
}

/** The grid cell under a pointer event on a canvas showing the whole image. */
export function cellAt(canvas, ev, tokens) {
  const rect = canvas.getBoundingClientRect();
  const x = (ev.clientX - rect.left) / rect.width;
  const y = (ev.clientY - rect.top) / rect.height;
  if (!(x >= 0 && x < 1 && y >= 0 && y < 1)) return null;
  const [R, C] = tokens.grid;
  const [ey, ex] = tokens.extent || [1, 1];
  return { r: Math.min(R - 1, Math.floor((y * R) / ey)), c: Math.min(C - 1, Math.floor((x * C) / ex)) };
}

/** Format an attention weight for labels: at least 3 significant figures (0.0126, not 0.013). */
export function fmt(v) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "–";
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 0.1) return v.toFixed(3);
  if (a >= 0.01) return v.toPrecision(3);
  return v.toExponential(2);
}
