// Intake: the ways an image comes in. A chosen file, a file dropped anywhere on the page, a
// pasted picture, a sample button, a model switch, and a shared URL (?image=...). Each one
// hands the image to fetching.js and brings the result into view.

import { ApiError } from "./api.js";
import { app } from "./actions.js";
import { $, scrollMotion } from "./dom.js";
import { openById, openFile, sampleFile } from "./fetching.js";
import { state, syncUrl } from "./state.js";

const ROOM_MARGIN = 8; // px kept between what is scrolled into view and the window's edges or bars

/**
 * Scroll the status line and the map into view when they are out of sight (on a phone they sit
 * below the upload box), so that choosing a file visibly does something. The room is the window
 * less the sticky top bar and the fixed layer/head dock: the status line with the whole map where
 * both fit, else the whole map, else (a window too short for it) the map's top.
 */
function showResult() {
  const status = $("status").getBoundingClientRect();
  const overlay = $("overlay");
  // the map of the previous image, or the room kept for it while the first one is computed
  const map = (overlay.hidden ? $("viewer") : overlay).getBoundingClientRect();
  const bar = $("topbar");
  const dock = $("view-dock");
  const top = getComputedStyle(bar).position === "sticky" ? bar.getBoundingClientRect().height : 0;
  const bottom = getComputedStyle(dock).position === "fixed" ? dock.getBoundingClientRect().top : window.innerHeight;
  const room = bottom - top - 2 * ROOM_MARGIN;
  let dy;
  if (map.bottom - status.top <= room) { // both, the status line first
    if (status.top >= top && map.bottom <= bottom) return;
    dy = status.top - (top + ROOM_MARGIN);
  } else if (map.height <= room) { // the whole map, above the dock
    if (map.top >= top && map.bottom <= bottom) return;
    dy = map.bottom - (bottom - ROOM_MARGIN);
  } else { // the map's top
    dy = map.top - (top + ROOM_MARGIN);
    if (Math.abs(dy) <= ROOM_MARGIN) return;
  }
  window.scrollBy({ top: dy, behavior: scrollMotion() });
}

/** Whether the user scrolls (or presses a key) from now on: the returned function says it, once. */
function watchUser() {
  let moved = false;
  const mark = () => { moved = true; };
  const kinds = ["wheel", "touchstart", "keydown", "pointerdown"];
  for (const k of kinds) window.addEventListener(k, mark, { capture: true, passive: true });
  return () => {
    for (const k of kinds) window.removeEventListener(k, mark, { capture: true });
    return moved;
  };
}

export function takeFile(file, sample = null) {
  if (!file) return;
  const done = openFile(state, file, app, sample);
  showResult();
  // What lands above the map once the answer is in (the file's facts) and the map's own size move it:
  // it is shown again then, unless the user has scrolled or pressed a key meanwhile.
  const moved = watchUser();
  done.then(() => { if (!moved()) showResult(); }, () => moved());
  return done;
}

async function takeSample(url) {
  try {
    await takeFile(await sampleFile(url), url);
  } catch (e) {
    app.fail(e);
  }
}

let shared = null; // the shared URL's want, until its image is shown

/** Open the image of a shared URL (want: readUrl()'s answer). */
export function takeShared(want) {
  shared = want;
  return openById(state, want.image, { layer: want.layer, head: want.head, q: want.q }, "Loading the shared view…", app);
}

/** The model picker: the shown image again with another model. */
export function switchModel(model) {
  state.model = model;
  if (state.imageId) {
    // The layer, head and query chosen meanwhile, not those of the moment the model was picked.
    openById(state, state.imageId, () => ({ layer: state.layer, head: state.head, q: state.query }),
      `Computing attention with ${model}…`, app);
  } else if (shared) {
    takeShared(shared); // the link's image did not open (another model may open it)
  } else {
    syncUrl(state); // the model travels in the URL even before an image
    app.update();
  }
}

export function bindIntake() {
  $("image-input").addEventListener("change", (e) => {
    const f = e.target.files && e.target.files[0];
    if (f) takeFile(f);
    e.target.value = "";
  });
  for (const b of document.querySelectorAll("[data-sample]")) {
    b.addEventListener("click", () => takeSample(b.dataset.sample));
  }
  $("model").addEventListener("change", (e) => switchModel(e.target.value));

  document.addEventListener("paste", (e) => {
    const t = e.target;
    if (t && t.closest && t.closest("input[type=text], textarea, [contenteditable]")) return;
    const files = [...((e.clipboardData && e.clipboardData.files) || [])];
    const file = files.find((f) => f.type.startsWith("image/")) || files[0];
    if (file) {
      e.preventDefault();
      takeFile(file);
    } else {
      app.fail(new ApiError(0, "no_image", "The clipboard holds no image: copy a picture, then press Ctrl+V here."));
    }
  });

  // Drop anywhere: the page is outlined while a file is dragged over it.
  let depth = 0;
  const hasFiles = (e) => e.dataTransfer && [...e.dataTransfer.types].includes("Files");
  document.addEventListener("dragenter", (e) => {
    if (!hasFiles(e)) return;
    depth++;
    document.body.classList.add("dragging");
  });
  document.addEventListener("dragleave", () => {
    depth = Math.max(0, depth - 1);
    if (!depth) document.body.classList.remove("dragging");
  });
  document.addEventListener("dragover", (e) => {
    if (hasFiles(e)) e.preventDefault();
  });
  document.addEventListener("drop", (e) => {
    depth = 0;
    document.body.classList.remove("dragging");
    if (!hasFiles(e)) return;
    e.preventDefault();
    const f = e.dataTransfer.files[0];
    if (f) takeFile(f);
  });
}
