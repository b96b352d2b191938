// The page's views: "Attention maps" and any other panel behind a tab. A tab button
// [data-view-tab=NAME] shows the panel [data-view-panel=NAME]. The shown view is state.view and
// travels in the URL (?view=NAME), so a shared link opens the same view.
//
// Where a view plugs in (four places; learn.js and ablation.js are two examples):
//   1. templates/index.html: a <button data-view-tab=NAME data-testid=NAME-tab> in the tab bar
//      and a <section data-view-panel=NAME hidden> panel (its elements get data-testids);
//   2. a module NAME.js exporting a view object (below);
//   3. one entry in VIEWS here;
//   4. its own part of the state, if it has any: state.NAME = {...} in state.js (answers it
//      fetched, what it shows); it writes it with act.setIn(NAME, patch) from its controls and
//      in need() when answers arrive (no module variables: what the view knows is in the state).
//      URL fields go in syncUrl/readUrl (state.js).
// A view object: {
//   name,                  // its NAME
//   render(s, act, shown), // draw the panel from the state `s` (read only); called on every
//                          //   change, shown or not (return early when !shown if the drawing
//                          //   is heavy); `act` holds the actions (actions.js)
//   renderSlow?(s, act),   // heavier drawing of the shown view, coalesced (charts)
//   bind?(act, s),         // wire the panel's own controls once at start; `s` is the one state,
//                          //   for the handlers to read when an event comes (they write through act)
//   need?(s, app),         // the shown view only: start the requests it lacks after a render;
//                          //   app.update() re-renders when an answer is in, app.fail(e, retry);
//                          //   returns whether it started one (the loading state shows at once)
//   release?(s),           // every view, shown or not, after each change: give up the long
//                          //   requests whose answers it would no longer show (another picture,
//                          //   model or target), so they stop holding this page's server share
// }
// The sidebar (layer, head, query, display options) and the error banner are shared by every
// view; a view reads s.layer, s.head, s.query like the maps do.

import { ablationView } from "./ablation.js";
import { learnView } from "./learn.js";
import { mapsView } from "./maps.js";
import { whyView } from "./why.js";

export const VIEWS = [mapsView, learnView, ablationView, whyView];

/** Every view's release(s): see above. */
export function releaseViews(s) {
  for (const v of VIEWS) if (v.release) v.release(s);
}

/** The view names the page has, in tab order. */
export function viewNames() {
  return [...document.querySelectorAll("[data-view-tab]")].map((b) => b.dataset.viewTab);
}

/** The view object shown for state `s` (the first tab when s.view names none). */
export function shownView(s) {
  const names = viewNames();
  const name = names.includes(s.view) ? s.view : names[0];
  return VIEWS.find((v) => v.name === name) || null;
}

/** Show the panel of s.view and mark its tab (reads the state, writes the DOM). */
export function renderViews(s) {
  const names = viewNames();
  const view = names.includes(s.view) ? s.view : names[0];
  for (const b of document.querySelectorAll("[data-view-tab]")) {
    const on = b.dataset.viewTab === view;
    b.setAttribute("aria-selected", on ? "true" : "false");
    b.classList.toggle("active", on);
    // the WAI-ARIA tabs pattern: one Tab stop (the shown tab), the arrows move between tabs,
    // except while focus is on another tab the arrows moved it to
    if (!b.parentElement.contains(document.activeElement)) b.tabIndex = on ? 0 : -1;
  }
  for (const p of document.querySelectorAll("[data-view-panel]")) p.hidden = p.dataset.viewPanel !== view;
  document.body.dataset.view = view;
}

/** Wire the tab buttons: a click asks for that view (act.setView). */
export function bindViews(act) {
  const tabs = [...document.querySelectorAll("[data-view-tab]")];
  for (const b of tabs) {
    b.addEventListener("click", () => act.setView(b.dataset.viewTab));
    const panel = document.querySelector(`[data-view-panel="${b.dataset.viewTab}"]`);
    if (!b.id) b.id = `tab-${b.dataset.viewTab}`;
    if (panel) {
      if (!panel.id) panel.id = `${b.dataset.viewTab}-view`;
      b.setAttribute("aria-controls", panel.id);
      panel.setAttribute("aria-labelledby", b.id);
    }
  }
  // Arrows, Home and End move focus along the tabs (a wrap at the ends); Enter or Space shows
  // the focused one (manual activation: a view can take a while to load).
  const list = tabs.length ? tabs[0].closest("[role=tablist]") : null;
  if (!list) return;
  list.addEventListener("keydown", (e) => {
    const i = tabs.indexOf(e.target);
    if (i < 0 || e.ctrlKey || e.metaKey || e.altKey) return;
    const n = tabs.length;
    const to = { ArrowRight: (i + 1) % n, ArrowLeft: (i - 1 + n) % n, Home: 0, End: n - 1 }[e.key];
    if (to === undefined) return;
    e.preventDefault();
    for (const t of tabs) t.tabIndex = t === tabs[to] ? 0 : -1;
    tabs[to].focus();
  });
  // The tab list itself (the skip link's target) passes focus on to the shown tab, where the
  // keys above work at once.
  list.addEventListener("focus", (e) => {
    if (e.target !== list) return;
    const shown = tabs.find((t) => t.getAttribute("aria-selected") === "true") || tabs[0];
    shown.focus();
  });
  list.addEventListener("focusout", (e) => {
    if (list.contains(e.relatedTarget)) return;
    for (const t of tabs) t.tabIndex = t.getAttribute("aria-selected") === "true" ? 0 : -1;
  });
}
