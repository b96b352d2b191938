// The figure downloads: the image and its overlay at the picture's own resolution, and under it a
// legend band (what is shown: layer, head, query, model; the colour bar with its scale; a caption
// that wraps, never cut), so the file explains itself on a slide or in a paper.
//
// PNG: one raster; the same facts go into its iTXt chunks ("Title", "Description", and
// "headscope": JSON) for programs. SVG: the picture with its overlay as an embedded PNG, and the
// title, scale, colour bar (a vector gradient) and caption as vectors; the facts go into its
// <title>, <desc> and <metadata>. Both are laid out by figureLayout(), so they read the same.

import { lut } from "./colormaps.js";
import { drawComposite, fmt } from "./overlay.js";
import { artifactTokens, shownRow } from "./sinks.js";
import { headLabel, markerAt, nameOf, parseQuery, queryLabel, tokensAt } from "./state.js";
import { selection } from "./viewer.js";

const MIN_WIDTH = 360; // narrower pictures are centred on a band this wide, so the legend fits
const BG = "#0b1120";
const FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
const MONO = "ui-monospace, Menlo, Consolas, monospace";
const COLOURS = { title: "#e2e8f0", scale: "#cbd5e1", caption: "#94a3b8" };

/**
 * Where everything of a figure goes, for an image of iw x ih pixels: {W, H, x0 (the picture's
 * left edge), u (the scale of text and bar), pad, band (the legend's height), title: {x, y, size},
 * bar: {x, y, w, h}, lo, hi: {x, y, text} (the scale's ends), caption: {x, y: [..], size, lines}}.
 * `ctx` measures text (a 2D context); y values are tops of text lines.
 */
export function figureLayout(ctx, iw, ih, title, caption, range) {
  const W = Math.max(iw, MIN_WIDTH);
  const u = Math.max(1, W / 640); // text and bar scale with the picture
  const pad = Math.round(12 * u);
  const gap = Math.round(8 * u);
  const line = Math.round(17 * u);
  const captionSize = Math.round(12 * u);
  ctx.font = `${captionSize}px ${FONT}`;
  const lines = wrapText(ctx, caption, W - 2 * pad); // the caption wraps: the band grows with it
  const band = Math.round(92 * u) + line * (lines.length - 1);
  const titleSize = Math.round(14 * u);
  ctx.font = `600 ${titleSize}px ${FONT}`;
  const titleText = fitText(ctx, title, W - 2 * pad);
  const barY = ih + pad + Math.round(22 * u);
  const barH = Math.round(12 * u);
  ctx.font = `${captionSize}px ${MONO}`;
  const lo = range ? fmt(range.min) : "–";
  const hi = range ? fmt(range.max) : "–";
  const loW = ctx.measureText(lo).width;
  const hiW = ctx.measureText(hi).width;
  const bx = pad + loW + gap;
  const bw = Math.max(40, W - 2 * pad - loW - hiW - 2 * gap);
  const capY = barY + barH + Math.round(10 * u);
  return {
    W, H: ih + band, x0: Math.floor((W - iw) / 2), u, pad, band,
    title: { x: pad, y: ih + pad, size: titleSize, text: titleText },
    bar: { x: bx, y: barY, w: bw, h: barH },
    lo: { x: pad, y: barY + barH / 2, text: lo, size: captionSize },
    hi: { x: bx + bw + gap, y: barY + barH / 2, text: hi, size: captionSize },
    caption: { x: pad, y: lines.map((_, i) => capY + line * i), size: captionSize, lines },
  };
}

/** The colour map's colours at n + 1 even stops: [[offset, "rgb(r,g,b)"], ...]. */
function gradientStops(colormap, n) {
  const table = lut(colormap);
  return Array.from({ length: n + 1 }, (_, i) => {
    const k = 3 * Math.round((i / n) * 255);
    return [i / n, `rgb(${table[k]},${table[k + 1]},${table[k + 2]})`];
  });
}

