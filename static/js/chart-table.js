// Every chart's twin as text (datasette's rule): a "Show as table" disclosure after each Plotly
// chart with the numbers it draws, built from the chart's own traces when it is opened, and the
// chart named for screen readers (a figure with the card's title). charts.js calls chartTable
// each time it draws and hideTable when a chart gives way to a note.

const traces = new WeakMap(); // chart element -> {traces, layout, title} last drawn (the table is built on open)

function strip(html) {
  return String(html ?? "").replace(/<[^>]*>/g, "").trim();
}

/** A number as the tables write it: 3 significant digits, no exponent below 1e-4. */
export function cellText(v) {
  if (v === null || v === undefined || (typeof v === "number" && !Number.isFinite(v))) return "–";
  if (typeof v !== "number") return String(v);
  if (v === 0 || Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  return a < 1e-4 || a >= 1e6 ? v.toExponential(2) : String(Number(v.toPrecision(3)));
}

function axisTitle(layout, axis, fallback) {
  const a = layout && layout[axis];
  const t = a && a.title && (typeof a.title === "string" ? a.title : a.title.text);
  return strip(t) || fallback;
}

/** The rows of a chart's table: [header, ...rows], each a list of cell texts. */
export function tableRows(data, layout) {
  const heat = data.find((t) => t.type === "heatmap");
  if (heat) {
    const xs = heat.x || heat.z[0].map((_, i) => i);
    const ys = heat.y || heat.z.map((_, i) => i);
    const xt = axisTitle(layout, "xaxis", "column");
    const yt = axisTitle(layout, "yaxis", "row");
    const header = [`${yt} \\ ${xt}`, ...xs.map((x) => `${xt} ${x}`)];
    return [header, ...heat.z.map((row, i) => [`${yt} ${ys[i]}`, ...xs.map((_, j) => cellText(row[j]))])];
  }
  // lines, dots and bars: a row per x value, a column per trace
  const series = data.filter((t) => t.x && t.y).map((t) => {
    const h = t.orientation === "h";
    return { name: strip(t.name) || "value", x: h ? t.y : t.x, y: h ? t.x : t.y };
  });
  const xt = axisTitle(layout, "xaxis", "x");
  const xs = [];
  const seen = new Set();
  for (const s of series) for (const x of s.x) if (!seen.has(String(x))) { seen.add(String(x)); xs.push(x); }
  const at = series.map((s) => new Map(s.x.map((x, i) => [String(x), s.y[i]])));
  return [[xt, ...series.map((s) => s.name)], ...xs.map((x) => [cellText(x), ...at.map((m) => cellText(m.get(String(x))))])];
}

function buildTable(details, el) {
  const got = traces.get(el);
  if (!got) return;
  const rows = tableRows(got.traces, got.layout);
  const table = document.createElement("table");
  table.className = "chart-data";
  const cap = document.createElement("caption");
  cap.textContent = got.title;
  const thead = document.createElement("thead");
  const head = document.createElement("tr");
  for (const h of rows[0]) {
    const th = document.createElement("th");
    th.scope = "col";
    th.textContent = h;
    head.append(th);
  }
  thead.append(head);
  const body = document.createElement("tbody");
  for (const r of rows.slice(1)) {
    const tr = document.createElement("tr");
    r.forEach((v, i) => {
      const td = document.createElement(i === 0 ? "th" : "td");
      if (i === 0) td.scope = "row";
      td.textContent = v;
      tr.append(td);
    });
    body.append(tr);
  }
  table.append(cap, thead, body);
  const wrap = details.querySelector(".chart-table-body");
  wrap.replaceChildren(table);
}

/** The chart's title: the aria-label given, else its card's heading. */
function titleOf(el) {
  const card = el.closest(".card, .panel");
  const h = card && card.querySelector("h3, h2");
  return h ? h.textContent.replace(/\s+/g, " ").trim() : "Chart";
}

const hiding = new WeakSet(); // charts whose redraws hide their drawing again

/**
 * A screen reader would read the drawing's own text one piece at a time (every tick label, the
 * axis titles, the legend, the hover box): noise beside the figure's name and its table, which say
 * the same. The SVGs are hidden from it; Plotly's toolbar is not in them, so its buttons stay.
 */
function hideDrawing(el) {
  for (const svg of el.querySelectorAll("svg.main-svg")) svg.setAttribute("aria-hidden", "true");
}

/** Once Plotly has drawn `el`: its drawing hidden from screen readers, after each redraw too. */
export function drawingHidden(el) {
  hideDrawing(el);
  if (!hiding.has(el) && typeof el.on === "function") {
    hiding.add(el);
    el.on("plotly_afterplot", () => hideDrawing(el)); // a redraw may make new SVGs
  }
}

/**
 * When `el` is given these traces and layout (drawn now, or once it comes in sight): name it (a
 * figure labelled by its card's title, or `label`) and give it the "Show as table" disclosure
 * right after it. Its drawing is hidden from screen readers when Plotly draws it (drawingHidden).
 */
export function chartTable(el, data, layout, label) {
  traces.set(el, { traces: data, layout, title: label || titleOf(el) });
  el.setAttribute("role", "figure");
  el.setAttribute("aria-label", label || `${titleOf(el)} (chart; “Show as table” below gives its numbers)`);
  let details = el.nextElementSibling;
  if (!details || !details.classList.contains("chart-table")) {
    details = document.createElement("details");
    details.className = "chart-table";
    details.setAttribute("data-testid", "chart-table");
    const summary = document.createElement("summary");
    summary.textContent = "Show as table";
    // a long table scrolls in its box: the box takes focus, so the keys scroll it (WCAG 2.1.1)
    const body = document.createElement("div");
    body.className = "chart-table-body";
    body.tabIndex = 0;
    body.setAttribute("role", "region");
    details.append(summary, body);
    details.addEventListener("toggle", () => { if (details.open) buildTable(details, el); });
    el.after(details);
  }
  details.hidden = false;
  details.querySelector(".chart-table-body").setAttribute("aria-label", `${label || titleOf(el)}: the numbers`);
  if (details.open) buildTable(details, el);
}

/** The chart shows a note instead of data: no table. */
export function hideTable(el) {
  traces.delete(el);
  hiding.delete(el); // clear() purges the chart next, and its handlers with it
  el.removeAttribute("role");
  const details = el.nextElementSibling;
  if (details && details.classList.contains("chart-table")) {
    details.hidden = true;
    details.open = false;
  }
}
