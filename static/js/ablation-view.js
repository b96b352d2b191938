// Render functions of the "Ablation" view. Each takes its element and its data as arguments and
// writes only the DOM: the model's own output (saliency map, top-5 classes or the embedding's
// norm), the difference once heads are off, the layers x heads toggles, the progress of a long
// computation, the importance heat map and the pruning curve. ablation.js owns the data.

import {
  AXIS, LEGEND_BELOW, base, clear, layerHeadHeatmap, note, plotKeyed, plotlyReady, unavailable,
} from "./charts.js";
import { lut } from "./colormaps.js";
import { el } from "./dom.js";

const MAX_SIDE = 300; // CSS pixels of the longer side of a figure

// The API's output-change metrics (importance and pruning `metric`) in words: a short one for a
// colour bar, a longer one for an axis. The answer's `metric_text` says it in full (hover).
const METRIC_WORDS = {
  mean_abs_diff: ["mean |Δ saliency|", "saliency change, mean |Δ| per pixel"],
  top1_logprob_drop: ["drop of log p(top class)", "drop of log p(top class)"],
  relative_l2: ["relative Δ embedding", "|Δ embedding| / |embedding|"],
};

/** A metric in words: [short, long] ("abs_grad_<kind>" is the gradient method's). */
export function metricWords(metric) {
  if (METRIC_WORDS[metric]) return METRIC_WORDS[metric];
  if (String(metric).startsWith("abs_grad_")) return ["|∂ loss / ∂ gate|", "|∂ loss / ∂ gate| at the unablated model"];
  const plain = String(metric).replace(/_/g, " ");
  return [plain, plain];
}

function fmt(x, digits = 3) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e4)) return x.toExponential(2);
  return x.toFixed(digits);
}

function pct(p) {
  return `${(100 * p).toFixed(p >= 0.1 ? 1 : 2)}%`;
}

