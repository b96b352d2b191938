// Fetch wrappers for the REST API. Every failure becomes an ApiError with a message a person
// can read: the server's {"error": {code, message}} body when there is one.

export class ApiError extends Error {
  constructor(status, code, message, retryAfter = null) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
  }
}

async function errorFrom(resp) {
  let code = `http_${resp.status}`;
  let message = `${resp.status} ${resp.statusText || "error"}`;
  try {
    const body = await resp.json();
    if (body && body.error) {
      code = String(body.error.code || code);
      message = String(body.error.message || message);
    }
  } catch {
    // not JSON: keep the status line
  }
  const ra = resp.headers.get("Retry-After");
  return new ApiError(resp.status, code, message, ra ? Number(ra) : null);
}

async function request(url, options = {}) {
  let resp;
  try {
    resp = await fetch(url, { credentials: "same-origin", ...options });
  } catch (e) {
    if (e && e.name === "AbortError") throw e;
    throw new ApiError(0, "network", "the server could not be reached; is it still running?");
  }
  if (!resp.ok) throw await errorFrom(resp);
  return resp;
}

/** GET /api/v1/models */
export async function getModels() {
  return (await request("/api/v1/models")).json();
}

/** GET /api/v1/models/catalog?q=&limit=: timm's pretrained models of the supported families. */
export async function searchCatalog(params, signal) {
  return (await request(`/api/v1/models/catalog?${query(params)}`, { signal })).json();
}

/** GET (the state) or POST (start it) /api/v1/models/catalog/{name}/load. */
export async function catalogLoad(name, method = "GET") {
  return (await request(`/api/v1/models/catalog/${encodeURIComponent(name)}/load`, { method })).json();
}

/** Flatten the nested [L][H][Q][N] lists of an answer into one Float32Array. */
export function flatten(nested, shape) {
  const [L, H, Q, N] = shape;
  const out = new Float32Array(L * H * Q * N);
  let o = 0;
  for (let l = 0; l < L; l++) {
    for (let h = 0; h < H; h++) {
      for (let q = 0; q < Q; q++) {
        const row = nested[l][h][q];
        for (let n = 0; n < N; n++) out[o++] = row[n];
      }
    }
  }
  return out;
}

async function attentionAnswer(resp) {
  const body = await resp.json();
  body.data = flatten(body.attention, body.shape);
  delete body.attention;
  return body;
}

/** POST /api/v1/attention with the file and text fields; the answer with `data` flattened. */
export async function postImage(file, fields, signal) {
  const form = new FormData();
  form.append("image", file, file.name || "pasted.png");
  for (const [k, v] of Object.entries(fields)) form.append(k, String(v));
  return attentionAnswer(await request("/api/v1/attention", { method: "POST", body: form, signal }));
}

/** The URL of GET /api/v1/attention/{id} for these query parameters. */
export function attentionUrl(imageId, params) {
  const qs = new URLSearchParams(params);
  return `/api/v1/attention/${encodeURIComponent(imageId)}?${qs}`;
}

/**
 * The file name the server's Content-Disposition gives a binary answer for these parameters
 * (app/serving/encoders.py download_stem spells the same rule): the page's download links
 * carry it too, so the browser saves the file under the name the page shows.
 */
export function downloadName(imageId, model, params) {
  const slug = (x) => String(x).replace(/[^A-Za-z0-9._-]+/g, "_").replace(/^_+|_+$/g, "");
  const p = { query: "cls", layers: "all", heads: "all", aggregate: "none", drop: "none", dtype: "float32", ablate: "", ...params };
  const parts = ["headscope", imageId.slice(0, 12), model, p.query];
  if (p.layers !== "all") parts.push(`L${p.layers}`);
  if (p.heads !== "all" && p.aggregate === "none") parts.push(`H${p.heads}`);
  if (p.aggregate !== "none") parts.push(p.aggregate);
  if (p.drop !== "none") parts.push(`drop-${p.drop}`);
  if (p.ablate) parts.push(`ablate-${p.ablate}`);
  if (p.dtype !== "float32") parts.push(p.dtype);
  if (p.temperature !== undefined && Number(p.temperature) !== 1) parts.push(`T${Number(Number(p.temperature).toPrecision(6))}`);
  return `${fitStem(parts.map(slug))}.${p.format === "npy" ? "npy" : "safetensors"}`;
}

/** encoders.fit_stem: the parts joined by "-", at most `limit` characters, every part kept (the
 * longest after the image id shortened) beside 8 hex digits of the whole name's hash. */
export function fitStem(parts, limit = 150) {
  const stem = parts.join("-");
  if (stem.length <= limit) return stem;
  const tag = fnv1a32(stem).toString(16).padStart(8, "0");
  const room = limit - tag.length - 1;
  const out = [...parts];
  let joined = out.join("-");
  while (joined.length > room) {
    let i = 2;
    for (let k = 3; k < out.length; k++) if (out[k].length > out[i].length) i = k; // the first of the longest
    out[i] = out[i].slice(0, Math.max(1, out[i].length - (joined.length - room)));
    joined = out.join("-");
  }
  return `${joined}-${tag}`;
}

