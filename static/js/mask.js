// DINO mass-threshold masks (Caron et al., 2021): the smallest set of patches that holds a given
// share of a row's attention over the patches, and the outline of their union on the canvas.
//
// massMask has a Python twin (app/engine/stats.mass_threshold_count / mass_threshold_mask, the
// stats endpoint's mass_patches): tests/fixtures/parity.json holds their common answers. Ties
// go to the lower index on both sides (a stable sort).

/**
 * values: the patch weights of a row (row-major). Sort them descending, accumulate, and keep
 * patches until the running sum over the total reaches `fraction` (the server's
 * mass_threshold_count does the same). Returns {count, mask: Uint8Array (1 = in the set)}.
 */
export function massMask(values, fraction) {
  const P = values.length;
  const mask = new Uint8Array(P);
  if (!P) return { count: 0, mask };
  let total = 0;
  for (let i = 0; i < P; i++) total += values[i];
  const order = Array.from({ length: P }, (_, i) => i).sort((a, b) => values[b] - values[a]);
  if (!(total > 0)) {
    mask.fill(1);
    return { count: P, mask };
  }
  let acc = 0;
  let count = 0;
  for (const i of order) {
    mask[i] = 1;
    count++;
    acc += values[i];
    if (acc / total >= fraction - 1e-7) break;
  }
  return { count, mask };
}

/** The edges of the union of the masked grid cells, as one path over (w x h). */
function outlinePath(ctx, mask, R, C, w, h) {
  const X = (c) => Math.round((c * w) / C);
  const Y = (r) => Math.round((r * h) / R);
  const on = (r, c) => r >= 0 && r < R && c >= 0 && c < C && mask[r * C + c] === 1;
  ctx.beginPath();
  for (let r = 0; r < R; r++) {
    for (let c = 0; c < C; c++) {
      if (!on(r, c)) continue;
      if (!on(r - 1, c)) { ctx.moveTo(X(c), Y(r)); ctx.lineTo(X(c + 1), Y(r)); }
      if (!on(r + 1, c)) { ctx.moveTo(X(c), Y(r + 1)); ctx.lineTo(X(c + 1), Y(r + 1)); }
      if (!on(r, c - 1)) { ctx.moveTo(X(c), Y(r)); ctx.lineTo(X(c), Y(r + 1)); }
      if (!on(r, c + 1)) { ctx.moveTo(X(c + 1), Y(r)); ctx.lineTo(X(c + 1), Y(r + 1)); }
    }
  }
}

/** Stroke the outline of the mask: a dark halo under a white line, so it shows on any colour. */
export function drawMaskOutline(ctx, mask, R, C, w, h, px = 1) {
  ctx.save();
  ctx.lineCap = "square";
  outlinePath(ctx, mask, R, C, w, h);
  // Even widths on whole-pixel edges: crisp lines, no half-covered pixels.
  ctx.lineWidth = 4 * Math.max(1, Math.round(px));
  ctx.strokeStyle = "rgba(0,0,0,0.7)";
  ctx.stroke();
  ctx.lineWidth = 2 * Math.max(1, Math.round(px));
  ctx.strokeStyle = "#ffffff";
  ctx.stroke();
  ctx.restore();
}
