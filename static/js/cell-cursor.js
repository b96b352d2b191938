// A cell cursor on a picture canvas, for the keyboard: the arrows move it over the patch grid,
// Shift+arrows grow a box from where it started, Enter picks (the query patch on the maps, the
// box to explain in the Why view), Escape lets go. Each move is announced (keys.js announce) and
// drawn as an outline over the canvas while it has focus. Where the cursor stands is kept on the
// canvas (data-cursor, data-anchor), like a drag in progress: it is no part of the page's state
// until Enter picks.

import { announce } from "./keys.js";

const STEPS = { ArrowRight: [0, 1], ArrowLeft: [0, -1], ArrowDown: [1, 0], ArrowUp: [-1, 0] };

function parse(v) {
  if (!v) return null;
  const [r, c] = v.split(",").map(Number);
  return Number.isFinite(r) && Number.isFinite(c) ? [r, c] : null;
}

/** The selection [r0, c0, r1, c1] (inclusive cells) between the anchor and the cursor. */
export function selectionOf(anchor, cursor) {
  return [Math.min(anchor[0], cursor[0]), Math.min(anchor[1], cursor[1]),
    Math.max(anchor[0], cursor[0]), Math.max(anchor[1], cursor[1])];
}

/** The selection in words: "row 3, column 5" or "rows 3 to 5, columns 4 to 8 (3 by 5 cells)". */
export function selectionWords(sel) {
  const [r0, c0, r1, c1] = sel;
  if (r0 === r1 && c0 === c1) return `row ${r0}, column ${c0}`;
  const rows = r0 === r1 ? `row ${r0}` : `rows ${r0} to ${r1}`;
  const cols = c0 === c1 ? `column ${c0}` : `columns ${c0} to ${c1}`;
  return `${rows}, ${cols} (${r1 - r0 + 1} by ${c1 - c0 + 1} cells)`;
}

/** Place `mark` over the cells `sel` of `canvas`; frac(r, c) gives a cell's top-left corner as fractions. */
function place(mark, canvas, sel, frac) {
  const [r0, c0, r1, c1] = sel;
  const [x0, y0] = frac(r0, c0);
  const [x1, y1] = frac(r1 + 1, c1 + 1);
  const w = canvas.clientWidth;
  const h = canvas.clientHeight;
  Object.assign(mark.style, {
    left: `${canvas.offsetLeft + x0 * w}px`, top: `${canvas.offsetTop + y0 * h}px`,
    width: `${(x1 - x0) * w}px`, height: `${(y1 - y0) * h}px`,
  });
  mark.hidden = false;
}

/**
 * Give `canvas` the cell cursor. opts: {
 *   grid(): [rows, cols] or null (nothing to point at yet),
 *   frac(r, c): [x, y] of a cell's top-left corner as fractions of the canvas (default: even cells),
 *   start(): [r, c] where the cursor starts (the current query patch, the centre…),
 *   box: whether Shift+arrows grow a box,
 *   onPick(sel): Enter, with the selection [r0, c0, r1, c1],
 *   onEscape(): Escape,
 *   describe(sel): words said after a move (default: the cells),
 * }. `mark` is an element positioned in the canvas' offset parent (the outline).
 */
export function bindCellCursor(canvas, mark, opts) {
  canvas.tabIndex = 0;
  canvas.dataset.ownKeys = "";
  const even = (r, c) => { const [R, C] = opts.grid(); return [c / C, r / R]; };
  const frac = opts.frac || even;
  const describe = opts.describe || selectionWords;
  const show = () => {
    const cur = parse(canvas.dataset.cursor);
    const anchor = parse(canvas.dataset.anchor) || cur;
    if (!cur || !opts.grid() || document.activeElement !== canvas || !("ownKeys" in canvas.dataset)) {
      mark.hidden = true;
      return null;
    }
    const sel = selectionOf(anchor, cur);
    place(mark, canvas, sel, frac);
    return sel;
  };
  // Focus from a click is the mouse's: the page's arrow shortcuts keep working, no cursor shows.
  canvas.addEventListener("pointerdown", () => {
    delete canvas.dataset.ownKeys;
    mark.hidden = true;
  });
  canvas.addEventListener("focus", () => {
    const g = opts.grid();
    if (!g || !("ownKeys" in canvas.dataset)) return;
    if (!parse(canvas.dataset.cursor)) {
      const [r, c] = opts.start();
      canvas.dataset.cursor = `${r},${c}`;
      canvas.dataset.anchor = `${r},${c}`;
    }
    const sel = show();
    if (sel) announce(describe(sel));
    // the words may have moved the page under it: keep it clear of the fixed bars (scroll-padding)
    requestAnimationFrame(() => canvas.scrollIntoView({ block: "nearest", inline: "nearest" }));
  });
  canvas.addEventListener("blur", () => {
    mark.hidden = true;
    canvas.dataset.ownKeys = "";
  });
  canvas.addEventListener("keydown", (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey || !("ownKeys" in canvas.dataset)) return;
    const g = opts.grid();
    if (!g) return;
    const cur = parse(canvas.dataset.cursor) || opts.start();
    const anchor = parse(canvas.dataset.anchor) || cur;
    if (STEPS[e.key]) {
      e.preventDefault();
      const [dr, dc] = STEPS[e.key];
      const next = [Math.max(0, Math.min(g[0] - 1, cur[0] + dr)), Math.max(0, Math.min(g[1] - 1, cur[1] + dc))];
      canvas.dataset.cursor = `${next[0]},${next[1]}`;
      if (!(e.shiftKey && opts.box)) canvas.dataset.anchor = canvas.dataset.cursor;
      const sel = show();
      if (sel) announce(describe(sel));
    } else if (e.key === "Enter" || e.key === " ") {
      e.preventDefault();
      opts.onPick(selectionOf(anchor, cur));
    } else if (e.key === "Escape" && opts.onEscape) {
      e.preventDefault();
      canvas.dataset.anchor = canvas.dataset.cursor || "";
      show();
      opts.onEscape();
    }
  });
  return { refresh: show, reset: () => { delete canvas.dataset.cursor; delete canvas.dataset.anchor; mark.hidden = true; } };
}
