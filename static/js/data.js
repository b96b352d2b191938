// The attention rows of one image under one model, kept client-side.
//
// rows:    query -> Float32Array [L * H * N]   (every layer and head for that query row)
// rollout: query -> Float32Array [L * N]       (attention rollout of that row, per layer)
// mean/max over heads are computed here from the per-head rows, on first use.

import { getAttention } from "./api.js";

export class AttentionStore {
  constructor(meta) {
    this.imageId = meta.image_id;
    this.model = meta.model;
    this.L = meta.layers.length;
    this.H = meta.heads.length;
    this.N = meta.tokens.count;
    this.rows = new Map();
    this.rollout = new Map();
    this.fused = new Map();
    this.loading = new Map(); // key -> promise
    this.failed = new Map();  // key -> error (not retried automatically)
  }

  putRows(query, data) {
    if (data.length !== this.L * this.H * this.N) throw new Error("attention answer of unexpected size");
    this.rows.set(query, data);
  }

  /** Is everything needed to show (query, head) here? */
  has(query, head) {
    if (head === "rollout") return this.rollout.has(query);
    return this.rows.has(query);
  }

  /** The row (length N) of query at layer for head ("0".., "mean", "max", "rollout"); null if not loaded. */
  row(query, layer, head) {
    const { L, H, N } = this;
    if (layer < 0 || layer >= L) return null;
    if (head === "rollout") {
      const r = this.rollout.get(query);
      return r ? r.subarray(layer * N, (layer + 1) * N) : null;
    }
    const all = this.rows.get(query);
    if (!all) return null;
    if (head === "mean" || head === "max") {
      const f = this.fusedRows(query, head, all);
      return f.subarray(layer * N, (layer + 1) * N);
    }
    const h = Number(head);
    if (!(h >= 0 && h < H)) return null;
    const off = (layer * H + h) * N;
    return all.subarray(off, off + N);
  }

  fusedRows(query, how, all) {
    const key = `${how}|${query}`;
    let f = this.fused.get(key);
    if (f) return f;
    const { L, H, N } = this;
    f = new Float32Array(L * N);
    for (let l = 0; l < L; l++) {
      const o = l * N;
      for (let n = 0; n < N; n++) {
        let acc = how === "max" ? -Infinity : 0;
        for (let h = 0; h < H; h++) {
          const v = all[(l * H + h) * N + n];
          acc = how === "max" ? Math.max(acc, v) : acc + v;
        }
        f[o + n] = how === "max" ? acc : acc / H;
      }
    }
    this.fused.set(key, f);
    return f;
  }

  /** Fetch the per-head rows of a query (GET, all layers and heads); one request per key. */
  loadRows(query, apiQuery) {
    if (this.rows.has(query)) return Promise.resolve();
    return this.once(`rows|${query}`, async () => {
      const ans = await getAttention(this.imageId, {
        model: this.model, layers: "all", heads: "all", query: apiQuery,
      });
      this.putRows(query, ans.data);
    });
  }

  /** Fetch the rollout of a query for every layer (GET aggregate=rollout). */
  loadRollout(query, apiQuery) {
    if (this.rollout.has(query)) return Promise.resolve();
    return this.once(`rollout|${query}`, async () => {
      const ans = await getAttention(this.imageId, {
        model: this.model, layers: "all", query: apiQuery, aggregate: "rollout",
      });
      if (ans.data.length !== this.L * this.N) throw new Error("rollout answer of unexpected size");
      this.rollout.set(query, ans.data);
    });
  }

  isLoading(kind, query) {
    return this.loading.has(`${kind}|${query}`);
  }

  once(key, fn) {
    if (this.loading.has(key)) return this.loading.get(key);
    const p = fn()
      .catch((e) => {
        this.failed.set(key, e);
        throw e;
      })
      .finally(() => this.loading.delete(key));
    this.loading.set(key, p);
    return p;
  }
}

/**
 * Entropy of a row divided by log N (0 = all mass on one token, 1 = uniform). The row is
 * renormalised first, so a max over heads (which does not sum to 1) gets a meaningful value.
 */
export function normEntropy(row) {
  let s = 0;
  for (let i = 0; i < row.length; i++) s += row[i] > 0 ? row[i] : 0;
  if (!(s > 0) || row.length < 2) return 0;
  let h = 0;
  for (let i = 0; i < row.length; i++) {
    const p = row[i] / s;
    if (p > 0) h -= p * Math.log(p);
  }
  return h / Math.log(row.length);
}

/** Sum of a row over the prefix tokens (indices 0..numPrefix-1). */
export function prefixMass(row, numPrefix) {
  let s = 0;
  for (let i = 0; i < numPrefix; i++) s += row[i];
  return s;
}
