// The "Inside a head" view: one head's whole computation for the query token, with the model's
// own tensors from GET /api/v1/attention/{id}/explain, stage by stage (learn-stages.js draws them).
//
// Its part of the state is state.learn: the explain answers, one per (image, model, layer, head,
// query), the requests on their way and the failed ones (need() fetches what is missing), the key
// under the pointer (`hover`) and the temperature slider's value while it is dragged (`previewT`).
// While the slider moves, the view recomputes the softmax, entropy, top tokens and o_h from the
// answer's `scores` and `v` in the page, in the same frame, with no request; released, it sets the
// page's temperature (state.temperature), and the maps follow (one cached GET).
//
// Windowed models (Swin, learn-window.js): the keys are the query's window (`key_tokens`: the stage
// cell of each place, -1 for padding); the maps are drawn on the layer's stage grid with the window
// outlined, and the temperature recomputes the softmax over the window's places.

import { getExplain, isRetryable } from "./api.js";
import { $, fmtTemperature, isTap, onPress, setOff, setText, sliderTemperature } from "./dom.js";
import { renderAnswer } from "./learn-stages.js";
import { isWindowAnswer } from "./learn-window.js";
import { tokenLabel } from "./learn-words.js";
import { bindCellCursor, selectionWords } from "./cell-cursor.js";
import { cellAt } from "./overlay.js";
import { apiQuery, markerAt, switching, tokensAt } from "./state.js";
import { isWindowed, stageOf } from "./windows.js";

const KEEP = 64; // explain answers kept (the oldest go first)

// ------------------------------------------------------------------ what the view shows
/** The (layer, head, query) the view explains for state `s`: a numeric head, or head 0 for an aggregate. */
function target(s) {
  const head = /^\d+$/.test(s.head) ? Number(s.head) : 0;
  if (isWindowed(s.meta)) { // swin: the stage's cell under the page's stage-0 query (cell 0 by default)
    const st = stageOf(s.meta, s.layer);
    const cell = markerAt(s.meta, s.query, s.layer) || { r: 0, c: 0 };
    return { layer: s.layer, head: Math.min(head, st.heads - 1), query: `patch:${cell.r},${cell.c}` };
  }
  return { layer: s.layer, head, query: apiQuery(s.query, s.meta.tokens) };
}

function keyOf(s, t) {
  return [s.imageId, s.model, t.layer, t.head, t.query].join("|");
}

/** The temperature the view draws at: the slider's while it is dragged, else the page's. */
function shownTemperature(s) {
  return s.learn.previewT ?? s.temperature;
}

// ------------------------------------------------------------------ fetching
/** Fetch the explain answer the view shows, if it is missing; answers go to s.learn, then app.update(). */
function need(s, app) {
  if (!s.imageId || !s.meta || switching(s)) return false;
  const { answers, loading, failed } = s.learn;
  const t = target(s);
  const key = keyOf(s, t);
  // A busy server or a timeout is asked again when its head is needed again (Try again, or coming
  // back to it); another error stays until the page is reloaded.
  for (const [k, err] of failed) if (k !== key && isRetryable(err)) failed.delete(k);
  if (answers.has(key) || loading.has(key) || failed.has(key)) return false;
  loading.add(key);
  getExplain(s.imageId, { model: s.model, layer: t.layer, head: t.head, query: t.query })
    .then((ans) => {
      answers.set(key, ans);
      while (answers.size > KEEP) answers.delete(answers.keys().next().value);
    })
    .catch((e) => {
      failed.set(key, e);
      // Not over another head's, picture's or view's page (a late answer of the one left).
      if (s.view === "learn" && s.meta && keyOf(s, target(s)) === key) {
        app.fail(e, () => { failed.delete(key); app.update(); });
      }
    })
    .finally(() => {
      loading.delete(key);
      app.update();
    });
  return true;
}

// ------------------------------------------------------------------ render
/** The view's temperature slider: log10 T, and T in words (its value while dragged). */
function renderSlider(s) {
  const T = shownTemperature(s);
  const slider = $("temperature");
  // Not under a dragging pointer: the slider keeps its own finer position while it moves.
  if (document.activeElement !== slider || Math.abs(Number(slider.value) - Math.log10(T)) > 0.006) {
    slider.value = String(Math.log10(T));
  }
  setText("temperature-out", fmtTemperature(T));
  setOff($("temperature-reset"), T === 1);
}

