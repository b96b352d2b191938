// render(): bring the page up to date with the state. It only reads the state: the chrome
// (tabs, sidebar controls, status line, error banner) and every view (views.js). Each view
// draws on every change, shown or not, so a hidden panel is never stale when its tab is
// clicked (a view may return early when it is hidden and its drawing is heavy: learn.js does).
// The heavier drawing of the shown view (charts) runs in renderSlow(), which actions.js
// coalesces; only the shown view asks the server for what it lacks (its need()).

import { renderControls, renderError, renderStatus } from "./controls.js";
import { VIEWS, renderViews, shownView } from "./views.js";

export function render(s, act) {
  renderViews(s);
  renderControls(s);
  renderStatus(s);
  renderError(s, act.retry);
  const shown = shownView(s);
  for (const view of VIEWS) view.render(s, act, view === shown);
}

export function renderSlow(s, act) {
  const view = shownView(s);
  if (view && view.renderSlow) view.renderSlow(s, act);
}
