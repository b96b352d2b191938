// Fetching: what the shown view needs from the server, the loads of images, and cancellation.
//
// needRows(s, app) and the shown view's need(s, app) run after every render: they start the
// requests the state lacks (the query's rows for every view; for the maps view its rollout, the
// statistics, the compare sides' images) and each answer calls
// app.update() (render + need again) or app.fail(error, retry). A new image or model bumps
// state.requests.gen, so late answers of the previous one are dropped, and aborts the running
// image load and statistics (state.requests.load, .stats).
//
// app: {update(), fail(error, retry = null)} (actions.js).

import { ApiError, getAttention, loadImage, postImage } from "./api.js";
import { rowKeyOfAnswer } from "./data.js";
import { SIDES, followImage, otherKey, preset, sideData } from "./compare.js";
import { fmtBytes } from "./dom.js";
import { isAbort } from "./long-requests.js";
import {
  apiQuery, canonicalQuery, defaultQuery, dims, dropParts, hasCls, headChoices, mapQuery, nameOf, parseQuery,
} from "./state.js";
import { makeStore } from "./swin-store.js";
import { firstFields, isWindowed, shapeSummary } from "./windows.js";

const FIRST = { layers: "all", heads: "all" }; // the first answer of an image: one row, every map

/**
 * The fields of an image's first request under a model: one row of every map (windowed models:
 * one stage of a probe query, firstFields), at the page's softmax temperature.
 */
function firstRequest(s, windowed, query) {
  return {
    model: s.model, ...FIRST, query, ...firstFields({ windowed }),
    ...(s.temperature === 1 ? {} : { temperature: s.temperature }),
  };
}
const SLOW_ROWS_MS = 300; // a query's rows that take longer than this say so on the map
const ROWS_BUSY = "Loading the attention of this query…";

// ---------------------------------------------------------------- what the view needs
/**
 * The rows of the query for the shown image, whichever view is shown: they are the overlay and
 * the status line of the image (and what the other views' readers of s.store expect). Answers
 * call app.update(). Returns whether it started a request.
 */
export function needRows(s, app) {
  const store = s.store;
  if (!store) return false;
  const mine = (fn) => (...args) => { if (s.store === store) fn(...args); };
  const q = s.query;
  const tokens = s.meta.tokens;
  const busyRows = [...store.loading.keys()].some((k) => k.startsWith("rows|"));
  if (!store.rows.has(q)) {
    if (busyRows || store.hasFailed("rows", q)) return false;
    const slow = setTimeout(mine(() => {
      if (!s.busy) {
        s.busy = ROWS_BUSY;
        app.update();
      }
    }), SLOW_ROWS_MS);
    store.loadRows(q, apiQuery(q, tokens))
      .catch(mine((e) => {
        if (!isAbort(e)) app.fail(e, () => { store.forget("rows", q); app.update(); });
      }))
      .finally(() => {
        clearTimeout(slow);
        mine(() => {
          if (s.busy === ROWS_BUSY) s.busy = null;
          app.update();
        })();
      });
    return true;
  }
  return false;
}

/**
 * Start what the attention maps view lacks besides the rows (needRows): the compare sides, the
 * statistics, the rollout. Answers call app.update(). Returns whether it started a request (the
 * caller draws the loading state then).
 */
export function need(s, app) {
  const store = s.store;
  if (!store) return false;
  const mine = (fn) => (...args) => { if (s.store === store) fn(...args); };
  let started = needCompare(s, app);
  const q = s.query;
  const tokens = s.meta.tokens;
  const busyRows = [...store.loading.keys()].some((k) => k.startsWith("rows|"));
  if (!store.rows.has(q)) return started; // the overlay first (needRows)
  // The statistics wait for the overlay (the rows are in, so render() has drawn it) and for no
  // new image to be on its way: they hold the server's worker for seconds, and an upload
  // behind them would wait.
  if (!store.stats && !s.requests.load && !store.isLoading("stats") && !store.hasFailed("stats")) {
    const ctl = new AbortController();
    s.requests.stats = ctl;
    started = true;
    store.loadStats(ctl.signal)
      .catch(mine((e) => {
        if (isAbort(e)) return;
        app.fail(e, () => { store.forget("stats"); app.update(); });
      }))
      .finally(() => {
        if (s.requests.stats === ctl) s.requests.stats = null;
        mine(app.update)();
      });
  }
  const r = s.rollout;
  if (!store.has(q, "rollout", r) && !busyRows && !store.isLoading("rollout", q, r) && !store.hasFailed("rollout", q, r)) {
    started = true;
    store.loadRollout(q, apiQuery(q, tokens), parseQuery(q, tokens).token, r)
      .catch(mine((e) => {
        // Said only when the rollout is on show now; one asked for ahead is asked again once it is
        // chosen (actions.js pick).
        if (s.head === "rollout" && !isAbort(e)) app.fail(e, () => { store.forget("rollout", q, r); app.update(); });
      }))
      .finally(mine(app.update));
  }
  return started;
}

