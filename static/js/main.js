// Wiring: image intake (file, drop, paste, samples, shared URL), model switch, fetching what the
// view needs, the events of every control, and render() which brings every view up to date.

import { ApiError, describeError, getAttention, getModels, loadImage, postImage } from "./api.js";
import { rolloutKey, rowKeyOfAnswer } from "./data.js";
import { cellAt, compositeBlob } from "./overlay.js";
import { renderRow, resizeCharts } from "./charts.js";
import { analyticsEls, renderAnalytics } from "./analytics.js";
import { renderHeadGrid, renderModelView } from "./grid.js";
import { renderRolloutStrip } from "./rollout.js";
import {
  enterCompare, followImage, initCompare, needCompare, rememberImage, renderCompare, resetOthers,
} from "./compare.js";
import { artifactTokens, shownRow } from "./sinks.js";
import {
  fmtBytes, initStaticControls, renderAnalysisControls, renderControls, renderError, renderStatus,
} from "./controls.js";
import { renderPrefixList, renderReadout, renderViewer } from "./viewer.js";
import { bindViews, renderViews } from "./views.js";
import { bindLearn, needLearn, renderLearn } from "./learn.js"; // #15 Inside a head
import { bindAblation, mapsAblate, renderAblation, renderMapsAblated } from "./ablation.js"; // ablation view (#16)
import {
  apiQuery, defaultQuery, dims, headChoices, markerAt, parseQuery, readUrl, state, syncUrl, tokensAt,
} from "./state.js";
import { makeStore } from "./swin-store.js"; // swin: per-stage rows for windowed models
import { firstFields, isWindowed, shapeSummary } from "./windows.js"; // swin

const $ = (id) => document.getElementById(id);
const analytics = analyticsEls();
const charts = { ...analytics, row: $("chart-row") };
delete charts.panel;
delete charts.status;

let store = null;      // AttentionStore of the shown image and model
let gen = 0;           // bumps on every new image/model load; stale answers are dropped
let upload = null;     // AbortController of the running upload
let summary = "";      // status line once ready
let lastPatch = null;  // the last patch query, for the query-mode select
let slowTimer = 0;

// ---------------------------------------------------------------- render
function render() {
  if (store) store.rolloutOpts = { ...state.rollout };
  if (store) store.setTemperature(state.temperature); // #15 maps at softmax(scores / T)
  // #16 maps of the model with the Ablation view's heads off; asked for once another view shows
  // them, so that a click on a head in the Ablation view costs one forward (its output), not two.
  if (store && state.view !== "ablation") store.setAblate(mapsAblate());
  renderViews();
  renderControls();
  renderAnalysisControls(store);
  renderStatus(summary);
  renderError(retry);
  renderViewer(store);
  renderPrefixList(store, setQuery);
  renderRolloutStrip($("rollout-strip"), thumbView(), (l) => pick(l, "rollout"));
  renderCompare({ store });
  renderHeadGrid($("head-grid"), thumbView(), pick);
  renderLearn(); // #15
  needLearn(render, showError); // #15
  renderAblation(); // ablation view (#16)
  renderMapsAblated(); // #16: the maps view says when heads are off
  clearTimeout(slowTimer);
  slowTimer = setTimeout(renderSlow, 40);
  if (state.imageId || state.view !== "viewer") syncUrl();
  need();
}

/** Model view and charts: heavier, so coalesced while the pointer sweeps over patches. */
function renderSlow() {
  const view = thumbView();
  renderModelView($("model-view"), view, (l, h) => {
    pick(l, h);
    $("overlay").scrollIntoView({ behavior: "smooth", block: "center" });
  });
  const q = view && parseQuery(state.query);
  renderAnalytics(analytics, view && {
    ...view, entropyKind: state.entropyKind, sinkKind: state.sinkKind, simKind: state.simKind,
  }, pick);
  renderRow(charts.row, view && { ...view, queryToken: view.marker ? view.marker.token : q.token }); // swin: the layer's cell
}

