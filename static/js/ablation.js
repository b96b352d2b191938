// The "Ablation" view: switch heads off and see the model's own output change (saliency for the
// default model, classes for classifiers, the embedding's norm otherwise); head importance on
// demand (exact sweep or gradient) with progress, and the pruning curve. ablation-view.js draws.
//
// Its part of the state is state.ablation: what the person chose ({off: ["l:h", …], method,
// asked: ["image|model|method", …] (importance asked for), retry}) and, in `data`, what the server
// answered for the shown image and model (need() fetches into it): outputs by ablation set,
// importance and pruning answers by method, the requests on their way, and their progress.
//
// Progress: GET …/importance?wait=S (and …/pruning) answers 200 with the final JSON once the
// computation is done, or 202 with its progress after S seconds (the computation goes on). While
// that request is open the page polls GET …/importance/progress every 250 ms ({state, fraction,
// eta_s, stage}) and shows a bar; after a 202 it asks again.

import { getOutput } from "./api.js";
import {
  renderDifference, renderImportance, renderModelOutput, renderPicture, renderProgress, renderPruning, renderToggles,
} from "./ablation-view.js";
import { $, onPress, setOff } from "./dom.js";
import { announce, bindRoving, syncRoving } from "./keys.js";
import { IMPORTANCE_METHODS, ablateText, ablatedPairs, dims, switching } from "./state.js";
import { forget, forgetBusy, longRequest, sayUnsaid, track } from "./long-requests.js";
import { isWindowed } from "./windows.js";

const LABELS = { ablation: "exact ablation sweep", gradient: "gradient (Michel et al.)" };

/** The answers' key of the shown image and model ("" before an image). */
function keyOf(s) {
  return s.imageId && s.model && s.meta ? `${s.imageId}|${s.model}` : "";
}

/** What the server answered for the shown image and model: s.ablation.data when it is theirs. */
function dataOf(s) {
  const d = s.ablation.data;
  return d && d.key === keyOf(s) ? d : null;
}

/** Fresh answers for an image and model (need() puts them in s.ablation.data). */
function freshData(key, imageId, model) {
  return {
    key, imageId, model,
    outputs: new Map(),   // ablate text -> GET …/output answer
    shown: null,          // the ablate text of the output on screen while the next one loads
    loading: new Set(),   // "output|text", "importance|method", "pruning|method"
    failed: new Map(),    // the same keys -> the error (long-requests.js track)
    unsaid: [],           // failures that came while the view was not shown (sayUnsaid)
    retries: new Map(),   // the same keys -> failed attempts (busy, timeout)
    importance: new Map(), // method -> answer
    pruning: new Map(),    // method -> answer
    progress: new Map(),   // "importance|method" -> progress answer
    running: new Map(),    // the same keys -> the AbortController of the request while it runs
  };
}

/** Whether `d` is the data on show, and whether the Ablation view is too (see track). */
function where(s, d) {
  return { current: () => dataOf(s) === d, shown: () => s.view === "ablation" && dataOf(s) === d };
}

/** The heads switched off in the shown model, as sorted [layer, head] pairs (none for Swin). */
function offPairs(s) {
  return ablatedPairs(s.meta, s.ablation.off);
}

/** Whether importance was asked for this image, model and method. */
function asked(s, method) {
  return s.ablation.asked.includes(`${keyOf(s)}|${method}`);
}

// ---------------------------------------------------------------- fetching (into s.ablation.data)
function fetchOutput(s, d, text, app) {
  const key = `output|${text}`;
  if (d.outputs.has(text) || d.loading.has(key) || d.failed.has(key)) return false;
  // One ablated output at a time: clicks made meanwhile are answered by the next request.
  if (text && [...d.loading].some((k) => k.startsWith("output|") && k !== "output|")) return false;
  const onAnswer = (ans) => {
    d.outputs.set(text, ans);
    if (text === ablateText(offPairs(s))) d.shown = text;
  };
  return track(d, key, getOutput(d.imageId, { model: d.model, ablate: text }), onAnswer, app, where(s, d));
}

