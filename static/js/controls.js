// The form controls, status line, error banner and download links, kept in step with the state
// `s` (read only: a choice the loaded image cannot have is shown disabled; actions.js moves the
// state off it).

import { attentionUrl, downloadName } from "./api.js";
import { COLORMAPS } from "./colormaps.js";
import { $, fmtBytes, fmtTemperature, setOptions, setText } from "./dom.js";
import { artifactTokens } from "./sinks.js";
import {
  ENTROPY_KINDS, SIM_KINDS, SINK_KINDS, ablateOf, apiQuery, dims, hasCls, headChoices, headLabel, markerAt, parseQuery,
  prefixLabel, prefixQuery, stageQuery, tokensAt,
} from "./state.js";
import { isWindowed, stageOf } from "./windows.js";

export function initStaticControls() {
  setOptions($("colormap"), COLORMAPS);
  setOptions($("sink-kind"), SINK_KINDS);
  const max = Number(document.body.dataset.maxUpload || 0);
  $("max-upload").textContent = max ? fmtBytes(max) : "the server's limit";
}

function renderModels(s) {
  const opts = s.models.map((m) => [m.id, m.error ? `${m.id} (failed to load)` : m.id, !!m.error]);
  if (s.model && !opts.some((o) => o[0] === s.model)) opts.unshift([s.model, s.model]);
  setOptions($("model"), opts);
  $("model").value = s.model;
  const info = s.models.find((m) => m.id === s.model);
  $("model").title = info ? [info.description, info.arch, info.source].filter(Boolean).join(" · ") : "";
  renderModelFailures(s);
}

/** Which configured models failed to load at start-up, and why (the server serves the others). */
function renderModelFailures(s) {
  const failed = s.models.filter((m) => m.error && !m.on_demand);
  const note = $("model-failures");
  note.hidden = !failed.length;
  const lines = failed.map((m) => `${m.id} could not be loaded: ${m.error}`);
  const serving = s.models.find((m) => m.default && !m.error);
  note.textContent = lines.join(" ") + (failed.length && serving ? ` Serving ${serving.id}.` : "");
}

export function renderControls(s) {
  const { L, H } = dims(s.meta, s.layer);
  const loaded = !!s.meta;
  // The page's layout while an image is shown or on its way (app.css: on a phone the view controls
  // dock at the bottom of the screen); set before intake.js scrolls the result into view.
  document.body.toggleAttribute("data-image", loaded || !!s.busy);
  const layer = $("layer");
  layer.max = String(Math.max(0, L - 1));
  layer.value = String(s.layer);
  layer.disabled = !loaded;
  // Windowed models (Swin): the slider also says the stage, and shifted blocks.
  const stage = loaded && stageOf(s.meta, s.layer);
  const shift = stage && tokensAt(s.meta, s.layer).shift.some((v) => v > 0) ? ", shifted windows" : "";
  $("layer-out").textContent = loaded ? `${s.layer} of ${L - 1}${stage ? ` · stage ${stage.index}${shift}` : ""}` : "–";
  $("layer-out").dataset.stage = stage ? String(stage.index) : "";

  const head = $("head");
  const heads = headChoices(s.meta, s.layer).map((h) => [h, headLabel(h) + (h === "rollout" ? " (layers 0…l)" : "")]);
  if (stage) heads.push(["rollout", "rollout: not for Swin (its stages have different grids)", true]);
  setOptions(head, heads);
  head.value = s.head;
  head.disabled = !loaded;

  const qm = $("query-mode");
  const opts = [];
  if (loaded) {
    const t = s.meta.tokens;
    for (const p of t.prefix) {
      opts.push([prefixQuery(p), `${prefixLabel(p.index, t)} token`]);
    }
    opts.push(["patch", "a patch (click the image)"]);
  }
  setOptions(qm, opts);
  const q = parseQuery(s.query, s.meta && s.meta.tokens);
  qm.value = q && q.kind === "patch" ? "patch" : s.query;
  qm.disabled = !loaded;
  const cell = stage && markerAt(s.meta, s.query, s.layer);
  $("query-text").textContent = cell
    ? `cell (${q.r}, ${q.c}) of stage 0; on stage ${stage.index}: cell (${cell.r}, ${cell.c}) = token ${cell.token}`
    : q ? `token ${q.token}${q.kind === "patch" ? ` = patch row ${q.r}, column ${q.c}` : ""}` : "";

  $("hover-toggle").checked = s.hover;
  $("opacity").value = String(s.opacity);
  $("opacity-out").textContent = `${Math.round(s.opacity * 100)}%`;
  $("colormap").value = s.colormap;
  $("patch-grid-toggle").checked = s.showGrid;
  $("smooth-toggle").checked = s.smooth;
  renderModels(s);
  renderImageInfo(s);
  renderDownloads(s, L, H);
  renderTemperature(s);
}

/** The maps' temperature slider: log10 T, and T in words ("Inside a head" draws its own, learn.js). */
function renderTemperature(s) {
  const T = s.temperature;
  const slider = $("map-temperature");
  // Not under a dragging pointer: the slider keeps its own finer position while it moves.
  if (document.activeElement !== slider || Math.abs(Number(slider.value) - Math.log10(T)) > 0.006) {
    slider.value = String(Math.log10(T));
  }
  setText($("map-temperature-out"), fmtTemperature(T));
}

