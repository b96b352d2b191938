// The "Why" view (#27): which patches made the model output what it did. The relevance map of one
// target of the output (GET …/relevance) beside the raw attention it improves on (the same
// answer's `attention` method: one forward and backward give both), a method and a target picker
// (the whole saliency output, a box drawn on it, or a class of the top 5), and the faithfulness
// test of the maps (GET …/faithfulness, with progress). why-view.js draws.
//
// Its part of the state is state.why: what the person chose ({method, target: "" (the model's
// default) | "output" | "box" | "top" | "class:N" | "embedding", box: [x0, y0, x1, y1] in output-map
// pixels or null, steps: "quick" | "full", asked: ["image|model|ablate", …] (the test asked for)})
// and, in `data`, what the server answered for the shown image, model and heads off (need()
// fetches into it).

import { getLong, getOutput } from "./api.js";
import { renderProgress } from "./ablation-view.js";
import { $, onPress, setOff, setOptions } from "./dom.js";
import { RELEVANCE_METHODS, ablateOf, switching } from "./state.js";
import { forget, forgetBusy, longRequest, sayUnsaid, track } from "./long-requests.js";
import { renderVerdict } from "./why-verdict.js";
import { METHOD_NAMES, methodHint, renderFaithfulness, renderRelevance, renderWhyOutput } from "./why-view.js";
import { bindSaliencyKeys } from "./why-keys.js";
import { renderFaithfulnessLive, renderFaithfulnessResults } from "./why-live.js";
import { hasText, labelsText, phraseTarget, renderTokens, renderZeroShot } from "./why-text.js";
import { isWindowed } from "./windows.js";

const RAW = "attention"; // the raw attention the maps improve on: the last layer's CLS row
const TESTED = RELEVANCE_METHODS; // in the test's order
const LRP = ["chefer2021", "attnlrp"]; // their rules cover the image tower alone: not for a phrase
const BASELINE = ["chefer", "attention", "random"]; // always tested, with the chosen method
const FRACTIONS = { quick: "0,0.25,0.5,0.75", full: "" }; // "": the server's default, 0, 0.1, …, 0.9
const DEFAULT_TARGET = { saliency: "output", classes: "top", embedding: "embedding" };

/** The answers' key of the shown image, model and heads off ("" before an image). */
function keyOf(s) {
  return s.imageId && s.model && s.meta ? `${s.imageId}|${s.model}|${ablateOf(s)}` : "";
}

function dataOf(s) {
  const d = s.why.data;
  return d && d.key === keyOf(s) ? d : null;
}

function freshData(key, imageId, model, ablate) {
  return {
    key, imageId, model, ablate,
    output: null,          // GET …/output answer (its kind, the saliency map, the top 5)
    maps: new Map(),       // "method|target" -> GET …/relevance answer
    tests: new Map(),      // "target|methods|fractions" -> GET …/faithfulness answer
    progress: new Map(),   // the same keys -> progress answer while the test runs
    running: new Map(),    // the same keys -> the AbortController of the test while it runs
    zeroShot: new Map(),   // labels -> GET …/zero-shot answer
    loading: new Set(),
    failed: new Map(),     // key -> the error (long-requests.js track)
    unsaid: [],            // failures that came while the view was not shown (sayUnsaid)
    retries: new Map(),    // key -> failed attempts (busy, timeout)
  };
}

/** Whether `d` is the data on show, and whether the Why view is too (see track). */
function where(s, d) {
  return { current: () => dataOf(s) === d, shown: () => s.view === "why" && dataOf(s) === d };
}

/** The API target the state asks for, given the output kind; null while a box is asked but not drawn. */
export function targetOf(why, kind, text = false) {
  if (why.target === "text") {
    if (text) return phraseTarget(why.phrase);
    why = { ...why, target: "" }; // another model, without a text tower: its default
  }
  const t = why.target || DEFAULT_TARGET[kind] || "";
  if (t === "box") {
    if (!why.box) return null;
    return `box:${why.box.join(",")}`;
  }
  if (kind === "saliency" && !["output", "box"].includes(t)) return "output";
  if (kind === "classes" && t !== "top" && !t.startsWith("class:")) return "top";
  if (kind === "embedding") return "embedding";
  return t;
}