/** Size a canvas for w x h CSS pixels on this screen; returns its 2D context (scaled). */
function sized(canvas, w, h) {
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.round(w * dpr);
  canvas.height = Math.round(h * dpr);
  canvas.style.width = `${w}px`;
  canvas.style.height = `${h}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return ctx;
}

function figureSize(image) {
  const s = Math.min(MAX_SIDE / image.naturalWidth, MAX_SIDE / image.naturalHeight);
  return { w: Math.round(image.naturalWidth * s), h: Math.round(image.naturalHeight * s) };
}

/** A [h][w] map of values (lo..hi) colour-mapped into an offscreen canvas of w x h pixels. */
export function mapCanvas(rows, lo, hi, colormap) {
  const h = rows.length;
  const w = rows[0].length;
  const c = document.createElement("canvas");
  c.width = w;
  c.height = h;
  const ctx = c.getContext("2d");
  const img = ctx.createImageData(w, h);
  const table = lut(colormap);
  const span = hi - lo;
  let o = 0;
  for (let y = 0; y < h; y++) {
    const row = rows[y];
    for (let x = 0; x < w; x++, o += 4) {
      const t = span > 0 ? (row[x] - lo) / span : 0;
      const k = 3 * Math.max(0, Math.min(255, Math.round(t * 255)));
      img.data[o] = table[k];
      img.data[o + 1] = table[k + 1];
      img.data[o + 2] = table[k + 2];
      img.data[o + 3] = 255;
    }
  }
  ctx.putImageData(img, 0, 0);
  return c;
}

/** The picture with a map laid over it (the model input is a resize of the whole picture). */
export function drawOver(canvas, image, map, opacity) {
  const { w, h } = figureSize(image);
  const ctx = sized(canvas, w, h);
  ctx.imageSmoothingQuality = "high";
  ctx.drawImage(image, 0, 0, w, h);
  if (map) {
    ctx.globalAlpha = opacity;
    ctx.drawImage(map, 0, 0, w, h);
    ctx.globalAlpha = 1;
  }
}

/** The picture as the model saw it. view: {image} or null. */
export function renderPicture(canvas, view) {
  if (!view) {
    canvas.hidden = true;
    return;
  }
  canvas.hidden = false;
  if (canvas.dataset.src === view.image.src) return;
  drawOver(canvas, view.image, null, 0);
  canvas.dataset.src = view.image.src;
}

/**
 * The model's own output. view: null, or {kind, answer, image, loading, error} where answer is
 * GET …/output's JSON (saliency: output [h][w]; classes: output.top5; embedding: output.norm)
 * and base the unablated answer (for "was" values).
 */
export function renderModelOutput(box, view) {
  const body = box.querySelector(".output-body");
  const caption = box.querySelector("figcaption");
  box.dataset.state = !view ? "idle" : view.answer ? (view.loading ? "updating" : "ready") : "loading";
  if (!view || !view.answer) {
    box.dataset.kind = view ? view.kind || "" : "";
    delete box.dataset.ablate;
    const key = view ? "computing" : "none"; // the box is a live region: its words once, not at every render
    if (box.dataset.key === key) return;
    box.dataset.key = key;
    body.replaceChildren(el("p", "hint", view ? "Computing the model's output…" : "The model's output appears here."));
    caption.textContent = "Model output";
    return;
  }
  const { answer, base } = view;
  const key = `${answer.image_id}|${answer.model}|${answer.ablate}|${view.image.src}`;
  box.dataset.kind = answer.kind;
  box.dataset.ablate = answer.ablate;
  if (box.dataset.key === key) return;
  box.dataset.key = key;
  const off = answer.ablated.length;
  const tail = off ? ` · ${off} head${off === 1 ? "" : "s"} off` : " · all heads on";
  if (answer.kind === "saliency") {
    caption.textContent = `Predicted saliency, where people look (0 dark … 1 bright)${tail}`;
    const canvas = el("canvas", "output-canvas");
    canvas.setAttribute("aria-label", "The picture with the predicted saliency laid over it");
    drawOver(canvas, view.image, mapCanvas(answer.output, 0, 1, "inferno"), 0.72);
    body.replaceChildren(canvas);
  } else if (answer.kind === "classes") {
    caption.textContent = `Top 5 classes${tail}`;
    const was = base && base !== answer ? base.output.probabilities : null;
    const list = el("ol", "class-list");
    for (const c of answer.output.top5) {
      const li = el("li", "class-row");
      li.title = c.description || c.label;
      const name = el("span", "class-name", c.label);
      const bar = el("span", "class-bar");
      const fill = el("span", "class-fill");
      fill.style.width = `${Math.max(0.5, 100 * c.probability)}%`;
      bar.append(fill);
      const val = el("span", "class-p", pct(c.probability));
      li.append(name, bar, val);
      if (was) li.append(el("span", "class-was", `was ${pct(was[c.index])}`));
      list.append(li);
    }
    body.replaceChildren(list);
  } else {
    caption.textContent = `Pooled embedding${tail}`;
    body.replaceChildren(
      el("p", "big-number", fmt(answer.output.norm, 3)),
      el("p", "hint", `the norm of the ${answer.output.dim}-dimensional pooled embedding: this model has `
        + "neither a saliency decoder nor a classifier head"),
    );
  }
  if (answer.note) body.append(el("p", "hint", answer.note));
}

/**
 * The difference once heads are off. view: null, or {answer (ablated), base (unablated), image}.
 * Hidden while every head is on.
 */
export function renderDifference(box, view) {
  const on = !!(view && view.answer && view.base && view.answer.ablated.length && view.answer.change);
  box.hidden = !on;
  if (!on) {
    box.dataset.key = "";
    return;
  }
  const { answer, base } = view;
  const key = `${answer.image_id}|${answer.model}|${answer.ablate}|${view.image.src}`;
  if (box.dataset.key === key) return;
  box.dataset.key = key;
  const body = box.querySelector(".output-body");
  const caption = box.querySelector("figcaption");
  const ch = answer.change;
  if (answer.kind === "saliency") {
    const h = answer.output.length;
    const w = answer.output[0].length;
    const diff = new Array(h);
    let max = 0;
    for (let y = 0; y < h; y++) {
      const a = answer.output[y];
      const b = base.output[y];
      const row = new Float32Array(w);
      for (let x = 0; x < w; x++) {
        row[x] = Math.abs(a[x] - b[x]);
        if (row[x] > max) max = row[x];
      }
      diff[y] = row;
    }
    caption.textContent = "|difference| to all heads on";
    const canvas = el("canvas", "output-canvas");
    canvas.setAttribute("aria-label", "Where the saliency changed");
    drawOver(canvas, view.image, mapCanvas(diff, 0, max, "magma"), 0.85);
    body.replaceChildren(
      canvas,
      el("p", "change-line", `mean |Δ| ${fmt(ch.mean_abs_diff, 4)} · max |Δ| ${fmt(ch.max_abs_diff, 3)} (colour: 0 … max)`),
    );
  } else if (answer.kind === "classes") {
    caption.textContent = "Change against all heads on";
    const same = !ch.top1_changed;
    body.replaceChildren(
      el("p", "change-line", `top-1: ${ch.top1_before.label} (${pct(ch.top1_before.probability)}) → `
        + `${ch.top1_after.label} (${pct(ch.top1_after.probability)})${same ? " · unchanged" : " · changed"}`),
      el("p", "change-line", `log p(${ch.top1_before.label}) drops by ${fmt(ch.top1_logprob_drop, 3)} `
        + `(now ${pct(ch.top1_before_probability_after)})`),
      el("p", "change-line", `KL(all heads ‖ ablated) = ${fmt(ch.kl, 4)} nats`),
    );
  } else {
    caption.textContent = "Change against all heads on";
    body.replaceChildren(
      el("p", "change-line", `norm ${fmt(ch.norm_before, 3)} → ${fmt(ch.norm_after, 3)}`),
      el("p", "change-line", `|e′ − e| / |e| = ${fmt(ch.relative_l2, 4)}`),
    );
  }
}

/**
 * The layers x heads toggles. view: null, or {L, H, off: Set("l:h"), importance: [L][H] | null};
 * onToggle(layer, head) on a click.
 */
export function renderToggles(container, view, onToggle) {
  if (!view) {
    container.replaceChildren();
    container.dataset.dims = "";
    return;
  }
  const { L, H } = view;
  const dims = `${L}x${H}`;
  if (container.dataset.dims !== dims) {
    container.dataset.dims = dims;
    container.style.setProperty("--heads", String(H));
    const cells = [el("span", "ablate-corner", "")];
    for (let h = 0; h < H; h++) cells.push(el("span", "ablate-col", `h${h}`));
    for (let l = 0; l < L; l++) {
      cells.push(el("span", "ablate-row", `L${l}`));
      for (let h = 0; h < H; h++) {
        const b = el("button", "ablate-head");
        b.type = "button";
        b.setAttribute("data-testid", "ablate-head");
        b.dataset.layer = String(l);
        b.dataset.head = String(h);
        b.addEventListener("click", () => onToggle(l, h));
        cells.push(b);
      }
    }
    container.replaceChildren(...cells);
  }
  let max = 0;
  if (view.importance) for (const row of view.importance) for (const v of row) max = Math.max(max, v);
  const table = lut("viridis");
  for (const b of container.querySelectorAll(".ablate-head")) {
    const key = `${b.dataset.layer}:${b.dataset.head}`;
    const off = view.off.has(key);
    b.setAttribute("aria-pressed", off ? "true" : "false");
    b.classList.toggle("off", off);
    const v = view.importance ? view.importance[Number(b.dataset.layer)][Number(b.dataset.head)] : null;
    b.textContent = off ? "✕" : "";
    b.setAttribute("aria-label", `layer ${b.dataset.layer}, head ${b.dataset.head}, ${off ? "off" : "on"}`);
    b.title = `layer ${b.dataset.layer}, head ${b.dataset.head}: ${off ? "removed (click to restore)" : "on (click to remove)"}`
      + (v === null ? "" : ` · importance ${fmt(v, 4)}`);
    if (v !== null && max > 0) {
      const k = 3 * Math.round((v / max) * 255);
      b.style.setProperty("--cell", `rgb(${table[k]}, ${table[k + 1]}, ${table[k + 2]})`);
    } else {
      b.style.removeProperty("--cell");
    }
  }
}

/**
 * Progress of a long computation. view: {state: idle|running|done|failed, label, fraction,
 * eta_s, stage}.
 */
export function renderProgress(box, view) {
  const bar = box.querySelector(".progress-fill");
  const text = box.querySelector(".progress-text");
  box.dataset.state = view.state;
  box.hidden = view.state === "idle";
  const f = Math.max(0, Math.min(1, view.fraction || 0));
  bar.style.width = `${(100 * f).toFixed(1)}%`;
  box.setAttribute("aria-valuenow", String(Math.round(100 * f)));
  if (view.state === "running") {
    const eta = view.eta_s !== null && view.eta_s !== undefined ? ` · about ${Math.max(1, Math.round(view.eta_s))} s left` : "";
    text.textContent = `${view.label}: ${Math.round(100 * f)}%${view.stage ? ` (${view.stage})` : ""}${eta}`;
  } else if (view.state === "done") {
    text.textContent = view.label;
  } else if (view.state === "failed") {
    text.textContent = `${view.label} failed.`;
  }
  // a progress bar's children are not read: its value in words carries the text (the time left)
  if (view.state === "idle") box.removeAttribute("aria-valuetext");
  else box.setAttribute("aria-valuetext", text.textContent);
}

/** The importance heat map. view: null | {L, H, answer, off}; onPick(layer, head) toggles a head. */
export function renderImportance(elm, view, onPick, waiting) {
  if (!view) {
    if (waiting) return note(elm, waiting, "loading");
    return note(elm, "Press “Compute importance” to measure every head.");
  }
  if (!plotlyReady()) return unavailable(elm);
  const { answer } = view;
  const max = Math.max(...answer.importance.flat());
  const [short] = metricWords(answer.metric);
  const what = answer.method === "ablation" ? `output change without the head (${short})` : short;
  const full = answer.metric_text ? `<br><i>${answer.metric_text}</i>` : "";
  layerHeadHeatmap(elm, `imp|${answer.image_id}|${answer.model}|${answer.method}`, answer.importance, {
    L: view.L, H: view.H, layer: null, head: null, colormap: "viridis", title: short,
    zmin: 0, zmax: max,
    hover: `layer %{y}, head %{x}<br>${what} %{z:.4g}${full}<br>click: switch the head off or on<extra></extra>`,
  }, (l, h) => onPick(l, Number(h)));
  return undefined;
}

/** The pruning curve: output change against heads removed, least important first. */
export function renderPruning(elm, answer, waiting) {
  if (!answer) {
    if (waiting) return note(elm, waiting, "loading");
    return note(elm, "The pruning curve follows the importance.");
  }
  if (!plotlyReady()) return unavailable(elm);
  const order = answer.order;
  const text = answer.removed.map((k) => (k === 0 ? "all heads on" : `last removed: layer ${order[k - 1][0]}, head ${order[k - 1][1]}`));
  const [short, long] = metricWords(answer.metric);
  const traces = [{
    type: "scatter", mode: "lines+markers", x: answer.removed, y: answer.change, text, name: short,
    line: { color: "#38bdf8", width: 2 }, marker: { size: 5 },
    hovertemplate: `%{x} heads removed<br>${short} %{y:.4g}<br>%{text}<extra></extra>`,
  }];
  if (answer.top1_kept) {
    traces.push({
      type: "scatter", mode: "markers", x: answer.removed.filter((_, i) => !answer.top1_kept[i]),
      y: answer.change.filter((_, i) => !answer.top1_kept[i]), name: "top-1 class changed",
      marker: { color: "#f87171", size: 8, symbol: "x" }, hoverinfo: "skip",
    });
  }
  const layout = base({
    xaxis: { ...AXIS, title: { text: `heads removed, least important first (of ${answer.heads_total})` }, rangemode: "tozero" },
    yaxis: { ...AXIS, title: { text: long, font: { size: 11.5 } }, rangemode: "tozero" },
    margin: { l: 60, r: 12, b: traces.length > 1 ? 72 : 44 }, height: traces.length > 1 ? 330 : 300,
    showlegend: traces.length > 1, legend: { ...LEGEND_BELOW, y: -0.26 },
  });
  plotKeyed(elm, `prune|${answer.image_id}|${answer.model}|${answer.method}|${answer.removed.length}`, traces, layout);
  return undefined;
}

export { clear };
