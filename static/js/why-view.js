// Render functions of the "Why" view. Each takes its element and its data and writes only the
// DOM: the model's output with the box drawn on it (or the top-5 classes), a relevance map over
// the picture, and the faithfulness chart. why.js owns the data.

import { drawOver, mapCanvas } from "./ablation-view.js";
import { paintColorbar } from "./colormaps.js";
import { AXIS, LEGEND_BELOW, base, note, plotKeyed, plotlyReady, unavailable } from "./charts.js";
import { el } from "./dom.js";
import { describeCanvas, gridWords } from "./map-text.js";

export const METHOD_NAMES = {
  chefer: "Chefer et al.",
  grad_attention: "attention × gradient",
  rollout: "rollout",
  attention: "raw attention",
  random: "random",
  chefer2021: "Chefer et al. 2021 (LRP)",
  attnlrp: "AttnLRP",
  legrad: "LeGrad",
};
const COLOURS = {
  chefer: "#38bdf8", grad_attention: "#a78bfa", rollout: "#34d399", attention: "#fbbf24", random: "#94a3b8",
  chefer2021: "#f472b6", attnlrp: "#fb923c", legrad: "#2dd4bf",
};
// A marker shape per method too: the curves stay apart without colour (deuteranopia mixes the
// first two colours).
export const SYMBOLS = {
  chefer: "circle", grad_attention: "square", rollout: "diamond", attention: "triangle-up", random: "x",
  chefer2021: "star", attnlrp: "hexagon", legrad: "cross",
};

/** A target in words: "the whole output", "the box x 60–150, y 40–120", "class 281". */
export function targetWords(target, answer) {
  if (target === "output") return "the whole output";
  if (target.startsWith("box:")) {
    const [x0, y0, x1, y1] = target.slice(4).split(",");
    return `the box x ${x0}–${x1}, y ${y0}–${y1}`;
  }
  if (answer && answer.class_label) return `“${answer.class_label}”`;
  if (target === "embedding") return "the embedding";
  if (target.startsWith("text:")) return `the phrase “${target.slice(5)}”`;
  return target.replace(":", " ");
}

/**
 * The model's output, where a box is drawn. view: {answer (GET …/output), image, box ([x0, y0,
 * x1, y1] in output-map pixels, or null), boxOn (the box is the target), dragging}.
 */
export function renderWhyOutput(fig, view) {
  const body = fig.querySelector(".output-body");
  const caption = fig.querySelector("figcaption");
  const boxEl = fig.querySelector(".why-box");
  const { answer } = view;
  fig.dataset.state = answer ? "ready" : "loading";
  if (!answer) {
    body.replaceChildren(el("p", "hint", "Computing the model's output…"));
    caption.textContent = "Model output";
    fig.dataset.key = "";
    boxEl.hidden = true;
    return;
  }
  const key = `${answer.image_id}|${answer.model}|${answer.ablate}|${view.image.src}`;
  fig.dataset.kind = answer.kind;
  if (fig.dataset.key !== key) {
    fig.dataset.key = key;
    if (answer.kind === "saliency") {
      const canvas = el("canvas", "output-canvas why-canvas");
      canvas.setAttribute("data-testid", "why-saliency");
      canvas.setAttribute("aria-label", "The predicted saliency: drag on it to draw a box to explain");
      drawOver(canvas, view.image, mapCanvas(answer.output, 0, 1, "inferno"), 0.72);
      body.replaceChildren(canvas);
    } else if (answer.kind === "classes") {
      const list = el("ol", "class-list");
      for (const c of answer.output.top5) {
        const li = el("li", "class-row");
        const fill = el("span", "class-fill");
        fill.style.width = `${Math.max(0.5, 100 * c.probability)}%`;
        const bar = el("span", "class-bar");
        bar.append(fill);
        li.append(el("span", "class-name", c.label), bar, el("span", "class-p", `${(100 * c.probability).toFixed(1)}%`));
        list.append(li);
      }
      body.replaceChildren(list);
    } else {
      body.replaceChildren(el("p", "hint", `A ${answer.output.dim}-dimensional embedding: the target is its `
        + "projection on itself, which every patch can push up or down."));
    }
  }
  const off = answer.ablated.length ? ` · ${answer.ablated.length} heads off` : "";
  caption.textContent = answer.kind === "saliency"
    ? `Predicted saliency: drag on it to draw a box to explain${off}`
    : answer.kind === "classes" ? `Top 5 classes: pick one under “Explain”${off}` : `Pooled embedding${off}`;
  const canvas = body.querySelector("canvas");
  const b = view.box;
  boxEl.hidden = !(canvas && b);
  if (!canvas || !b) return;
  // In percent of the canvas (the figure scales with the page's width).
  const [h, w] = answer.input_size;
  const pc = (v, n) => `${(100 * v) / n}%`;
  Object.assign(boxEl.style, { left: pc(b[0], w), top: pc(b[1], h), width: pc(b[2] - b[0], w), height: pc(b[3] - b[1], h) });
  boxEl.classList.toggle("off", !view.boxOn);
  boxEl.classList.toggle("dragging", !!view.dragging);
}

