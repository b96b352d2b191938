// The page's JavaScript twins of server calculations give the answers of the Python ones on the
// shared fixture (tests/fixtures/parity.json, written by scripts/make_parity_fixtures.py; the
// Python side is checked against it by tests/unit/test_parity.py). These import the real ES
// modules of static/js, which load without a DOM.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import test from "node:test";

import { downloadName } from "../../static/js/api.js";
import { fuseHeads, normEntropy } from "../../static/js/data.js";
import { massMask } from "../../static/js/mask.js";
import { dropColumns } from "../../static/js/sinks.js";

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