/** GET …/importance or …/pruning with its progress in d.progress while it runs. */
async function longAnswer(s, d, what, params, app) {
  const pkey = `${what}|${params.method}`;
  const onProgress = (p) => {
    d.progress.set(pkey, p);
    if (dataOf(s) === d) app.update();
  };
  const stop = new AbortController();
  d.running.set(pkey, stop);
  try {
    return await longRequest(d.imageId, what, params, onProgress, stop.signal);
  } finally {
    d.progress.delete(pkey);
    d.running.delete(pkey);
  }
}

/**
 * After every change, shown or not: the importance and pruning requests of another picture or
 * model than the shown one are given up (cancelled on the server), each holding a share of the
 * server's heavy work that the shown picture's runs need. Another method's runs go on: the view
 * shows them when their method is chosen again.
 */
function release(s) {
  const d = s.ablation.data;
  if (!d || !d.running.size || dataOf(s) === d) return;
  for (const stop of d.running.values()) stop.abort();
}

function fetchLong(s, d, what, method, app) {
  const key = `${what}|${method}`;
  const have = what === "importance" ? d.importance : d.pruning;
  if (have.has(method) || d.loading.has(key) || d.failed.has(key)) return false;
  const answer = longAnswer(s, d, what, { model: d.model, method }, app);
  return track(d, key, answer, (ans) => { have.set(method, ans); }, app, where(s, d));
}

/**
 * Start what the view lacks: the unablated output, the current one, and the importance and
 * pruning curve asked for. Answers go to s.ablation.data, then app.update(). Returns whether it
 * started a request.
 */
function need(s, app) {
  const key = keyOf(s);
  if (!key || !s.image || switching(s)) return false;
  if (!dataOf(s)) s.ablation.data = freshData(key, s.imageId, s.model);
  const d = s.ablation.data;
  sayUnsaid(d, app); // what failed while another view was shown
  if (s.ablation.retry) { // "Compute importance" again after a failure
    for (const what of ["importance", "pruning"]) forget(d, `${what}|${s.ablation.retry}`);
    s.ablation.retry = null;
  }
  const text = isWindowed(s.meta) ? "" : ablateText(offPairs(s));
  // what this call asks for stays failed (no loop of busy answers); the rest is asked again when needed again
  const methods = IMPORTANCE_METHODS.filter((m) => asked(s, m));
  forgetBusy(d, ["output|", `output|${text}`, ...methods.flatMap((m) => [`importance|${m}`, `pruning|${m}`])]);
  let started = fetchOutput(s, d, "", app);
  if (isWindowed(s.meta)) return started; // the output only: no heads to remove, no importance
  if (text) started = fetchOutput(s, d, text, app) || started;
  for (const m of methods) {
    started = fetchLong(s, d, "importance", m, app) || started;
    if (d.importance.has(m)) started = fetchLong(s, d, "pruning", m, app) || started;
  }
  return started;
}

// ---------------------------------------------------------------- render
function progressView(d, method) {
  for (const what of ["importance", "pruning"]) {
    const key = `${what}|${method}`;
    if (d.loading.has(key)) {
      const p = d.progress.get(key) || { state: "running", fraction: 0 };
      const label = what === "importance" ? `Head importance, ${LABELS[method]}` : "Pruning curve";
      return { ...p, state: "running", label };
    }
    if (d.failed.has(key)) return { state: "failed", label: what === "importance" ? "Head importance" : "Pruning curve" };
  }
  const imp = d.importance.get(method);
  if (imp) {
    return {
      state: "done", fraction: 1,
      label: `Importance by ${LABELS[method]}: computed in ${(imp.timing_ms.compute / 1000).toFixed(1)} s on the server`,
    };
  }
  return { state: "idle", fraction: 0 };
}

const EMPTY = freshData("", null, null);