function thumbView() {
  if (!store || !state.image) return null;
  // swin: a windowed model's layers have their stage's grid and heads (tokensAt, markerAt, headChoices)
  const tokens = tokensAt(state.layer);
  const windowed = isWindowed(state.meta);
  return {
    store, image: state.image, tokens, query: state.query, layer: state.layer,
    head: state.head, heads: headChoices(), colormap: state.colormap, opacity: state.opacity,
    smooth: state.smooth, marker: markerAt(state.query, state.layer),
    layerOf: (layer) => ({ tokens: tokensAt(layer), marker: markerAt(state.query, layer) }),
    headsOf: windowed ? (layer) => headChoices(layer) : null,
    allHeads: windowed ? [...Array.from({ length: store.H }, (_, i) => String(i)), "mean", "max"] : null,
    rowOf: (layer, head) => shownRow(store, state.query, layer, head, tokens, state.drop),
    key: [state.imageId, store.model, state.query, state.colormap, state.opacity, state.smooth,
      state.drop, artifactTokens(store).join(","), rolloutKey("", state.rollout), state.temperature,
      store.ablate].join("|"),
  };
}

/** Start fetching what the current view lacks: the query's rows, then its rollout; the stats. */
function need() {
  if (!store) return;
  const s = store;
  const q = state.query;
  if (!s.stats && !s.isLoading("stats") && !s.hasFailed("stats")) {
    s.loadStats()
      .catch((e) => { if (s === store) showError(e); })
      .finally(() => { if (s === store) render(); });
  }
  needCompare({ store: s }, () => { if (s === store) render(); }, (e) => { if (s === store) showError(e); });
  const busyRows = [...s.loading.keys()].some((k) => k.startsWith("rows|"));
  if (!s.rows.has(q)) {
    if (busyRows || s.failed.has(`rows|${q}`)) return;
    const slow = setTimeout(() => { if (s === store) { state.busy = "Loading the attention of this query…"; render(); } }, 300);
    s.loadRows(q, apiQuery(q))
      .catch((e) => { if (s === store) showError(e); })
      .finally(() => {
        clearTimeout(slow);
        if (s === store) {
          if (state.busy && state.busy.startsWith("Loading the attention")) state.busy = null;
          render();
        }
      });
    return;
  }
  if (!s.has(q, "rollout") && !busyRows && !s.isLoading("rollout", q) && !s.hasFailed("rollout", q)) {
    s.loadRollout(q, apiQuery(q), parseQuery(q).token)
      .catch((e) => { if (s === store && state.head === "rollout") showError(e); })
      .finally(() => { if (s === store) render(); });
  }
}

// ---------------------------------------------------------------- state changes
function pick(layer, head) {
  const { L } = dims();
  state.layer = Math.max(0, Math.min(L - 1, layer));
  if (headChoices().includes(head)) state.head = head;
  else if (!headChoices().includes(state.head)) state.head = String(dims().H - 1); // swin: fewer heads here
  render();
}

function setQuery(q) {
  const p = parseQuery(q);
  if (!p || q === state.query) return;
  if (p.kind === "patch") lastPatch = q;
  state.query = q;
  render();
}

function stepLayer(d) {
  const { L } = dims();
  if (!L) return;
  pick(Math.max(0, Math.min(L - 1, state.layer + d)), state.head);
}

function stepHead(d) {
  const choices = headChoices();
  const i = choices.indexOf(state.head);
  if (i < 0 || !choices.length) return;
  pick(state.layer, choices[Math.max(0, Math.min(choices.length - 1, i + d))]);
}

function showError(err, retryFn = null) {
  console.warn("headscope:", err);
  state.error = { ...describeError(err), code: err && err.code, retry: retryFn };
  render();
}

function clearError() {
  state.error = null;
}

function retry(fn) {
  clearError();
  fn();
}

// ---------------------------------------------------------------- loading images
function modelInfo(id) {
  return state.models.find((m) => m.id === id) || null;
}

