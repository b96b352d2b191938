// The page without a mouse: which element owns a key, the one Tab stop of a grid of buttons
// (roving tabindex), and the page's polite announcements (a live region screen readers read).
//
// The page-wide shortcuts (arrows: layer and head, Escape: back to CLS; bindings.js) apply only
// where focus is not in something with keys of its own: form fields, the view tabs, the tile and
// toggle grids, the map's cell cursor, an open dialog.

import { headLabel, parseQuery, prefixLabel } from "./state.js";

const OWN_KEYS = "select, textarea, input:not([type=checkbox]):not([type=file]), [contenteditable], "
  + "[role=tablist], [role=grid], [role=listbox], [role=menu], [role=slider], [data-own-keys], dialog";

/** Whether a key event at `target` belongs to the element (or a modal dialog), not to the page. */
export function ownsKeys(target) {
  if (typeof document !== "undefined" && document.querySelector("dialog[open]")) return true;
  return !!(target && target.closest && target.closest(OWN_KEYS));
}

const MOVES = {
  ArrowRight: [0, 1], ArrowLeft: [0, -1], ArrowDown: [1, 0], ArrowUp: [-1, 0],
};

/**
 * The item a key moves to among `items` placed at pos(item) = [row, col]: arrows to the next
 * one in that direction (the nearest column on another row), Home/End to the row's ends,
 * Ctrl+Home/End to the first and last. Returns null where the key does not move (an edge).
 */
export function moveTarget(items, current, key, ctrl, pos) {
  const at = items.map((el) => ({ el, p: pos(el) }));
  const cur = at.find((a) => a.el === current);
  if (!cur) return at.length ? at[0].el : null;
  const [r, c] = cur.p;
  const by = (f) => at.filter(f);
  const first = (list, cmp) => (list.length ? list.sort(cmp)[0].el : null);
  if (key === "Home") return ctrl ? at[0].el : first(by((a) => a.p[0] === r), (a, b) => a.p[1] - b.p[1]);
  if (key === "End") return ctrl ? at[at.length - 1].el : first(by((a) => a.p[0] === r), (a, b) => b.p[1] - a.p[1]);
  const m = MOVES[key];
  if (!m) return null;
  if (m[0] === 0) { // along the row
    const next = by((a) => a.p[0] === r && (m[1] > 0 ? a.p[1] > c : a.p[1] < c));
    return first(next, (a, b) => m[1] * (a.p[1] - b.p[1]));
  }
  const rows = by((a) => (m[0] > 0 ? a.p[0] > r : a.p[0] < r));
  if (!rows.length) return null;
  const row = rows.reduce((best, a) => (m[0] * (a.p[0] - best) < 0 ? a.p[0] : best), rows[0].p[0]);
  return first(by((a) => a.p[0] === row), (a, b) => Math.abs(a.p[1] - c) - Math.abs(b.p[1] - c));
}

/**
 * Make the buttons `selector` inside `container` one Tab stop: the current one (the element
 * `current(items)` names, else the one that had the stop, else the first) gets tabindex 0, the
 * others -1. Call after every render that rebuilds or reselects the items.
 */
export function syncRoving(container, selector, current) {
  const items = [...container.querySelectorAll(selector)];
  if (!items.length) return;
  const focused = items.find((el) => el === document.activeElement);
  const keep = focused || (current && current(items)) || items.find((el) => el.tabIndex === 0) || items[0];
  for (const el of items) el.tabIndex = el === keep ? 0 : -1;
}

/**
 * Arrows, Home and End move focus among `selector` inside `container` (bound once; the
 * container is marked as owning its keys). pos(el) gives an item's [row, col].
 */
export function bindRoving(container, selector, pos) {
  container.dataset.ownKeys = "";
  container.addEventListener("keydown", (e) => {
    if (e.altKey || e.metaKey || e.shiftKey) return;
    const from = e.target.closest(selector);
    if (!from || !container.contains(from)) return;
    if (!(e.key in MOVES) && e.key !== "Home" && e.key !== "End") return;
    e.preventDefault();
    const to = moveTarget([...container.querySelectorAll(selector)], from, e.key, e.ctrlKey, pos);
    if (!to || to === from) return;
    from.tabIndex = -1;
    to.tabIndex = 0;
    to.focus();
  });
  // A click moves the Tab stop too, so Tab comes back to the item last used.
  container.addEventListener("focusin", (e) => {
    const to = e.target.closest(selector);
    if (!to) return;
    for (const el of container.querySelectorAll(selector)) el.tabIndex = el === to ? 0 : -1;
  });
}

/** [row, col] of an item laid out in a CSS grid (its place on the screen, in rounded pixels). */
export function screenPos(el) {
  const r = el.getBoundingClientRect();
  return [Math.round(r.top / 4), Math.round(r.left)];
}

/**
 * Keep --dock-h (the root's custom property) at the height of `dock` while it is fixed to the
 * bottom of the screen (a phone, 200 % zoom): the page's scroll-padding keeps focus above it.
 */
export function followDockHeight(dock) {
  const set = () => {
    const fixed = getComputedStyle(dock).position === "fixed";
    document.documentElement.style.setProperty("--dock-h", `${fixed ? Math.ceil(dock.getBoundingClientRect().height) : 0}px`);
  };
  new ResizeObserver(set).observe(dock);
  window.addEventListener("resize", set);
  set();
}

let clearTimer = 0;

/**
 * Say `text` politely through the page's live region (#announce): screen readers read it
 * after what they are saying. The same text twice is said twice.
 */
export function announce(text) {
  const el = typeof document !== "undefined" && document.getElementById("announce");
  if (!el) return;
  el.textContent = "";
  clearTimeout(clearTimer);
  // a frame later, so the region's change is a new announcement even for the same words
  clearTimer = setTimeout(() => { el.textContent = text; }, 30);
}

/** A one-row query in words: "CLS", "patch (3, 5), token 42", "register 1, token 2". */
export function queryWords(q, tokens) {
  const p = parseQuery(q, tokens);
  if (!p) return String(q);
  if (p.kind === "cls") return "CLS";
  if (p.kind === "patch") return `patch (${p.r}, ${p.c}), token ${p.token}`;
  return `${prefixLabel(p.token, tokens)}, token ${p.token}`;
}

/** The shown layer and head in words: "layer 10, head 1", "layer 3, mean of heads". */
export function layerWords(layer, head) {
  return `layer ${layer}, ${headLabel(head)}`;
}

/**
 * What a shortcut changed, short, for the live region: "layer 10, head 1" when the layer or the
 * head moved, "query: CLS" or "query: patch (3, 5), token 42" when the query did (both, joined
 * by ". "); "" when nothing changed (an edge: the same words are not said again).
 * `before` and `after` are {layer, head, query}.
 */
export function changeWords(before, after, tokens) {
  const said = [];
  if (before.layer !== after.layer || before.head !== after.head) said.push(layerWords(after.layer, after.head));
  if (before.query !== after.query) said.push(`query: ${queryWords(after.query, tokens)}`);
  return said.join(". ");
}