/**
 * One map over the picture. view: {image, answer (GET …/relevance) or null, loading, role:
 * "relevance" (the chosen method) | "raw" (the raw attention beside it)}.
 */
export function renderRelevance(fig, view) {
  const canvas = fig.querySelector("canvas");
  const caption = fig.querySelector("figcaption");
  const { answer } = view;
  fig.dataset.state = answer ? "ready" : view.loading ? "loading" : "idle";
  const key = answer
    ? `${answer.image_id}|${answer.model}|${answer.method}|${answer.target}|${answer.ablate}|${answer.seed}|${view.image.src}`
    : `none|${view.image.src}`;
  if (canvas.dataset.key !== key) {
    canvas.dataset.key = key;
    let map = null;
    if (answer) {
      let max = 0;
      for (const row of answer.relevance) for (const v of row) if (v > max) max = v;
      map = mapCanvas(answer.relevance, 0, max, "inferno");
    }
    drawOver(canvas, view.image, map, 0.78);
    canvas.dataset.method = answer ? answer.method : "";
    canvas.dataset.target = answer ? answer.target : "";
    renderMapColorbar(fig, answer);
    describeCanvas(canvas, answer ? relevanceWords(answer) : "");
  }
  if (!answer) {
    caption.textContent = view.loading ? "Computing the map (one forward and one backward pass)…" : "";
    return;
  }
  caption.textContent = view.role === "raw" ? rawCaption(answer) : mapCaption(answer);
}

/** The map's numbers in words (its accessible description): its highest patches and its lowest. */
export function relevanceWords(answer) {
  const rows = answer.relevance;
  const C = rows.length ? rows[0].length : 0;
  return gridWords(rows.flat(), rows.length, C);
}

// Methods whose map follows the target's gradient, and those that propagate the target's relevance
// back with LRP rules: both change with the target. The others (attention alone, a seeded random
// map) are the same map whatever the target is, and their captions say so.
export const GRADIENT_METHODS = ["chefer", "grad_attention", "legrad"];
export const LRP_METHODS = ["chefer2021", "attnlrp"];

function rowsWords(answer) {
  return answer.rows === "cls" ? "where the class token looks" : "the mean over every token's row";
}

/** The caption of the raw attention beside the chosen map. */
export function rawCaption(answer) {
  return `Raw attention, for comparison: the last layer, ${rowsWords(answer)}, averaged over heads. `
    + "It shows where the model looks, not what made this output.";
}

