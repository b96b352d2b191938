// What the page's shortcuts say in its live region (keys.js changeWords): the new layer and
// head, the new query, and nothing where a key changed nothing.

import assert from "node:assert/strict";
import test from "node:test";

import { changeWords, layerWords, queryWords } from "../../static/js/keys.js";

const CAT = { count: 385, num_prefix: 1, prefix: [{ index: 0, kind: "cls" }], grid: [16, 24], patch_size: [14, 14] };
const REG = {
  count: 261, num_prefix: 5, grid: [16, 16], patch_size: [14, 14],
  prefix: [{ index: 0, kind: "cls" }, ...[1, 2, 3, 4].map((index) => ({ index, kind: "reg" }))],
};

test("the layer and head in words, mean, max and rollout by their names", () => {
  assert.equal(layerWords(10, "1"), "layer 10, head 1");
  assert.equal(layerWords(3, "mean"), "layer 3, mean of heads");
  assert.equal(layerWords(0, "rollout"), "layer 0, rollout");
});

test("a query in words: CLS, a patch with its token, another prefix token", () => {
  assert.equal(queryWords("cls", CAT), "CLS");
  assert.equal(queryWords("patch:3,5", CAT), "patch (3, 5), token 78");
  assert.equal(queryWords("2", REG), "register 2, token 2");
});

test("what changed is said, short; nothing when nothing changed", () => {
  const at = { layer: 11, head: "0", query: "cls" };
  assert.equal(changeWords(at, { ...at, layer: 10 }, CAT), "layer 10, head 0");
  assert.equal(changeWords(at, { ...at, head: "1" }, CAT), "layer 11, head 1");
  assert.equal(changeWords(at, { ...at, query: "patch:0,1" }, CAT), "query: patch (0, 1), token 2");
  assert.equal(changeWords({ ...at, query: "patch:0,1" }, at, CAT), "query: CLS");
  assert.equal(changeWords(at, { layer: 10, head: "1", query: "patch:0,0" }, CAT),
    "layer 10, head 1. query: patch (0, 0), token 1");
  assert.equal(changeWords(at, { ...at }, CAT), ""); // an edge: the layer stays, nothing is said
});
