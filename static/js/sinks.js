// Attention sinks: the key tokens that soak up a row's mass (prefix tokens, and the high-norm
// "artifact" patches of Darcet et al., 2024, listed by the stats endpoint). Dropping them zeroes
// their columns and renormalises the row, so the rest of the map gets the colour scale.
//
// dropColumns has a Python twin (app/engine/analysis.drop_and_renormalise, behind the API's
// `drop`): tests/fixtures/parity.json holds their common answers.

import { dropParts } from "./state.js";

/** The token indices `drop` removes for this store ([] for "none"; artifacts once stats are in). */
export function droppedTokens(store, tokens, drop) {
  const out = [];
  const parts = dropParts(drop);
  if (!store) return out;
  if (parts.prefix) {
    for (let i = 0; i < tokens.num_prefix; i++) out.push(i);
  }
  if (parts.artifacts && store.stats) {
    for (const t of artifactTokens(store)) if (!out.includes(t)) out.push(t);
  }
  return out.sort((a, b) => a - b);
}

/** Artifact token indices of the store's image ([] before the stats arrive, and for windowed models,
 * whose high-norm tokens are cells of the last stage's grid only). */
export function artifactTokens(store) {
  if (store && store.windowed) return [];
  const a = store && store.stats && store.stats.artifacts;
  return a && Array.isArray(a.tokens) ? a.tokens.map(Number).filter((t) => Number.isInteger(t)) : [];
}

/** A copy of `row` with the columns `cols` zeroed and renormalised to sum 1 (the row itself if none). */
export function dropColumns(row, cols) {
  if (!row || !cols.length) return row;
  const out = Float32Array.from(row);
  for (const c of cols) if (c >= 0 && c < out.length) out[c] = 0;
  let s = 0;
  for (let i = 0; i < out.length; i++) s += out[i];
  if (s > 0) for (let i = 0; i < out.length; i++) out[i] /= s;
  return out;
}

/** Sum of the patch part of a row. */
export function patchSum(row, tokens) {
  let s = 0;
  for (let i = tokens.num_prefix; i < row.length; i++) s += row[i];
  return s;
}

/**
 * The row as the page shows it: store.row() with the dropped key tokens removed (null if not
 * loaded). sel: {query, layer, head, tokens, drop, rollout}.
 */
export function shownRow(store, sel) {
  const row = store.row(sel.query, sel.layer, sel.head, sel.rollout);
  return row && dropColumns(row, droppedTokens(store, sel.tokens, sel.drop));
}
