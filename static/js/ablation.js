// The "Ablation" view: switch heads off and see the model's own output change (saliency for the
// default model, classes for classifiers, the embedding's norm otherwise); head importance on
// demand (exact sweep or gradient) with progress, and the pruning curve.
//
// The user's choices live in state.ablation ({off: ["l:h", …], method}). What the server
// answered lives here, per image and model (`store`): outputs by ablation set, importance and
// pruning answers by method, and the progress of the running ones.
//
// Progress: GET …/importance?wait=S (and …/pruning) answers 200 with the final JSON once the
// computation is done, or 202 with its progress after S seconds (the computation goes on). While
// that request is open the page polls GET …/importance/progress every 250 ms ({state, fraction,
// eta_s, stage}) and shows a bar; after a 202 it asks again.

import { getLong, getOutput, getProgress } from "./api.js";
import {
  renderDifference, renderImportance, renderModelOutput, renderPicture, renderProgress, renderPruning, renderToggles,
} from "./ablation_view.js";
import { dims, state } from "./state.js";
import { isWindowed } from "./windows.js";

const $ = (id) => document.getElementById(id);
const POLL_MS = 250;
const WAIT_S = 20; // a long request is answered within this (202 with the progress when not done)
const TRANSIENT = new Set(["busy", "timeout"]);
const LABELS = { ablation: "exact ablation sweep", gradient: "gradient (Michel et al.)" };

let onChange = () => {};
let onError = () => {};
let store = null;

function storeFor(imageId, model) {
  if (!imageId || !model) return null;
  const key = `${imageId}|${model}`;
  if (!store || store.key !== key) {
    store = {
      key, imageId, model,
      outputs: new Map(),   // ablate text -> GET …/output answer
      shown: null,          // the ablate text of the output on screen while the next one loads
      loading: new Set(),   // "output|text", "importance|method", "pruning|method"
      failed: new Set(),
      retries: new Map(),   // "output|text" -> failed attempts (busy, timeout)
      asked: new Set(),     // methods whose importance the user asked for
      importance: new Map(), // method -> answer
      pruning: new Map(),    // method -> answer
      progress: new Map(),   // "importance|method" -> progress answer
    };
  }
  return store;
}

/** The heads switched off, as valid sorted [layer, head] pairs of the shown model (none for a
 * windowed model: the server has no head ablation for those). */
function offPairs() {
  if (isWindowed(state.meta)) return [];
  const { L, H } = dims(state.meta);
  const pairs = [];
  for (const k of state.ablation.off) {
    const [l, h] = k.split(":").map(Number);
    if (Number.isInteger(l) && Number.isInteger(h) && l >= 0 && l < L && h >= 0 && h < H) pairs.push([l, h]);
  }
  pairs.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  return pairs;
}

const ablateText = (pairs) => pairs.map(([l, h]) => `${l}:${h}`).join(",");

/** The `ablate` of the maps view: the heads switched off here ("" for the model itself). */
export function mapsAblate() {
  return state.meta ? ablateText(offPairs()) : "";
}

/** The maps view's note while heads are off: which, and a way to switch them all back on. */
export function renderMapsAblated() {
  const el = $("maps-ablated");
  if (!el) return;
  const pairs = state.meta ? offPairs() : [];
  el.hidden = !pairs.length;
  if (!pairs.length) return;
  $("maps-ablated-text").textContent = ablatedNote(pairs, dims(state.meta).L);
}

/**
 * The maps view's words for the heads switched off ([layer, head] pairs, sorted): a removed head's
 * output is zeroed after its own layer's attention, so the maps up to the first layer with a head
 * off are the model's own and the later ones change.
 */