/** Start what the compare sides lack (their image, rows, rollout, stats); whether it started any. */
function needCompare(s, app) {
  if (!s.compare.on || !s.meta) return false;
  const store = s.store;
  let started = false;
  for (const name of SIDES) {
    const side = s.compare[name];
    if (!side) continue;
    // Only a request that starts here gets the update() callback: one render when it ends.
    if (typeof side.image === "string" && side.image.startsWith("sample:")) {
      if (!s.compare.loading.has(side.image)) {
        started = true;
        openSample(s, side.image.slice(7), app).finally(app.update);
      }
      continue;
    }
    const ctx = sideData(s, side);
    if (!ctx) {
      const key = otherKey(s.model, side.image);
      if (!s.compare.loading.has(key) && !s.compare.failed.has(key)) {
        started = true;
        openOther(s, side.image, app).finally(app.update);
      }
      continue;
    }
    if (ctx.store === store) continue; // need() fetches what the main view needs
    const st = ctx.store;
    const q = mapQuery(s.query, s.meta.tokens, ctx.tokens);
    const fail = (e) => { if (s.compare.on && !isAbort(e)) app.fail(e); }; // not once compare mode is closed
    if (!st.rows.has(q)) {
      if (!st.isLoading("rows", q) && !st.hasFailed("rows", q)) {
        started = true;
        st.loadRows(q, apiQuery(q, ctx.tokens)).catch(fail).finally(app.update);
      }
      continue;
    }
    const r = s.rollout;
    if (side.head === "rollout" && !st.has(q, "rollout", r) && !st.isLoading("rollout", q, r) && !st.hasFailed("rollout", q, r)) {
      started = true;
      st.loadRollout(q, apiQuery(q, ctx.tokens), parseQuery(q, ctx.tokens).token, r).catch(fail).finally(app.update);
    }
    if (dropParts(s.drop).artifacts && !st.stats && !st.isLoading("stats") && !st.hasFailed("stats")) {
      started = true;
      st.loadStats().catch(fail).finally(app.update);
    }
  }
  return started;
}

// ---------------------------------------------------------------- opening images
/** A new image load begins: drop the answers of the previous one, cancel its requests. */
function begin(s) {
  s.requests.gen += 1;
  if (s.requests.load) s.requests.load.abort();
  if (s.requests.stats) s.requests.stats.abort();
  s.requests.stats = null;
  s.requests.load = new AbortController();
  s.error = null;
  return { my: s.requests.gen, signal: s.requests.load.signal };
}

function end(s, my) {
  if (my === s.requests.gen) s.requests.load = null;
}

function modelInfo(s, id) {
  return s.models.find((m) => m.id === id) || null;
}

/** The first query to ask for: CLS when the model has one (token 0 is CLS then), else token 0. */
function firstQuery(s) {
  const info = modelInfo(s, s.model);
  if (info && Array.isArray(info.prefix_tokens)) {
    return info.prefix_tokens.some((p) => p.kind === "cls") ? "cls" : "0";
  }
  return "0";
}

/**
 * The data of an attention answer: {meta, store}. Its rows are of the temperature the answer says
 * (the one asked for when it was sent): the slider may have moved meanwhile, and update() then
 * asks for the rows of the new one (syncStores).
 */
function storeOf(ans) {
  const meta = { ...ans };
  delete meta.data;
  const store = makeStore(meta); // windowed models (Swin): rows per stage
  store.setTemperature(ans.temperature);
  store.putRows(rowKeyOfAnswer(ans), ans.data);
  return { meta, store };
}

// The server names an image only in the answer to its upload (the id is the content's: whoever
// sends the same bytes shares it, and must not see the name another gave it). The page keeps the
// names it gave in the tab's sessionStorage, so a reload shows them again; they never leave the browser.
const NAMES_KEY = "headscope.names";
const MAX_NAMES = 100;