/** The caption of one method's map for its target: what it is, true for that method. */
export function mapCaption(answer) {
  const what = targetWords(answer.target, answer);
  const value = `${answer.target === "output" || answer.target.startsWith("box:") ? "mean saliency" : "value"} ${answer.y.toPrecision(3)}`;
  const flat = answer.uniform ? " The map is flat: no patch pushed the target up." : "";
  switch (answer.method) {
    case "chefer":
      return `${METHOD_NAMES.chefer}: how much each patch pushed ${what} up (${value}), every layer's attention `
        + `weighted by its gradient and chained through the layers.${flat}`;
    case "grad_attention":
      return `${METHOD_NAMES.grad_attention}: how much each patch pushed ${what} up (${value}), from the last `
        + `layer's attention weighted by its gradient.${flat}`;
    case "legrad":
      return `${METHOD_NAMES.legrad}: how much each patch pushed ${what} up (${value}), from the gradient of `
        + `its attention maps in the last layers.${flat}`;
    case "chefer2021":
      return `${METHOD_NAMES.chefer2021}: how much each patch contributed to ${what} (${value}), every layer's `
        + `attention relevance (LRP) weighted by its gradient and chained through the layers.${flat}`;
    case "attnlrp":
      return `${METHOD_NAMES.attnlrp}: how much each patch contributed to ${what} (${value}), its relevance `
        + `carried back through the whole model in one backward pass with LRP rules; signed, the patches that `
        + `spoke against it are drawn dark.${flat}`;
    case "rollout":
      return "Attention rollout: how much attention flows from each patch "
        + `${answer.rows === "cls" ? "to the class token" : "to the tokens (the mean over every row)"} through all `
        + "the layers, averaged over heads. It comes from the attention alone: the same map for every target.";
    case "attention":
      return `Raw attention: the last layer, ${rowsWords(answer)}, averaged over heads. `
        + "It comes from the attention alone: the same map for every target.";
    case "random":
      return `Random (seed ${answer.seed}): a seeded random map, the baseline the test compares every map with. `
        + "It depends on neither the picture nor the target.";
    default:
      return `${METHOD_NAMES[answer.method] || answer.method}: the map for ${what} (${value}).${flat}`;
  }
}

/** The hint above the maps, for the chosen method (the gradient is named only where it is used). */
export function methodHint(method) {
  const common = " Bright patches matter most; the map sums to 1.";
  if (GRADIENT_METHODS.includes(method)) {
    return "A relevance map says how much each patch of the picture pushed one number of the model's output (the "
      + "target) up: attention combined with the gradient of that number, so it follows what the model computed, "
      + `not only where its heads look.${common}`;
  }
  if (LRP_METHODS.includes(method)) {
    const signs = method === "attnlrp"
      ? " Its relevance is signed: bright patches pushed the target up; those that spoke against it are drawn dark "
        + "(the map sums to 1, or to −1 where the target's total relevance is negative)."
      : common;
    return "A relevance map says how much each patch of the picture contributed to one number of the model's output "
      + "(the target): that number's relevance carried back through the model with LRP rules, so it follows what "
      + `the model computed, not only where its heads look.${signs}`;
  }
  if (method === "random") {
    return "A random map is the baseline: the faithfulness test below says whether the other maps do better than "
      + "patches picked at random.";
  }
  return "This map comes from the attention alone (no gradient): it shows where the model looks, the same for "
    + `every target; the faithfulness test below says whether that explains the target.${common}`;
}

/** The colour bar under a map: inferno from 0 to the map's largest share (the colours are scaled to it). */
function renderMapColorbar(fig, answer) {
  const bar = fig.querySelector(".colorbar");
  if (!bar) return;
  bar.hidden = !answer;
  if (!answer) return;
  let max = 0;
  for (const row of answer.relevance) for (const v of row) if (v > max) max = v;
  const canvas = bar.querySelector("canvas");
  if (!canvas.dataset.painted) {
    paintColorbar(canvas, "inferno");
    canvas.dataset.painted = "1";
  }
  bar.querySelector(".cb-min").textContent = "0";
  bar.querySelector(".cb-max").textContent = max > 0 ? max.toPrecision(3) : "0";
  bar.setAttribute("aria-label", `Colour scale: black 0 to bright yellow ${max > 0 ? max.toPrecision(3) : "0"} of the relevance`);
}

