// Compare mode: two maps side by side for the same query row, each with its own colour bar.
// Each side is (image, layer, head): two heads of a layer, two layers of a head, or the same
// layer and head on two images (the other one a sample, or an image opened earlier in this
// session). Images other than the shown one get their own AttentionStore, fetched on demand.

import { ApiError, getAttention, loadImage, postImage } from "./api.js";
import { rowKeyOfAnswer } from "./data.js";
import { makeStore } from "./swin-store.js";
import { firstFields, isWindowed, stageCell } from "./windows.js";
import { paintColorbar } from "./colormaps.js";
import { cellAt, drawComposite, fit, fmt, sizeCanvas } from "./overlay.js";
import { artifactTokens, droppedTokens, patchSum, shownRow } from "./sinks.js";
import { dims, hasCls, headChoices, headLabel, queryLabel, state } from "./state.js";

const $ = (id) => document.getElementById(id);
const SIDES = ["a", "b"];

export const MODES = [["heads", "two heads of a layer"], ["layers", "two layers of a head"], ["images", "two images"]];

const others = new Map(); // `${model}|${imageId}` -> {store, image, filename}
const loading = new Map(); // same key (or "sample:url") -> promise

function samples() {
  return [...document.querySelectorAll("[data-sample]")].map((b) => ({
    url: b.dataset.sample, name: (b.textContent || "").trim() || b.dataset.sample,
  }));
}

/** Remember an image opened in this session (for the image pickers). */
export function rememberImage(id, filename, sample = null) {
  const known = state.session.find((s) => s.id === id);
  if (known) {
    if (sample) known.sample = sample;
    return;
  }
  state.session.push({ id, filename: filename || "image", sample });
}

// ---------------------------------------------------------------- queries across grids
/** The same query on another token grid: CLS and prefix tokens as they are, a patch at the same place. */
function mapQuery(q, from, to) {
  const m = /^patch:(\d+),(\d+)$/.exec(q);
  if (!m) return q;
  const [R, C] = from.grid;
  const [R2, C2] = to.grid;
  if (R === R2 && C === C2) return q;
  const r = Math.min(R2 - 1, Math.floor(((Number(m[1]) + 0.5) * R2) / R));
  const c = Math.min(C2 - 1, Math.floor(((Number(m[2]) + 0.5) * C2) / C));
  return `patch:${r},${c}`;
}

function parse(q, tokens) {
  if (q === "cls") {
    const p = tokens.prefix.find((x) => x.kind === "cls");
    return p ? { kind: "cls", token: p.index } : null;
  }
  let m = /^patch:(\d+),(\d+)$/.exec(q);
  if (m) {
    const r = Number(m[1]);
    const c = Number(m[2]);
    return { kind: "patch", r, c, token: tokens.num_prefix + r * tokens.grid[1] + c };
  }
  m = /^tok:(\d+)$/.exec(q);
  return m ? { kind: "token", token: Number(m[1]) } : null;
}

function apiQ(q) {
  const m = /^tok:(\d+)$/.exec(q);
  return m ? m[1] : q;
}

// ---------------------------------------------------------------- state
function preset(mode) {
  const { L, H } = dims();
  const a = { image: state.imageId, layer: state.layer, head: state.head };
  if (mode === "layers") {
    const other = state.layer === L - 1 ? Math.max(0, Math.floor((L - 1) / 2)) : L - 1;
    return { a, b: { ...a, layer: other } };
  }
  if (mode === "images") {
    const prev = state.session.find((s) => s.id !== state.imageId);
    let image = prev ? prev.id : null;
    if (!image) {
      const mine = state.session.find((s) => s.id === state.imageId);
      const same = (s) => mine && (mine.sample === s.url || mine.filename === s.url.split("/").pop());
      const smp = samples().find((s) => !same(s));
      image = smp ? `sample:${smp.url}` : state.imageId;
    }
    return { a, b: { ...a, image } };
  }
  const h = /^\d+$/.test(state.head) ? (Number(state.head) + 1) % H : 0;
  return { a, b: { ...a, head: String(h) } };
}

export function enterCompare(on) {
  state.compare.on = on;
  if (on) Object.assign(state.compare, preset(state.compare.mode));
}

export function setMode(mode) {
  state.compare.mode = mode;
  Object.assign(state.compare, preset(mode));
}

/** A new image is shown: sides that showed the previous one follow it. */
export function followImage(oldId) {
  if (!state.compare.on) return;
  for (const s of SIDES) {
    const side = state.compare[s];
    if (side && (side.image === oldId || !side.image)) side.image = state.imageId;
  }
  const { L } = dims();
  for (const s of SIDES) {
    const side = state.compare[s];
    if (side) {
      side.layer = Math.min(side.layer, L - 1);
      if (!headChoices().includes(side.head)) side.head = "0";
    }
  }
}

/** The data of one side: {store, image, tokens, filename} or null while it loads. */
function contextOf(side, main) {
  if (!side) return null;
  if (side.image === state.imageId) {
    return main.store ? { store: main.store, image: state.image, tokens: state.meta.tokens, filename: state.filename } : null;
  }
  return others.get(`${state.model}|${side.image}`) || null;
}