export function ablatedNote(pairs, L) {
  const n = pairs.length;
  const list = n <= 6 ? ` (${pairs.map(([l, h]) => `layer ${l} head ${h}`).join(", ")})` : "";
  const first = pairs[0][0];
  const where = first >= L - 1
    ? `The maps are the model's own: removing a head acts after its layer's attention, and layer ${first} is the last.`
    : `Layers 0–${first} are unchanged (removing a head acts after its layer's attention); `
      + `from layer ${first + 1} on, the maps are those of the model without ${n > 1 ? "these heads" : "it"}.`;
  return `Maps of the model with ${n} head${n > 1 ? "s" : ""} off${list}, switched off in the Ablation view. ${where}`;
}

// ---------------------------------------------------------------- fetching
function fetchOutput(s, text) {
  const key = `output|${text}`;
  if (s.outputs.has(text) || s.loading.has(key) || s.failed.has(key)) return;
  // One ablated output at a time: clicks made meanwhile are answered by the next request.
  if (text && [...s.loading].some((k) => k.startsWith("output|") && k !== "output|")) return;
  s.loading.add(key);
  getOutput(s.imageId, { model: s.model, ablate: text })
    .then((ans) => {
      s.outputs.set(text, ans);
      if (text === ablateText(offPairs())) s.shown = text;
    })
    .catch(async (e) => {
      // A busy or slow server is worth a second try before the page shows an error.
      const tries = (s.retries.get(key) || 0) + 1;
      s.retries.set(key, tries);
      if (TRANSIENT.has(e && e.code) && tries < 3) {
        await sleep(1000 * tries);
        return;
      }
      s.failed.add(key);
      if (s === store) onError(e);
    })
    .finally(() => {
      s.loading.delete(key);
      if (s === store) onChange();
    });
}

const sleep = (ms) => new Promise((r) => { setTimeout(r, ms); });

/** GET …/{what} with progress polling, asking again after each 202 until the answer is there. */
async function longRequest(s, what, params) {
  const pkey = `${what}|${params.method}`;
  let open = true;
  const poll = async () => {
    while (open) {
      try {
        const p = await getProgress(s.imageId, what, params);
        if (!open) break;
        s.progress.set(pkey, p);
        if (s === store) onChange();
      } catch {
        // progress is a nicety: the answer itself reports errors
      }
      await sleep(POLL_MS);
    }
  };
  poll();
  try {
    for (;;) {
      const ans = await getLong(s.imageId, what, { ...params, wait: WAIT_S });
      if (ans.done) return ans.body;
    }
  } finally {
    open = false;
    s.progress.delete(pkey);
  }
}

function fetchLong(s, what, method) {
  const key = `${what}|${method}`;
  const have = what === "importance" ? s.importance : s.pruning;
  if (have.has(method) || s.loading.has(key) || s.failed.has(key)) return;
  s.loading.add(key);
  longRequest(s, what, { model: s.model, method })
    .then((ans) => { have.set(method, ans); })
    .catch((e) => {
      s.failed.add(key);
      if (s === store) onError(e);
    })
    .finally(() => {
      s.loading.delete(key);
      if (s === store) onChange();
    });
}

/** Start fetching what the view lacks: the unablated output, the current one, importance, curve. */
function need(s) {
  fetchOutput(s, "");
  if (isWindowed(state.meta)) return; // the output only: no heads to remove, no importance
  const text = ablateText(offPairs());
  if (text) fetchOutput(s, text);
  for (const m of s.asked) {
    fetchLong(s, "importance", m);
    if (s.importance.has(m)) fetchLong(s, "pruning", m);
  }
}

// ---------------------------------------------------------------- actions
function toggle(layer, head) {
  const key = `${layer}:${head}`;
  const off = new Set(state.ablation.off);
  if (off.has(key)) off.delete(key);
  else off.add(key);
  state.ablation.off = [...off];
  onChange();
}