function curveName(method, sign, auc) {
  const a = auc === null || auc === undefined ? "–" : auc.toFixed(3);
  return `${METHOD_NAMES[method] || method} · AUC ${a}`;
}

/** The faithfulness chart: positive (left) and negative (right) curves per method, AUC in the legend. */
export function renderFaithfulness(elm, answer, waiting) {
  if (!answer) return note(elm, waiting || "Press “Run the test” to compare the maps.", waiting ? "loading" : "note");
  if (!plotlyReady()) return unavailable(elm);
  const traces = [];
  for (const [method, c] of Object.entries(answer.methods)) {
    const dash = method === "random" ? "dash" : "solid";
    const colour = COLOURS[method] || "#e2e8f0";
    for (const [sign, xa, ya] of [["positive", "x", "y"], ["negative", "x2", "y2"]]) {
      const auc = c[`auc_${sign}`];
      traces.push({
        type: "scatter", mode: "lines+markers", x: answer.fractions, y: c[sign], xaxis: xa, yaxis: ya,
        name: `${sign === "positive" ? "+" : "−"} ${curveName(method, sign, auc)}`, legendgroup: method,
        line: { color: colour, width: 2, dash }, marker: { size: 8, symbol: SYMBOLS[method] || "circle" },
        meta: { method, sign, auc },
        hovertemplate: `${METHOD_NAMES[method] || method}, ${sign}<br>%{x:.0%} removed: %{y:.3f} of the target<extra></extra>`,
      });
    }
  }
  // Side by side on a wide screen, one above the other on a narrow one (a phone).
  const narrow = elm.clientWidth > 0 && elm.clientWidth < 560;
  const pct = { ...AXIS, tickformat: ".0%", rangemode: "tozero" };
  const ratio = { ...AXIS, rangemode: "tozero", title: { text: "target / unperturbed" } };
  const head = (text, x, y) => ({
    xref: "paper", yref: "paper", x, y, xanchor: "left", yanchor: "bottom", showarrow: false, text, font: { size: 12 },
  });
  const layout = base(narrow
    ? {
      height: 640,
      margin: { l: 48, r: 12, b: 150 },
      xaxis: { ...pct, anchor: "y", title: { text: "removed, most relevant first" } },
      xaxis2: { ...pct, anchor: "y2", title: { text: "removed, least relevant first" } },
      yaxis: { ...ratio, domain: [0.62, 1] },
      yaxis2: { ...ratio, domain: [0, 0.36] },
      showlegend: true, legend: { ...LEGEND_BELOW, y: -0.12 },
      annotations: [head("<b>positive</b>: lower is better", 0, 1.01), head("<b>negative</b>: higher is better", 0, 0.37)],
    }
    : {
      height: 380,
      margin: { l: 48, r: 12, b: 140 },
      xaxis: { ...pct, domain: [0, 0.46], title: { text: "patches removed, most relevant first" } },
      xaxis2: { ...pct, domain: [0.54, 1], anchor: "y2", title: { text: "patches removed, least relevant first" } },
      yaxis: ratio,
      yaxis2: { ...AXIS, anchor: "x2", rangemode: "tozero" },
      showlegend: true, legend: { ...LEGEND_BELOW, y: -0.3 },
      annotations: [head("<b>positive</b>: lower is better", 0, 1.02), head("<b>negative</b>: higher is better", 0.54, 1.02)],
    });
  const key = `faith|${answer.image_id}|${answer.model}|${answer.target}|${Object.keys(answer.methods)}|${answer.fractions}|${answer.ablate}|${narrow}`;
  plotKeyed(elm, key, traces, layout);
  return undefined;
}