// ---------------------------------------------------------------- fetching
const failed = new Set(); // keys of images that could not be opened (not retried)

async function openOther(id, onError) {
  const model = state.model;
  const key = `${model}|${id}`;
  if (others.has(key) || loading.has(key) || failed.has(key)) return;
  const p = (async () => {
    const ans = await getAttention(id, {
      model, layers: "all", heads: "all", query: hasCls() ? "cls" : "0", ...firstFields({ windowed: isWindowed(state.meta) }),
    });
    const image = await loadImage(id);
    const meta = { ...ans };
    delete meta.data;
    const store = makeStore(meta);
    store.putRows(rowKeyOfAnswer(ans), ans.data);
    const entry = state.session.find((s) => s.id === id);
    others.set(key, { store, image, tokens: meta.tokens, filename: (entry && entry.filename) || ans.filename || "image" });
  })();
  loading.set(key, p);
  try {
    await p;
  } catch (e) {
    failed.add(key);
    for (const s of SIDES) {
      const side = state.compare[s];
      if (side && side.image === id) side.image = state.imageId;
    }
    onError(e);
  } finally {
    loading.delete(key);
  }
}

async function openSample(url, onError) {
  const key = `sample:${url}`;
  const p = (async () => {
    const resp = await fetch(url);
    if (!resp.ok) throw new ApiError(resp.status, "sample_missing", `the sample ${url} could not be loaded`);
    const blob = await resp.blob();
    const name = url.split("/").pop();
    const ans = await postImage(new File([blob], name, { type: blob.type || "image/png" }), {
      model: state.model, layers: "all", heads: "all", query: hasCls() ? "cls" : "0",
      ...firstFields({ windowed: isWindowed(state.meta) }),
    });
    const image = await loadImage(ans.image_id);
    const meta = { ...ans };
    delete meta.data;
    const store = makeStore(meta);
    store.putRows(rowKeyOfAnswer(ans), ans.data);
    rememberImage(ans.image_id, name, url);
    others.set(`${ans.model}|${ans.image_id}`, { store, image, tokens: meta.tokens, filename: name });
    for (const s of SIDES) {
      const side = state.compare[s];
      if (side && side.image === key) side.image = ans.image_id;
    }
  })();
  loading.set(key, p);
  try {
    await p;
  } catch (e) {
    for (const s of SIDES) {
      const side = state.compare[s];
      if (side && side.image === key) side.image = state.imageId;
    }
    onError(e);
  } finally {
    loading.delete(key);
  }
}

/** Start what the sides lack (their image, rows, rollout, stats); calls done() as things arrive. */
export function needCompare(main, done, onError) {
  if (!state.compare.on || !state.meta) return;
  for (const s of SIDES) {
    const side = state.compare[s];
    if (!side) continue;
    // Only a request that starts here gets the done() callback: one render when it ends.
    if (typeof side.image === "string" && side.image.startsWith("sample:")) {
      if (!loading.has(side.image)) openSample(side.image.slice(7), onError).finally(done);
      continue;
    }
    const ctx = contextOf(side, main);
    if (!ctx) {
      const key = `${state.model}|${side.image}`;
      if (!loading.has(key) && !failed.has(key)) openOther(side.image, onError).finally(done);
      continue;
    }
    if (ctx.store === main.store) continue; // main.js fetches what the main view needs
    const st = ctx.store;
    st.rolloutOpts = { ...state.rollout };
    const q = mapQuery(state.query, state.meta.tokens, ctx.tokens);
    if (!st.rows.has(q)) {
      if (!st.isLoading("rows", q) && !st.hasFailed("rows", q)) st.loadRows(q, apiQ(q)).catch(onError).finally(done);
      continue;
    }
    if (side.head === "rollout" && !st.has(q, "rollout") && !st.isLoading("rollout", q) && !st.hasFailed("rollout", q)) {
      st.loadRollout(q, apiQ(q), parse(q, ctx.tokens).token).catch(onError).finally(done);
    }
    if ((state.drop === "artifacts" || state.drop === "both") && !st.stats && !st.isLoading("stats") && !st.hasFailed("stats")) {
      st.loadStats().catch(onError).finally(done);
    }
  }
}

// ---------------------------------------------------------------- rendering
function setOptions(select, options) {
  const want = options.map(([v, l]) => `${v}\u0000${l}`).join("\u0001");
  if (select.dataset.options === want) return;
  select.replaceChildren(...options.map(([v, l]) => {
    const o = document.createElement("option");
    o.value = v;
    o.textContent = l;
    return o;
  }));
  select.dataset.options = want;
}

function imageOptions() {
  const opts = state.session.map((s) => [s.id, s.id === state.imageId ? `${s.filename} (shown)` : s.filename]);
  for (const smp of samples()) {
    if (!state.session.some((s) => s.sample === smp.url)) opts.push([`sample:${smp.url}`, `${smp.name} (sample)`]);
  }
  return opts;
}

