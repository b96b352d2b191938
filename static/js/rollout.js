// The rollout strip: with the "rollout" head shown, the chain of rollout maps across depth, one
// small overlay per layer from the start layer S to the last (one GET of layers S..L-1), and the
// controls of the rollout (start layer, head fusion, discard ratio). A click opens that layer.

import { $, setOptions } from "./dom.js";
import { drawTile, keepTileFocus, makeTile } from "./grid.js";
import { fit } from "./overlay.js";
import { FUSIONS } from "./state.js";

/** Keep the rollout controls in step with the rollout options ({start, fusion, discard}) of L layers. */
export function renderRolloutControls(rollout, L) {
  const { start, fusion, discard } = rollout;
  setOptions($("rollout-start"), Array.from({ length: Math.max(1, L) }, (_, i) => [String(i), `layer ${i}`]));
  $("rollout-start").value = String(start);
  setOptions($("head-fusion"), FUSIONS);
  $("head-fusion").value = fusion;
  const slider = $("discard-ratio");
  if (document.activeElement !== slider) {
    slider.value = String(discard);
    $("discard-out").textContent = `${Math.round(discard * 100)}%`;
  }
}

/**
 * view: null before an image, else {store, rowOf, image, tokens, query, layer, head, colormap,
 * opacity, smooth, marker, key, rollout}; onPick(layer) opens the rollout up to that layer.
 */
export function renderRolloutStrip(container, view, onPick) {
  const panel = $("rollout-panel");
  const show = !!view && view.head === "rollout";
  panel.hidden = !show;
  if (!show) {
    container.replaceChildren();
    container.dataset.key = "";
    return;
  }
  const L = view.store.L;
  renderRolloutControls(view.rollout, L);
  const { start } = view.rollout;
  const loaded = view.store.has(view.query, "rollout", view.rollout);
  const drawKey = `${view.key}|${loaded}|${container.clientWidth}`;
  if (container.dataset.key !== drawKey) {
    const layers = Array.from({ length: L - start }, (_, i) => start + i);
    const tiles = layers.map((l) => makeTile(l, "rollout", true));
    keepTileFocus(container, () => container.replaceChildren(...tiles));
    const gap = 6;
    const chrome = 8;
    const width = Math.max(56, Math.min(130, Math.floor((container.clientWidth - gap * (tiles.length - 1)) / tiles.length) - chrome));
    const { w, h } = fit(view.image.naturalWidth, view.image.naturalHeight, width, width * 1.25);
    for (const t of tiles) {
      const l = Number(t.dataset.layer);
      drawTile(t, view, l, "rollout", w, h);
      const b = document.createElement("b");
      b.textContent = `L${l}`;
      const s = document.createElement("span");
      s.textContent = l === start ? "start" : `${start}…${l}`;
      t.querySelector(".tile-caption").replaceChildren(b, s);
      t.title = `Rollout over layers ${start}…${l}`;
      t.addEventListener("click", () => onPick(l));
    }
    container.dataset.key = drawKey;
    container.dataset.start = String(start);
    container.dataset.fusion = view.rollout.fusion;
    container.dataset.discard = String(view.rollout.discard);
    container.dataset.count = String(tiles.length);
    container.dataset.loaded = loaded ? "1" : "0";
  }
  for (const t of container.querySelectorAll(".tile")) {
    const on = t.dataset.layer === String(view.layer);
    t.classList.toggle("selected", on);
    t.setAttribute("aria-pressed", on ? "true" : "false");
  }
}
