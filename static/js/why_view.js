// Render functions of the "Why" view. Each takes its element and its data and writes only the
// DOM: the model's output with the box drawn on it (or the top-5 classes), a relevance map over
// the picture, and the faithfulness chart. why.js owns the data.

import { drawOver, mapCanvas } from "./ablation_view.js";
import { AXIS, LEGEND_BELOW, base, note, plotKeyed, plotlyReady, unavailable } from "./charts.js";
import { el } from "./dom.js";

export const METHOD_NAMES = {
  chefer: "Chefer et al.",
  grad_attention: "attention × gradient",
  rollout: "rollout",
  attention: "raw attention",
  random: "random",
};
const COLOURS = { chefer: "#38bdf8", grad_attention: "#a78bfa", rollout: "#34d399", attention: "#fbbf24", random: "#94a3b8" };

/** A target in words: "the whole output", "the box x 60–150, y 40–120", "class 281". */
export function targetWords(target, answer) {
  if (target === "output") return "the whole output";
  if (target.startsWith("box:")) {
    const [x0, y0, x1, y1] = target.slice(4).split(",");
    return `the box x ${x0}–${x1}, y ${y0}–${y1}`;
  }
  if (answer && answer.class_label) return `“${answer.class_label}”`;
  if (target === "embedding") return "the embedding";
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
  }
  if (!answer) {
    caption.textContent = view.loading ? "Computing the map (one forward and one backward pass)…" : "";
    return;
  }
  const what = targetWords(answer.target, answer);
  if (view.role === "raw") {
    const rows = answer.rows === "cls" ? "where the class token looks" : "the mean over every token's row";
    caption.textContent = `Raw attention, for comparison: the last layer, ${rows}, averaged over heads. `
      + "It shows where the model looks, not what made this output.";
  } else {
    caption.textContent = `${METHOD_NAMES[answer.method]}: how much each patch pushed ${what} up`
      + ` (${answer.target === "output" || answer.target.startsWith("box:") ? "mean saliency" : "value"} ${answer.y.toPrecision(3)}).`
      + (answer.uniform ? " The map is flat: no patch pushed the target up." : "");
  }
}

function curveName(method, sign, auc) {
  const a = auc === null || auc === undefined ? "–" : auc.toFixed(3);
  return `${METHOD_NAMES[method] || method} · AUC ${a}`;
}

/** The faithfulness chart: positive (left) and negative (right) curves per method, AUC in the legend. */
export function renderFaithfulness(elm, answer, waiting) {
  if (!plotlyReady()) return unavailable(elm);
  if (!answer) return note(elm, waiting || "Press “Run the test” to compare the maps.", waiting ? "loading" : "note");
  const traces = [];
  for (const [method, c] of Object.entries(answer.methods)) {
    const dash = method === "random" ? "dash" : "solid";
    const colour = COLOURS[method] || "#e2e8f0";
    for (const [sign, xa, ya] of [["positive", "x", "y"], ["negative", "x2", "y2"]]) {
      const auc = c[`auc_${sign}`];
      traces.push({
        type: "scatter", mode: "lines+markers", x: answer.fractions, y: c[sign], xaxis: xa, yaxis: ya,
        name: `${sign === "positive" ? "+" : "−"} ${curveName(method, sign, auc)}`, legendgroup: method,
        line: { color: colour, width: 2, dash }, marker: { size: 5 },
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
  elm.setAttribute("aria-label", Object.entries(answer.methods)
    .map(([m, c]) => `${m}: AUC positive ${c.auc_positive}, negative ${c.auc_negative}`).join("; "));
  return undefined;
}