function savedNames() {
  try {
    const names = JSON.parse(sessionStorage.getItem(NAMES_KEY) || "{}");
    return names && typeof names === "object" && !Array.isArray(names) ? names : {};
  } catch {
    return {}; // storage off, or not ours: the page works without it
  }
}

/** The name this tab gave the upload `id`, if any. */
function savedName(id) {
  const name = savedNames()[id];
  return typeof name === "string" ? name : null;
}

function saveName(id, name) {
  const names = savedNames();
  delete names[id];
  names[id] = name; // the newest last; the oldest are dropped past MAX_NAMES
  const ids = Object.keys(names);
  for (const old of ids.slice(0, Math.max(0, ids.length - MAX_NAMES))) delete names[old];
  try {
    sessionStorage.setItem(NAMES_KEY, JSON.stringify(names));
  } catch {
    // full or off: the name shows until the page is left, as before
  }
}

/** Remember an image opened in this session (for the compare image pickers). */
function rememberImage(s, id, filename, sample = null) {
  const known = s.session.find((x) => x.id === id);
  if (known) {
    if (sample) known.sample = sample;
    return;
  }
  s.session.push({ id, filename: nameOf(filename, id), sample });
}

/** Make an attention answer the shown image. want: {layer, head, q} to restore, if valid. */
async function adopt(s, ans, my, want = {}, sample = null) {
  const image = s.image && s.imageId === ans.image_id ? s.image : await loadImage(ans.image_id);
  if (my !== s.requests.gen) return;
  const { meta, store } = storeOf(ans);
  const oldId = s.imageId;
  if (s.model !== ans.model || (s.store && s.store.model !== ans.model)) {
    s.compare.others.clear(); // the other images' maps were of the previous model
    s.compare.failed.clear();
  }
  const keep = { layer: s.layer, head: s.head };
  if (ans.filename) saveName(ans.image_id, ans.filename); // an upload's answer: the only one with the name
  Object.assign(s, {
    meta, store, image, imageId: ans.image_id, model: ans.model,
    // the shown name stays for the same image (a model switch), never for another one
    filename: ans.filename || (ans.image_id === s.imageId ? s.filename : null) || savedName(ans.image_id),
  });
  rememberImage(s, ans.image_id, s.filename, sample);
  const { L, H, N } = dims(meta);
  // The last layer by default (where the CLS maps are most telling).
  const layer = Number.isInteger(want.layer) ? want.layer : L - 1;
  s.layer = layer >= 0 && layer < L ? layer : L - 1;
  const heads = headChoices(meta, s.layer); // swin: the heads of that layer's stage
  s.head = heads.includes(want.head) ? want.head : (heads.includes(keep.head) ? keep.head : "0");
  // In its one spelling (an old shared link's query reads as the API's, state.js parseQuery).
  s.query = canonicalQuery(want.q, meta.tokens) || defaultQuery(meta.tokens);
  s.lastPatch = parseQuery(s.query, meta.tokens).kind === "patch" ? s.query : null;
  s.rollout = { ...s.rollout, start: Math.min(s.rollout.start, L - 1) };
  // Chart modes the new model cannot have (no CLS token) fall back to ones it can.
  if (!hasCls(meta.tokens)) {
    if (s.entropyKind === "cls") s.entropyKind = "all";
    if (s.simKind === "cos") s.simKind = "js";
  }
  followImage(s, oldId);
  const t = ans.timing_ms;
  s.summary = `${nameOf(s.filename, s.imageId)} · ${shapeSummary(meta) || `${L} layers × ${H} heads · ${N} tokens`} · `
    + (ans.cached ? "from the server's cache" : `computed in ${Math.round(t.queue + t.compute)} ms`);
  s.error = null;
  s.busy = null;
}

/** Upload a file and show it (sample: the sample's URL when it is one). */
export async function openFile(s, file, app, sample = null) {
  if (!file) return;
  const max = Number(document.body.dataset.maxUpload || 0);
  if (max && file.size > max) {
    app.fail(new ApiError(413, "upload_too_large",
      `“${file.name}” is ${fmtBytes(file.size)}; this server accepts up to ${fmtBytes(max)}.`));
    return;
  }
  const { my, signal } = begin(s);
  s.filename = file.name || "pasted image";
  s.busy = `Computing attention for “${s.filename}”…`;
  app.update();
  try {
    const info = modelInfo(s, s.model);
    const fields = firstRequest(s, !!(info && info.windowed), firstQuery(s));
    const ans = await postImage(file, fields, signal);
    if (my !== s.requests.gen) return;
    const keep = s.store ? { layer: s.layer, head: s.head } : {};
    await adopt(s, ans, my, keep, sample);
  } catch (e) {
    if (my !== s.requests.gen || isAbort(e)) return;
    s.busy = null;
    s.filename = s.meta ? s.meta.filename : null;
    end(s, my);
    app.fail(e, () => openFile(s, file, app, sample));
    return;
  }
  end(s, my);
  if (my === s.requests.gen) app.update();
}