/** The mass mask, drop and chart-mode controls. */
export function renderAnalysisControls(s) {
  const loaded = !!s.meta;
  const store = s.store;
  $("mass-toggle").checked = s.mask;
  $("mass-toggle").disabled = !loaded;
  const slider = $("mass-slider");
  if (document.activeElement !== slider) slider.value = String(s.massFraction);
  slider.disabled = !loaded || !s.mask;
  $("mass-out").textContent = `${Math.round(s.massFraction * 100)}%`;
  const drop = $("drop-tokens");
  const np = loaded ? s.meta.tokens.num_prefix : 0;
  const stats = !!(store && store.stats);
  const nArt = artifactTokens(store).length;
  setOptions(drop, [
    ["none", "none"],
    ["prefix", loaded ? `prefix tokens (${np})` : "prefix tokens"],
    ["artifacts", stats ? `artifact tokens (${nArt})` : "artifact tokens"],
    ["prefix,artifacts", "prefix + artifacts"],
  ]);
  drop.value = s.drop;
  const windowed = loaded && isWindowed(s.meta); // swin: no prefix; artifacts on the last stage only
  drop.disabled = !loaded || windowed;
  drop.title = windowed ? "Swin has no prefix tokens, and its high-norm tokens are cells of the last stage only"
    : "Zero the attention to these key tokens and renormalise each row"
      + (stats && !nArt ? "; this image has no high-norm artifact tokens" : "");
  const cls = !loaded || hasCls(s.meta.tokens);
  setOptions($("entropy-kind"), ENTROPY_KINDS.map(([v, label]) => [v, label, v === "cls" && !cls]));
  $("entropy-kind").value = s.entropyKind;
  $("sink-kind").value = s.sinkKind;
  setOptions($("similarity-kind"), SIM_KINDS.map(([v, label]) => [v, label, v === "cos" && !cls]));
  $("similarity-kind").value = s.simKind;
}

function renderImageInfo(s) {
  const box = $("image-info");
  const m = s.meta;
  box.hidden = !m && !s.filename;
  $("filename").textContent = s.filename || (m ? "(no name)" : "");
  if (!m) {
    $("image-size").textContent = "";
    $("token-info").textContent = "";
    return;
  }
  const t = m.tokens;
  $("image-size").textContent = `${m.image_size[1]} × ${m.image_size[0]} px → model input ${m.input_size[1]} × ${m.input_size[0]}`;
  $("token-info").textContent = isWindowed(m)
    ? `no prefix; one grid per stage: ${m.stages.map((st) => `${st.grid[0]} × ${st.grid[1]}`).join(", ")} cells `
      + `of ${m.stages.map((st) => st.cell_size[0]).join("/")} px, in ${m.stages.map((st) => st.window.join("×")).join("/")} windows`
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
    a.removeAttribute("download");
    a.classList.add("disabled");
    a.setAttribute("aria-disabled", "true");
  }
}

function renderDownloads(s, L, H) {
  const ok = !!(s.meta && s.image); // the figure downloads (PNG, SVG) follow the drawn map: viewer.js
  if (!ok) {
    setLink($("download-tensors"), null);
    setLink($("download-full"), null);
    return;
  }
  // The links carry the name the server's Content-Disposition gives the file (downloadName).
  const base = { model: s.meta.model, layers: "all", heads: "all", format: "safetensors" };
  let q = apiQuery(s.query, s.meta.tokens);
  let { N } = dims(s.meta, s.layer);
  const stage = stageOf(s.meta, s.layer);
  if (stage) { // swin: one stage per request; the query's cell on that stage's grid
    base.layers = `${stage.layers[0]}-${stage.layers[1]}`;
    q = stageQuery(s.meta, q, stage);
    L = stage.layers[1] - stage.layers[0] + 1;
  }
  if (s.temperature !== 1) base.temperature = s.temperature; // the maps shown: softmax(scores / T)
  // the maps shown with the Ablation view's heads off and the key tokens dropped (the server drops
  // them as the page does), so the file holds the numbers on screen
  const ablate = ablateOf(s);
  if (ablate) base.ablate = ablate;
  if (s.drop && s.drop !== "none" && !stage) base.drop = s.drop; // swin: no prefix, and the page drops no cells
  setLink($("download-tensors"), attentionUrl(s.imageId, { ...base, query: q }),
    downloadName(s.imageId, s.meta.model, { ...base, query: q }));
  if (stage && !stage.dense) { // swin: N x N maps of a big stage are not answered (almost all zeros)
    setLink($("download-full"), null);
    $("download-full").textContent = `the full attention (not for stage ${stage.index}: ${N} cells, ask for rows)`;
    return;
  }
  setLink($("download-full"), attentionUrl(s.imageId, { ...base, query: "all" }),
    downloadName(s.imageId, s.meta.model, { ...base, query: "all" }));
  $("download-full").textContent = `the full attention, all ${N} rows (${fmtBytes(L * H * N * N * 4)})`;
}

export function renderStatus(s) {
  const el = $("status");
  let st = "idle";
  let text = "Bring an image to start: choose a file, drop one, paste it, or click a sample.";
  if (s.busy) {
    st = "busy";
    text = s.busy;
  } else if (s.error && !s.meta) {
    st = "error";
    text = "Nothing to show yet.";
  } else if (s.meta) {
    st = "ready";
    text = s.summary || "Ready.";
  }
  el.dataset.state = st;
  setText("status-text", text); // a live region: only new words
}

/** The error banner; "Try again" only where the error has a retry (actions.showError decides). */
export function renderError(s, onRetry) {
  const el = $("error");
  const err = s.error;
  el.hidden = !err;
  if (!err) return;
  $("error-title").textContent = err.title;
  $("error-message").textContent = err.message;
  el.dataset.code = err.code || "";
  const retry = $("error-retry");
  retry.hidden = !err.retry;
  retry.onclick = err.retry ? () => onRetry(err.retry) : null;
}
