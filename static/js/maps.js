// The "Attention maps" view (the panel [data-view-panel=viewer]): the overlay and its toolbars,
// the rollout strip, compare mode, heads at a glance, the head analytics and the model view.
// render() draws the quick parts on every change; renderSlow() the model view and the charts,
// coalesced while the pointer sweeps over patches. Both only read the state `s`; `act` holds
// the actions a click on a drawn thing calls (actions.js).

import { analyticsEls, renderAnalytics, renderAnalyticsStatus } from "./analytics.js";
import { renderRow, resizeCharts } from "./charts.js";
import { renderCompare } from "./compare.js";
import { renderAnalysisControls } from "./controls.js";
import { rolloutKey } from "./data.js";
import { $, scrollMotion } from "./dom.js";
import { need } from "./fetching.js";
import { renderHeadGrid, renderModelView } from "./grid.js";
import { announce, bindRoving, layerWords, screenPos, syncRoving } from "./keys.js";
import { renderRolloutStrip } from "./rollout.js";
import { artifactTokens, shownRow } from "./sinks.js";
import { headChoices, markerAt, parseQuery, tokensAt } from "./state.js";
import { renderMapsAblated, renderPrefixList, renderViewer, selection } from "./viewer.js";
import { isWindowed } from "./windows.js";

/** What the thumbnail views draw: null before an image. */
export function thumbView(s) {
  const store = s.store;
  if (!store || !s.image) return null;
  // swin: a windowed model's layers have their stage's grid and heads (tokensAt, markerAt, headChoices)
  const tokens = tokensAt(s.meta, s.layer);
  const windowed = isWindowed(s.meta);
  return {
    store, image: s.image, tokens, query: s.query, layer: s.layer, rollout: s.rollout,
    head: s.head, heads: headChoices(s.meta, s.layer), colormap: s.colormap, opacity: s.opacity,
    smooth: s.smooth, marker: markerAt(s.meta, s.query, s.layer),
    layerOf: (layer) => ({ tokens: tokensAt(s.meta, layer), marker: markerAt(s.meta, s.query, layer) }),
    headsOf: windowed ? (layer) => headChoices(s.meta, layer) : null,
    allHeads: windowed ? [...Array.from({ length: store.H }, (_, i) => String(i)), "mean", "max"] : null,
    rowOf: (layer, head) => shownRow(store, selection(s, { layer, head })),
    key: [s.imageId, store.model, s.query, s.colormap, s.opacity, s.smooth,
      s.drop, artifactTokens(store).join(","), rolloutKey("", s.rollout), s.temperature, store.ablate].join("|"),
  };
}

export function render(s, act) {
  // The panels that only mean something with an image (no empty chart cards on a fresh page).
  for (const el of document.querySelectorAll("[data-needs-image]")) el.hidden = !s.meta;
  renderAnalysisControls(s);
  renderViewer(s);
  renderPrefixList(s, act.setQuery);
  const view = thumbView(s);
  renderAnalyticsStatus(analyticsEls(), view);
  renderRolloutStrip($("rollout-strip"), view, (l) => act.pick(l, "rollout"));
  renderCompare(s);
  renderHeadGrid($("head-grid"), view, act.pick);
  for (const id of ["head-grid", "rollout-strip"]) syncRoving($(id), ".tile", selectedTile);
  renderMapsAblated(s); // the maps say when the Ablation view's heads are off
}

export function renderSlow(s, act) {
  const view = thumbView(s);
  renderModelView($("model-view"), view, (l, h, e) => {
    act.pick(l, h);
    const map = $("overlay");
    map.scrollIntoView({ behavior: scrollMotion(), block: "center" });
    // Enter or Space on the tile (a click with no pointer): focus goes to the map with it, so
    // that it stays in sight and the next keys move the map's cell cursor.
    if (e && e.detail === 0 && !map.hidden) {
      map.focus({ preventScroll: true });
      const cell = $("readout").textContent; // the cursor's words, written as it took focus
      announce(cell ? `${layerWords(s.layer, s.head)}. ${cell}` : layerWords(s.layer, s.head));
    }
  });
  syncRoving($("model-view"), ".tile", selectedTile);
  const els = analyticsEls();
  renderAnalytics(els, view && {
    ...view, entropyKind: s.entropyKind, sinkKind: s.sinkKind, simKind: s.simKind,
  }, act.pick);
  const q = view && parseQuery(s.query, s.meta.tokens);
  renderRow($("chart-row"), view && { ...view, queryToken: view.marker ? view.marker.token : q.token }); // swin: the layer's cell
}

/** After a resize: thumbnails are redrawn at the new width, Plotly charts resized. */
export function resized() {
  for (const id of ["head-grid", "model-view", "rollout-strip"]) $(id).dataset.key = "";
  const els = analyticsEls();
  delete els.panel;
  delete els.status;
  resizeCharts({ ...els, row: $("chart-row") });
}

/** The tile that shows the current layer and head: the tile grid's Tab stop. */
function selectedTile(tiles) {
  return tiles.find((t) => t.classList.contains("selected"));
}

/** The tile grids (heads at a glance, rollout strip, model view): one Tab stop each, arrows inside. */
function bind() {
  for (const id of ["head-grid", "rollout-strip", "model-view"]) bindRoving($(id), ".tile", screenPos);
}

export const mapsView = { name: "viewer", render, renderSlow, need, bind };