/**
 * The method the view uses: the one chosen where it is offered for the target, else Chefer's (the
 * default). The choice itself is kept, so going back to a target that offers it brings it back.
 */
export function methodOf(why, text = false) {
  const isText = why.target === "text" && text;
  if (isText ? LRP.includes(why.method) : why.method === "legrad") return "chefer";
  return why.method;
}

/** The methods the test compares: the chosen one and the baseline set, in a fixed order. */
function testedMethods(method) {
  return TESTED.filter((m) => m === method || BASELINE.includes(m)).join(",");
}

function testKey(target, methods, fractions) {
  return `${target}|${methods}|${fractions}`;
}

// ---------------------------------------------------------------- fetching (into s.why.data)
function fetchOutput(s, d, app) {
  if (d.output || d.loading.has("output") || d.failed.has("output")) return false;
  const params = { model: d.model, ablate: d.ablate };
  return track(d, "output", getOutput(d.imageId, params), (ans) => { d.output = ans; }, app, where(s, d));
}

function fetchMap(s, d, method, target, app) {
  const key = `${method}|${target}`;
  if (d.maps.has(key) || d.loading.has(`map|${key}`) || d.failed.has(`map|${key}`)) return false;
  // One map at a time: a target or method chosen meanwhile is asked for when it is in (every
  // method of a target comes from one computation the server caches, so the next is quick).
  if ([...d.loading].some((k) => k.startsWith("map|"))) return false;
  const params = { model: d.model, ablate: d.ablate, method, target };
  const family = method === RAW ? "raw" : "map"; // the raw map's refusal is its own, not the chosen map's
  return track(d, `map|${key}`, getLong(d.imageId, "relevance", params).then((a) => a.body), (ans) => { d.maps.set(key, ans); }, app, where(s, d), family);
}

function fetchZeroShot(s, d, labels, app) {
  const key = `zero|${labels}`;
  if (!labels || d.zeroShot.has(labels) || d.loading.has(key) || d.failed.has(key)) return false;
  const params = { model: d.model, labels };
  return track(d, key, getLong(d.imageId, "zero-shot", params).then((a) => a.body), (ans) => { d.zeroShot.set(labels, ans); }, app, where(s, d));
}

/** GET …/faithfulness with its progress in d.progress while it runs. */
async function testRequest(s, d, key, params, app) {
  const onProgress = (p) => {
    d.progress.set(key, p);
    if (dataOf(s) === d) app.update();
  };
  const stop = new AbortController();
  d.running.set(key, stop);
  try {
    return await longRequest(d.imageId, "faithfulness", params, onProgress, stop.signal);
  } finally {
    d.progress.delete(key);
    d.running.delete(key);
  }
}

/**
 * Give up the tests of `d` the view no longer shows (all but `keep`): each holds a share of the
 * server's heavy work that the test on show needs (a client holds 2 by default).
 */
function stopTests(d, keep = null) {
  for (const [key, stop] of d.running) if (key !== keep) stop.abort();
}

/** The test the view shows for `target`: the methods it compares, its fractions and its key. */
function testSpec(s, target) {
  const methods = testedMethods(methodOf(s.why, hasText(s.models, s.model)));
  const fractions = FRACTIONS[s.why.steps] ?? "";
  return { methods, fractions, key: testKey(target, methods, fractions) };
}

/** The key of the test the view would show for `d` now; null without a target (no output, no box yet). */
function testOf(s, d) {
  if (!d.output) return null;
  const target = targetOf(s.why, d.output.kind, hasText(s.models, s.model));
  return target === null ? null : testSpec(s, target).key;
}

/** The key of the test the view shows for `d` now; null when it shows none (not asked, no target yet). */
function shownTest(s, d) {
  return s.why.asked.includes(d.key) ? testOf(s, d) : null;
}

/**
 * After every change, shown or not: the tests the view would no longer show are given up (another
 * picture, model or heads off: all of them; another target, method or fractions: all but the one
 * shown), each holding a share of the server's heavy work that the next one needs. Switching to
 * another view keeps a test running: it is still the one the Why view shows.
 */