/** Bring the view up to date with the state (reads it, writes the DOM only). */
function render(s, act, shown) {
  if (!shown) return;
  const ready = !!(keyOf(s) && s.image);
  $("ablation-empty").hidden = ready;
  $("ablation-body").hidden = !ready;
  if (!ready) return;
  const d = dataOf(s) || EMPTY; // need() makes the answers of a new image right after this render
  // Windowed models (Swin): the output alone; the heads and importance are hidden, with a note.
  const windowed = isWindowed(s.meta);
  $("ablation-windowed").hidden = !windowed;
  $("ablation-heads").hidden = windowed;
  $("importance-panel").hidden = windowed;
  const { L, H } = dims(s.meta);
  const pairs = offPairs(s);
  const text = ablateText(pairs);
  const method = s.ablation.method;
  const base = d.outputs.get("");
  const current = d.outputs.get(text) || (d.shown !== null ? d.outputs.get(d.shown) : null) || base;
  const loading = !d.outputs.has(text);
  renderPicture($("ablation-picture"), { image: s.image });
  renderModelOutput($("model-output"), { kind: base && base.kind, answer: current, base, image: s.image, loading });
  renderDifference($("output-difference"), text && current && current.ablate ? { answer: current, base, image: s.image } : null);
  if (windowed) return;
  const imp = d.importance.get(method);
  const toggle = (l, h) => {
    const key = `${l}:${h}`;
    const off = s.ablation.off.includes(key) ? s.ablation.off.filter((k) => k !== key) : [...s.ablation.off, key];
    act.setIn("ablation", { off });
  };
  renderToggles($("ablate-grid"), { L, H, off: new Set(pairs.map(([l, h]) => `${l}:${h}`)), importance: imp ? imp.importance : null }, toggle);
  syncRoving($("ablate-grid"), ".ablate-head");
  $("ablate-count").textContent = pairs.length
    ? `${pairs.length} of ${L * H} heads off${loading ? " · updating…" : ""}`
    : `all ${L * H} heads on`;
  setOff($("ablate-reset"), !pairs.length);
  renderProgress($("importance-progress"), progressView(d, method));
  setOff($("importance-run"), d.loading.has(`importance|${method}`) || d.importance.has(method));
  $("importance-method").value = method;
  const wanted = asked(s, method);
  renderImportance($("importance-heatmap"), imp ? { L, H, answer: imp } : null, toggle,
    wanted && !imp ? "Measuring every head…" : null);
  renderPruning($("pruning-curve"), d.pruning.get(method) || null,
    wanted ? "Removing heads, least important first…" : null);
}

/** Wire the view's own controls (s: the one state, read when an event comes). */
function bind(act, s) {
  // the toggles: one Tab stop, arrows inside (layers down, heads across)
  bindRoving($("ablate-grid"), ".ablate-head", (b) => [Number(b.dataset.layer), Number(b.dataset.head)]);
  onPress($("ablate-reset"), () => act.setIn("ablation", { off: [] }));
  // The maps' note hides itself once every head is on: its button's focus goes to the map.
  onPress($("maps-ablated-reset"), () => {
    act.setIn("ablation", { off: [] });
    $("overlay").focus();
    announce("All heads on: the maps are the model's own again.");
  });
  const ask = (method) => `${keyOf(s)}|${method}`;
  $("importance-method").addEventListener("change", (e) => {
    const method = e.target.value;
    // Once importance is asked for an image, another method is computed as soon as it is chosen.
    const more = IMPORTANCE_METHODS.some((m) => s.ablation.asked.includes(ask(m)));
    act.setIn("ablation", { method, asked: more ? [...new Set([...s.ablation.asked, ask(method)])] : s.ablation.asked });
  });
  onPress($("importance-run"), () => {
    if (!keyOf(s)) return;
    const method = s.ablation.method;
    act.setIn("ablation", { asked: [...new Set([...s.ablation.asked, ask(method)])], retry: method });
  });
}

/** The view object (views.js): its answers live in state.ablation.data. */
export const ablationView = { name: "ablation", render, need, bind, release };
