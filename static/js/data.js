// The attention rows of one image under one model, kept client-side.
//
// rows:    query -> Float32Array [L * H * N]   (every layer and head for that query row)
// rollout: "query|start|fusion|discard" -> {start, token, data: Float32Array [(L - start) * N]}
//          (attention rollout of that row for layers start..L-1; before start it is the identity)
// stats:   the answer of GET /api/v1/attention/{id}/stats (per-head statistics), once loaded
// mean/max over heads are computed here from the per-head rows, on first use (fuseHeads).
// The rollout options ({start, fusion, discard}, state.rollout) are an argument of every call
// that reads or loads a rollout: the store keeps what it fetched, not what is shown.
//
// fuseHeads and normEntropy have Python twins (app/engine/analysis.fuse_heads,
// app/engine/stats.normalized_entropy): tests/fixtures/parity.json holds their common answers.
// temperature: rows and rollouts are those of softmax(scores / T); changing T drops them (the
//          server answers the new ones from its cache); the statistics stay the model's (T = 1).
// ablate:  heads switched off in the Ablation view ("3:0,3:1", #16): rows, rollouts and statistics
//          are those of the model with those heads removed; changing the set drops them all.

import { getAttention, getStats } from "./api.js";
import { isAbort } from "./long-requests.js";
import { canonicalQuery } from "./state.js";

export const ROLLOUT_DEFAULT = { start: 0, fusion: "mean", discard: 0 };

/** Map key of a rollout: the query row and the rollout options. */
export function rolloutKey(query, opts) {
  return `${query}|${opts.start}|${opts.fusion}|${opts.discard}`;
}

/** Key under which the row of an answer's first query is stored: its query's one spelling
 * ("cls", "I" or "patch:R,C", state.js canonicalQuery). */
export function rowKeyOfAnswer(ans) {
  return canonicalQuery(String(ans.query[0]), ans.tokens);
}

export class AttentionStore {
  constructor(meta) {
    this.imageId = meta.image_id;
    this.model = meta.model;
    this.L = meta.layers.length;
    this.H = meta.heads.length;
    this.N = meta.tokens.count;
    this.rows = new Map();
    this.rollout = new Map();
    this.stats = null;
    this.fused = new Map();
    this.loading = new Map(); // key -> promise
    this.failed = new Map();  // key -> error (not retried automatically)
    this.temperature = 1;
    this.ablate = "";
  }

  /** Show the maps of the model with the heads of `text` removed ("" for the model itself). */
  setAblate(text) {
    if (text === this.ablate) return;
    this.ablate = text;
    for (const m of [this.rows, this.rollout, this.fused]) m.clear();
    this.stats = null;
    this.failed.clear();
  }

  /** The ablate parameter of a request, when heads are removed. */
  ablateParam() {
    return this.ablate ? { ablate: this.ablate } : {};
  }

  /** Show maps at softmax temperature t from now on: rows of another temperature are dropped. */
  setTemperature(t) {
    if (t === this.temperature) return;
    this.temperature = t;
    for (const m of [this.rows, this.rollout, this.fused]) m.clear();
    for (const k of [...this.failed.keys()]) if (k !== "stats") this.failed.delete(k);
  }

  /** The temperature parameter of a request, when it is not the model's own. */
  temperatureParam() {
    return this.temperature === 1 ? {} : { temperature: this.temperature };
  }

  putRows(query, data) {
    if (data.length !== this.L * this.H * this.N) throw new Error("attention answer of unexpected size");
    this.rows.set(query, data);
  }

  /** Is everything needed to show (query, head) here? `rollout`: the rollout options. */
  has(query, head, rollout = ROLLOUT_DEFAULT) {
    if (head === "rollout") return this.rollout.has(rolloutKey(query, rollout));
    return this.rows.has(query);
  }