/** The picture with its overlay, at its own resolution, on a canvas; returns {canvas, range}. */
function composite(opts) {
  const { image } = opts;
  const canvas = document.createElement("canvas");
  canvas.width = image.naturalWidth;
  canvas.height = image.naturalHeight;
  const px = Math.max(1, Math.round(Math.max(canvas.width, canvas.height) / 800));
  const range = drawComposite(canvas.getContext("2d"), canvas.width, canvas.height, { ...opts, px });
  return { canvas, range };
}

/** The JSON facts of a figure: the legend's, the scale's ends and the band's height. */
function facts(legend, range, band) {
  return { ...legend.meta, min: range && range.min, max: range && range.max, legend_px: band };
}

/**
 * A PNG Blob of image + overlay + legend.
 * opts: the drawComposite options ({image, row, tokens, colormap, opacity, ...}).
 * legend: {title, subtitle, meta}: the title, the caption and the JSON-ready facts.
 */
export async function exportPng(opts, legend) {
  const { canvas: pic, range } = composite(opts);
  const canvas = document.createElement("canvas");
  const ctx = canvas.getContext("2d");
  const f = figureLayout(ctx, pic.width, pic.height, legend.title, legend.subtitle, range);
  canvas.width = f.W;
  canvas.height = f.H;
  ctx.fillStyle = BG;
  ctx.fillRect(0, 0, f.W, f.H);
  ctx.drawImage(pic, f.x0, 0);
  ctx.textBaseline = "top";
  ctx.fillStyle = COLOURS.title;
  ctx.font = `600 ${f.title.size}px ${FONT}`;
  ctx.fillText(f.title.text, f.title.x, f.title.y);
  ctx.font = `${f.lo.size}px ${MONO}`;
  ctx.fillStyle = COLOURS.scale;
  ctx.textBaseline = "middle";
  ctx.fillText(f.lo.text, f.lo.x, f.lo.y);
  ctx.fillText(f.hi.text, f.hi.x, f.hi.y);
  const grad = ctx.createLinearGradient(f.bar.x, 0, f.bar.x + f.bar.w, 0);
  for (const [at, colour] of gradientStops(opts.colormap, 16)) grad.addColorStop(at, colour);
  ctx.fillStyle = grad;
  ctx.fillRect(f.bar.x, f.bar.y, f.bar.w, f.bar.h);
  ctx.textBaseline = "top";
  ctx.fillStyle = COLOURS.caption;
  ctx.font = `${f.caption.size}px ${FONT}`;
  f.caption.lines.forEach((text, i) => ctx.fillText(text, f.caption.x, f.caption.y[i]));
  const blob = await new Promise((resolve, reject) => {
    canvas.toBlob((b) => (b ? resolve(b) : reject(new Error("the PNG could not be made"))), "image/png");
  });
  return withText(blob, {
    Title: legend.title,
    Description: `${legend.title} · ${legend.subtitle}`,
    headscope: JSON.stringify(facts(legend, range, f.band)),
  });
}

/** Text for XML: &, <, >, quotes escaped. */
function xml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&apos;" })[c]);
}

/**
 * An SVG Blob of the same figure: the picture with its overlay embedded as a PNG (data: URL), the
 * title, the scale's ends, the colour bar (a linearGradient of the colour map) and the caption
 * as vector text and shapes. Same arguments as exportPng.
 */
