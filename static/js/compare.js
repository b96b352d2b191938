// Compare mode: two maps side by side for the same query row, each with its own colour bar.
// Each side is (image, layer, head): two heads of a layer, two layers of a head, or the same
// layer and head on two images (the other one a sample, or an image opened earlier in this
// session). The data of images other than the shown one is in state.compare.others (fetching.js
// loads it); this module holds the side presets (state changes, called by actions.js) and the
// drawing (reads the state only).

import { paintColorbar } from "./colormaps.js";
import { $, scrollMotion, setOptions, shortName } from "./dom.js";
import { cellText } from "./chart-table.js";
import { describeCanvas, gridWords } from "./map-text.js";
import { drawComposite, fit, fmt, patchValues, sizeCanvas } from "./overlay.js";
import { artifactTokens, droppedTokens, patchSum, shownRow } from "./sinks.js";
import {
  COMPARE_MODES, dims, headChoices, headLabel, mapQuery, markerAt, nameOf, queryLabel, tokensAt,
} from "./state.js";

export const SIDES = ["a", "b"];
const MODE_NAMES = { heads: "two heads of a layer", layers: "two layers of a head", images: "two images" };
export const MODES = COMPARE_MODES.map((m) => [m, MODE_NAMES[m]]);

/** The sample buttons of the page: [{url, name}]. */
export function samples() {
  return [...document.querySelectorAll("[data-sample]")].map((b) => ({
    url: b.dataset.sample, name: (b.textContent || "").trim() || b.dataset.sample,
  }));
}

/** The key of another image's data in state.compare.others. */
export function otherKey(model, imageId) {
  return `${model}|${imageId}`;
}

// ---------------------------------------------------------------- side presets (state changes)
/** The two sides a mode starts from, for state `s`: {a, b}. */
export function preset(s, mode) {
  const { L, H } = dims(s.meta, s.layer);
  const a = { image: s.imageId, layer: s.layer, head: s.head };
  if (mode === "layers") {
    const other = s.layer === L - 1 ? Math.max(0, Math.floor((L - 1) / 2)) : L - 1;
    return { a, b: { ...a, layer: other } };
  }
  if (mode === "images") {
    const prev = s.session.find((x) => x.id !== s.imageId);
    let image = prev ? prev.id : null;
    if (!image) {
      const mine = s.session.find((x) => x.id === s.imageId);
      const same = (smp) => mine && (mine.sample === smp.url || mine.filename === smp.url.split("/").pop());
      const smp = samples().find((x) => !same(x));
      image = smp ? `sample:${smp.url}` : s.imageId;
    }
    return { a, b: { ...a, image } };
  }
  const h = /^\d+$/.test(s.head) ? (Number(s.head) + 1) % H : 0;
  return { a, b: { ...a, head: String(h) } };
}

/** A new image is shown (oldId was): sides that showed the previous one follow it. */
export function followImage(s, oldId) {
  if (!s.compare.on) return;
  const { L } = dims(s.meta);
  for (const name of SIDES) {
    const side = s.compare[name];
    if (!side) continue;
    if (side.image === oldId || !side.image) side.image = s.imageId;
    side.layer = Math.min(side.layer, L - 1);
    if (!headChoices(s.meta, side.layer).includes(side.head)) side.head = "0";
  }
}

// ---------------------------------------------------------------- reading
/** The data of one side: {store, image, meta, tokens, filename}, or null while it loads. */
export function sideData(s, side) {
  if (!side) return null;
  if (side.image === s.imageId) {
    if (!s.store) return null;
    return { store: s.store, image: s.image, meta: s.meta, tokens: s.meta.tokens, filename: nameOf(s.filename, s.imageId) };
  }
  return s.compare.others.get(otherKey(s.model, side.image)) || null;
}

// ---------------------------------------------------------------- rendering
function imageOptions(s) {
  // Short names, so that the closed menu shows the whole label, "(shown)" included.
  const opts = s.session.map((x) => [x.id, x.id === s.imageId ? `${shortName(x.filename)} (shown)` : shortName(x.filename)]);
  for (const smp of samples()) {
    if (!s.session.some((x) => x.sample === smp.url)) opts.push([`sample:${smp.url}`, `${smp.name} (sample)`]);
  }
  return opts;
}