function release(s) {
  const d = s.why.data;
  if (!d || !d.running.size) return;
  stopTests(d, dataOf(s) === d ? shownTest(s, d) : null);
}

function fetchTest(s, d, target, app) {
  const { methods, fractions, key } = testSpec(s, target);
  if (d.tests.has(key) || d.loading.has(key) || d.failed.has(key)) return false;
  const params = { model: d.model, ablate: d.ablate, methods, target, fractions };
  return track(d, key, testRequest(s, d, key, params, app), (ans) => { d.tests.set(key, ans); }, app, where(s, d), "test");
}

/**
 * Start what the view lacks: the model's output (its kind, the saliency map, the top 5), the
 * chosen method's map and the raw attention for the target, and the test once asked for.
 */
function need(s, app) {
  const key = keyOf(s);
  if (!key || !s.image || isWindowed(s.meta) || switching(s)) return false;
  if (!dataOf(s)) s.why.data = freshData(key, s.imageId, s.model, ablateOf(s)); // release() stopped the old tests
  const d = s.why.data;
  sayUnsaid(d, app); // what failed while another view was shown
  const text = hasText(s.models, s.model);
  const labels = text ? labelsText(s.why.labels) : "";
  const target = d.output ? targetOf(s.why, d.output.kind, text) : null;
  const method = methodOf(s.why, text);
  const test = shownTest(s, d);
  // what this call asks for stays failed (no loop of busy answers); the rest is asked again when needed again
  forgetBusy(d, ["output", `zero|${labels}`, `map|${method}|${target}`, `map|${RAW}|${target}`, test]);
  let started = fetchOutput(s, d, app);
  if (text) {
    if (d.zeroShot.has(labels)) started = app.settle(d, "zero") || started; // as a map's, below
    started = fetchZeroShot(s, d, labels, app) || started;
  }
  if (target === null) return started;
  // a refused map is old news once the map asked for now is in (one already here asks nothing)
  if (d.maps.has(`${method}|${target}`)) started = app.settle(d, "map") || started;
  started = fetchMap(s, d, method, target, app) || started;
  // the raw attention once the chosen map is in: the server answers it from the same computation
  if (d.maps.has(`${method}|${target}`)) started = fetchMap(s, d, RAW, target, app) || started;
  if (test) started = fetchTest(s, d, target, app) || started;
  return started;
}

// ---------------------------------------------------------------- render
function targetOptions(why, output, text) {
  if (!output) return [["", "…"]];
  if (text) {
    const p = phraseTarget(why.phrase);
    return [["embedding", "the embedding (its projection on itself)"], ["text", p ? `the phrase “${p.slice(5)}”` : "a phrase: type it below"]];
  }
  if (output.kind === "saliency") {
    const b = why.box;
    return [
      ["output", "the whole output (mean saliency)"],
      ["box", b ? `the box x ${b[0]}–${b[2]}, y ${b[1]}–${b[3]}` : "a box: draw one on the output (or with its keys)", !b],
    ];
  }
  if (output.kind === "classes") {
    const top = output.output.top5;
    return [
      ["top", `the top class (${top[0].label})`],
      ...top.map((c) => [`class:${c.index}`, `${c.label} (${(100 * c.probability).toFixed(1)}%)`]),
    ];
  }
  return [["embedding", "the embedding (its projection on itself)"]];
}

function testProgress(d, key) {
  if (d.loading.has(key)) {
    const p = d.progress.get(key) || { fraction: 0 };
    return { ...p, state: "running", label: "Removing patches and running the model" };
  }
  if (d.failed.has(key)) return { state: "failed", label: "The faithfulness test" };
  const ans = d.tests.get(key);
  if (ans) {
    return { state: "done", fraction: 1, label: `${ans.forwards} forwards in ${(ans.timing_ms.compute / 1000).toFixed(1)} s on the server` };
  }
  return { state: "idle", fraction: 0 };
}

const EMPTY = freshData("", null, null, "");

