// Windowed models (Swin) on the page: every layer belongs to a stage with its own grid, its own
// heads and W x W windows; every second block shifts its windows by half a window, cyclically,
// so a window at an edge wraps round to the other side. The page's query is a cell of stage 0 (the
// finest grid); on a deeper stage it is the stage's cell under it (patch merging halves the grid,
// so cell (r, c) of stage 0 lies in cell (r >> s, c >> s) of stage s).
//
// Geometry and drawing only (no imports): state.js, overlay.js and swin-store.js build on it.

/** Whether an answer's metadata describes a windowed model (it lists `stages`). */
export function isWindowed(meta) {
  return !!(meta && Array.isArray(meta.stages) && meta.stages.length);
}

/** The stage of a layer (null for a model without stages). */
export function stageOf(meta, layer) {
  if (!isWindowed(meta)) return null;
  return meta.stages.find((s) => layer >= s.layers[0] && layer <= s.layers[1]) || null;
}

/** Layers of a windowed model, numbered across its stages. */
export function numLayers(meta) {
  return meta.stages[meta.stages.length - 1].layers[1] + 1;
}

/** Heads of a layer: its stage's count (windowed), else the answer's. */
export function headsAt(meta, layer) {
  const s = stageOf(meta, layer);
  return s ? s.heads : meta.heads.length;
}

/**
 * The token layout of a layer's maps: the answer's own, or for a windowed model its stage's grid
 * (no prefix tokens), with `window`, `shift` (of this layer) and `extent`: the share of the
 * picture the grid spans on each axis (above 1 where patch merging padded an odd grid).
 */
export function layerTokens(meta, layer) {
  const s = stageOf(meta, layer);
  if (!s) return meta.tokens;
  const [ih, iw] = meta.input_size;
  return {
    count: s.grid[0] * s.grid[1], num_prefix: 0, prefix: [], grid: s.grid, patch_size: s.cell_size,
    stage: s.index, window: s.window, shift: s.shifts[layer - s.layers[0]], windows: s.windows,
    extent: [(s.grid[0] * s.cell_size[0]) / ih, (s.grid[1] * s.cell_size[1]) / iw],
  };
}

/** A stage-0 cell {r, c} on a layer's grid: {kind: "patch", r, c, token} (itself without stages). */
export function stageCell(meta, cell, layer) {
  const s = stageOf(meta, layer);
  if (!s || !cell) return cell;
  const k = s.cell_size[0] / meta.stages[0].cell_size[0];
  const r = Math.min(s.grid[0] - 1, Math.floor(cell.r / k));
  const c = Math.min(s.grid[1] - 1, Math.floor(cell.c / k));
  return { kind: "patch", r, c, token: r * s.grid[1] + c };
}

/** Runs of consecutive values, as [start, end) pairs: [5, 6, 0, 1] -> [[5, 7], [0, 2]]. */
function runs(values) {
  const out = [];
  for (const v of values) {
    const last = out[out.length - 1];
    if (last && last[1] === v) last[1] = v + 1;
    else out.push([v, v + 1]);
  }
  return out;
}

/** The image rows (or columns) of the window holding `i` along one axis: rolled, then unrolled. */
function windowSpan(i, size, w, shift) {
  const rolled = (((i - shift) % size) + size) % size; // torch.roll(x, -shift) puts row i here
  const a = Math.floor(rolled / w) * w;
  const rows = [];
  for (let x = a; x < Math.min(a + w, size); x++) rows.push((x + shift) % size); // padding is no row
  return runs(rows);
}

/**
 * The query cell's window on its layer's grid, in the image's own (unrolled) grid: a list of
 * rectangles [r0, c0, r1, c1) in cells. One rectangle, or in a shifted block up to four pieces
 * when the window wraps round the edges.
 */
export function windowPieces(tokens, cell) {
  if (!tokens.window || !cell) return [];
  const [R, C] = tokens.grid;
  const [wh, ww] = tokens.window;
  const [sh, sw] = tokens.shift || [0, 0];
  const out = [];
  for (const [r0, r1] of windowSpan(cell.r, R, wh, sh)) {
    for (const [c0, c1] of windowSpan(cell.c, C, ww, sw)) out.push([r0, c0, r1, c1]);
  }
  return out;
}