/** 32-bit FNV-1a of a string's UTF-8 bytes (encoders.fnv1a32). */
export function fnv1a32(text) {
  let h = 0x811c9dc5;
  for (const b of new TextEncoder().encode(text)) h = Math.imul(h ^ b, 0x01000193) >>> 0;
  return h;
}

/** GET /api/v1/attention/{id}: answered from the server cache. */
export async function getAttention(imageId, params, signal) {
  return attentionAnswer(await request(attentionUrl(imageId, params), { signal }));
}

/** GET /api/v1/attention/{id}/stats: per-head statistics (entropy, distance, sinks, similarity, rank). */
export async function getStats(imageId, params, signal) {
  const qs = new URLSearchParams(params);
  return (await request(`/api/v1/attention/${encodeURIComponent(imageId)}/stats?${qs}`, { signal })).json();
}

/** GET /api/v1/attention/{id}/explain: one head's whole computation for one query token. */
export async function getExplain(imageId, params, signal) {
  const qs = new URLSearchParams(params);
  return (await request(`/api/v1/attention/${encodeURIComponent(imageId)}/explain?${qs}`, { signal })).json();
}

/** The uploaded picture (decoded, EXIF-rotated PNG) as a ready <img>. */
export async function loadImage(imageId) {
  const resp = await request(`/api/v1/images/${encodeURIComponent(imageId)}`);
  const blob = await resp.blob();
  const url = URL.createObjectURL(blob);
  const img = new Image();
  img.src = url;
  try {
    await img.decode();
  } catch {
    throw new ApiError(0, "bad_display_image", "the browser could not show the picture");
  }
  return img;
}

/**
 * Can sending the same request again help? Only when the server was busy, slow or out of
 * reach (429, 503, timeouts, the network); a bad file or a bad parameter stays bad.
 */
export function isRetryable(err) {
  if (!(err instanceof ApiError)) return false;
  if (["network", "timeout", "busy", "out_of_memory", "model_unavailable"].includes(err.code)) return true;
  return [408, 429, 502, 503, 504].includes(err.status);
}

/** Headline + detail for an error, in words a person understands. */
export function describeError(err) {
  if (!(err instanceof ApiError)) {
    return { title: "Something went wrong.", message: String((err && err.message) || err) };
  }
  const titles = {
    not_an_image: "This file is not an image.",
    unsupported_format: "This image format is not supported.",
    empty_file: "The file is empty.",
    corrupt_image: "The image could not be decoded.",
    upload_too_large: "The file is too large.",
    image_too_large: "The image is too large.",
    too_large: "The file is too large.",
    busy: "The server is busy.",
    image_not_found: "This image is no longer on the server.",
    unknown_model: "Unknown model.",
    model_unavailable: "The model is not available.",
    model_refused: "This model cannot be loaded.",
    out_of_memory: "The server ran out of memory.",
    timeout: "The computation took too long.",
    network: "No connection to the server.",
  };
  let message = err.message;
  if (err.code === "busy") {
    const wait = err.retryAfter ? ` Try again in ${err.retryAfter} s.` : " Try again in a moment.";
    // the server's own words up to its advice for API clients: its pool is full, or this page
    // already holds its share of it
    const said = err.message.split(";")[0].trim();
    message = `${said.charAt(0).toUpperCase()}${said.slice(1)}.${wait}`;
  } else if (err.code === "image_not_found") {
    message = "The server keeps recent images only and this one has been evicted. Upload the image again to continue.";
  }
  return { title: titles[err.code] || `Request failed (${err.status || "network"}).`, message };
}

// ---------------------------------------------------------------- model output, ablation, importance (#16)

function query(params) {
  const qs = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") qs.set(k, String(v));
  return qs.toString();
}

/** GET /api/v1/attention/{id}/output: the model's own output with the `ablate` heads removed. */
export async function getOutput(imageId, params, signal) {
  return (await request(`/api/v1/attention/${encodeURIComponent(imageId)}/output?${query(params)}`, { signal })).json();
}

/**
 * GET /api/v1/attention/{id}/{what}, what = "importance" | "pruning" (takes seconds). With
 * params.wait: {done: true, body} (the final JSON) or {done: false, body} (202: the progress;
 * the computation goes on, ask again).
 */
export async function getLong(imageId, what, params, signal) {
  const resp = await request(`/api/v1/attention/${encodeURIComponent(imageId)}/${what}?${query(params)}`, { signal });
  return { done: resp.status === 200, body: await resp.json() };
}

/** DELETE /api/v1/tasks/{token}: give up a long computation this page started (the token of its 202). */
export async function cancelTask(token) {
  return (await request(`/api/v1/tasks/${encodeURIComponent(token)}`, { method: "DELETE" })).json();
}

/** GET /api/v1/attention/{id}/{what}/progress: {state: idle|running|done, fraction, eta_s, stage}. */
export async function getProgress(imageId, what, params, signal) {
  return (await request(`/api/v1/attention/${encodeURIComponent(imageId)}/${what}/progress?${query(params)}`, { signal })).json();
}