/** Bring the view up to date with the state (reads it, writes the DOM only). */
function render(s, act, shown) {
  if (!shown) return;
  const windowed = !!(s.meta && isWindowed(s.meta));
  const ready = !!(keyOf(s) && s.image) && !windowed;
  $("why-empty").hidden = !!(keyOf(s) && s.image);
  $("why-windowed").hidden = !windowed;
  $("why-body").hidden = !ready;
  $("faithfulness-panel").hidden = !ready;
  const text = hasText(s.models, s.model);
  const method = methodOf(s.why, text);
  $("relevance-method").value = method;
  $("faithfulness-steps").value = s.why.steps;
  // a chosen method the target does not offer: say which map is shown instead
  const swapped = method === s.why.method ? ""
    : `${METHOD_NAMES[s.why.method] || s.why.method} is not offered for ${s.why.method === "legrad" ? "this target (it explains a phrase)" : "a phrase"}: `
      + `the page shows ${METHOD_NAMES[method]}'s map. `;
  $("relevance-hint").textContent = swapped + methodHint(method);
  if (!ready) return;
  const d = dataOf(s) || EMPTY;
  const out = d.output;
  const target = out ? targetOf(s.why, out.kind, text) : null;
  const isText = s.why.target === "text" && text;
  setOptions($("relevance-target"), targetOptions(s.why, out, text));
  if (out) $("relevance-target").value = isText ? "text" : target && target.startsWith("box:") ? "box" : target || "box";
  $("relevance-method").querySelector("option[value=legrad]").disabled = !isText;
  for (const m of LRP) $("relevance-method").querySelector(`option[value=${m}]`).disabled = isText;
  $("why-text").hidden = !text;
  if (document.activeElement !== $("relevance-phrase")) $("relevance-phrase").value = s.why.phrase;
  if (document.activeElement !== $("zero-shot-labels")) $("zero-shot-labels").value = s.why.labels;
  renderWhyOutput($("why-output"), { answer: out, image: s.image, box: s.why.box, boxOn: !!target && target.startsWith("box:") });
  bindSaliencyKeys($("why-output"), s, act, () => (out && out.kind === "saliency" ? (dataOf(s) || EMPTY).output : null));
  const mapKey = `${method}|${target}`;
  renderRelevance($("relevance-figure"), {
    image: s.image, answer: d.maps.get(mapKey) || null, loading: !d.maps.has(mapKey) && !d.failed.has(`map|${mapKey}`) && target !== null, role: "relevance",
  });
  renderTokens($("text-tokens"), isText ? d.maps.get(mapKey) || null : null);
  const labels = labelsText(s.why.labels);
  const zs = `zero|${labels}`;
  const zsState = !labels ? "idle" : d.zeroShot.has(labels) ? "ready" : d.failed.has(zs) ? "failed" : "loading";
  renderZeroShot($("zero-shot-list"), text ? d.zeroShot.get(labels) || null : null, isText ? s.why.phrase.trim() : null,
    (label) => act.setIn("why", { target: "text", phrase: label }), zsState);
  const rawKey = `${RAW}|${target}`;
  // asked for once the chosen map is in (need()): never, where the chosen map was refused
  const rawComing = !d.maps.has(rawKey) && !d.failed.has(`map|${rawKey}`) && !d.failed.has(`map|${mapKey}`);
  renderRelevance($("raw-figure"), {
    image: s.image, answer: d.maps.get(rawKey) || null, loading: rawComing && target !== null, role: "raw",
  });
  const note = $("why-target-note");
  const whole = out && out.kind === "saliency" && target === "output";
  const noBox = out && out.kind === "saliency" && target === null;
  note.hidden = !(whole || noBox);
  note.textContent = noBox
    ? "Drag on the model output to draw a box (or focus it: arrows, Shift+arrows, Enter): the maps then explain the saliency inside it."
    : "The whole saliency map is a poor target: removing the patches the model looks at moves its saliency "
      + "elsewhere, so the total hardly falls and on the sample photos every map scored worse than random on average. "
      + "Drag on the model output to draw a box and ask about one region (without a mouse: Tab to the output, "
      + "move the cell cursor with the arrows, grow a box with Shift+arrows, Enter).";
  const key = target === null ? "" : testSpec(s, target).key;
  const asked = s.why.asked.includes(keyOf(s));
  const progress = key ? testProgress(d, key) : { state: "idle", fraction: 0 };
  renderProgress($("faithfulness-progress"), progress);
  setOff($("faithfulness-run"), !key || d.loading.has(key) || d.tests.has(key));
  const test = key ? d.tests.get(key) || null : null;
  renderFaithfulness($("faithfulness-chart"), test, asked && key && !d.failed.has(key) ? "Running the test…" : null);
  renderFaithfulnessResults($("faithfulness-results"), test);
  renderVerdict($("why-verdict"), test, METHOD_NAMES, document.body.dataset.docsUrl || "");
  renderFaithfulnessLive($("faithfulness-live"), progress, test);
}