/**
 * Ask the server for an image it already has (a shared URL, or a model switch). want: {layer,
 * head, q} to restore, or a function giving them when the answer is in (what the person chose
 * while it was on its way).
 */
export async function openById(s, imageId, want, what, app) {
  const { my, signal } = begin(s);
  s.busy = what;
  app.update();
  try {
    const info = modelInfo(s, s.model);
    const ans = await getAttention(imageId, firstRequest(s, !!(info && info.windowed), firstQuery(s)), signal);
    if (my !== s.requests.gen) return;
    await adopt(s, ans, my, typeof want === "function" ? want() : want);
  } catch (e) {
    if (my !== s.requests.gen || isAbort(e)) return;
    s.busy = null;
    if (s.store) s.model = s.store.model; // a failed model switch keeps the previous view
    end(s, my);
    app.fail(e, e.code === "image_not_found" ? null : () => openById(s, imageId, want, what, app));
    return;
  }
  end(s, my);
  if (my === s.requests.gen) app.update();
}

/** A sample image as a File (fetched from the page's own static files). */
export async function sampleFile(url) {
  const resp = await fetch(url);
  if (!resp.ok) throw new ApiError(resp.status, "sample_missing", `the sample ${url} could not be loaded`);
  const blob = await resp.blob();
  return new File([blob], url.split("/").pop(), { type: blob.type || "image/png" });
}

// ---------------------------------------------------------------- compare: other images
async function openOther(s, id, app) {
  const model = s.model;
  const key = otherKey(model, id);
  const p = (async () => {
    const ans = await getAttention(id, firstRequest(s, isWindowed(s.meta), hasCls(s.meta.tokens) ? "cls" : "0"));
    const image = await loadImage(id);
    const { meta, store } = storeOf(ans);
    const entry = s.session.find((x) => x.id === id);
    const filename = nameOf((entry && entry.filename) || ans.filename || savedName(id), id);
    rememberImage(s, id, filename); // a shared link's other image: the side's picker lists it
    s.compare.others.set(key, { store, image, meta, tokens: meta.tokens, filename });
  })();
  s.compare.loading.set(key, p);
  try {
    await p;
  } catch (e) {
    s.compare.failed.add(key);
    retarget(s, id, s.imageId);
    if (s.compare.on) app.fail(e);
  } finally {
    s.compare.loading.delete(key);
  }
}

/** Compare sides that show image `from` (an id, or a sample's "sample:url" while it loads) show `to`. */
function retarget(s, from, to) {
  for (const name of SIDES) {
    const side = s.compare[name];
    if (side && side.image === from) side.image = to;
  }
}

async function openSample(s, url, app) {
  const key = `sample:${url}`;
  const p = (async () => {
    const file = await sampleFile(url);
    const ans = await postImage(file, firstRequest(s, isWindowed(s.meta), hasCls(s.meta.tokens) ? "cls" : "0"));
    const image = await loadImage(ans.image_id);
    const { meta, store } = storeOf(ans);
    rememberImage(s, ans.image_id, file.name, url);
    if (ans.filename) saveName(ans.image_id, ans.filename);
    s.compare.others.set(otherKey(ans.model, ans.image_id), { store, image, meta, tokens: meta.tokens, filename: file.name });
    // The shown picture itself (a tab opened from a link knows neither its name nor its sample):
    // "two images" then takes the next one, as its preset would have with the sample known.
    const same = ans.image_id === s.imageId && s.compare.mode === "images";
    retarget(s, key, same ? preset(s, "images").b.image : ans.image_id);
  })();
  s.compare.loading.set(key, p);
  try {
    await p;
  } catch (e) {
    retarget(s, key, s.imageId);
    if (s.compare.on) app.fail(e);
  } finally {
    s.compare.loading.delete(key);
  }
}