/** Grid lines between windows along one axis (cell indices), shifted blocks included. */
function windowBorders(size, w, shift) {
  const out = [];
  for (let k = 0; k * w < size; k++) {
    const b = (k * w + shift) % size;
    if (b > 0) out.push(b);
  }
  return out;
}

/**
 * Draw the windows of a windowed layer over (0, 0, ew, eh), the grid's extent on the canvas: the
 * borders between windows (faint), and the query cell's window (dashed, each wrapped piece).
 */
export function drawWindows(ctx, tokens, marker, ew, eh, px) {
  if (!tokens.window) return;
  const [R, C] = tokens.grid;
  const [wh, ww] = tokens.window;
  const [sh, sw] = tokens.shift || [0, 0];
  const cw = ew / C;
  const ch = eh / R;
  ctx.save();
  ctx.strokeStyle = "rgba(255,255,255,0.5)";
  ctx.lineWidth = px;
  ctx.setLineDash([]);
  ctx.beginPath();
  for (const c of windowBorders(C, ww, sw)) {
    ctx.moveTo(c * cw, 0);
    ctx.lineTo(c * cw, eh);
  }
  for (const r of windowBorders(R, wh, sh)) {
    ctx.moveTo(0, r * ch);
    ctx.lineTo(ew, r * ch);
  }
  ctx.stroke();
  const pieces = windowPieces(tokens, marker);
  for (const [width, colour, dash] of [[4 * px, "rgba(0,0,0,0.75)", []], [2 * px, "#facc15", [6 * px, 4 * px]]]) {
    ctx.lineWidth = width;
    ctx.strokeStyle = colour;
    ctx.setLineDash(dash);
    for (const [r0, c0, r1, c1] of pieces) ctx.strokeRect(c0 * cw, r0 * ch, (c1 - c0) * cw, (r1 - r0) * ch);
  }
  ctx.restore();
}

/** One line on a windowed layer for the explanation under the map ("" without stages). */
export function windowNote(meta, layer, marker) {
  const s = stageOf(meta, layer);
  if (!s) return "";
  const t = layerTokens(meta, layer);
  const [sh, sw] = t.shift;
  const pieces = windowPieces(t, marker).length;
  const shifted = sh || sw
    ? ` This block shifts the windows by ${sh} × ${sw} cells, cyclically: cells brought together from opposite edges `
      + `are masked apart${pieces > 1 ? `, and the query's window wraps round the edges (${pieces} dashed pieces)` : ""}.`
    : "";
  return ` Layer ${layer} is in stage ${s.index} (layers ${s.layers[0]}–${s.layers[1]}): a ${s.grid[0]} × ${s.grid[1]} grid of `
    + `${s.cell_size[1]} × ${s.cell_size[0]} px cells, ${s.heads} heads, attention inside ${s.window[0]} × ${s.window[1]} `
    + `windows (dashed: the query's) with a relative position bias; every cell outside the window gets 0.${shifted}`;
}

/** The model's shape in a few words, for the status line ("" without stages). */
export function shapeSummary(meta) {
  if (!isWindowed(meta)) return "";
  const st = meta.stages;
  const heads = st.map((s) => s.heads).join("/");
  const grids = st.map((s) => `${s.grid[0]}×${s.grid[1]}`).join(", ");
  return `${numLayers(meta)} layers in ${st.length} stages × ${heads} heads · grids ${grids}`;
}

/** Fields for the first request of an image under a model: windowed models answer one stage at a time. */
export function firstFields(info) {
  return info && info.windowed ? { layers: "0", heads: "all", query: "0" } : {};
}

/** Entropy of a row over the keys it could attend to, / log of their count (the window's cells). */
export function keyCount(tokens) {
  return tokens && tokens.window ? tokens.window[0] * tokens.window[1] : null;
}