/** Map pixels of the output figure under a pointer event (clamped to the map). */
function mapPoint(e, canvas, size) {
  const r = canvas.getBoundingClientRect();
  const [h, w] = size;
  const x = Math.round(((e.clientX - r.left) / r.width) * w);
  const y = Math.round(((e.clientY - r.top) / r.height) * h);
  return [Math.max(0, Math.min(w, x)), Math.max(0, Math.min(h, y))];
}

/** Wire the view's own controls (s: the one state, read when an event comes). */
function bind(act, s) {
  $("relevance-method").addEventListener("change", (e) => act.setIn("why", { method: e.target.value }));
  $("relevance-target").addEventListener("change", (e) => act.setIn("why", { target: e.target.value }));
  // the phrase and the labels: taken when typed out (Enter or leaving the box), not per key
  $("relevance-phrase").addEventListener("change", (e) => act.setIn("why", { phrase: e.target.value.trim(), target: "text" }));
  $("zero-shot-labels").addEventListener("change", (e) => act.setIn("why", { labels: e.target.value }));
  $("faithfulness-steps").addEventListener("change", (e) => act.setIn("why", { steps: e.target.value }));
  onPress($("faithfulness-run"), () => {
    const key = keyOf(s);
    if (!key) return;
    const d = dataOf(s);
    const test = d && testOf(s, d);
    if (test) forget(d, test); // run again after a failure
    act.setIn("why", { asked: [...new Set([...s.why.asked, key])] });
  });
  // A box drawn on the saliency output: the drag is kept on the box element (DOM, not module
  // state); its end writes the box, in output-map pixels, to the state.
  const fig = $("why-output");
  const boxEl = $("why-box");
  const answer = () => { const d = dataOf(s); return d && d.output && d.output.kind === "saliency" ? d.output : null; };
  fig.addEventListener("pointerdown", (e) => {
    const out = answer();
    const canvas = fig.querySelector("canvas");
    if (!out || !canvas || e.target !== canvas) return;
    e.preventDefault();
    canvas.setPointerCapture(e.pointerId);
    boxEl.dataset.start = JSON.stringify(mapPoint(e, canvas, out.input_size));
  });
  fig.addEventListener("pointermove", (e) => {
    const out = answer();
    const canvas = fig.querySelector("canvas");
    if (!out || !canvas || !boxEl.dataset.start) return;
    const [x0, y0] = JSON.parse(boxEl.dataset.start);
    const [x1, y1] = mapPoint(e, canvas, out.input_size);
    const b = [Math.min(x0, x1), Math.min(y0, y1), Math.max(x0, x1), Math.max(y0, y1)];
    renderWhyOutput(fig, { answer: out, image: s.image, box: b, boxOn: true, dragging: true });
  });
  const end = (e) => {
    const out = answer();
    const canvas = fig.querySelector("canvas");
    if (!boxEl.dataset.start) return;
    const [x0, y0] = JSON.parse(boxEl.dataset.start);
    delete boxEl.dataset.start;
    if (!out || !canvas) return;
    const [x1, y1] = mapPoint(e, canvas, out.input_size);
    const b = [Math.min(x0, x1), Math.min(y0, y1), Math.max(x0, x1), Math.max(y0, y1)];
    // A click (or a sliver) is not a box: keep the target there was.
    if (b[2] - b[0] < 4 || b[3] - b[1] < 4) return act.update();
    return act.setIn("why", { box: b, target: "box" });
  };
  fig.addEventListener("pointerup", end);
  fig.addEventListener("pointercancel", end);
}

/** The view object (views.js): its answers live in state.why.data. */
export const whyView = { name: "why", render, need, bind, release };