function renderSide(name, main) {
  const side = state.compare[name];
  const canvas = $(`compare-${name}`);
  const fig = canvas.closest(".compare-side");
  const { L } = dims();
  setOptions($(`compare-${name}-image`), imageOptions());
  $(`compare-${name}-image`).value = side.image;
  setOptions($(`compare-${name}-layer`), Array.from({ length: L }, (_, i) => [String(i), `layer ${i}`]));
  $(`compare-${name}-layer`).value = String(side.layer);
  // Windowed models (Swin): the heads of the side's layer, and its stage's grid for the drawing.
  const choices = headChoices(side.layer);
  const head = choices.includes(side.head) ? side.head : choices[0];
  setOptions($(`compare-${name}-head`), choices.map((h) => [h, /^\d+$/.test(h) ? `head ${h}` : h]));
  $(`compare-${name}-head`).value = head;

  const ctx = contextOf(side, main);
  const title = fig.querySelector(".compare-title");
  if (!ctx) {
    canvas.dataset.pending = "1";
    fig.classList.add("pending");
    title.textContent = "Loading the image…";
    return;
  }
  ctx.store.rolloutOpts = { ...state.rollout };
  const q = mapQuery(state.query, state.meta.tokens, ctx.tokens);
  const tokens = ctx.store.tokensAt ? ctx.store.tokensAt(side.layer) : ctx.tokens;
  const row = shownRow(ctx.store, q, side.layer, head, tokens, state.drop);
  canvas.dataset.pending = row ? "0" : "1";
  fig.classList.toggle("pending", !row);
  if (!row) {
    title.textContent = "Loading the attention…";
    return;
  }
  const p0 = parse(q, ctx.tokens);
  const pq = ctx.store.windowed && p0 && p0.kind === "patch" ? stageCell(ctx.store.meta, p0, side.layer) : p0;
  const row2 = $("compare-row");
  const maxW = Math.max(160, Math.floor((row2.clientWidth - 16) / 2));
  const maxH = Math.max(240, Math.round(window.innerHeight * 0.5));
  const { w, h } = fit(ctx.image.naturalWidth, ctx.image.naturalHeight, maxW, maxH);
  const dpr = sizeCanvas(canvas, w, h);
  const range = drawComposite(canvas.getContext("2d"), canvas.width, canvas.height, {
    image: ctx.image, row, tokens, colormap: state.colormap, opacity: state.opacity, grid: state.showGrid,
    smooth: state.smooth, marker: pq && pq.kind === "patch" ? pq : null, px: dpr,
    mask: state.mask ? state.massFraction : null, rings: artifactTokens(ctx.store),
  });
  Object.assign(canvas.dataset, {
    image: ctx.store.imageId, model: ctx.store.model, layer: String(side.layer), head, query: q,
    min: String(range.min), max: String(range.max), dropped: droppedTokens(ctx.store, tokens, state.drop).join(","),
    patchSum: String(patchSum(row, tokens)),
  });
  if (state.mask) canvas.dataset.maskPatches = String(range.maskCount);
  else delete canvas.dataset.maskPatches;
  paintColorbar(fig.querySelector(".compare-cb canvas"), state.colormap);
  fig.querySelector(".cb-min").textContent = fmt(range.min);
  fig.querySelector(".cb-max").textContent = fmt(range.max);
  title.textContent = `${ctx.filename} · layer ${side.layer} · ${headLabel(head)} · query ${queryLabel(state.query)}`;
}

/** main: {store}. Shows or hides the compare panel and draws both sides. */
export function renderCompare(main) {
  const panel = $("compare-panel");
  const on = state.compare.on && !!state.meta && !!main.store;
  panel.hidden = !on;
  $("compare-toggle").checked = state.compare.on;
  $("compare-toggle").disabled = !state.meta;
  if (!on) return;
  $("compare-mode").value = state.compare.mode;
  for (const s of SIDES) renderSide(s, main);
}

/** Bind the pickers; onChange() re-renders, onQuery(q) sets the query from a click on a side. */
export function initCompare(onChange, onQuery) {
  setOptions($("compare-mode"), MODES);
  $("compare-mode").addEventListener("change", (e) => {
    setMode(e.target.value);
    onChange();
  });
  for (const s of SIDES) {
    $(`compare-${s}-image`).addEventListener("change", (e) => {
      state.compare[s].image = e.target.value;
      onChange();
    });
    $(`compare-${s}-layer`).addEventListener("change", (e) => {
      state.compare[s].layer = Number(e.target.value);
      onChange();
    });
    $(`compare-${s}-head`).addEventListener("change", (e) => {
      state.compare[s].head = e.target.value;
      onChange();
    });
    const canvas = $(`compare-${s}`);
    canvas.addEventListener("click", (e) => {
      const side = state.compare[s];
      const ctx = side && (side.image === state.imageId ? { tokens: state.meta.tokens } : others.get(`${state.model}|${side.image}`));
      if (!ctx) return;
      const cell = cellAt(canvas, e, ctx.tokens);
      if (!cell) return;
      onQuery(mapQuery(`patch:${cell.r},${cell.c}`, ctx.tokens, state.meta.tokens));
    });
  }
}

/** Forget the stores of other images (after a model switch they no longer apply). */
export function resetOthers() {
  others.clear();
  failed.clear();
}