/** Bring the view up to date with the state (reads it, writes the DOM only). */
function render(s, act, shown) {
  renderSlider(s);
  if (!shown) return;
  const root = $("learn-view");
  const stages = $("learn-stages");
  if (!s.imageId || !s.meta || !s.image) {
    // While the first image is computed, say so (not "bring an image").
    setText("learn-status", s.busy || "Bring an image to start: the view walks one head of the model through it.");
    stages.hidden = true;
    $("learn-notes").replaceChildren();
    root.dataset.state = s.busy ? "loading" : "empty";
    return;
  }
  // Another image (or model) is on its way: the shown head stays until it is in, and says so.
  const coming = s.requests.load && s.busy ? `${s.busy} Until it is in, this is the previous image. ` : "";
  const key = keyOf(s, target(s));
  const ans = s.learn.answers.get(key);
  if (!ans) {
    const err = s.learn.failed.get(key);
    setText("learn-status", coming + (err ? `Could not load this head: ${err.message}` : "Loading this head's tensors…"));
    root.dataset.state = err ? "error" : "loading";
    stages.hidden = !stages.dataset.key; // keep the last picture while the next one loads
    return;
  }
  root.dataset.state = "ready";
  stages.hidden = false;
  stages.dataset.key = key;
  const aggregateNote = /^\d+$/.test(s.head) ? "" : ` The maps view shows the ${s.head} of the heads; `
    + "this view follows one head, head 0: pick another on the left.";
  const where = isWindowAnswer(ans) ? ` of stage ${ans.stage}` : "";
  const seen = s.session.find((x) => x.id === ans.image_id); // s.filename is already the next image's
  setText("learn-status", `${coming}Layer ${ans.layer}, head ${ans.head}, query ${tokenLabel(ans.tokens, ans.query)}${where}: `
    + `the model's own numbers for ${(seen && seen.filename) || "this image"}.${aggregateNote}`);
  renderAnswer(s, ans, shownTemperature(s), (token) => act.setIn("learn", { hover: token }));
}

// ------------------------------------------------------------------ events
/** Wire the view's controls: the temperature slider, and the pointer over the two maps (state: the
 * one state, read when an event comes). */
function bind(act, state) {
  const slider = $("temperature");
  // While sliding: this view only, from the scores already here (no request).
  slider.addEventListener("input", () => act.setIn("learn", { previewT: sliderTemperature(slider) }));
  // Released: the whole page, whose maps follow the temperature (one cached GET).
  slider.addEventListener("change", () => {
    const T = sliderTemperature(slider); // before a render puts the slider back at the page's T
    act.setIn("learn", { previewT: null });
    act.setTemperature(T);
  });
  onPress($("temperature-reset"), () => {
    act.setIn("learn", { previewT: null });
    act.setTemperature(1);
  });
  // The maps' grid: the image's tokens, or a windowed model's stage grid of the shown layer.
  const gridOf = () => (isWindowed(state.meta) ? tokensAt(state.meta, state.layer) : state.meta.tokens);
  for (const id of ["learn-scores", "learn-weights"]) {
    const canvas = $(id);
    canvas.addEventListener("pointermove", (e) => {
      if (!state.meta) return;
      const t = gridOf();
      const cell = cellAt(canvas, e, t);
      const token = cell ? t.num_prefix + cell.r * t.grid[1] + cell.c : null;
      if (token !== state.learn.hover) act.setIn("learn", { hover: token });
    });
    // A finger has no hover: its tap (touch or pen, below) shows the key's numbers, and they stay
    // when the finger lifts (a pen that can hover clears them as a mouse does).
    canvas.addEventListener("pointerleave", (e) => {
      if (e.pointerType === "touch") return;
      if (state.learn.hover !== null) act.setIn("learn", { hover: null });
    });
    canvas.addEventListener("click", (e) => {
      if (!state.meta) return;
      const t = gridOf();
      const cell = cellAt(canvas, e, t);
      if (!cell) return;
      if (isTap(e)) act.setIn("learn", { hover: t.num_prefix + cell.r * t.grid[1] + cell.c });
      // swin: the page's query is a cell of stage 0; the stage cell's top-left stage-0 cell maps back to it
      const s0 = t.window ? state.meta.stages[0].cell_size : t.patch_size;
      act.setQuery(`patch:${(cell.r * t.patch_size[0]) / s0[0]},${(cell.c * t.patch_size[1]) / s0[1]}`);
    });
  }
  // Without a mouse: a cell cursor on the softmax map (the hovered key follows it), Enter queries it.
  const canvas = $("learn-weights");
  const pick = (r, c) => {
    const t = gridOf();
    const s0 = t.window ? state.meta.stages[0].cell_size : t.patch_size;
    act.setQuery(`patch:${(r * t.patch_size[0]) / s0[0]},${(c * t.patch_size[1]) / s0[1]}`);
  };
  bindCellCursor(canvas, $("learn-cursor"), {
    grid: () => (state.meta ? gridOf().grid : null),
    frac: (r, c) => {
      const t = gridOf();
      const [ey, ex] = t.extent || [1, 1];
      return [(c / t.grid[1]) * ex, (r / t.grid[0]) * ey];
    },
    start: () => { const [R, C] = gridOf().grid; return [Math.floor(R / 2), Math.floor(C / 2)]; },
    describe: (sel) => {
      const t = gridOf();
      act.setIn("learn", { hover: t.num_prefix + sel[0] * t.grid[1] + sel[1] });
      return `${selectionWords(sel)}. Enter queries this patch.`;
    },
    onPick: ([r, c]) => pick(r, c),
    onEscape: () => act.setIn("learn", { hover: null }),
  });
}

/** The view object (views.js): its answers live in state.learn. */
export const learnView = { name: "learn", render, need, bind };