/** The first query to ask for: CLS when the model has one (token 0 is CLS then), else token 0. */
function firstQuery() {
  const info = modelInfo(state.model);
  if (info && Array.isArray(info.prefix_tokens)) {
    return info.prefix_tokens.some((p) => p.kind === "cls") ? "cls" : "0";
  }
  return "0";
}

/** Make an attention answer the shown image. want: {layer, head, q} to restore, if valid. */
async function adopt(ans, my, want = {}, sample = null) {
  const image = state.image && state.imageId === ans.image_id ? state.image : await loadImage(ans.image_id);
  if (my !== gen) return;
  const meta = { ...ans };
  delete meta.data;
  const oldId = state.imageId;
  if (state.model !== ans.model || (store && store.model !== ans.model)) resetOthers();
  state.meta = meta;
  state.imageId = ans.image_id;
  state.filename = ans.filename || state.filename;
  state.model = ans.model;
  state.image = image;
  store = makeStore(meta); // swin
  store.rolloutOpts = { ...state.rollout };
  store.putRows(rowKeyOfAnswer(ans), ans.data);
  rememberImage(ans.image_id, state.filename, sample);
  const { L, H, N } = dims();
  // The last layer by default (where the CLS maps are most telling); keep the layer across images.
  const layer = Number.isInteger(want.layer) ? want.layer : L - 1;
  state.layer = layer >= 0 && layer < L ? layer : L - 1;
  state.head = headChoices().includes(want.head) ? want.head : (headChoices().includes(state.head) ? state.head : "0");
  state.query = parseQuery(want.q) ? want.q : defaultQuery();
  lastPatch = parseQuery(state.query).kind === "patch" ? state.query : null;
  state.rollout = { ...state.rollout, start: Math.min(state.rollout.start, L - 1) };
  followImage(oldId);
  const t = ans.timing_ms;
  summary = `${state.filename || "image"} · ${shapeSummary(meta) || `${L} layers × ${H} heads · ${N} tokens`} · ` // swin
    + (ans.cached ? "from the server's cache" : `computed in ${Math.round(t.queue + t.compute)} ms`);
  clearError();
  state.busy = null;
  render();
}

async function uploadFile(file, sample = null) {
  if (!file) return;
  clearError();
  const max = Number(document.body.dataset.maxUpload || 0);
  if (max && file.size > max) {
    showError(new ApiError(413, "upload_too_large",
      `“${file.name}” is ${fmtBytes(file.size)}; this server accepts up to ${fmtBytes(max)}.`));
    return;
  }
  const my = ++gen;
  if (upload) upload.abort();
  upload = new AbortController();
  state.filename = file.name || "pasted image";
  state.busy = `Computing attention for “${state.filename}”…`;
  render();
  try {
    const fields = { model: state.model, layers: "all", heads: "all", query: firstQuery(), ...firstFields(modelInfo(state.model)) }; // swin
    const ans = await postImage(file, fields, upload.signal);
    if (my !== gen) return;
    await adopt(ans, my, store ? { layer: state.layer, head: state.head } : {}, sample);
  } catch (e) {
    if (my !== gen || (e && e.name === "AbortError")) return;
    state.busy = null;
    state.filename = state.meta ? state.meta.filename : null;
    showError(e, () => uploadFile(file, sample));
  }
}

/** Ask the server for an image it already has (shared URL, or a model switch). */
async function openById(imageId, want, what) {
  const my = ++gen;
  if (upload) upload.abort();
  clearError();
  state.busy = what;
  render();
  try {
    const ans = await getAttention(imageId, {
      model: state.model, layers: "all", heads: "all", query: firstQuery(), ...firstFields(modelInfo(state.model)), // swin
    });
    if (my !== gen) return;
    await adopt(ans, my, want);
  } catch (e) {
    if (my !== gen) return;
    state.busy = null;
    if (store) state.model = store.model; // a failed model switch keeps the previous view
    showError(e, e.code === "image_not_found" ? null : () => openById(imageId, want, what));
  }
}

