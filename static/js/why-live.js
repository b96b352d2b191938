// The faithfulness test for screen readers (and for reading): its progress and its finish in a
// polite live region, and its result as text, a table of each method's areas under the curves in
// words and rounded numbers. The answer's verdicts (what the Why view writes under the chart) are
// read out with the finish, sentence by sentence. why.js calls these from render.

import { verdictWords } from "./why-verdict.js";
import { METHOD_NAMES } from "./why-view.js";

const STEPS = 4; // the running test is announced at its start and at each quarter done

function el(tag, text) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  return e;
}

function auc(v) {
  return v === null || v === undefined || !Number.isFinite(v) ? "not measured" : v.toFixed(3);
}

/** One sentence per method: "Chefer et al.: area under the positive curve 0.412, negative 0.633." */
export function resultSentences(answer) {
  return Object.entries(answer.methods).map(([m, c]) => `${METHOD_NAMES[m] || m}: area under the positive curve `
    + `${auc(c.auc_positive)} (lower is better), under the negative curve ${auc(c.auc_negative)} (higher is better).`);
}

/**
 * The result as a table (box: the [data-testid=faithfulness-results] element): a row per method
 * with its two areas. answer: GET …/faithfulness, or null (the table empties).
 */
export function renderFaithfulnessResults(box, answer) {
  const key = answer ? `${answer.image_id}|${answer.target}|${Object.keys(answer.methods)}|${answer.fractions}|${answer.ablate}` : "";
  if (box.dataset.key === key) return;
  box.dataset.key = key;
  box.hidden = !answer;
  if (!answer) {
    box.replaceChildren();
    return;
  }
  const table = el("table");
  table.className = "chart-data";
  table.append(el("caption", `Area under each curve (${answer.fractions.length} fractions of the patches removed)`));
  const head = el("tr");
  for (const h of ["Method", "Positive: most relevant removed first (lower is better)", "Negative: least relevant removed first (higher is better)"]) {
    const th = el("th", h);
    th.scope = "col";
    head.append(th);
  }
  const thead = el("thead");
  thead.append(head);
  const body = el("tbody");
  for (const [m, c] of Object.entries(answer.methods)) {
    const tr = el("tr");
    tr.dataset.method = m;
    const th = el("th", METHOD_NAMES[m] || m);
    th.scope = "row";
    tr.append(th, el("td", auc(c.auc_positive)), el("td", auc(c.auc_negative)));
    body.append(tr);
  }
  table.append(thead, body);
  box.replaceChildren(table);
}

/**
 * The live region (live: [data-testid=faithfulness-live], aria-live=polite) from the test's
 * progress view ({state, fraction, eta_s, label}) and answer: a sentence at the start, one at
 * each quarter with the time left, and the finish with the results and verdicts. What it last
 * said is kept on the element (data-said), so a redraw says nothing new.
 */
export function renderFaithfulnessLive(live, progress, answer) {
  let said = "";
  let text = "";
  if (progress.state === "running") {
    const step = Math.min(STEPS - 1, Math.floor((progress.fraction || 0) * STEPS));
    said = `running|${step}`;
    const eta = progress.eta_s !== null && progress.eta_s !== undefined
      ? `, about ${Math.max(1, Math.round(progress.eta_s))} s left` : "";
    text = step === 0 && !(progress.fraction > 0)
      ? "Faithfulness test started: removing patches and running the model."
      : `Faithfulness test ${Math.round(100 * (progress.fraction || 0))}% done${eta}.`;
  } else if (progress.state === "done" && answer) {
    said = `done|${answer.image_id}|${answer.target}|${Object.keys(answer.methods)}|${answer.fractions}`;
    const verdicts = verdictWords(answer, METHOD_NAMES);
    text = `Faithfulness test done: ${progress.label}. ${resultSentences(answer).join(" ")}${verdicts ? ` ${verdicts}` : ""}`;
  } else if (progress.state === "failed") {
    said = "failed";
    text = "The faithfulness test failed.";
  }
  if (live.dataset.said === said) return;
  live.dataset.said = said;
  live.textContent = text;
}
