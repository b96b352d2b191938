// The page's JavaScript twins of server calculations give the answers of the Python ones on the
// shared fixture (tests/fixtures/parity.json, written by scripts/make_parity_fixtures.py; the
// Python side is checked against it by tests/unit/test_parity.py). These import the real ES
// modules of static/js, which load without a DOM.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import test from "node:test";

import { downloadName } from "../../static/js/api.js";
import { fuseHeads, normEntropy } from "../../static/js/data.js";
import { temperedSoftmax } from "../../static/js/learn-math.js";
import { massMask } from "../../static/js/mask.js";
import { dropColumns } from "../../static/js/sinks.js";
import { parseQuery, queryRows } from "../../static/js/state.js";
import { windowPieces } from "../../static/js/windows.js";

const fixture = JSON.parse(readFileSync(new URL("../fixtures/parity.json", import.meta.url), "utf8"));

// The page holds rows in Float32Arrays: answers agree to float32 precision.
function close(got, want, what, rtol = 2e-6, atol = 1e-7) {
  assert.equal(got.length, want.length, `${what}: length`);
  for (let i = 0; i < want.length; i++) {
    const tol = atol + rtol * Math.abs(want[i]);
    assert.ok(Math.abs(got[i] - want[i]) <= tol, `${what}[${i}]: ${got[i]} vs ${want[i]}`);
  }
}

test("dropColumns = analysis.drop_and_renormalise", () => {
  assert.ok(fixture.drop.length >= 4);
  for (const [i, c] of fixture.drop.entries()) {
    const got = dropColumns(Float32Array.from(c.row), c.tokens);
    close(got, c.expected, `drop case ${i}`);
  }
});

test("massMask = stats.mass_threshold_count / mass_threshold_mask", () => {
  assert.ok(fixture.mass.length >= 10);
  for (const [i, c] of fixture.mass.entries()) {
    const { count, mask } = massMask(Float32Array.from(c.values), c.fraction);
    assert.equal(count, c.count, `mass case ${i} (fraction ${c.fraction}): count`);
    assert.deepEqual([...mask], c.mask, `mass case ${i} (fraction ${c.fraction}): mask`);
  }
});

test("fuseHeads = analysis.fuse_heads (mean and max over heads)", () => {
  assert.deepEqual(new Set(fixture.fuse.map((c) => c.how)), new Set(["mean", "max"]));
  for (const [i, c] of fixture.fuse.entries()) {
    const got = fuseHeads(Float32Array.from(c.all), c.L, c.H, c.N, c.how);
    close(got, c.expected, `fuse case ${i} (${c.how})`);
  }
});

test("normEntropy = stats.normalized_entropy", () => {
  for (const [i, c] of fixture.entropy.entries()) {
    close([normEntropy(Float32Array.from(c.row))], [c.expected], `entropy case ${i}`, 1e-6, 1e-7);
  }
});

test("downloadName = encoders.download_stem + extension (the Content-Disposition name)", () => {
  for (const c of fixture.download_name) {
    assert.equal(downloadName(c.image_id, c.model, c.params), c.expected);
  }
});

test("temperedSoftmax = capture.temper_ + torch.softmax (the API's temperature)", () => {
  assert.ok(fixture.temperature.length >= 20);
  for (const [i, c] of fixture.temperature.entries()) {
    const got = temperedSoftmax(c.scores, c.T);
    close(got, c.expected, `temperature case ${i} (T = ${c.T})`, 1e-12, 1e-300);
  }
});

test("windowPieces = windows.WindowIndex: the cells of a query's (shifted) window", () => {
  assert.ok(fixture.windows.some((c) => c.shift[0] > 0) && fixture.windows.some((c) => c.window[0] > c.grid[0]));
  for (const c of fixture.windows) {
    const tokens = { grid: c.grid, window: c.window, shift: c.shift };
    for (const q of c.queries) {
      const cells = [];
      for (const [r0, c0, r1, c1] of windowPieces(tokens, { r: q.cell[0], c: q.cell[1] })) {
        for (let r = r0; r < r1; r++) for (let k = c0; k < c1; k++) cells.push(r * c.grid[1] + k);
      }
      const what = `grid ${c.grid}, window ${c.window}, shift ${c.shift}, cell ${q.cell}`;
      assert.equal(new Set(cells).size, cells.length, `${what}: pieces overlap`);
      assert.deepEqual(cells.sort((a, b) => a - b), q.cells, what);
    }
  }
});

test("queryRows = selection.parse_query (the page speaks the API's query grammar)", () => {
  const { layouts, cases } = fixture.query;
  assert.ok(cases.some((c) => c.rows === "error") && cases.some((c) => c.rows === null));
  for (const c of cases) {
    const tokens = layouts[c.layout];
    const got = queryRows(c.spec, tokens);
    const what = `${c.layout}: ${JSON.stringify(c.spec)}`;
    const one = parseQuery(c.spec, tokens);
    if (c.rows === "error") {
      assert.ok(got.error, `${what}: the API refuses it, the page reads ${JSON.stringify(got.rows)}`);
      // The page's one row: none, but for "tok:I", its own old spelling, read from links shared before.
      if (c.spec === "tok:2") assert.equal(one.token, 2, what);
      else assert.equal(one, null, what);
      continue;
    }
    assert.deepEqual(got, { rows: c.rows }, what);
    // The page's one row: where the API answers exactly one.
    if (c.rows && c.rows.length === 1) assert.equal(one && one.token, c.rows[0], what);
    else assert.equal(one, null, what);
  }
});