export async function exportSvg(opts, legend) {
  const { canvas: pic, range } = composite(opts);
  const f = figureLayout(document.createElement("canvas").getContext("2d"), pic.width, pic.height,
    legend.title, legend.subtitle, range);
  const stops = gradientStops(opts.colormap, 32)
    .map(([at, colour]) => `<stop offset="${at.toFixed(4)}" stop-color="${colour}"/>`).join("");
  const text = (t, x, y, size, fill, baseline, extra = "") => `<text x="${x}" y="${y}" font-size="${size}" fill="${fill}" `
    + `dominant-baseline="${baseline}"${extra}>${xml(t)}</text>`;
  const meta = JSON.stringify(facts(legend, range, f.band));
  const svg = [
    '<?xml version="1.0" encoding="UTF-8"?>',
    `<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" version="1.1" `
      + `width="${f.W}" height="${f.H}" viewBox="0 0 ${f.W} ${f.H}" font-family="${xml(FONT)}">`,
    `<title>${xml(legend.title)}</title>`,
    `<desc>${xml(`${legend.title} · ${legend.subtitle}`)}</desc>`,
    `<metadata id="headscope" data-format="application/json">${xml(meta)}</metadata>`,
    `<defs><linearGradient id="colour-bar" x1="0" y1="0" x2="1" y2="0">${stops}</linearGradient></defs>`,
    `<rect width="${f.W}" height="${f.H}" fill="${BG}"/>`,
    `<image id="map" x="${f.x0}" y="0" width="${pic.width}" height="${pic.height}" preserveAspectRatio="none" `
      + `xlink:href="${pic.toDataURL("image/png")}"/>`,
    '<g id="legend">',
    text(f.title.text, f.title.x, f.title.y, f.title.size, COLOURS.title, "hanging", ' font-weight="600" id="figure-title"'),
    `<g id="scale" font-family="${xml(MONO)}">`,
    text(f.lo.text, f.lo.x, f.lo.y, f.lo.size, COLOURS.scale, "central", ' id="scale-min"'),
    text(f.hi.text, f.hi.x, f.hi.y, f.hi.size, COLOURS.scale, "central", ' id="scale-max"'),
    '</g>',
    `<rect id="colour-bar-rect" x="${f.bar.x}" y="${f.bar.y}" width="${f.bar.w}" height="${f.bar.h}" fill="url(#colour-bar)"/>`,
    `<g id="caption" font-size="${f.caption.size}" fill="${COLOURS.caption}">`,
    ...f.caption.lines.map((t, i) => `<text x="${f.caption.x}" y="${f.caption.y[i]}" dominant-baseline="hanging">${xml(t)}</text>`),
    '</g>',
    '</g>',
    '</svg>',
  ].join("\n");
  return new Blob([svg, "\n"], { type: "image/svg+xml" });
}

/**
 * The text as lines that fit `width` pixels in the context's font: broken between the caption's
 * " · " items, and inside an item only when it is wider than a line (at its spaces; a word wider
 * than the line is shortened with an ellipsis).
 */
export function wrapText(ctx, text, width) {
  const fits = (t) => ctx.measureText(t).width <= width;
  const lines = [];
  let line = "";
  const add = (piece, sep) => {
    const next = line ? `${line}${sep}${piece}` : piece;
    if (!fits(next)) return false;
    line = next;
    return true;
  };
  for (const item of String(text).split(" · ")) {
    if (add(item, " · ")) continue;
    if (line) lines.push(line);
    line = "";
    if (add(item, "")) continue;
    for (const word of item.split(" ")) {
      if (add(word, " ")) continue;
      if (line) lines.push(line);
      line = fits(word) ? word : fitText(ctx, word, width);
    }
  }
  if (line) lines.push(line);
  return lines.length ? lines : [""];
}

/** The text, shortened with an ellipsis to fit `width` pixels in the context's font. */
function fitText(ctx, text, width) {
  if (ctx.measureText(text).width <= width) return text;
  let s = text;
  while (s.length > 1 && ctx.measureText(`${s}…`).width > width) s = s.slice(0, -1);
  return `${s}…`;
}

/**
 * What the shown map of state `s` is, as a figure: {opts (drawComposite's), legend: {title,
 * subtitle, meta}, stem (the file name without extension)}; null while its row is not in.
 */
