// The page without a mouse (#43), its pure parts in Node: where the arrows move in a grid of
// buttons, the cell cursor's selection and its words, the Why view's box from cells, a chart's
// table from its traces, and the faithfulness result in words.

import assert from "node:assert/strict";
import test from "node:test";

import { selectionOf, selectionWords } from "../../static/js/cell-cursor.js";
import { cellText, tableRows } from "../../static/js/chart-table.js";
import { moveTarget } from "../../static/js/keys.js";
import { cellBox } from "../../static/js/why-keys.js";
import { resultSentences } from "../../static/js/why-live.js";

// A 3 x 4 grid of items named "r,c", the last row one short (a stage with fewer heads).
const items = [];
for (let r = 0; r < 3; r++) for (let c = 0; c < (r === 2 ? 3 : 4); c++) items.push(`${r},${c}`);
const pos = (it) => it.split(",").map(Number);
const move = (from, key, ctrl = false) => moveTarget(items, from, key, ctrl, pos);

test("arrows move along a row and across rows to the nearest column; edges stop", () => {
  assert.equal(move("0,0", "ArrowRight"), "0,1");
  assert.equal(move("0,3", "ArrowRight"), null);
  assert.equal(move("0,0", "ArrowLeft"), null);
  assert.equal(move("0,2", "ArrowDown"), "1,2");
  assert.equal(move("1,3", "ArrowDown"), "2,2"); // the short row's nearest column
  assert.equal(move("2,1", "ArrowDown"), null);
  assert.equal(move("1,1", "ArrowUp"), "0,1");
  assert.equal(move("0,1", "ArrowUp"), null);
});

test("Home and End go to the row's ends, Ctrl+Home and Ctrl+End to the first and last", () => {
  assert.equal(move("1,2", "Home"), "1,0");
  assert.equal(move("1,1", "End"), "1,3");
  assert.equal(move("2,0", "End"), "2,2");
  assert.equal(move("1,2", "Home", true), "0,0");
  assert.equal(move("0,2", "End", true), "2,2");
  assert.equal(move("0,2", "PageDown"), null);
});

test("screen positions in pixels work the same (a grid that wraps)", () => {
  const boxes = { a: [10, 0], b: [10, 90], c: [10, 180], d: [120, 0], e: [120, 90] };
  const at = (k) => boxes[k];
  const keys = Object.keys(boxes);
  assert.equal(moveTarget(keys, "c", "ArrowDown", false, at), "e");
  assert.equal(moveTarget(keys, "e", "ArrowUp", false, at), "b");
  assert.equal(moveTarget(keys, "d", "ArrowRight", false, at), "e");
});

test("the cursor's selection, in words", () => {
  assert.deepEqual(selectionOf([5, 7], [3, 9]), [3, 7, 5, 9]);
  assert.equal(selectionWords([4, 6, 4, 6]), "row 4, column 6");
  assert.equal(selectionWords([3, 7, 5, 9]), "rows 3 to 5, columns 7 to 9 (3 by 3 cells)");
  assert.equal(selectionWords([3, 7, 3, 8]), "row 3, columns 7 to 8 (1 by 2 cells)");
});

test("a box of cells in output-map pixels: end-exclusive, the grid spread over the whole map", () => {
  assert.deepEqual(cellBox([0, 0, 0, 0], [16, 16], [224, 224]), [0, 0, 14, 14]);
  assert.deepEqual(cellBox([8, 7, 9, 9], [16, 16], [224, 224]), [98, 112, 140, 140]);
  assert.deepEqual(cellBox([0, 0, 15, 23], [16, 24], [224, 336]), [0, 0, 336, 224]);
  assert.deepEqual(cellBox([1, 1, 1, 1], [3, 3], [100, 100]), [33, 33, 67, 67]);
});

test("numbers in the tables: 3 significant digits, integers as they are, gaps as a dash", () => {
  assert.equal(cellText(0.123456), "0.123");
  assert.equal(cellText(12), "12");
  assert.equal(cellText(0.000012345), "1.23e-5");
  assert.equal(cellText(null), "–");
  assert.equal(cellText(Number.NaN), "–");
  assert.equal(cellText("patch (0, 1)"), "patch (0, 1)");
});

test("a heat map's table: a row per layer, a column per head, the axes' titles", () => {
  const data = [{ type: "heatmap", x: [0, 1], y: [0, 1, 2], z: [[0.5, 0.25], [0.125, null], [1, 0.3333]] }];
  const layout = { xaxis: { title: { text: "head" } }, yaxis: { title: { text: "layer" } } };
  assert.deepEqual(tableRows(data, layout), [
    ["layer \\ head", "head 0", "head 1"],
    ["layer 0", "0.5", "0.25"],
    ["layer 1", "0.125", "–"],
    ["layer 2", "1", "0.333"],
  ]);
});

test("curves' table: a row per x value, a column per trace (names without markup)", () => {
  const data = [
    { type: "scatter", name: "<b>+</b> chefer", x: [0, 0.25, 0.5], y: [1, 0.5, 0.25] },
    { type: "scatter", name: "random", x: [0, 0.5], y: [1, 0.75] },
  ];
  assert.deepEqual(tableRows(data, { xaxis: { title: { text: "removed" } } }), [
    ["removed", "+ chefer", "random"],
    ["0", "1", "1"],
    ["0.25", "0.5", "–"],
    ["0.5", "0.25", "0.75"],
  ]);
});

test("the faithfulness result in words: method names, rounded areas, which way is better", () => {
  const answer = { methods: {
    chefer: { auc_positive: 0.41234567891234567, auc_negative: 0.6 },
    grad_attention: { auc_positive: 0.5, auc_negative: null },
  } };
  assert.deepEqual(resultSentences(answer), [
    "Chefer et al.: area under the positive curve 0.412 (lower is better), under the negative curve 0.600 (higher is better).",
    "attention × gradient: area under the positive curve 0.500 (lower is better), under the negative curve not measured (higher is better).",
  ]);
});