async function useSample(url) {
  try {
    const resp = await fetch(url);
    if (!resp.ok) throw new ApiError(resp.status, "sample_missing", `the sample ${url} could not be loaded`);
    const blob = await resp.blob();
    await uploadFile(new File([blob], url.split("/").pop(), { type: blob.type || "image/png" }), url);
  } catch (e) {
    showError(e);
  }
}

async function downloadPng() {
  if (!store || !state.image) return;
  const tokens = tokensAt(state.layer); // swin: the layer's grid
  const row = shownRow(store, state.query, state.layer, state.head, tokens, state.drop);
  if (!row) return;
  const blob = await compositeBlob({
    image: state.image, row, tokens, colormap: state.colormap, opacity: state.opacity,
    grid: state.showGrid, smooth: state.smooth, marker: markerAt(state.query, state.layer),
    mask: state.mask ? state.massFraction : null, rings: artifactTokens(store),
  });
  const stem = (state.filename || "image").replace(/\.[a-z0-9]+$/i, "").replace(/[^a-z0-9_-]+/gi, "_").slice(0, 60);
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `headscope_${stem}_L${state.layer}_${state.head}_${state.query.replace(/[^a-z0-9]+/gi, "_")}.png`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

// ---------------------------------------------------------------- events
function bind() {
  bindViews(render);
  bindLearn(render, setQuery); // #15
  bindAblation(render, showError); // ablation view (#16)
  $("image-input").addEventListener("change", (e) => {
    const f = e.target.files && e.target.files[0];
    if (f) uploadFile(f);
    e.target.value = "";
  });
  for (const b of document.querySelectorAll("[data-sample]")) {
    b.addEventListener("click", () => useSample(b.dataset.sample));
  }
  $("model").addEventListener("change", (e) => {
    state.model = e.target.value;
    if (state.imageId) openById(state.imageId, { layer: state.layer, head: state.head, q: state.query }, `Computing attention with ${state.model}…`);
    else { syncUrl(); render(); }
  });
  $("layer").addEventListener("input", (e) => pick(Number(e.target.value), state.head));
  $("head").addEventListener("change", (e) => pick(state.layer, e.target.value));
  $("query-mode").addEventListener("change", (e) => {
    const v = e.target.value;
    if (v !== "patch") return setQuery(v);
    const [R, C] = state.meta.tokens.grid;
    return setQuery(lastPatch && parseQuery(lastPatch) ? lastPatch : `patch:${Math.floor(R / 2)},${Math.floor(C / 2)}`);
  });
  $("hover-toggle").addEventListener("change", (e) => { state.hover = e.target.checked; render(); });
  $("opacity").addEventListener("input", (e) => { state.opacity = Number(e.target.value); render(); });
  $("colormap").addEventListener("change", (e) => { state.colormap = e.target.value; render(); });
  $("patch-grid-toggle").addEventListener("change", (e) => { state.showGrid = e.target.checked; render(); });
  $("smooth-toggle").addEventListener("change", (e) => { state.smooth = e.target.checked; render(); });
  $("download-png").addEventListener("click", () => downloadPng().catch(showError));

  // analysis tools: mass mask, attention sinks, compare, rollout options, chart modes
  $("mass-toggle").addEventListener("change", (e) => { state.mask = e.target.checked; render(); });
  $("mass-slider").addEventListener("input", (e) => {
    state.massFraction = Math.max(0.1, Math.min(0.95, Number(e.target.value)));
    render();
  });
  $("drop-tokens").addEventListener("change", (e) => { state.drop = e.target.value; render(); });
  $("compare-toggle").addEventListener("change", (e) => { enterCompare(e.target.checked); render(); });
  initCompare(render, setQuery);
  const setRollout = (patch) => { state.rollout = { ...state.rollout, ...patch }; render(); };
  $("rollout-start").addEventListener("change", (e) => setRollout({ start: Number(e.target.value) }));
  $("head-fusion").addEventListener("change", (e) => setRollout({ fusion: e.target.value }));
  let discardTimer = 0;
  $("discard-ratio").addEventListener("input", (e) => {
    // one request once the slider rests, not one per step
    $("discard-out").textContent = `${Math.round(Number(e.target.value) * 100)}%`;
    clearTimeout(discardTimer);
    discardTimer = setTimeout(() => setRollout({ discard: Math.max(0, Math.min(0.95, Number(e.target.value))) }), 150);
  });
  $("entropy-kind").addEventListener("change", (e) => { state.entropyKind = e.target.value; renderSlow(); });
  $("sink-kind").addEventListener("change", (e) => { state.sinkKind = e.target.value; renderSlow(); });
  $("similarity-kind").addEventListener("change", (e) => { state.simKind = e.target.value; renderSlow(); });
  $("error-close").addEventListener("click", () => { clearError(); render(); });

  const canvas = $("overlay");
  canvas.addEventListener("click", (e) => {
    const cell = state.meta && cellAt(canvas, e, state.meta.tokens);
    if (cell) setQuery(`patch:${cell.r},${cell.c}`);
  });
  canvas.addEventListener("pointermove", (e) => {
    const cell = state.meta && cellAt(canvas, e, state.meta.tokens);
    renderReadout(store, cell);
    if (cell && (state.hover || e.shiftKey)) setQuery(`patch:${cell.r},${cell.c}`);
  });
  canvas.addEventListener("pointerleave", () => renderReadout(store, null));

  document.addEventListener("keydown", (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey || !store) return;
    const t = e.target;
    if (t && t.closest && t.closest("select, textarea, input:not([type=checkbox]):not([type=file]), [contenteditable]")) return;
    const actions = {
      ArrowUp: () => stepLayer(1), ArrowDown: () => stepLayer(-1),
      ArrowRight: () => stepHead(1), ArrowLeft: () => stepHead(-1),
      Escape: () => setQuery(defaultQuery()),
    };
    if (actions[e.key]) {
      e.preventDefault();
      actions[e.key]();
    }
  });

  document.addEventListener("paste", (e) => {
    const t = e.target;
    if (t && t.closest && t.closest("input[type=text], textarea, [contenteditable]")) return;
    const files = [...((e.clipboardData && e.clipboardData.files) || [])];
    const file = files.find((f) => f.type.startsWith("image/")) || files[0];
    if (file) {
      e.preventDefault();
      uploadFile(file);
    } else {
      showError(new ApiError(0, "no_image", "The clipboard holds no image: copy a picture, then press Ctrl+V here."));
    }
  });

  let depth = 0;
  const hasFiles = (e) => e.dataTransfer && [...e.dataTransfer.types].includes("Files");
  document.addEventListener("dragenter", (e) => {
    if (!hasFiles(e)) return;
    depth++;
    document.body.classList.add("dragging");
  });
  document.addEventListener("dragleave", () => {
    depth = Math.max(0, depth - 1);
    if (!depth) document.body.classList.remove("dragging");
  });
  document.addEventListener("dragover", (e) => {
    if (hasFiles(e)) e.preventDefault();
  });
  document.addEventListener("drop", (e) => {
    depth = 0;
    document.body.classList.remove("dragging");
    if (!hasFiles(e)) return;
    e.preventDefault();
    const f = e.dataTransfer.files[0];
    if (f) uploadFile(f);
  });

  let resizeTimer = 0;
  new ResizeObserver(() => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      $("head-grid").dataset.key = "";
      $("model-view").dataset.key = "";
      $("rollout-strip").dataset.key = "";
      render();
      resizeCharts(charts);
    }, 80);
  }).observe($("viewer"));
}

async function start() {
  initStaticControls();
  bind();
  const want = readUrl();
  if (want.view) state.view = want.view;
  state.temperature = want.temperature; // #15
  state.model = want.model || document.body.dataset.defaultModel;
  render();
  try {
    const models = await getModels();
    state.models = models.models || [];
    state.model = want.model || models.default;
  } catch (e) {
    showError(e);
  }
  if (want.image) {
    await openById(want.image, { layer: want.layer, head: want.head, q: want.q }, "Loading the shared view…");
  } else {
    render();
  }
  document.body.dataset.ready = "1";
}

start();