export function mapFigure(s) {
  if (!s.store || !s.image) return null;
  const row = shownRow(s.store, selection(s));
  if (!row) return null;
  const tokens = tokensAt(s.meta, s.layer); // swin: the layer's stage grid
  const q = parseQuery(s.query, s.meta.tokens);
  const marker = markerAt(s.meta, s.query, s.layer);
  const stage = tokens.window ? ` (stage ${tokens.stage})` : "";
  const title = `Layer ${s.layer}${stage} · ${headLabel(s.head)} · query ${queryLabel(s.query, s.meta.tokens)}`;
  const extra = [s.drop !== "none" ? `dropped: ${s.drop}` : "", s.mask ? `mass mask ${Math.round(s.massFraction * 100)}%` : "",
    s.temperature !== 1 ? `softmax temperature ${s.temperature}` : "",
    s.store.ablate ? `heads off: ${s.store.ablate}` : ""];
  const name = nameOf(s.filename, s.imageId); // a link opened in another tab has no file name
  const subtitle = [`model ${s.store.model}`, name, ...extra.filter(Boolean), "attention weight (colour bar)", "Headscope"]
    .join(" · ");
  const stem = name.replace(/\.[a-z0-9]+$/i, "").replace(/[^a-z0-9_-]+/gi, "_").slice(0, 60);
  return {
    opts: {
      image: s.image, row, tokens, colormap: s.colormap, opacity: s.opacity,
      grid: s.showGrid, smooth: s.smooth, marker,
      mask: s.mask ? s.massFraction : null, rings: artifactTokens(s.store),
    },
    legend: {
      title, subtitle,
      meta: {
        model: s.store.model, image_id: s.imageId, filename: s.filename, layer: s.layer, head: s.head,
        query: s.query, token: marker ? marker.token : q.token, colormap: s.colormap, drop: s.drop,
        temperature: s.temperature, stage: tokens.window ? tokens.stage : null,
        rollout: s.head === "rollout" ? s.rollout : null, mass_fraction: s.mask ? s.massFraction : null,
        ablate: s.store.ablate || null,
      },
    },
    stem: figureStem(s, stem),
  };
}

/**
 * The figure's file name, less its extension: the picture, layer, head and query, then what else
 * changes the numbers (the temperature, the tokens dropped, the heads off), so that two different
 * maps of one picture are not saved under one name.
 */
function figureStem(s, picture) {
  const slug = (x) => String(x).replace(/[^a-z0-9.]+/gi, "_");
  let name = `headscope_${picture}_L${s.layer}_${s.head}_${slug(s.query)}`;
  if (s.temperature !== 1) name += `_T${Number(Number(s.temperature).toPrecision(6))}`;
  if (s.drop && s.drop !== "none") name += `_drop-${slug(s.drop)}`;
  if (s.store.ablate) name += `_ablate-${slug(s.store.ablate)}`;
  return name;
}

/** Save the shown map of state `s` as a figure: format "png" or "svg" (the Download buttons). */
export async function downloadMap(s, format) {
  const fig = mapFigure(s);
  if (!fig) return; // the buttons are off until the map is drawn (viewer.js)
  const blob = await (format === "svg" ? exportSvg : exportPng)(fig.opts, fig.legend);
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `${fig.stem}.${format === "svg" ? "svg" : "png"}`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

// ---------------------------------------------------------------- PNG text chunks
let crcTable = null;

function crc32(bytes) {
  if (!crcTable) {
    crcTable = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      crcTable[n] = c >>> 0;
    }
  }
  let c = 0xffffffff;
  for (let i = 0; i < bytes.length; i++) c = crcTable[(c ^ bytes[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

/** An iTXt chunk (UTF-8 text, uncompressed): length, type, data, CRC of type + data. */
function itxtChunk(keyword, text) {
  const enc = new TextEncoder();
  const data = [...enc.encode(keyword), 0, 0, 0, 0, 0, ...enc.encode(text)]; // no compression, no language
  const body = new Uint8Array(4 + data.length);
  body.set(enc.encode("iTXt"), 0);
  body.set(data, 4);
  const out = new Uint8Array(8 + data.length + 4);
  const view = new DataView(out.buffer);
  view.setUint32(0, data.length);
  out.set(body, 4);
  view.setUint32(8 + data.length, crc32(body));
  return out;
}

/** The PNG with text chunks put right after its IHDR chunk (signature 8 + IHDR 25 bytes). */
async function withText(blob, entries) {
  const png = new Uint8Array(await blob.arrayBuffer());
  const at = 8 + 25;
  const chunks = Object.entries(entries).map(([k, v]) => itxtChunk(k, String(v)));
  return new Blob([png.subarray(0, at), ...chunks, png.subarray(at)], { type: "image/png" });
}
