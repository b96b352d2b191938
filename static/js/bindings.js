// Bindings: the events of every control of the page, each turned into an action (actions.js).
// Image intake (file, drop, paste, samples, model) is in intake.js.

import { actions as act, update } from "./actions.js";
import { SIDES, revealCompare, sideData } from "./compare.js";
import { $, debounce, fmtTemperature, isTap, sliderTemperature } from "./dom.js";
import { downloadMap } from "./export.js";
import { resized } from "./maps.js";
import { bindCellCursor } from "./cell-cursor.js";
import { announce, changeWords, followDockHeight, ownsKeys } from "./keys.js";
import { cellAt } from "./overlay.js";
import { MASS_RANGE, defaultQuery, mapQuery, parseQuery, state } from "./state.js";
import { renderReadout } from "./viewer.js";
import { VIEWS, bindViews } from "./views.js";

/**
 * Run `change` (an action) and say what it changed in the live region: the new layer and head,
 * or the new query; nothing where it changed nothing (an edge, the row already shown).
 */
export function saying(change) {
  const now = () => ({ layer: state.layer, head: state.head, query: state.query });
  const before = now();
  change();
  const words = state.meta ? changeWords(before, now(), state.meta.tokens) : "";
  if (words) announce(words);
}

const DISCARD_REST_MS = 150; // the rollout's discard slider asks the server once it rests
const RESIZE_REST_MS = 80;

function bindControls() {
  $("layer").addEventListener("input", (e) => act.pick(Number(e.target.value), state.head));
  $("head").addEventListener("change", (e) => act.pick(state.layer, e.target.value));
  $("query-mode").addEventListener("change", (e) => act.setQueryMode(e.target.value));
  $("hover-toggle").addEventListener("change", (e) => act.set({ hover: e.target.checked }));
  $("opacity").addEventListener("input", (e) => act.set({ opacity: Number(e.target.value) }));
  $("colormap").addEventListener("change", (e) => act.set({ colormap: e.target.value }));
  $("patch-grid-toggle").addEventListener("change", (e) => act.set({ showGrid: e.target.checked }));
  $("smooth-toggle").addEventListener("change", (e) => act.set({ smooth: e.target.checked }));
  // The maps' temperature: the number follows the drag, the maps the release (one request).
  const mapT = $("map-temperature");
  mapT.addEventListener("input", () => { $("map-temperature-out").textContent = fmtTemperature(sliderTemperature(mapT)); });
  mapT.addEventListener("change", () => act.setTemperature(sliderTemperature(mapT)));
  $("download-png").addEventListener("click", () => downloadMap(state, "png").catch((e) => act.showError(e)));
  $("download-svg").addEventListener("click", () => downloadMap(state, "svg").catch((e) => act.showError(e)));
  $("error-close").addEventListener("click", () => act.clearError());

  // analysis tools: mass mask, attention sinks, rollout options, chart modes
  $("mass-toggle").addEventListener("change", (e) => act.set({ mask: e.target.checked }));
  $("mass-slider").addEventListener("input", (e) => {
    act.set({ massFraction: Math.max(MASS_RANGE[0], Math.min(MASS_RANGE[1], Number(e.target.value))) });
  });
  $("drop-tokens").addEventListener("change", (e) => act.set({ drop: e.target.value }));
  $("rollout-start").addEventListener("change", (e) => act.setRollout({ start: Number(e.target.value) }));
  $("head-fusion").addEventListener("change", (e) => act.setRollout({ fusion: e.target.value }));
  const discard = debounce((v) => act.setRollout({ discard: Math.max(0, Math.min(0.95, v)) }), DISCARD_REST_MS);
  $("discard-ratio").addEventListener("input", (e) => {
    $("discard-out").textContent = `${Math.round(Number(e.target.value) * 100)}%`;
    discard(Number(e.target.value));
  });
  $("entropy-kind").addEventListener("change", (e) => act.setChart({ entropyKind: e.target.value }));
  $("sink-kind").addEventListener("change", (e) => act.setChart({ sinkKind: e.target.value }));
  $("similarity-kind").addEventListener("change", (e) => act.setChart({ simKind: e.target.value }));
}

