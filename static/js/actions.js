// The page's loop and the state changes a person asks for. Every change ends in update():
// render() draws the state, the URL follows, and the shown view's need() starts the requests
// it lacks, whose answers call update() again. bindings.js, intake.js and the views call the
// actions here; nothing else writes the state except fetching.js (answers).

import { describeError, isRetryable } from "./api.js";
import { SIDES, preset } from "./compare.js";
import { debounce } from "./dom.js";
import { needRows } from "./fetching.js";
import { render, renderSlow } from "./render.js";
import {
  ablateOf, canonicalQuery, defaultQuery, dims, headChoices, parseQuery, state, syncUrl,
} from "./state.js";
import { releaseViews, shownView } from "./views.js";

const SLOW_MS = 40; // charts and the model view wait until the pointer rests this long

const slowSoon = debounce(() => renderSlow(state, actions), SLOW_MS);

/**
 * What fetching and the views call back: re-render, or show an error. An error may name its
 * `source`, `{data, family}`: a view's answers (`data`, one object per view, picture and model)
 * and a kind of request among them ("map", "raw", "zero", "test"). settle(data, family), called
 * when a request of that kind is answered or the answer now asked for is at hand, takes such an
 * error down (what it said is no longer so) and says whether it did; the caller redraws.
 */
export const app = {
  update,
  fail: (err, retry = null, source = null) => showError(err, retry, source),
  settle: (data, family) => {
    const src = state.error && state.error.source;
    if (!src || src.data !== data || src.family !== family) return false;
    state.error = null;
    return true;
  },
};

/**
 * The shown image's store follows what the maps show: the softmax temperature and the heads
 * switched off in the Ablation view (asked for once another view shows the maps, so a click on a
 * head there costs one forward, not two).
 */
function syncStores() {
  const stores = [state.store, ...[...state.compare.others.values()].map((o) => o.store)].filter(Boolean);
  for (const st of stores) st.setTemperature(state.temperature);
  if (state.store && state.view !== "ablation") state.store.setAblate(ablateOf(state));
}

/** Draw the state, sync the URL, start what the shown view lacks. */
export function update() {
  syncStores();
  render(state, actions);
  slowSoon();
  if (state.imageId || state.view !== "viewer") syncUrl(state);
  releaseViews(state);
  const view = shownView(state);
  // What need() starts (a loading note, a spinner) shows at once, not with the answer.
  const rows = needRows(state, app); // the shown image's query rows, whichever view is shown
  const more = !!(view && view.need && view.need(state, app));
  if (rows || more) render(state, actions);
}

/** Redraw the heavy parts now (a chart mode changed: no request needed). */
function updateSlow() {
  render(state, actions);
  renderSlow(state, actions);
}

function pick(layer, head) {
  const { L } = dims(state.meta);
  state.layer = Math.max(0, Math.min(L - 1, layer));
  const heads = headChoices(state.meta, state.layer);
  // A rollout that failed while asked for ahead (nothing said it) is asked again once chosen.
  if (head === "rollout" && state.head !== "rollout" && state.store) state.store.forget("rollout", state.query, state.rollout);
  if (heads.includes(head)) state.head = head;
  else if (!heads.includes(state.head)) state.head = String(dims(state.meta, state.layer).H - 1); // swin: fewer heads here
  update();
}

/** Query one row: any one-row spelling of the API's grammar, kept in its one spelling. */
function setQuery(spec) {
  const tokens = state.meta && state.meta.tokens;
  const q = canonicalQuery(spec, tokens);
  if (!q || q === state.query) return;
  if (parseQuery(q, tokens).kind === "patch") state.lastPatch = q;
  state.query = q;
  update();
}

/** The query-mode select: a prefix token, or "patch" (the last patch, else the centre one). */
function setQueryMode(v) {
  if (v !== "patch") return setQuery(v);
  const t = state.meta.tokens;
  const [R, C] = t.grid;
  const last = state.lastPatch && parseQuery(state.lastPatch, t) ? state.lastPatch : null;
  return setQuery(last || `patch:${Math.floor(R / 2)},${Math.floor(C / 2)}`);
}

function stepLayer(d) {
  const { L } = dims(state.meta);
  if (L) pick(Math.max(0, Math.min(L - 1, state.layer + d)), state.head);
}

function stepHead(d) {
  const choices = headChoices(state.meta, state.layer);
  const i = choices.indexOf(state.head);
  if (i >= 0) pick(state.layer, choices[Math.max(0, Math.min(choices.length - 1, i + d))]);
}

function resetQuery() {
  if (state.meta) setQuery(defaultQuery(state.meta.tokens));
}

/** Display options and tools: {opacity, colormap, showGrid, smooth, hover, mask, massFraction, drop}. */
function set(patch) {
  Object.assign(state, patch);
  update();
}

/** Chart modes ({entropyKind, sinkKind, simKind}): drawn from data the page has; they travel in the link. */
function setChart(patch) {
  Object.assign(state, patch);
  if (state.imageId) syncUrl(state);
  updateSlow();
}

function setRollout(patch) {
  state.rollout = { ...state.rollout, ...patch };
  update();
}

/**
 * The softmax temperature of every map (both sliders, released): the stores drop
 * their rows of the old temperature; the shown view asks for the new ones (one cached GET).
 */
function setTemperature(t) {
  if (!(Number.isFinite(t) && t > 0) || t === state.temperature) return;
  state.temperature = t;
  if (state.store) state.store.setTemperature(t);
  for (const other of state.compare.others.values()) other.store.setTemperature(t);
  update();
}

/**
 * A view's own part of the state (state[name], e.g. state.learn): patch it and update. Views
 * call this from their bind(act) for what only they show (a hovered token, a tool's options).
 */
function setIn(name, patch) {
  state[name] = { ...state[name], ...patch };
  update();
}

function setView(name) {
  if (state.view === name) return;
  state.view = name;
  update();
}

// ---------------------------------------------------------------- compare mode
function setCompare(on) {
  state.compare.on = on;
  if (on) Object.assign(state.compare, preset(state, state.compare.mode));
  update();
}

function setCompareMode(mode) {
  state.compare.mode = mode;
  Object.assign(state.compare, preset(state, mode));
  update();
}

/** One side's pickers: patch of {image, layer, head}. */
function setSide(name, patch) {
  if (!SIDES.includes(name)) return;
  state.compare[name] = { ...state.compare[name], ...patch };
  update();
}

// ---------------------------------------------------------------- errors
/**
 * Show an error; "Try again" (retry) only when sending the same request again can help
 * (api.js isRetryable: busy, timeouts, 503, the network).
 */
function showError(err, retry = null, source = null) {
  console.warn("headscope:", err);
  state.error = { ...describeError(err), code: err && err.code, retry: retry && isRetryable(err) ? retry : null, source };
  update();
}

function clearError() {
  state.error = null;
  update();
}

function retry(fn) {
  state.error = null;
  fn();
}

export const actions = {
  update, pick, setQuery, setQueryMode, stepLayer, stepHead, resetQuery, set, setChart, setRollout, setTemperature, setIn, setView,
  setCompare, setCompareMode, setSide, showError, clearError, retry,
};
