// Words and layout helpers of the page, in Node: the figure caption wraps instead of being cut
// (export.js wrapText, the PNG and SVG downloads), long file names are shortened in the middle
// (dom.js shortName, the compare image menu), the heads switched off in the Ablation view
// (state.js ablatedPairs / ablateText) and the maps' note about them (viewer.js ablatedNote).

import assert from "node:assert/strict";
import test from "node:test";

import { shortName } from "../../static/js/dom.js";
import { wrapText } from "../../static/js/export.js";
import { ablateText, ablatedPairs } from "../../static/js/state.js";
import { ablatedNote } from "../../static/js/viewer.js";

const ctx = { measureText: (t) => ({ width: 7 * t.length }) }; // 7 px a character

test("wrapText breaks a caption between its items, cutting nothing", () => {
  const caption = "model dinov2-s14-focus · cat.png · dropped: prefix,artifacts · mass mask 60% · attention weight (colour bar) · Headscope";
  const lines = wrapText(ctx, caption, 420); // 60 characters a line
  assert.ok(lines.length >= 2);
  assert.ok(lines.every((l) => 7 * l.length <= 420), lines);
  assert.equal(lines.join(" · "), caption);
  assert.ok(!lines.some((l) => l.includes("…")));
  assert.deepEqual(wrapText(ctx, "short · caption", 420), ["short · caption"]);
});

test("wrapText breaks an item wider than a line at its spaces, and shortens only a word wider than a line", () => {
  const lines = wrapText(ctx, "a b c d e f g h i j", 35); // 5 characters a line
  assert.deepEqual(lines, ["a b c", "d e f", "g h i", "j"]);
  const long = wrapText(ctx, "x".repeat(30), 70);
  assert.equal(long.length, 1);
  assert.ok(long[0].endsWith("…") && 7 * long[0].length <= 70);
});

test("shortName keeps a long name's start and its extension", () => {
  assert.equal(shortName("cat.png"), "cat.png");
  const s = shortName("a_rather_long_holiday_picture_name_2024.png", 20);
  assert.equal(s.length, 20);
  assert.ok(s.startsWith("a_rather_long") && s.endsWith("4.png") && s.includes("…"), s);
});

test("the heads switched off: valid pairs of the model, sorted, in the API's ablate spelling", () => {
  const meta = { layers: Array.from({ length: 12 }, (_, i) => i), heads: [0, 1, 2, 3, 4, 5], tokens: { count: 1 } };
  const pairs = ablatedPairs(meta, ["11:0", "3:2", "3:1", "12:0", "2:6", "x"]);
  assert.deepEqual(pairs, [[3, 1], [3, 2], [11, 0]]);
  assert.equal(ablateText(pairs), "3:1,3:2,11:0");
  assert.deepEqual(ablatedPairs(null, ["1:1"]), []);
  assert.deepEqual(ablatedPairs({ ...meta, stages: [{ layers: [0, 11] }] }, ["1:1"]), []); // Swin: no head ablation
});

test("the maps' note says which layers changed", () => {
  const one = ablatedNote([[3, 1]], 12);
  assert.ok(one.includes("1 head off (layer 3 head 1)") && one.includes("Layers 0–3 are unchanged") && one.includes("from layer 4 on"));
  const last = ablatedNote([[11, 0]], 12);
  assert.ok(last.includes("The maps are the model's own") && last.includes("layer 11 is the last"));
  const many = ablatedNote(Array.from({ length: 7 }, (_, h) => [5, h % 6]), 12);
  assert.ok(many.includes("7 heads off,") && many.includes("these heads"));
});