function bindCompare() {
  $("compare-toggle").addEventListener("change", (e) => {
    act.setCompare(e.target.checked);
    if (e.target.checked) revealCompare(); // drawn by now: update() renders synchronously
  });
  $("compare-mode").addEventListener("change", (e) => act.setCompareMode(e.target.value));
  for (const name of SIDES) {
    $(`compare-${name}-image`).addEventListener("change", (e) => act.setSide(name, { image: e.target.value }));
    $(`compare-${name}-layer`).addEventListener("change", (e) => act.setSide(name, { layer: Number(e.target.value) }));
    $(`compare-${name}-head`).addEventListener("change", (e) => act.setSide(name, { head: e.target.value }));
    // A click on a side queries that patch (mapped back onto the shown image's grid).
    const canvas = $(`compare-${name}`);
    canvas.addEventListener("click", (e) => {
      const ctx = sideData(state, state.compare[name]);
      const cell = ctx && cellAt(canvas, e, ctx.tokens);
      if (cell) act.setQuery(mapQuery(`patch:${cell.r},${cell.c}`, ctx.tokens, state.meta.tokens));
    });
  }
}

function bindOverlay() {
  const canvas = $("overlay");
  let tapped = null; // the cell a finger or a pen tapped, and its picture: {cell, image}
  canvas.addEventListener("click", (e) => {
    const cell = state.meta && cellAt(canvas, e, state.meta.tokens);
    // A finger has no hover: its tap (touch or pen) shows the patch's words, and they stay (the
    // finger's pointerleave after the tap keeps them; a hovering pen's clears them as a mouse's
    // does), following the map as it is drawn again.
    if (isTap(e)) tapped = cell ? { cell, image: state.imageId } : null;
    if (cell) act.setQuery(`patch:${cell.r},${cell.c}`);
    if (isTap(e)) renderReadout(state, cell);
  });
  canvas.addEventListener("pointermove", (e) => {
    const cell = state.meta && cellAt(canvas, e, state.meta.tokens);
    if (!isTap(e)) tapped = null; // a mouse took over
    renderReadout(state, cell);
    if (cell && (state.hover || e.shiftKey)) act.setQuery(`patch:${cell.r},${cell.c}`);
  });
  canvas.addEventListener("pointerleave", (e) => {
    if (tapped && e.pointerType === "touch") return; // the finger lifted: the tap's words stay
    tapped = null;
    renderReadout(state, null);
  });
  new MutationObserver(() => { // the map drawn again: another row, layer, head...
    if (tapped && tapped.image !== state.imageId) tapped = null; // another picture, another grid
    if (tapped) renderReadout(state, tapped.cell);
  }).observe(canvas, { attributes: true });
  // Without a mouse: a cell cursor (arrows), Enter queries its patch, Escape back to the default row.
  const tokens = () => (state.meta && state.store ? state.meta.tokens : null);
  const cursor = bindCellCursor(canvas, $("overlay-cursor"), {
    grid: () => (tokens() ? tokens().grid : null),
    frac: (r, c) => {
      const [R, C] = tokens().grid;
      const [ey, ex] = tokens().extent || [1, 1];
      return [(c / C) * ex, (r / R) * ey];
    },
    start: () => {
      const q = parseQuery(state.query, tokens());
      const [R, C] = tokens().grid;
      return q && q.kind === "patch" ? [q.r, q.c] : [Math.floor(R / 2), Math.floor(C / 2)];
    },
    onPick: ([r, c]) => saying(() => act.setQuery(`patch:${r},${c}`)),
    onEscape: () => saying(() => act.setQuery(defaultQuery(state.meta.tokens))),
    describe: ([r, c]) => {
      renderReadout(state, { r, c });
      return `${$("readout").textContent}. Enter queries this patch.`;
    },
  });
  canvas.addEventListener("blur", () => {
    tapped = null;
    renderReadout(state, null);
  });
  new ResizeObserver(() => cursor.refresh()).observe(canvas);
}

function bindKeys() {
  document.addEventListener("keydown", (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey || !state.store) return;
    if (ownsKeys(e.target)) return; // tabs, grids, the map's cursor, dialogs: their own keys
    const keys = {
      ArrowUp: () => act.stepLayer(1), ArrowDown: () => act.stepLayer(-1),
      ArrowRight: () => act.stepHead(1), ArrowLeft: () => act.stepHead(-1),
      Escape: () => act.resetQuery(),
    };
    if (keys[e.key]) {
      e.preventDefault();
      saying(keys[e.key]);
    }
  });
}

/** Wire every control once; the views wire their own panels (view.bind). */
export function bindAll() {
  bindViews(act);
  bindControls();
  bindCompare();
  bindOverlay();
  bindKeys();
  followDockHeight($("view-dock"));
  for (const view of VIEWS) if (view.bind) view.bind(act, state); // the one state, read when an event comes
  const onResize = debounce(() => {
    resized();
    update();
  }, RESIZE_REST_MS);
  new ResizeObserver(onResize).observe($("viewer"));
  window.addEventListener("resize", onResize); // a taller or shorter window: the map's height follows
}
