// The any-model picker: search timm's pretrained models of the supported families, load one on
// the server (download, then build) with its progress, and switch the page to it. Shown only when
// the server runs with --any-model (GET /api/v1/models says so). Self-contained: main.js calls
// bindModelPicker() once the model list is in; its own small state lives here, like learn.js's.

import { catalogLoad, getModels, searchCatalog } from "./api.js";
import { $, debounce, fmtBytes, setText } from "./dom.js";
import { app } from "./actions.js";
import { switchModel } from "./intake.js";
import { state } from "./state.js";

const POLL_MS = 400;
// loading: the name being loaded; chosen: counts the models chosen, here and in the menu (see ready)
const picker = { query: null, loading: null, chosen: 0, timer: 0, searchAbort: null };

function tags(m) {
  const t = [m.family];
  if (m.loaded) t.push("loaded");
  else if (m.offered) t.push("offered");
  else if (m.cached) t.push("cached");
  return t.join(" · ");
}

function renderResults(body) {
  const list = $("model-results");
  // A later answer (the user typed on) replaces the buttons; a keyboard user whose focus was on
  // one keeps it on the same model, or on the search field, never on the page behind the dialog.
  const had = list.contains(document.activeElement) ? document.activeElement.dataset.name || "" : null;
  list.replaceChildren(...body.models.map((m) => {
    const li = document.createElement("li");
    const b = document.createElement("button");
    b.type = "button";
    b.dataset.name = m.name;
    b.setAttribute("data-testid", "model-result");
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = m.name;
    const t = document.createElement("span");
    t.className = "tags";
    t.textContent = tags(m);
    b.append(name, t);
    b.addEventListener("click", () => load(m.name));
    li.append(b);
    return li;
  }));
  const shown = body.models.length;
  setText("model-results-count", body.total === 0 // a live region: only new words
    ? `No pretrained model of a supported family matches “${body.query}”.`
    : `${body.total} model${body.total === 1 ? "" : "s"}${shown < body.total ? `, the first ${shown} shown` : ""}`);
  list.dataset.query = body.query;
  if (had === null) return;
  const same = [...list.querySelectorAll("button")].find((b) => b.dataset.name === had);
  (same || $("model-search")).focus();
}

async function search(q) {
  if (picker.searchAbort) picker.searchAbort.abort();
  const ctrl = new AbortController();
  picker.searchAbort = ctrl;
  picker.query = q;
  try {
    renderResults(await searchCatalog({ q, limit: 50 }, ctrl.signal));
  } catch (e) {
    if (e && e.name === "AbortError") return;
    $("model-results").replaceChildren();
    setText("model-results-count", e.message);
  }
}

function renderLoad(st) {
  const box = $("model-load");
  box.hidden = false;
  box.dataset.state = st.state;
  const bar = $("model-load-progress");
  if (st.fraction == null) bar.removeAttribute("value");
  else bar.value = st.fraction;
  const size = st.bytes_total ? ` ${fmtBytes(st.bytes_done)} of ${fmtBytes(st.bytes_total)}` : "";
  const text = {
    queued: `${st.name}: waiting for another download to finish…`,
    downloading: `${st.name}: downloading${size}${st.fraction != null ? ` (${Math.round(st.fraction * 100)} %)` : ""}…`,
    loading: `${st.name}: building the model…`,
    ready: `${st.name} is loaded.`,
    failed: `${st.name} could not be loaded: ${st.error ? st.error.message : "unknown error"}`,
    idle: "",
  }[st.state];
  setText("model-load-status", text || st.state); // polled: the same words are not said again
}

/**
 * A loaded model goes into the menu; the page switches to it unless another model was chosen
 * since it was picked (`mine`: picker.chosen then), in the menu while a download took minutes
 * or here: that choice stands.
 */
async function ready(st, mine) {
  try {
    const models = await getModels();
    state.models = models.models || [];
  } catch {
    // the switch below reports a server that went away
  }
  if (mine !== picker.chosen) {
    app.update(); // in the menu only
    return;
  }
  $("model-dialog").close();
  switchModel(st.id);
}

async function poll(name, mine) {
  if (picker.loading !== name) return;
  let st;
  try {
    st = await catalogLoad(name);
  } catch (e) {
    if (picker.loading !== name) return;
    renderLoad({ name, state: "failed", fraction: null, error: { message: e.message } });
    picker.loading = null;
    return;
  }
  if (picker.loading !== name) return; // another model was chosen in the picker meanwhile
  renderLoad(st);
  if (st.state === "ready") {
    picker.loading = null;
    await ready(st, mine);
  } else if (st.state === "failed") {
    picker.loading = null;
  } else {
    picker.timer = setTimeout(() => poll(name, mine), POLL_MS);
  }
}

async function load(name) {
  clearTimeout(picker.timer);
  picker.loading = name;
  const mine = ++picker.chosen;
  renderLoad({ name, state: "queued", fraction: null, bytes_total: null });
  try {
    const st = await catalogLoad(name, "POST");
    if (picker.loading !== name) return; // another model was chosen in the picker meanwhile
    renderLoad(st);
    if (st.state === "ready") {
      picker.loading = null;
      await ready(st, mine);
      return;
    }
  } catch (e) {
    if (picker.loading !== name) return;
    // 503 hub_unreachable (and any other refusal): the server's sentence, in the picker
    renderLoad({ name, state: "failed", fraction: null, error: { message: e.message } });
    picker.loading = null;
    return;
  }
  picker.timer = setTimeout(() => poll(name, mine), POLL_MS);
}

/** Show the "Any pretrained model…" button when the server loads catalogue models (`any_model`). */
export function bindModelPicker(anyModel) {
  const open = $("model-search-open");
  open.hidden = !anyModel;
  if (!anyModel || open.dataset.bound) return;
  open.dataset.bound = "1";
  const dialog = $("model-dialog");
  const input = $("model-search");
  const later = debounce((q) => search(q), 200);
  open.addEventListener("click", () => {
    dialog.showModal();
    input.focus();
    if (picker.query === null) search(input.value);
  });
  input.addEventListener("input", () => later(input.value.trim()));
  // a model chosen in the menu is a choice a load finishing later does not override
  $("model").addEventListener("change", () => { picker.chosen += 1; });
  input.addEventListener("keydown", (e) => {
    if (e.isComposing) return;
    if (e.key === "Enter") {
      // Enter loads nothing (a download can take minutes): it moves to the first result, where
      // Enter then loads that model; with no result it does nothing.
      e.preventDefault();
      const first = $("model-results").querySelector("button");
      if (first) first.focus();
    } else if (e.key === "Escape") {
      // Escape closes the dialog from here too, where a search field would only clear itself.
      e.preventDefault();
      dialog.close();
      open.focus();
    }
  });
}
