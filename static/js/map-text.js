// The numbers of a map drawn on a canvas, in words, for screen readers: the Why view's relevance
// map and the raw attention beside it, the two compare maps and "Inside a head"'s scores. Each
// such canvas is an image whose accessible description (aria-describedby, a visually hidden
// paragraph after it) names its highest cells with their values and its lowest one, rewritten
// each time the map changes. The main map's numbers are in "The current row" chart's table.

import { cellText as num } from "./chart-table.js";

/**
 * The `k` largest of `items` ([{name, v}], non-finite values skipped), largest first (ties: the
 * earlier item first), and the smallest: {top, low}; low is null when no value is finite.
 */
export function extremes(items, k = 3) {
  const top = [];
  let low = null;
  for (const it of items) {
    if (!Number.isFinite(it.v)) continue;
    if (!low || it.v < low.v) low = it;
    if (top.length === k && it.v <= top[k - 1].v) continue;
    let i = top.length;
    while (i > 0 && top[i - 1].v < it.v) i--;
    top.splice(i, 0, it);
    if (top.length > k) top.pop();
  }
  return { top, low };
}

/** The cells of a row-major R x C grid as items: "patch (r, c)" (or `noun` (r, c)) and its value. */
export function gridItems(values, C, noun = "patch") {
  const out = [];
  for (let i = 0; i < values.length; i++) {
    out.push({ name: `${noun} (${Math.floor(i / C)}, ${i % C})`, v: values[i] });
  }
  return out;
}

/**
 * A map's numbers in one short sentence: "Highest: patch (3, 5) 0.12, patch (4, 5) 0.0912,
 * patch (3, 6) 0.07; lowest: patch (0, 0) 1.00e-5." (3 significant digits, as the charts' tables
 * write them); a flat map says so. `items`: [{name, v}].
 */
export function mapWords(items, k = 3) {
  const { top, low } = extremes(items, k);
  if (!low) return "No values.";
  if (top[0].v === low.v) {
    const n = items.filter((it) => Number.isFinite(it.v)).length;
    return `Every one of the ${n} values is ${num(low.v)}.`;
  }
  const highest = top.map((it) => `${it.name} ${num(it.v)}`).join(", ");
  return `Highest: ${highest}; lowest: ${low.name} ${num(low.v)}.`;
}

/** A grid's numbers in words: its size, then mapWords (row and column counted from the top left). */
export function gridWords(values, R, C, noun = "patch") {
  const many = noun === "patch" ? "patches" : `${noun}s`;
  return `${mapWords(gridItems(values, C, noun))} ${R} × ${C} ${many}, (row, column) counted from the top left.`;
}

/**
 * Name `canvas` as an image and describe it by `text`: a visually hidden paragraph right after it
 * (made once, id `<canvas id>-words`) that aria-describedby points at. The paragraph is hidden from
 * reading in order (aria-hidden) so that the words are said once, with the image; they are written
 * only when they change.
 */
export function describeCanvas(canvas, text) {
  const id = `${canvas.id}-words`; // not -text: "learn-scores-text" is that step's own explanation
  let p = document.getElementById(id);
  if (!p) {
    p = document.createElement("p");
    p.id = id;
    p.className = "sr-only";
    p.dataset.testid = id;
    p.setAttribute("aria-hidden", "true");
    canvas.after(p);
  }
  if (canvas.getAttribute("role") !== "img" && !canvas.hasAttribute("aria-roledescription")) {
    canvas.setAttribute("role", "img");
  }
  if (canvas.getAttribute("aria-describedby") !== id) canvas.setAttribute("aria-describedby", id);
  if (p.textContent !== text) p.textContent = text;
}
