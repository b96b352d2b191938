// The form controls, status line, error banner and download links, kept in step with `state`.

import { attentionUrl } from "./api.js";
import { ENTROPY_KINDS, SIM_KINDS, SINK_KINDS } from "./analytics.js";
import { COLORMAPS } from "./colormaps.js";
import { artifactTokens } from "./sinks.js";
import { apiQuery, dims, hasCls, headChoices, headLabel, markerAt, parseQuery, prefixLabel, state, tokensAt } from "./state.js";
import { isWindowed, stageOf, stageQuery } from "./windows.js";

const $ = (id) => document.getElementById(id);

function setOptions(select, options) {
  const want = options.map(([v, label]) => `${v}\u0000${label}`).join("\u0001");
  if (select.dataset.options === want) return;
  select.replaceChildren(...options.map(([v, label, disabled]) => {
    const o = document.createElement("option");
    o.value = v;
    o.textContent = label;
    o.disabled = !!disabled;
    return o;
  }));
  select.dataset.options = want;
}

export function fmtBytes(n) {
  if (n >= 1024 * 1024) return `${(n / (1024 * 1024)).toFixed(n >= 10 * 1024 * 1024 ? 0 : 1)} MB`;
  if (n >= 1024) return `${Math.round(n / 1024)} KB`;
  return `${n} B`;
}

export function initStaticControls() {
  setOptions($("colormap"), COLORMAPS.map((c) => [c, c]));
  setOptions($("entropy-kind"), ENTROPY_KINDS);
  setOptions($("sink-kind"), SINK_KINDS);
  setOptions($("similarity-kind"), SIM_KINDS);
  const max = Number(document.body.dataset.maxUpload || 0);
  $("max-upload").textContent = max ? fmtBytes(max) : "the server's limit";
}

export function renderModels() {
  const opts = state.models.map((m) => {
    const label = m.error ? `${m.id} (failed to load)` : m.id;
    return [m.id, label, !!m.error];
  });
  if (state.model && !opts.some((o) => o[0] === state.model)) opts.unshift([state.model, state.model]);
  setOptions($("model"), opts);
  $("model").value = state.model;
  const info = state.models.find((m) => m.id === state.model);
  $("model").title = info ? [info.description, info.arch, info.source].filter(Boolean).join(" · ") : "";
}

export function renderControls() {
  const { L, H } = dims();
  const loaded = !!state.meta;
  const layer = $("layer");
  layer.max = String(Math.max(0, L - 1));
  layer.value = String(state.layer);
  layer.disabled = !loaded;
  // Windowed models (Swin): the slider also says the stage, and shifted blocks.
  const stage = loaded && stageOf(state.meta, state.layer);
  const shift = stage && tokensAt(state.layer).shift.some((v) => v > 0) ? ", shifted windows" : "";
  $("layer-out").textContent = loaded ? `${state.layer} of ${L - 1}${stage ? ` · stage ${stage.index}${shift}` : ""}` : "–";
  $("layer-out").dataset.stage = stage ? String(stage.index) : "";

  const head = $("head");
  const heads = loaded ? headChoices().map((h) => [h, headLabel(h) + (h === "rollout" ? " (layers 0…l)" : "")]) : [];
  if (stage) heads.push(["rollout", "rollout: not for Swin (its stages have different grids)", true]);
  setOptions(head, heads);
  head.value = state.head;
  head.disabled = !loaded;

  const qm = $("query-mode");
  const opts = [];
  if (loaded) {
    for (const p of state.meta.tokens.prefix) {
      opts.push([p.kind === "cls" ? "cls" : `tok:${p.index}`, `${prefixLabel(p.index)} token`]);
    }
    opts.push(["patch", "a patch (click the image)"]);
  }
  setOptions(qm, opts);
  const q = parseQuery(state.query);
  qm.value = q && q.kind === "patch" ? "patch" : state.query;
  qm.disabled = !loaded;
  const cell = stage && markerAt(state.query, state.layer);
  $("query-text").textContent = cell
    ? `cell (${q.r}, ${q.c}) of stage 0; on stage ${stage.index}: cell (${cell.r}, ${cell.c}) = token ${cell.token}`
    : q ? `token ${q.token}${q.kind === "patch" ? ` = patch row ${q.r}, column ${q.c}` : ""}` : "";

  $("hover-toggle").checked = state.hover;
  $("opacity").value = String(state.opacity);
  $("opacity-out").textContent = `${Math.round(state.opacity * 100)}%`;
  $("colormap").value = state.colormap;
  $("patch-grid-toggle").checked = state.showGrid;
  $("smooth-toggle").checked = state.smooth;
  renderModels();
  renderImageInfo();
  renderDownloads(H);
}

