// The "Download PNG" picture: the image and its overlay at the picture's own resolution, and
// under it a legend band (what is shown: layer, head, query, model; the colour bar with its
// scale), so the file explains itself on a slide. The same facts go into the PNG's iTXt chunks
// ("Title", "Description", and "headscope": JSON) for programs.

import { lut } from "./colormaps.js";
import { drawComposite, fmt } from "./overlay.js";
import { artifactTokens, shownRow } from "./sinks.js";
import { headLabel, markerAt, parseQuery, queryLabel, tokensAt } from "./state.js";
import { selection } from "./viewer.js";

const MIN_WIDTH = 360; // narrower pictures are centred on a band this wide, so the legend fits
const BG = "#0b1120";

/**
 * A PNG Blob of image + overlay + legend.
 * opts: the drawComposite options ({image, row, tokens, colormap, opacity, ...}).
 * legend: {title, subtitle, meta}: two lines of text and the JSON-ready facts for the iTXt chunk.
 */
export async function exportPng(opts, legend) {
  const { image } = opts;
  const iw = image.naturalWidth;
  const ih = image.naturalHeight;
  const W = Math.max(iw, MIN_WIDTH);
  const u = Math.max(1, W / 640); // text and bar scale with the picture
  const band = Math.round(92 * u);
  const canvas = document.createElement("canvas");
  canvas.width = W;
  canvas.height = ih + band;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = BG;
  ctx.fillRect(0, 0, W, ih + band);
  const x0 = Math.floor((W - iw) / 2);
  ctx.save();
  ctx.translate(x0, 0);
  const px = Math.max(1, Math.round(Math.max(iw, ih) / 800));
  const range = drawComposite(ctx, iw, ih, { ...opts, px });
  ctx.restore();
  drawLegend(ctx, 0, ih, W, band, u, opts.colormap, range, legend);
  const blob = await new Promise((resolve, reject) => {
    canvas.toBlob((b) => (b ? resolve(b) : reject(new Error("the PNG could not be made"))), "image/png");
  });
  const meta = { ...legend.meta, min: range && range.min, max: range && range.max, legend_px: band };
  return withText(blob, {
    Title: legend.title,
    Description: `${legend.title} · ${legend.subtitle}`,
    headscope: JSON.stringify(meta),
  });
}

function drawLegend(ctx, x, y, W, band, u, colormap, range, legend) {
  const pad = Math.round(12 * u);
  const font = "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
  ctx.save();
  ctx.textBaseline = "top";
  ctx.fillStyle = "#e2e8f0";
  ctx.font = `600 ${Math.round(14 * u)}px ${font}`;
  ctx.fillText(fitText(ctx, legend.title, W - 2 * pad), x + pad, y + pad);

  // The colour bar: min value, the map's colours, max value, and what the colours measure.
  const barY = y + pad + Math.round(22 * u);
  const barH = Math.round(12 * u);
  ctx.font = `${Math.round(12 * u)}px ui-monospace, Menlo, Consolas, monospace`;
  const lo = range ? fmt(range.min) : "–";
  const hi = range ? fmt(range.max) : "–";
  const loW = ctx.measureText(lo).width;
  const hiW = ctx.measureText(hi).width;
  const gap = Math.round(8 * u);
  const bx = x + pad + loW + gap;
  const bw = Math.max(40, W - 2 * pad - loW - hiW - 2 * gap);
  ctx.fillStyle = "#cbd5e1";
  ctx.textBaseline = "middle";
  ctx.fillText(lo, x + pad, barY + barH / 2);
  ctx.fillText(hi, bx + bw + gap, barY + barH / 2);
  const table = lut(colormap);
  const grad = ctx.createLinearGradient(bx, 0, bx + bw, 0);
  for (let i = 0; i <= 16; i++) {
    const k = 3 * Math.round((i / 16) * 255);
    grad.addColorStop(i / 16, `rgb(${table[k]},${table[k + 1]},${table[k + 2]})`);
  }
  ctx.fillStyle = grad;
  ctx.fillRect(bx, barY, bw, barH);

  ctx.textBaseline = "top";
  ctx.fillStyle = "#94a3b8";
  ctx.font = `${Math.round(12 * u)}px ${font}`;
  ctx.fillText(fitText(ctx, legend.subtitle, W - 2 * pad), x + pad, barY + barH + Math.round(10 * u));
  ctx.restore();
}

/** The text, shortened with an ellipsis to fit `width` pixels in the context's font. */
function fitText(ctx, text, width) {
  if (ctx.measureText(text).width <= width) return text;
  let s = text;
  while (s.length > 1 && ctx.measureText(`${s}…`).width > width) s = s.slice(0, -1);
  return `${s}…`;
}

/** Save the shown map of state `s` as a PNG with its legend (the "Download PNG" button). */
export async function downloadMapPng(s) {
  if (!s.store || !s.image) return;
  const row = shownRow(s.store, selection(s));
  if (!row) return;
  const tokens = tokensAt(s.meta, s.layer); // swin: the layer's stage grid
  const q = parseQuery(s.query, s.meta.tokens);
  const marker = markerAt(s.meta, s.query, s.layer);
  const stage = tokens.window ? ` (stage ${tokens.stage})` : "";
  const title = `Layer ${s.layer}${stage} · ${headLabel(s.head)} · query ${queryLabel(s.query, s.meta.tokens)}`;
  const extra = [s.drop !== "none" ? `dropped: ${s.drop}` : "", s.mask ? `mass mask ${Math.round(s.massFraction * 100)}%` : "",
    s.temperature !== 1 ? `softmax temperature ${s.temperature}` : ""];
  const subtitle = [`model ${s.store.model}`, s.filename || "image", ...extra.filter(Boolean), "attention weight (colour bar)", "Headscope"]
    .join(" · ");
  const blob = await exportPng({
    image: s.image, row, tokens, colormap: s.colormap, opacity: s.opacity,
    grid: s.showGrid, smooth: s.smooth, marker,
    mask: s.mask ? s.massFraction : null, rings: artifactTokens(s.store),
  }, {
    title, subtitle,
    meta: {
      model: s.store.model, image_id: s.imageId, filename: s.filename, layer: s.layer, head: s.head,
      query: s.query, token: marker ? marker.token : q.token, colormap: s.colormap, drop: s.drop,
      temperature: s.temperature, stage: tokens.window ? tokens.stage : null,
      rollout: s.head === "rollout" ? s.rollout : null, mass_fraction: s.mask ? s.massFraction : null,
    },
  });
  const stem = (s.filename || "image").replace(/\.[a-z0-9]+$/i, "").replace(/[^a-z0-9_-]+/gi, "_").slice(0, 60);
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `headscope_${stem}_L${s.layer}_${s.head}_${s.query.replace(/[^a-z0-9]+/gi, "_")}.png`;
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