function progressView(s, method) {
  for (const what of ["importance", "pruning"]) {
    const key = `${what}|${method}`;
    if (s.loading.has(key)) {
      const p = s.progress.get(key) || { state: "running", fraction: 0 };
      const label = what === "importance" ? `Head importance, ${LABELS[method]}` : "Pruning curve";
      return { ...p, state: "running", label };
    }
    if (s.failed.has(key)) return { state: "failed", label: what === "importance" ? "Head importance" : "Pruning curve" };
  }
  const imp = s.importance.get(method);
  if (imp) {
    return {
      state: "done", fraction: 1,
      label: `Importance by ${LABELS[method]}: computed in ${(imp.timing_ms.compute / 1000).toFixed(1)} s on the server`,
    };
  }
  return { state: "idle", fraction: 0 };
}

// ---------------------------------------------------------------- render
/** Bring the view up to date with state (and fetch what it lacks while it is shown). */
export function renderAblation() {
  const panel = $("ablation-view");
  if (!panel || state.view !== "ablation") return;
  const s = storeFor(state.imageId, state.model);
  const ready = !!(s && state.image && state.meta);
  $("ablation-empty").hidden = ready;
  $("ablation-body").hidden = !ready;
  if (!ready) return;
  // Windowed models (Swin): the output alone; the heads and importance are hidden, with a note.
  const windowed = isWindowed(state.meta);
  $("ablation-windowed").hidden = !windowed;
  $("ablation-heads").hidden = windowed;
  $("importance-panel").hidden = windowed;
  const { L, H } = dims(state.meta);
  const pairs = offPairs();
  const text = ablateText(pairs);
  const method = state.ablation.method;
  const base = s.outputs.get("");
  const current = s.outputs.get(text) || (s.shown !== null ? s.outputs.get(s.shown) : null) || base;
  const loading = !s.outputs.has(text);
  renderPicture($("ablation-picture"), { image: state.image });
  renderModelOutput($("model-output"), { kind: base && base.kind, answer: current, base, image: state.image, loading });
  renderDifference($("output-difference"), text && current && current.ablate ? { answer: current, base, image: state.image } : null);
  if (windowed) {
    need(s);
    return;
  }
  const imp = s.importance.get(method);
  renderToggles($("ablate-grid"), { L, H, off: new Set(pairs.map(([l, h]) => `${l}:${h}`)), importance: imp ? imp.importance : null }, toggle);
  $("ablate-count").textContent = pairs.length
    ? `${pairs.length} of ${L * H} heads off${loading ? " · updating…" : ""}`
    : `all ${L * H} heads on`;
  $("ablate-reset").disabled = !pairs.length;
  const prog = progressView(s, method);
  renderProgress($("importance-progress"), prog);
  $("importance-run").disabled = s.loading.has(`importance|${method}`) || s.importance.has(method);
  $("importance-method").value = method;
  const asked = s.asked.has(method);
  renderImportance($("importance-heatmap"), imp ? { L, H, answer: imp } : null, toggle,
    asked && !imp ? "Measuring every head…" : null);
  renderPruning($("pruning-curve"), s.pruning.get(method) || null,
    asked ? "Removing heads, least important first…" : null);
  need(s);
}

/** Wire the view's own controls; onChange re-renders the page, onError shows a message. */
export function bindAblation(change, error) {
  onChange = change;
  onError = error;
  for (const id of ["ablate-reset", "maps-ablated-reset"]) {
    $(id).addEventListener("click", () => {
      state.ablation.off = [];
      onChange();
    });
  }
  $("importance-method").addEventListener("change", (e) => {
    state.ablation.method = e.target.value;
    if (store && store.asked.size) store.asked.add(state.ablation.method);
    onChange();
  });
  $("importance-run").addEventListener("click", () => {
    if (!store) return;
    store.asked.add(state.ablation.method);
    store.failed.delete(`importance|${state.ablation.method}`);
    store.failed.delete(`pruning|${state.ablation.method}`);
    onChange();
  });
}

/**
 * The view object (views.js): this module keeps the server's answers in its own `store` and its
 * controls write state.ablation; actions.update() gives the maps' store the heads that are off.
 */
export const ablationView = {
  name: "ablation",
  render: () => renderAblation(),
  bind: (act) => bindAblation(act.update, (e) => act.showError(e)),
};