  /**
   * The row (length N) of query at layer for head ("0".., "mean", "max", "rollout" with the
   * options `rollout`); null if not loaded.
   */
  row(query, layer, head, rollout = ROLLOUT_DEFAULT) {
    const { L, H, N } = this;
    if (layer < 0 || layer >= L) return null;
    if (head === "rollout") {
      const r = this.rollout.get(rolloutKey(query, rollout));
      if (!r) return null;
      if (layer < r.start) {
        // The product over no layer: the identity, the query attends to itself only.
        if (!r.identity) {
          r.identity = new Float32Array(N);
          r.identity[r.token] = 1;
        }
        return r.identity;
      }
      return r.data.subarray((layer - r.start) * N, (layer - r.start + 1) * N);
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
    if (!f) {
      f = fuseHeads(all, this.L, this.H, this.N, how);
      this.fused.set(key, f);
    }
    return f;
  }

  /** Fetch the per-head rows of a query (GET, all layers and heads); one request per key. */
  loadRows(query, apiQuery, signal) {
    if (this.rows.has(query)) return Promise.resolve();
    const t = this.temperature;
    const a = this.ablate;
    return this.once(`rows|${query}`, async () => {
      const ans = await getAttention(this.imageId, {
        model: this.model, layers: "all", heads: "all", query: apiQuery, ...this.temperatureParam(), ...this.ablateParam(),
      }, signal);
      if (t === this.temperature && a === this.ablate) this.putRows(query, ans.data); // else the slider moved on
    });
  }

  /**
   * Fetch the rollout of a query (token index `token`) for layers start..L-1 with the rollout
   * options `rollout`: one GET aggregate=rollout&rollout_start=S&layers=S-(L-1).
   */
  loadRollout(query, apiQuery, token, rollout, signal) {
    const opts = { ...rollout };
    const key = rolloutKey(query, opts);
    if (this.rollout.has(key)) return Promise.resolve();
    const t = this.temperature;
    const a = this.ablate;
    return this.once(`rollout|${key}`, async () => {
      const ans = await getAttention(this.imageId, {
        model: this.model, layers: `${opts.start}-${this.L - 1}`, query: apiQuery, aggregate: "rollout",
        rollout_start: opts.start, head_fusion: opts.fusion, discard_ratio: opts.discard, ...this.temperatureParam(),
        ...this.ablateParam(),
      }, signal);
      if (ans.data.length !== (this.L - opts.start) * this.N) throw new Error("rollout answer of unexpected size");
      if (t === this.temperature && a === this.ablate) this.rollout.set(key, { start: opts.start, token, data: ans.data });
    });
  }

  /** Per-head statistics of the image (GET …/stats), once; `signal` cancels the request. */
  loadStats(signal) {
    if (this.stats) return Promise.resolve();
    const a = this.ablate;
    return this.once("stats", async () => {
      const st = await getStats(this.imageId, { model: this.model, ...this.ablateParam() }, signal);
      if (st.layers !== this.L || st.heads !== this.H) throw new Error("statistics of unexpected size");
      if (a === this.ablate) this.stats = st;
    });
  }

  /** Loading state of one kind of request: "rows" | "rollout" (for the options `rollout`) | "stats". */
  isLoading(kind, query, rollout = ROLLOUT_DEFAULT) {
    return this.loading.has(requestKey(kind, query, rollout));
  }

  hasFailed(kind, query, rollout = ROLLOUT_DEFAULT) {
    return this.failed.has(requestKey(kind, query, rollout));
  }

  /** Forget a failure, so that the next need() asks again ("Try again"). */
  forget(kind, query, rollout = ROLLOUT_DEFAULT) {
    this.failed.delete(requestKey(kind, query, rollout));
  }

  /**
   * One request per key; a failure is remembered (not retried by itself), a cancellation is not.
   * A failure of a request asked at another temperature or with other heads off than the store's
   * now is not remembered either (the answer asked for now is another request): it rejects as an
   * AbortError, which the callers do not show.
   */
  once(key, fn) {
    if (this.loading.has(key)) return this.loading.get(key);
    const t = this.temperature;
    const a = this.ablate;
    const outdated = () => a !== this.ablate || (key !== "stats" && t !== this.temperature);
    const p = fn()
      .catch((e) => {
        if (isAbort(e)) throw e;
        if (outdated()) throw new DOMException("asked for at another temperature or heads off", "AbortError");
        this.failed.set(key, e);
        throw e;
      })
      .finally(() => this.loading.delete(key));
    this.loading.set(key, p);
    return p;
  }
}

function requestKey(kind, query, rollout) {
  if (kind === "stats") return "stats";
  if (kind === "rollout") return `rollout|${rolloutKey(query, rollout)}`;
  return `${kind}|${query}`;
}

/**
 * Mean or max over heads of per-head rows: `all` is [L * H * N] (layer, head, token), the
 * answer [L * N] (as analysis.fuse_heads over the head axis).
 */
export function fuseHeads(all, L, H, N, how) {
  const f = new Float32Array(L * N);
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
  return f;
}

/**
 * Entropy of a row divided by log N (0 = all mass on one token, 1 = uniform). The row is
 * renormalised first, so a max over heads (which does not sum to 1) gets a meaningful value.
 * keys: how many tokens the row could attend to, when fewer than its length (a Swin window's
 * cells): the entropy is then divided by log keys.
 */
export function normEntropy(row, keys = null) {
  let s = 0;
  for (let i = 0; i < row.length; i++) s += row[i] > 0 ? row[i] : 0;
  if (!(s > 0) || row.length < 2) return 0;
  let h = 0;
  for (let i = 0; i < row.length; i++) {
    const p = row[i] / s;
    if (p > 0) h -= p * Math.log(p);
  }
  return h / Math.log(keys && keys > 1 ? keys : row.length);
}

/** Sum of a row over the prefix tokens (indices 0..numPrefix-1). */
export function prefixMass(row, numPrefix) {
  let s = 0;
  for (let i = 0; i < numPrefix; i++) s += row[i];
  return s;
}
