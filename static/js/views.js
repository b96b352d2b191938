// The page's views ("Attention maps" and any other panel behind a tab): a tab button
// [data-view-tab=NAME] shows the panel [data-view-panel=NAME]. The shown view is state.view
// and travels in the URL (?view=NAME), so a shared link opens the same view.

import { state } from "./state.js";

/** The view names the page has, in tab order. */
export function viewNames() {
  return [...document.querySelectorAll("[data-view-tab]")].map((b) => b.dataset.viewTab);
}

/** Show the panel of state.view and mark its tab (render only: reads state, writes the DOM). */
export function renderViews() {
  const names = viewNames();
  const view = names.includes(state.view) ? state.view : names[0];
  for (const b of document.querySelectorAll("[data-view-tab]")) {
    const on = b.dataset.viewTab === view;
    b.setAttribute("aria-selected", on ? "true" : "false");
    b.classList.toggle("active", on);
  }
  for (const p of document.querySelectorAll("[data-view-panel]")) p.hidden = p.dataset.viewPanel !== view;
  document.body.dataset.view = view;
}

/** Wire the tab buttons: a click sets state.view and calls onChange (the page's render). */
export function bindViews(onChange) {
  for (const b of document.querySelectorAll("[data-view-tab]")) {
    b.addEventListener("click", () => {
      if (state.view === b.dataset.viewTab) return;
      state.view = b.dataset.viewTab;
      onChange();
    });
  }
}
