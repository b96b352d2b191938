// The maps' numbers in words (static/js/map-text.js and its callers), in Node: the highest cells
// with their values, largest first, and the lowest; (row, column) named as on the grid; a flat
// map said to be flat; the Why maps, compare maps and "Inside a head"'s scores described from
// their own numbers.

import assert from "node:assert/strict";
import test from "node:test";

import { compareWords } from "../../static/js/compare.js";
import { scoresWords } from "../../static/js/learn-stages.js";
import { extremes, gridItems, gridWords, mapWords } from "../../static/js/map-text.js";
import { relevanceWords } from "../../static/js/why-view.js";

test("extremes keeps the k largest, largest first, ties in order, and the smallest; skips non-finite values", () => {
  const items = [5, 1, NaN, 9, 5, 0.5, 9, Infinity, 7].map((v, i) => ({ name: `i${i}`, v }));
  const { top, low } = extremes(items, 3);
  assert.deepEqual(top.map((t) => t.name), ["i3", "i6", "i8"]);
  assert.equal(low.name, "i5");
  assert.deepEqual(extremes([{ name: "a", v: 2 }, { name: "b", v: 2 }], 3).top.map((t) => t.name), ["a", "b"]);
  assert.deepEqual(extremes([], 3), { top: [], low: null });
});

test("gridItems names cells (row, column) of a row-major grid", () => {
  const items = gridItems([0, 1, 2, 3, 4, 5], 3);
  assert.deepEqual(items.map((t) => t.name), ["patch (0, 0)", "patch (0, 1)", "patch (0, 2)", "patch (1, 0)",
    "patch (1, 1)", "patch (1, 2)"]);
  assert.equal(gridItems([1], 1, "cell")[0].name, "cell (0, 0)");
});

test("mapWords says the top three with their values and the lowest, to 3 significant digits", () => {
  const values = [0.0001, 0.03, 0.12, 0.005, 0.09, 0.07];
  assert.equal(mapWords(gridItems(values, 3)),
    "Highest: patch (0, 2) 0.12, patch (1, 1) 0.09, patch (1, 2) 0.07; lowest: patch (0, 0) 0.0001.");
  assert.equal(mapWords(gridItems([0.25, 0.25, 0.25, 0.25], 2)), "Every one of the 4 values is 0.25.");
  // skipped values are not counted: two of the three are numbers
  assert.equal(mapWords(gridItems([0.25, NaN, 0.25], 3)), "Every one of the 2 values is 0.25.");
  assert.equal(mapWords([]), "No values.");
  assert.equal(gridWords([1, 2, 3, 4], 2, 2),
    "Highest: patch (1, 1) 4, patch (1, 0) 3, patch (0, 1) 2; lowest: patch (0, 0) 1. "
    + "2 × 2 patches, (row, column) counted from the top left.");
  assert.match(gridWords([1, 2], 1, 2, "cell"), /1 × 2 cells,/);
  assert.match(mapWords(gridItems([0.0133, 0.0112, 0.00000123], 3)), /0\.0133, patch \(0, 1\) 0\.0112.*lowest: patch \(0, 2\) 1\.23e-6\.$/);
});

test("the Why maps, the compare maps and the scores are described by their own numbers", () => {
  const answer = { relevance: [[0.1, 0.4], [0.3, 0.2]] };
  assert.match(relevanceWords(answer), /^Highest: patch \(0, 1\) 0\.4, patch \(1, 0\) 0\.3, patch \(1, 1\) 0\.2; lowest: patch \(0, 0\) 0\.1\. 2 × 2 patches/);
  const tokens = { grid: [2, 2], num_prefix: 1 };
  const c = compareWords("b", "cat.png · layer 11 · head 1 · query CLS", new Float32Array([0.5, 0.25, 0.125, 0.125]), tokens);
  assert.match(c, /^Right map, cat\.png · layer 11 · head 1 · query CLS\. Highest: patch \(0, 0\) 0\.5, patch \(0, 1\) 0\.25, patch \(1, 0\) 0\.125; lowest: patch \(1, 0\) 0\.125\./);
  // The scores: the prefix tokens are not on the map, so not in its words; the mean is.
  const ans = { tokens: { grid: [1, 3], num_prefix: 1 }, scores: [9, -1, 2, 0.5] };
  assert.equal(scoresWords(ans, false, 0.5),
    "Scores. Highest: patch (0, 1) 2, patch (0, 2) 0.5, patch (0, 0) -1; lowest: patch (0, 0) -1. "
    + "1 × 3 patches, (row, column) counted from the top left. Colours centred on the mean, 0.500.");
  // Swin: the window's keys on the picture only (padding has no place), named by their stage cell.
  const win = { tokens: { grid: [2, 2], num_prefix: 0, window: true }, key_tokens: [0, 3, -1], scores: [1, 3, 7] };
  assert.equal(scoresWords(win, true, 2),
    "Scores of the 2 keys of the query's window on the picture. Highest: cell (1, 1) 3, cell (0, 0) 1; "
    + "lowest: cell (0, 0) 1. Colours centred on the mean, 2.000.");
});
