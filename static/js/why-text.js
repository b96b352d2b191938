// The Why view's text side (#42), for CLIP-style models (a text tower beside the image tower):
// a phrase as the target ("a phrase" in the target picker, the prompt box), the phrase's tokens
// with their relevance under it (the relevance answer's text_tokens), and zero-shot labels
// (GET …/zero-shot) as a ranked list whose labels switch the map to that label's phrase.
// why.js owns the state (state.why.phrase, state.why.labels) and the fetching; this module draws.

/** Whether the model has a text tower: known once loaded (`text`), else from its source. */
export function hasText(models, id) {
  const info = (models || []).find((m) => m.id === id);
  if (!info) return false;
  return info.text === true || (info.text == null && info.source === "open_clip");
}

/** The API target of a phrase (null while none is typed). */
export function phraseTarget(phrase) {
  const p = (phrase || "").trim();
  return p ? `text:${p}` : null;
}

/** The labels typed, trimmed, empty ones and repeats dropped ("" when none). */
export function labelsText(labels) {
  return [...new Set((labels || "").split(",").map((l) => l.trim()).filter(Boolean))].join(",");
}

/**
 * The phrase's tokens, each shaded by its share of the relevance (the answer's text_tokens) and
 * with the share written under it: read by a screen reader with the word, seen without a pointer.
 */
export function renderTokens(el, answer) {
  const tokens = answer && answer.text_tokens;
  el.replaceChildren();
  el.hidden = !tokens;
  if (!tokens) return;
  const top = Math.max(...tokens.map((t) => t.relevance), 1e-12);
  for (const t of tokens) {
    const span = document.createElement("span");
    span.className = "text-token";
    span.dataset.testid = "text-token";
    span.dataset.token = t.token;
    span.dataset.relevance = String(t.relevance);
    span.style.setProperty("--share", (t.relevance / top).toFixed(3));
    const word = document.createElement("span");
    word.className = "text-token-word";
    word.textContent = t.token;
    const share = document.createElement("small");
    share.className = "text-token-share";
    share.dataset.testid = "text-token-share";
    share.textContent = `${(100 * t.relevance).toFixed(1)}%`;
    span.append(word, " ", share);
    el.append(span);
  }
}

/**
 * The zero-shot answer as a ranked list; the label whose phrase is the target is marked.
 * @param {HTMLElement} el  the list (an <ol>)
 * @param {object|null} answer  GET …/zero-shot
 * @param {string|null} chosen  the phrase shown on the map
 * @param {(label: string) => void} pick  called when a label is clicked
 */
export function renderZeroShot(el, answer, chosen, pick, state) {
  el.dataset.state = state;
  if (el.zeroShot === answer && el.dataset.chosen === String(chosen)) return; // nothing new to draw
  el.zeroShot = answer;
  el.dataset.chosen = String(chosen);
  // A label picked from the keyboard rebuilds the list (the marked one changes): its focus goes to
  // the same label's new button, not to the page.
  const had = el.contains(document.activeElement) ? document.activeElement.dataset.label : null;
  el.replaceChildren();
  if (!answer) return;
  for (const row of answer.labels) {
    const li = document.createElement("li");
    const b = document.createElement("button");
    b.type = "button";
    b.className = "zero-shot-label";
    b.dataset.testid = "zero-shot-label";
    b.dataset.label = row.label;
    b.setAttribute("aria-pressed", String(row.label === chosen));
    b.textContent = `${row.label} — ${(100 * row.probability).toFixed(1)}%`;
    b.style.setProperty("--share", row.probability.toFixed(4));
    b.addEventListener("click", () => pick(row.label));
    li.append(b);
    el.append(li);
    if (row.label === had) b.focus();
  }
}
