// "Inside a head": the maths the view redoes in the page when the temperature slider moves (no
// request): the tempered softmax of the head's scores, its entropy, the top keys and the weighted
// sum of the values. temperedSoftmax has a Python twin (app/engine/capture.temper_ followed by
// torch.softmax, the API's `temperature`): tests/fixtures/parity.json holds their common answers.

/** softmax(scores / T) as a Float64Array (the max is subtracted first: any T > 0 stays finite). */
export function temperedSoftmax(scores, T) {
  const n = scores.length;
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (scores[i] > max) max = scores[i];
  const out = new Float64Array(n);
  let sum = 0;
  for (let i = 0; i < n; i++) {
    out[i] = Math.exp((scores[i] - max) / T);
    sum += out[i];
  }
  for (let i = 0; i < n; i++) out[i] /= sum;
  return out;
}

/** Entropy of a distribution in nats. */
export function entropy(p) {
  let h = 0;
  for (let i = 0; i < p.length; i++) if (p[i] > 0) h -= p[i] * Math.log(p[i]);
  return h;
}

/** Indices of the k largest values, largest first. */
export function topK(p, k) {
  const idx = Array.from(p.keys());
  idx.sort((a, b) => p[b] - p[a]);
  return idx.slice(0, k);
}

/** sum_j a_j v_j for weights a [N] and values v [N][d]. */
export function weightedSum(a, v) {
  const d = v[0].length;
  const o = new Float64Array(d);
  for (let j = 0; j < a.length; j++) {
    const w = a[j];
    const vj = v[j];
    for (let c = 0; c < d; c++) o[c] += w * vj[c];
  }
  return o;
}
