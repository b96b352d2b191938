// The page's entry point. How the modules fit:
//
//   state.js     the one `state` object, pure helpers over it, the URL
//   actions.js   update() (render + URL + the view's need) and every state change a person asks for
//   render.js    render(): the chrome and the shown view, from the state (read only)
//   views.js     the tabs and the list of views: where a new view plugs in
//   maps.js      the "Attention maps" view (viewer.js, compare.js, grid.js, rollout.js, analytics.js…)
//   learn.js     the "Inside a head" view (one head's computation, its temperature slider)
//   ablation.js  the "Ablation" view (heads off, the model's output, importance, pruning)
//   why.js       the "Why" view (relevance maps of a target, the faithfulness test)
//   fetching.js  what the view needs from the server, image loads, cancellation
//   intake.js    file, drop, paste, samples, model switch, shared URL
//   model-picker.js  the any-model picker (--any-model): search, load with progress, switch
//   bindings.js  the events of every control
//
// Nothing here runs at import time except start() below: the modules import without a DOM
// (tests/js runs them in Node).

import { app } from "./actions.js";
import { CHARTS_READY, loadPlotly } from "./charts.js";
import { bindAll } from "./bindings.js";
import { initStaticControls } from "./controls.js";
import { getModels } from "./api.js";
import { bindIntake, takeShared } from "./intake.js";
import { bindModelPicker } from "./model-picker.js";
import { applyChoices, readUrl, state } from "./state.js";
import { viewNames } from "./views.js";

async function start() {
  initStaticControls();
  bindIntake();
  bindAll();
  document.addEventListener(CHARTS_READY, () => app.update()); // the charts asked for meanwhile
  const want = readUrl();
  if (viewNames().includes(want.view)) state.view = want.view; // an unknown one is not written back
  state.temperature = want.temperature;
  applyChoices(state, want.choices);
  state.model = want.model || document.body.dataset.defaultModel;
  app.update();
  try {
    const models = await getModels();
    state.models = models.models || [];
    // A model the server does not offer is left out (the default stays), as any unknown value;
    // with --any-model the server may load it on demand.
    const offered = state.models.some((m) => m.id === want.model) || (want.model && models.any_model);
    state.model = offered ? want.model : models.default;
    bindModelPicker(!!models.any_model);
  } catch (e) {
    app.fail(e);
  }
  if (want.image) await takeShared(want);
  else app.update();
  document.body.dataset.ready = "1";
  // The charts' library, once the page is up and idle (or sooner, when a chart asks for it).
  const idle = window.requestIdleCallback || ((fn) => setTimeout(fn, 200));
  idle(() => loadPlotly(), { timeout: 2000 });
}

start();