function renderSide(s, name) {
  const side = s.compare[name];
  const canvas = $(`compare-${name}`);
  const fig = canvas.closest(".compare-side");
  const { L } = dims(s.meta);
  setOptions($(`compare-${name}-image`), imageOptions(s));
  $(`compare-${name}-image`).value = side.image;
  setOptions($(`compare-${name}-layer`), Array.from({ length: L }, (_, i) => [String(i), `layer ${i}`]));
  $(`compare-${name}-layer`).value = String(side.layer);
  // Windowed models (Swin): the heads of the side's layer, and its stage's grid for the drawing.
  const choices = headChoices(s.meta, side.layer);
  const head = choices.includes(side.head) ? side.head : choices[0];
  setOptions($(`compare-${name}-head`), choices.map((h) => [h, /^\d+$/.test(h) ? `head ${h}` : h]));
  $(`compare-${name}-head`).value = head;

  const ctx = sideData(s, side);
  const title = fig.querySelector(".compare-title");
  if (!ctx) {
    // Another picture is on its way: the previous one must not stand in for it.
    if (canvas.dataset.pending !== "image") canvas.getContext("2d").clearRect(0, 0, canvas.width, canvas.height);
    canvas.dataset.pending = "image";
    fig.classList.add("pending");
    title.textContent = "Loading the image…";
    describeCanvas(canvas, "");
    return;
  }
  // The side's own query: a patch of the shown image lands on the same place of this one.
  const q = mapQuery(s.query, s.meta.tokens, ctx.tokens);
  const tokens = tokensAt(ctx.meta, side.layer); // windowed: the side layer's stage grid
  const sel = { query: q, layer: side.layer, head, tokens, drop: s.drop, rollout: s.rollout };
  const row = shownRow(ctx.store, sel);
  canvas.dataset.pending = row ? "0" : "1";
  fig.classList.toggle("pending", !row);
  if (!row) {
    title.textContent = "Loading the attention…";
    describeCanvas(canvas, "");
    return;
  }
  const marker = markerAt(ctx.meta, q, side.layer);
  const box = fig.querySelector(".compare-canvas");
  const maxW = Math.max(120, box.clientWidth);
  const maxH = Math.max(200, Math.round(window.innerHeight * 0.5));
  const { w, h } = fit(ctx.image.naturalWidth, ctx.image.naturalHeight, maxW, maxH);
  const dpr = sizeCanvas(canvas, w, h);
  const range = drawComposite(canvas.getContext("2d"), canvas.width, canvas.height, {
    image: ctx.image, row, tokens, colormap: s.colormap, opacity: s.opacity, grid: s.showGrid,
    smooth: s.smooth, marker, px: dpr,
    mask: s.mask ? s.massFraction : null, rings: artifactTokens(ctx.store),
  });
  Object.assign(canvas.dataset, {
    image: ctx.store.imageId, model: ctx.store.model, layer: String(side.layer), head, query: q, temperature: String(ctx.store.temperature),
    min: String(range.min), max: String(range.max), dropped: droppedTokens(ctx.store, tokens, s.drop).join(","),
    patchSum: String(patchSum(row, tokens)),
  });
  if (s.mask) canvas.dataset.maskPatches = String(range.maskCount);
  else delete canvas.dataset.maskPatches;
  paintColorbar(fig.querySelector(".compare-cb canvas"), s.colormap);
  fig.querySelector(".cb-min").textContent = fmt(range.min);
  fig.querySelector(".cb-max").textContent = fmt(range.max);
  // The colour bar is one image in words (not two bare numbers in the figure's name), and the
  // map's numbers are its description.
  const cb = fig.querySelector(".compare-cb");
  cb.setAttribute("role", "img");
  cb.setAttribute("aria-label", `Colour scale: ${s.colormap} from ${cellText(range.min)} to ${cellText(range.max)}`);
  title.textContent = `${ctx.filename} · layer ${side.layer} · ${headLabel(head)} · query ${queryLabel(q, ctx.tokens)}`;
  describeCanvas(canvas, compareWords(name, title.textContent, patchValues(row, tokens).values, tokens));
}

/** One compare map in words: which side and what it shows, then its highest patches and its lowest. */
export function compareWords(name, what, values, tokens) {
  const [R, C] = tokens.grid;
  return `${name === "a" ? "Left" : "Right"} map, ${what}. ${gridWords(values, R, C, tokens.window ? "cell" : "patch")}`;
}

/** Show or hide the compare panel and draw both sides. */
export function renderCompare(s) {
  const panel = $("compare-panel");
  const on = s.compare.on && !!s.meta && !!s.store;
  panel.hidden = !on;
  $("compare-toggle").checked = s.compare.on;
  $("compare-toggle").disabled = !s.meta;
  if (!on) return;
  setOptions($("compare-mode"), MODES);
  $("compare-mode").value = s.compare.mode;
  for (const name of SIDES) renderSide(s, name);
}

/**
 * Bring the compare panel into sight once "compare" is ticked: it opens below the map, under the
 * fold of a 1280x800 window (#41). Scrolls only when its top is out of view or under the sticky
 * top bar; its top then sits just below the bar.
 */
export function revealCompare() {
  const panel = $("compare-panel");
  if (panel.hidden) return;
  const bar = $("topbar");
  const sticky = bar && getComputedStyle(bar).position === "sticky" ? bar.getBoundingClientRect().height : 0;
  const top = panel.getBoundingClientRect().top;
  if (top >= sticky && top < window.innerHeight * 0.6) return;
  window.scrollBy({ top: top - sticky - 8, behavior: scrollMotion() });
}
