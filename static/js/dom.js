// Small DOM helpers shared by the page and its views: the one `$` (element lookup), the one `el`
// (a new element with its class and text), the one `setText`, the one way to fill a <select>, a debounce for work that should wait until a sweep of events rests, and the
// page's ways to write numbers and names.

export const $ = (id) => document.getElementById(id);

/** A touch or a pen: a pointer without hover, whose tap shows what a mouse's hover shows. */
export const isTap = (e) => e.pointerType === "touch" || e.pointerType === "pen";

/** Write an element's text (the element, or its id) only where it changes: a live region
 * (role="status") is not told the same words again at every render. */
export function setText(target, text) {
  const e = typeof target === "string" ? $(target) : target;
  if (e.textContent !== text) e.textContent = text;
}

/** How the page scrolls on its own (to a result, a map, the compare panel): smoothly, unless the
 * user asked the system for reduced motion (WCAG 2.3.3), then at once. */
export function scrollMotion() {
  return window.matchMedia("(prefers-reduced-motion: reduce)").matches ? "auto" : "smooth";
}

/**
 * A button that is off for now but keeps focus: aria-disabled and the .disabled look, not the
 * `disabled` attribute, which would drop a keyboard user's focus to the page the moment the button
 * they pressed turns itself off (a reset, a "run" that starts its work). Pair with onPress.
 */
export function setOff(button, off) {
  button.setAttribute("aria-disabled", off ? "true" : "false");
  button.classList.toggle("disabled", off);
}

/** A click handler that does nothing while the button is off (setOff): Enter and Space still click it. */
export function onPress(button, fn) {
  button.addEventListener("click", (e) => {
    if (e.currentTarget.getAttribute("aria-disabled") === "true") return;
    fn(e);
  });
}

/** A new <tag> element with class `cls` and text `text` (each optional). */
export function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

/**
 * Give a <select> these options, [[value, label, disabled?], ...]; nothing happens when it
 * already has them (so an open select is not rebuilt under the pointer). A bare value stands
 * for [value, value].
 */
export function setOptions(select, options) {
  const opts = options.map((o) => (Array.isArray(o) ? o : [o, o]));
  const want = opts.map(([v, label, off]) => `${v}\u0000${label}\u0000${off ? 1 : 0}`).join("\u0001");
  if (select.dataset.options === want) return;
  select.replaceChildren(...opts.map(([v, label, disabled]) => {
    const o = document.createElement("option");
    o.value = String(v);
    o.textContent = String(label);
    o.disabled = !!disabled;
    return o;
  }));
  select.dataset.options = want;
}

/** fn, called once `ms` after the last of a burst of calls (with that call's arguments). */
export function debounce(fn, ms) {
  let timer = 0;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

export function fmtBytes(n) {
  if (n >= 1024 * 1024) return `${(n / (1024 * 1024)).toFixed(n >= 10 * 1024 * 1024 ? 0 : 1)} MB`;
  if (n >= 1024) return `${Math.round(n / 1024)} KB`;
  return `${n} B`;
}

/** The temperature a log-scale slider (log10 T) stands at, to 3 significant digits. */
export function sliderTemperature(el) {
  return Number(Math.pow(10, Number(el.value)).toPrecision(3));
}

/** A softmax temperature as the page writes it: 0.32, 1, 2.5, 10. */
export function fmtTemperature(T) {
  return T >= 10 || T === Math.round(T) ? String(Number(T.toPrecision(3))) : T.toFixed(2);
}

/** A file name of at most `max` characters: a long one keeps its start and its end (the extension). */
export function shortName(name, max = 20) {
  const s = String(name);
  if (s.length <= max) return s;
  const tail = Math.max(4, Math.floor((max - 1) / 3));
  return `${s.slice(0, max - 1 - tail)}…${s.slice(-tail)}`;
}
