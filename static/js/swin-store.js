// The attention rows of one image under a windowed model (Swin), kept client-side.
//
// The API answers one stage per request (stages have different grids and heads), so the rows of
// a query are one GET per stage, for the stage's cell under the page's stage-0 cell:
// rows: query -> [stage] Float32Array [L_s * H_s * N_s]  (every layer and head of that stage)
// Rollout is not offered (it multiplies maps of one grid); stats come as for any model.

import { getAttention } from "./api.js";
import { AttentionStore, fuseHeads } from "./data.js";
import { stageQuery } from "./state.js";
import { isWindowed, layerTokens, numLayers, stageOf } from "./windows.js";

export class WindowedStore extends AttentionStore {
  constructor(meta) {
    super(meta);
    this.meta = meta;
    this.stages = meta.stages;
    this.windowed = true;
    this.L = numLayers(meta);
    this.H = Math.max(...meta.stages.map((s) => s.heads)); // the stats' `heads`
    this.N = meta.stages[0].grid[0] * meta.stages[0].grid[1];
  }

  /** The first answer holds one stage of a probe query: the rows come from loadRows. */
  putRows() {}

  has(query, head) {
    return head === "rollout" ? true : this.rows.has(query); // no rollout to wait for
  }

  tokensAt(layer) {
    return layerTokens(this.meta, layer);
  }

  row(query, layer, head) {
    const s = stageOf(this.meta, layer);
    const parts = this.rows.get(query);
    if (!s || !parts || head === "rollout") return null;
    const all = parts[s.index];
    const H = s.heads;
    const N = s.grid[0] * s.grid[1];
    const l = layer - s.layers[0];
    if (head === "mean" || head === "max") {
      const key = `${head}|${query}|${s.index}`;
      let f = this.fused.get(key);
      if (!f) {
        f = fuseHeads(all, s.layers[1] - s.layers[0] + 1, H, N, head);
        this.fused.set(key, f);
      }
      return f.subarray(l * N, (l + 1) * N);
    }
    const h = Number(head);
    if (!(h >= 0 && h < H)) return null;
    const off = (l * H + h) * N;
    return all.subarray(off, off + N);
  }

  /**
   * Fetch every stage's rows of a query (one GET per stage, in parallel), at the store's
   * temperature; `signal` cancels them. (The API query is the stage's cell: apiQuery is unused.)
   */
  loadRows(query, apiQuery, signal) {
    if (this.rows.has(query)) return Promise.resolve();
    const t = this.temperature;
    return this.once(`rows|${query}`, async () => {
      const parts = await Promise.all(this.stages.map(async (s) => {
        const ans = await getAttention(this.imageId, {
          model: this.model, layers: `${s.layers[0]}-${s.layers[1]}`, heads: "all",
          query: stageQuery(this.meta, query, s), ...this.temperatureParam(),
        }, signal);
        const n = (s.layers[1] - s.layers[0] + 1) * s.heads * s.grid[0] * s.grid[1];
        if (ans.data.length !== n) throw new Error("attention answer of unexpected size");
        return ans.data;
      }));
      if (t === this.temperature) this.rows.set(query, parts); // else the temperature moved on
    });
  }

  loadRollout() {
    return Promise.resolve();
  }
}

/** The store for an answer's image and model: per stage for windowed models. */
export function makeStore(meta) {
  return isWindowed(meta) ? new WindowedStore(meta) : new AttentionStore(meta);
}
