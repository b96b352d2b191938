// The Why view without a mouse: the saliency output takes focus and a cell cursor (cell-cursor.js)
// on the model's patch grid; Shift+arrows grow a box, Enter makes it the target (the same
// `box` a drag draws, in output-map pixels). why.js calls bindSaliencyKeys from render, once per
// drawn canvas.

import { bindCellCursor, selectionWords } from "./cell-cursor.js";
import { announce } from "./keys.js";

/** The box [x0, y0, x1, y1] in output-map pixels (end-exclusive) of the cells `sel` of a grid. */
export function cellBox(sel, grid, size) {
  const [R, C] = grid;
  const [h, w] = size;
  const [r0, c0, r1, c1] = sel;
  const x = (c) => Math.round((c * w) / C);
  const y = (r) => Math.round((r * h) / R);
  return [x(c0), y(r0), x(c1 + 1), y(r1 + 1)];
}

/** The cell whose area holds most of output-map point (x, y). */
function cellOf(x, y, grid, size) {
  const [R, C] = grid;
  const [h, w] = size;
  return [Math.max(0, Math.min(R - 1, Math.floor((y * R) / h))), Math.max(0, Math.min(C - 1, Math.floor((x * C) / w)))];
}

/**
 * Give the saliency canvas in `fig` (the Why view's model output) its keys, once per canvas:
 * `s` is the one state (read when a key comes), `act` the actions, answerOf() the GET …/output
 * answer on show (null while none).
 */
export function bindSaliencyKeys(fig, s, act, answerOf) {
  const canvas = fig.querySelector("canvas[data-testid=why-saliency]");
  const mark = fig.querySelector(".cell-cursor");
  if (!canvas || !mark || canvas.dataset.keys) return;
  canvas.dataset.keys = "1";
  canvas.setAttribute("role", "application");
  canvas.setAttribute("aria-roledescription", "saliency map");
  canvas.setAttribute("aria-label", "The predicted saliency: drag on it to draw a box to explain, or use the keys: "
    + "the arrows move a cell cursor, Shift+arrows grow a box from it, Enter explains the box");
  const grid = () => (s.meta && answerOf() ? s.meta.tokens.grid : null);
  bindCellCursor(canvas, mark, {
    grid,
    box: true,
    start: () => {
      const b = s.why.box;
      const out = answerOf();
      if (b && out) return cellOf(b[0], b[1], grid(), out.input_size);
      const [R, C] = grid();
      return [Math.floor(R / 2), Math.floor(C / 2)];
    },
    describe: (sel) => {
      const b = cellBox(sel, grid(), answerOf().input_size);
      return `${selectionWords(sel)}: x ${b[0]}–${b[2]}, y ${b[1]}–${b[3]}. Enter explains this box.`;
    },
    onPick: (sel) => {
      const b = cellBox(sel, grid(), answerOf().input_size);
      announce(`Explaining the box x ${b[0]}–${b[2]}, y ${b[1]}–${b[3]}: computing the map.`);
      act.setIn("why", { box: b, target: "box" });
    },
    onEscape: () => {},
  });
}