/** The mass mask, drop and chart-mode controls. store: the shown image's AttentionStore (or null). */
export function renderAnalysisControls(store) {
  const loaded = !!state.meta;
  $("mass-toggle").checked = state.mask;
  $("mass-toggle").disabled = !loaded;
  const slider = $("mass-slider");
  if (document.activeElement !== slider) slider.value = String(state.massFraction);
  slider.disabled = !loaded || !state.mask;
  $("mass-out").textContent = `${Math.round(state.massFraction * 100)}%`;
  const drop = $("drop-tokens");
  drop.value = state.drop;
  const windowed = loaded && isWindowed(state.meta); // swin: no prefix; artifacts on the last stage only
  drop.disabled = !loaded || windowed;
  const np = loaded ? state.meta.tokens.num_prefix : 0;
  const nArt = artifactTokens(store).length;
  for (const o of drop.options) {
    if (o.value === "prefix") o.textContent = loaded ? `prefix tokens (${np})` : "prefix tokens";
    if (o.value === "artifacts") {
      o.textContent = store && store.stats ? `artifact tokens (${nArt})` : "artifact tokens";
    }
  }
  drop.title = windowed ? "Swin has no prefix tokens, and its high-norm tokens are cells of the last stage only"
    : "Zero the attention to these key tokens and renormalise each row"
      + (store && store.stats && !nArt ? "; this image has no high-norm artifact tokens" : "");
  const cls = !loaded || hasCls();
  const ek = $("entropy-kind");
  ek.querySelector("option[value=cls]").disabled = !cls;
  if (!cls && state.entropyKind === "cls") state.entropyKind = "all";
  ek.value = state.entropyKind;
  $("sink-kind").value = state.sinkKind;
  const sk = $("similarity-kind");
  sk.querySelector("option[value=cos]").disabled = !cls;
  if (!cls && state.simKind === "cos") state.simKind = "js";
  sk.value = state.simKind;
}

function renderImageInfo() {
  const box = $("image-info");
  const m = state.meta;
  box.hidden = !m && !state.filename;
  $("filename").textContent = state.filename || (m ? "(no name)" : "");
  if (!m) {
    $("image-size").textContent = "";
    $("token-info").textContent = "";
    return;
  }
  const t = m.tokens;
  $("image-size").textContent = `${m.image_size[1]} × ${m.image_size[0]} px → model input ${m.input_size[1]} × ${m.input_size[0]}`;
  $("token-info").textContent = isWindowed(m)
    ? `no prefix; one grid per stage: ${m.stages.map((s) => `${s.grid[0]} × ${s.grid[1]}`).join(", ")} cells `
      + `of ${m.stages.map((s) => s.cell_size[0]).join("/")} px, in ${m.stages.map((s) => s.window.join("×")).join("/")} windows`
    : `${t.count} = ${t.num_prefix} prefix + ${t.grid[0]} × ${t.grid[1]} patches of ${t.patch_size[1]} × ${t.patch_size[0]}`;
}

function setLink(a, href, name) {
  if (href) {
    a.href = href;
    a.setAttribute("download", name);
    a.classList.remove("disabled");
    a.removeAttribute("aria-disabled");
  } else {
    a.removeAttribute("href");
    a.classList.add("disabled");
    a.setAttribute("aria-disabled", "true");
  }
}

function renderDownloads(H) {
  const ok = !!(state.meta && state.image);
  $("download-png").disabled = !ok;
  if (!ok) {
    setLink($("download-tensors"), null);
    setLink($("download-full"), null);
    return;
  }
  const base = { model: state.meta.model, layers: "all", heads: "all", format: "safetensors" };
  let q = apiQuery(state.query);
  let stem = `headscope-${state.imageId.slice(0, 8)}`;
  let { L, N } = dims();
  const stage = stageOf(state.meta, state.layer);
  if (stage) { // swin: one stage per request; the query's cell on that stage's grid
    base.layers = `${stage.layers[0]}-${stage.layers[1]}`;
    q = stageQuery(state.meta, q, stage);
    stem += `-stage${stage.index}`;
    L = stage.layers[1] - stage.layers[0] + 1;
  }
  setLink($("download-tensors"), attentionUrl(state.imageId, { ...base, query: q }),
    `${stem}-${q.replace(/[^a-z0-9]+/gi, "_")}.safetensors`);
  if (stage && !stage.dense) { // swin: N x N maps of a big stage are not answered (almost all zeros)
    setLink($("download-full"), null);
    $("download-full").textContent = `the full attention (not for stage ${stage.index}: ${N} cells, ask for rows)`;
    return;
  }
  setLink($("download-full"), attentionUrl(state.imageId, { ...base, query: "all" }), `${stem}-all.safetensors`);
  $("download-full").textContent = `the full attention, all ${N} rows (${fmtBytes(L * H * N * N * 4)})`;
}

export function renderStatus(summary) {
  const el = $("status");
  let s = "idle";
  let text = "Bring an image to start: choose a file, drop one, paste it, or click a sample.";
  if (state.busy) {
    s = "busy";
    text = state.busy;
  } else if (state.error && !state.meta) {
    s = "error";
    text = "Nothing to show yet.";
  } else if (state.meta) {
    s = "ready";
    text = summary || "Ready.";
  }
  el.dataset.state = s;
  $("status-text").textContent = text;
}

export function renderError(onRetry) {
  const el = $("error");
  const err = state.error;
  el.hidden = !err;
  if (!err) return;
  $("error-title").textContent = err.title;
  $("error-message").textContent = err.message;
  el.dataset.code = err.code || "";
  const retry = $("error-retry");
  retry.hidden = !err.retry;
  retry.onclick = err.retry ? () => onRetry(err.retry) : null;
}
