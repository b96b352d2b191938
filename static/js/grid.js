// Thumbnail views: "heads at a glance" (every head of the current layer, plus mean, max and
// rollout) and the "model view" (every layer x head). Thumbnails are buttons carrying
// data-layer / data-head; a click opens that map in the main view.

import { drawComposite, fit, sizeCanvas } from "./overlay.js";
import { normEntropy } from "./data.js";
import { headLabel } from "./state.js";
import { keyCount } from "./windows.js";

let thumbCache = { image: null, side: 0, canvas: null };

/** A downscaled copy of the picture so that a hundred thumbnails draw quickly. */
function thumbSource(image, side) {
  if (thumbCache.image === image && thumbCache.side === side) return thumbCache.canvas;
  const { w, h } = fit(image.naturalWidth, image.naturalHeight, side, side);
  const c = document.createElement("canvas");
  c.width = w;
  c.height = h;
  const ctx = c.getContext("2d");
  ctx.imageSmoothingQuality = "high";
  ctx.drawImage(image, 0, 0, w, h);
  thumbCache = { image, side, canvas: c };
  return c;
}

/**
 * Redraw a tile grid with rebuild() (which replaces its tiles) without losing keyboard focus: the
 * tile of the same layer and head gets it back (a late answer redraws the grid under the keys).
 */
export function keepTileFocus(container, rebuild) {
  const had = container.contains(document.activeElement) ? document.activeElement.closest(".tile") : null;
  rebuild();
  if (!had) return;
  const tiles = [...container.querySelectorAll(".tile")];
  const again = tiles.find((t) => t.dataset.layer === had.dataset.layer && t.dataset.head === had.dataset.head)
    || tiles.find((t) => t.dataset.head === had.dataset.head) || tiles[0];
  if (again) {
    again.tabIndex = 0;
    again.focus({ preventScroll: true });
  }
}

export function makeTile(layer, head, caption) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = "tile";
  b.dataset.layer = String(layer);
  b.dataset.head = head;
  b.title = `layer ${layer}, ${headLabel(head)}`;
  // a tile without a caption is named by its title (a caption names the others: its words are on show)
  if (!caption) b.setAttribute("aria-label", b.title);
  const c = document.createElement("canvas");
  b.append(c);
  if (caption) {
    const s = document.createElement("span");
    s.className = "tile-caption";
    b.append(s);
  }
  return b;
}

/** Draw the map of (layer, head) into a tile; view.rowOf(layer, head) gives the shown row. */
export function drawTile(tile, view, layer, head, w, h) {
  const canvas = tile.querySelector("canvas");
  const dpr = sizeCanvas(canvas, w, h);
  const row = view.rowOf(layer, head);
  // Windowed models (Swin): each layer has its stage's grid and the query's cell on it.
  const { tokens, marker } = view.layerOf ? view.layerOf(layer) : view;
  drawComposite(canvas.getContext("2d"), canvas.width, canvas.height, {
    image: thumbSource(view.image, 320), row, tokens, colormap: view.colormap,
    opacity: Math.max(view.opacity, 0.35), smooth: view.smooth, marker, px: dpr * 0.6,
  });
  tile.classList.toggle("pending", !row);
  return row;
}

function markSelected(container, layer, head, sameLayerOnly) {
  for (const t of container.querySelectorAll(".tile")) {
    const on = t.dataset.head === head && (sameLayerOnly || t.dataset.layer === String(layer));
    t.classList.toggle("selected", on);
    t.setAttribute("aria-pressed", on ? "true" : "false");
  }
}

/**
 * Heads at a glance. view: {store, rowOf(layer, head), image, tokens, query, layer, head,
 * heads (choices), colormap, opacity, smooth, marker, rollout, key}; onPick(layer, head).
 */
export function renderHeadGrid(container, view, onPick) {
  if (!view) {
    container.replaceChildren();
    container.dataset.key = "";
    return;
  }
  const drawKey = `${view.key}|${view.layer}|${view.store.has(view.query, "0")}|${view.store.has(view.query, "rollout", view.rollout)}`;
  if (container.dataset.key !== drawKey) {
    const tiles = view.heads.map((head) => makeTile(view.layer, head, true));
    keepTileFocus(container, () => container.replaceChildren(...tiles));
    const gap = 8;
    const chrome = 8; // tile padding + border
    const width = Math.max(84, Math.min(150, Math.floor((container.clientWidth - gap * (tiles.length - 1)) / tiles.length) - chrome));
    const { w, h } = fit(view.image.naturalWidth, view.image.naturalHeight, width, width * 1.2);
    for (const t of tiles) {
      const row = drawTile(t, view, view.layer, t.dataset.head, w, h);
      const cap = t.querySelector(".tile-caption");
      const label = document.createElement("b");
      label.textContent = headLabel(t.dataset.head, true);
      const ent = document.createElement("span");
      ent.textContent = row ? `H ${normEntropy(row, keyCount(view.tokens)).toFixed(2)}` : "loading…";
      cap.replaceChildren(label, ent);
      t.addEventListener("click", () => onPick(Number(t.dataset.layer), t.dataset.head));
    }
    container.dataset.key = drawKey;
  }
  markSelected(container, view.layer, view.head, true);
}

/** Model view: a table of every layer (rows) x head (columns). */
export function renderModelView(container, view, onPick) {
  if (!view) {
    container.replaceChildren();
    container.dataset.key = "";
    return;
  }
  const drawKey = `${view.key}|${view.store.has(view.query, "0")}|${view.store.has(view.query, "rollout", view.rollout)}`;
  if (container.dataset.key !== drawKey) {
    const heads = view.allHeads || view.heads; // windowed: every stage's heads, blank where a stage has fewer
    const cols = heads.length;
    container.style.setProperty("--cols", String(cols));
    const cells = [document.createElement("span")];
    for (const head of heads) {
      const s = document.createElement("span");
      s.className = "mv-col";
      s.textContent = headLabel(head, true);
      cells.push(s);
    }
    // Every column fits the panel (a phone too: smaller tiles with less chrome, no sideways scroll).
    const narrow = container.clientWidth < 560;
    container.classList.toggle("is-narrow", narrow);
    const [label, gap, chrome] = narrow ? [28, 2, 4] : [44, 4, 6]; // app.css .model-view(.is-narrow)
    const avail = container.clientWidth - label - (gap + chrome) * cols;
    const width = Math.max(12, Math.min(110, Math.floor(avail / cols)));
    const { w, h } = fit(view.image.naturalWidth, view.image.naturalHeight, width, width * 1.25);
    for (let l = 0; l < view.store.L; l++) {
      const lab = document.createElement("span");
      lab.className = "mv-row";
      lab.textContent = `L${l}`;
      cells.push(lab);
      const here = view.headsOf ? view.headsOf(l) : null;
      for (const head of heads) {
        if (here && !here.includes(head)) {
          cells.push(Object.assign(document.createElement("span"), { className: "mv-none" }));
          continue;
        }
        const t = makeTile(l, head, false);
        drawTile(t, view, l, head, w, h);
        t.addEventListener("click", (e) => onPick(l, head, e));
        cells.push(t);
      }
    }
    keepTileFocus(container, () => container.replaceChildren(...cells));
    container.dataset.key = drawKey;
  }
  markSelected(container, view.layer, view.head, false);
}
