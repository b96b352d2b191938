// The one query parser and the helpers of the state (static/js/state.js), in Node.

import assert from "node:assert/strict";
import test from "node:test";

import { isRetryable, ApiError, describeError } from "../../static/js/api.js";
import {
  DROPS, apiQuery, canonicalQuery, defaultQuery, dims, dropParts, headChoices, mapQuery, markerAt, parseQuery, queryLabel,
  queryRows, readTemperature, stageQuery, tokensAt, applyChoices, readUrl, syncUrl, state,
} from "../../static/js/state.js";
import { fmt } from "../../static/js/overlay.js";

const CAT = { count: 385, num_prefix: 1, prefix: [{ index: 0, kind: "cls" }], grid: [16, 24], patch_size: [14, 14] };
const REGS = {
  count: 261, num_prefix: 5, grid: [16, 16], patch_size: [14, 14],
  prefix: [{ index: 0, kind: "cls" }, ...[1, 2, 3, 4].map((i) => ({ index: i, kind: "reg" }))],
};
const SIGLIP = { count: 196, num_prefix: 0, prefix: [], grid: [14, 14], patch_size: [16, 16] };

test("parseQuery reads the API's grammar: cls, token indices, patch:R,C, one row of them", () => {
  assert.deepEqual(parseQuery("cls", CAT), { kind: "cls", token: 0 });
  assert.deepEqual(parseQuery("patch:5,7", CAT), { kind: "patch", r: 5, c: 7, token: 1 + 5 * 24 + 7 });
  assert.deepEqual(parseQuery("patch:-1,-1", CAT), { kind: "patch", r: 15, c: 23, token: 384 }); // from the far edge
  assert.equal(parseQuery("patch:16,0", CAT), null); // off the grid
  assert.equal(parseQuery("patch:0,24", CAT), null);
  assert.deepEqual(parseQuery("3", REGS), { kind: "token", token: 3 }); // a register
  assert.deepEqual(parseQuery("0", REGS), { kind: "cls", token: 0 });
  assert.deepEqual(parseQuery("5", REGS), { kind: "patch", r: 0, c: 0, token: 5 }); // a token index may be a patch
  assert.deepEqual(parseQuery("-1", CAT), { kind: "patch", r: 15, c: 23, token: 384 });
  assert.deepEqual(parseQuery(" CLS ", CAT), { kind: "cls", token: 0 });
  assert.deepEqual(parseQuery("2,2", REGS), { kind: "token", token: 2 }); // one row, named twice
  assert.equal(parseQuery("2,3", REGS), null); // two rows: the page shows one
  assert.equal(parseQuery("all", CAT), null);
  assert.equal(parseQuery("385", CAT), null); // out of range
  assert.equal(parseQuery("cls", SIGLIP), null); // no CLS token
  assert.equal(parseQuery("nonsense", CAT), null);
  assert.equal(parseQuery("cls", null), null);
  assert.deepEqual(parseQuery("tok:3", REGS), { kind: "token", token: 3 }); // links shared before: "tok:I" is "I"
});

test("canonicalQuery and apiQuery spell one row one way, the API's", () => {
  assert.equal(canonicalQuery("0", CAT), "cls");
  assert.equal(canonicalQuery("tok:2", REGS), "2");
  assert.equal(canonicalQuery("17", CAT), "patch:0,16");
  assert.equal(canonicalQuery("patch:-1,0", CAT), "patch:15,0");
  assert.equal(canonicalQuery("all", CAT), null);
  assert.equal(apiQuery("cls", CAT), "cls");
  assert.equal(apiQuery("patch:2,3", CAT), "patch:2,3");
  assert.equal(apiQuery("2", REGS), "2");
  assert.equal(apiQuery("nonsense", CAT), "cls");
  assert.deepEqual(queryRows("all", CAT), { rows: null });
  assert.deepEqual(queryRows("patch:0,0;0,1;0,0", CAT), { rows: [1, 2] });
  assert.ok(queryRows("patch:0", CAT).error.includes("patch:ROW,COL"));
  assert.ok(queryRows("cls", SIGLIP).error.includes("no CLS token"));
});

test("mapQuery puts a patch on the same place of another grid", () => {
  assert.equal(mapQuery("patch:8,4", CAT, REGS), "patch:8,3"); // (4.5 / 24) * 16 = 3
  assert.equal(mapQuery("patch:15,23", CAT, REGS), "patch:15,15");
  assert.equal(mapQuery("cls", CAT, REGS), "cls");
  assert.equal(mapQuery("patch:1,1", CAT, CAT), "patch:1,1");
});

test("labels, defaults and head choices", () => {
  assert.equal(queryLabel("patch:8,3", REGS), "patch (row 8, col 3)");
  assert.equal(queryLabel("2", REGS), "register 2");
  assert.equal(defaultQuery(CAT), "cls");
  assert.equal(defaultQuery(SIGLIP), "patch:7,7");
  const meta = { layers: [0, 1], heads: [0, 1, 2], tokens: CAT };
  assert.deepEqual(headChoices(meta), ["0", "1", "2", "mean", "max", "rollout"]);
  assert.deepEqual(headChoices(null), []);
});

test("drop has the API's one spelling", () => {
  assert.deepEqual(DROPS, ["none", "prefix", "artifacts", "prefix,artifacts"]);
  assert.deepEqual(dropParts("prefix,artifacts"), { prefix: true, artifacts: true });
  assert.deepEqual(dropParts("artifacts"), { prefix: false, artifacts: true });
  assert.deepEqual(dropParts("none"), { prefix: false, artifacts: false });
});

test("only errors a retry can fix are retryable", () => {
  assert.ok(isRetryable(new ApiError(429, "busy", "")));
  assert.ok(isRetryable(new ApiError(503, "out_of_memory", "")));
  assert.ok(isRetryable(new ApiError(504, "timeout", "")));
  assert.ok(isRetryable(new ApiError(0, "network", "")));
  assert.ok(!isRetryable(new ApiError(415, "not_an_image", "")));
  assert.ok(!isRetryable(new ApiError(413, "upload_too_large", "")));
  assert.ok(!isRetryable(new ApiError(500, "compute_failed", "")));
  assert.ok(!isRetryable(new ApiError(0, "no_image", "")));
  assert.ok(!isRetryable(new Error("x")));
});

// A Swin-like answer: 4 layers in 2 stages, 8 x 8 cells of 4 px then 4 x 4 of 8 px, 2 then 4 heads.
const SWIN_TOKENS = { count: 64, num_prefix: 0, prefix: [], grid: [8, 8], patch_size: [4, 4], stage: 0, window: [4, 4] };
const SWIN = {
  layers: [0], heads: [0, 1], tokens: SWIN_TOKENS, input_size: [32, 32],
  stages: [
    { index: 0, layers: [0, 1], grid: [8, 8], heads: 2, cell_size: [4, 4], window: [4, 4], shifts: [[0, 0], [2, 2]], windows: 4, dense: true },
    { index: 1, layers: [2, 3], grid: [4, 4], heads: 4, cell_size: [8, 8], window: [4, 4], shifts: [[0, 0], [0, 0]], windows: 1, dense: true },
  ],
};

test("windowed models: layers of their stage's grid and heads, the query on each stage", () => {
  assert.deepEqual(dims(SWIN, 0), { L: 4, H: 2, N: 64 });
  assert.deepEqual(dims(SWIN, 3), { L: 4, H: 4, N: 16 });
  assert.deepEqual(headChoices(SWIN, 1), ["0", "1", "mean", "max"]); // no rollout across grids
  assert.deepEqual(headChoices(SWIN, 2), ["0", "1", "2", "3", "mean", "max"]);
  assert.deepEqual(tokensAt(SWIN, 2).grid, [4, 4]);
  assert.deepEqual(tokensAt(SWIN, 1).shift, [2, 2]);
  assert.deepEqual(markerAt(SWIN, "patch:5,3", 0), { kind: "patch", r: 5, c: 3, token: 43 });
  assert.deepEqual(markerAt(SWIN, "patch:5,3", 3), { kind: "patch", r: 2, c: 1, token: 9 });
  assert.equal(stageQuery(SWIN, "patch:5,3", SWIN.stages[1]), "patch:2,1");
  assert.equal(stageQuery(SWIN, "patch:9,0", SWIN.stages[1]), "patch:9,0"); // off the grid: as it is
  assert.equal(markerAt(SWIN, "cls", 0), null);
});

test("a busy answer is told in the server's words: a full pool, or this page's own share", () => {
  const share = describeError(new ApiError(429, "busy",
    "this client already has 2 heavy requests in progress (its share of the server's 2); retry when one has finished", 1));
  assert.equal(share.title, "The server is busy.");
  assert.equal(share.message, "This client already has 2 heavy requests in progress (its share of the server's 2). "
    + "Try again in 1 s.");
  const full = describeError(new ApiError(429, "busy", "the server is busy (32 upload requests in progress); retry shortly"));
  assert.equal(full.message, "The server is busy (32 upload requests in progress). Try again in a moment.");
  const tasks = describeError(new ApiError(429, "busy", "this client already has 2 long computations running (its share "
    + "of the server's 4); wait for one, or cancel one with DELETE /api/v1/tasks/{cancel_token}", 1));
  assert.doesNotMatch(tasks.message, /DELETE|cancel_token/); // an API client's advice, not a page user's
});

test("a shared link's temperature is kept in the slider's range 0.1 … 10; junk is 1", () => {
  assert.equal(readTemperature("2.5"), 2.5);
  assert.equal(readTemperature("0.0001"), 0.1);
  assert.equal(readTemperature("1e9"), 10);
  for (const t of ["0", "-2", "abc", "", null, "Infinity"]) assert.equal(readTemperature(t), 1);
});

test("weights are written to at least 3 significant figures", () => {
  assert.equal(fmt(0.0125739), "0.0126"); // was 0.013, 3.4 % off the map's max
  assert.equal(fmt(0.0799357), "0.0799");
  assert.equal(fmt(0.5), "0.500");
  assert.equal(fmt(0.000139244), "1.39e-4");
  assert.equal(fmt(0), "0");
});

/** The address bar, as syncUrl and readUrl see it in a page. */
function fakeAddressBar(search = "") {
  globalThis.location = { pathname: "/", search };
  globalThis.history = { replaceState: (_a, _b, url) => { location.search = url.includes("?") ? url.slice(url.indexOf("?")) : ""; } };
}

function shownState(patch) {
  const meta = { layers: Array.from({ length: 12 }, (_, i) => i), heads: Array.from({ length: 6 }, (_, i) => i), tokens: CAT };
  const s = structuredClone(state);
  return Object.assign(s, { imageId: "596aa1e7cb875eb79f437e31", model: "dinov2-s14-focus", meta, layer: 3, head: "1" }, patch);
}

test("a shared link keeps every choice that changes the maps, and a default adds nothing", () => {
  fakeAddressBar();
  syncUrl(shownState({}));
  assert.equal(location.search, "?image=596aa1e7cb875eb79f437e31&model=dinov2-s14-focus&layer=3&head=1&q=cls");
  assert.deepEqual(readUrl().choices, {});

  const chosen = shownState({
    drop: "prefix,artifacts",
    rollout: { start: 2, fusion: "min", discard: 0.35 },
    ablation: { off: ["7:2", "3:0", "99:0"], method: "ablation", asked: [], retry: null, data: null }, // 99: not this model's
    why: { ...state.why, method: "attnlrp", target: "box", box: [10, 20, 110, 220], steps: "full", labels: "a cat, a dog" },
  });
  syncUrl(chosen);
  const q = new URLSearchParams(location.search);
  assert.equal(q.get("ablate"), "3:0,7:2"); // the API's spelling, sorted, only the model's heads
  assert.equal(q.get("target"), "box:10,20,110,220");
  const back = readUrl();
  assert.deepEqual(back.choices, {
    drop: "prefix,artifacts",
    rollout: { start: 2, fusion: "min", discard: 0.35 },
    ablation: { off: ["3:0", "7:2"] },
    why: { method: "attnlrp", target: "box", box: [10, 20, 110, 220], labels: "a cat, a dog", steps: "full" },
  });
  // Applied to a fresh state, the link writes itself again (the round trip is the identity).
  const opened = shownState({});
  applyChoices(opened, back.choices);
  assert.equal(opened.ablation.method, "ablation"); // a view's part is patched, not replaced
  const before = location.search;
  syncUrl(opened);
  assert.equal(location.search, before);

  // A phrase (CLIP) and a class target, in the API's spelling.
  syncUrl(shownState({ why: { ...state.why, target: "text", phrase: "a photo of a cat" } }));
  assert.deepEqual(readUrl().choices.why, { target: "text", phrase: "a photo of a cat" });
  syncUrl(shownState({ why: { ...state.why, target: "class:281" } }));
  assert.deepEqual(readUrl().choices.why, { target: "class:281" });
  // A box asked for but not drawn, or an empty phrase, is the default target.
  syncUrl(shownState({ why: { ...state.why, target: "box", box: null } }));
  assert.equal(new URLSearchParams(location.search).get("target"), null);
});

test("a shared link's malformed choices are left out: the defaults stay", () => {
  fakeAddressBar("?drop=everything&rollout=1,median,0.2&ablate=3:x,-1:2,,4:1&method=gradcam"
    + "&target=box:5,5,5,9&steps=slow&labels=%20");
  assert.deepEqual(readUrl().choices, { ablation: { off: ["4:1"] } });
  for (const [rollout, ok] of [["1,max,0.2", true], ["1,max", false], ["-1,max,0", false], ["0,mean,0.99", false], ["1.5,mean,0", false]]) {
    fakeAddressBar(`?rollout=${rollout}`);
    assert.equal("rollout" in readUrl().choices, ok, rollout);
  }
  for (const [target, want] of [
    ["top", { target: "top" }], ["class:x", undefined], ["box:1,2,3", undefined], ["box:9,2,3,4", undefined],
    ["text:%20", undefined], ["embedding", { target: "embedding" }], ["javascript:alert(1)", undefined],
  ]) {
    fakeAddressBar(`?target=${target}`);
    assert.deepEqual(readUrl().choices.why, want, target);
  }
});

test("compare mode travels in a link: the mode and both sides, another image by its id", () => {
  fakeAddressBar();
  const other = "0123456789abcdef01234567";
  const s = shownState({});
  s.compare = { on: true, mode: "images", a: { image: s.imageId, layer: 3, head: "1" }, b: { image: other, layer: 5, head: "mean" } };
  syncUrl(s);
  const q = new URLSearchParams(location.search);
  assert.deepEqual([q.get("compare"), q.get("a"), q.get("b")], ["images", "3,1", `5,mean,${other}`]);
  assert.deepEqual(readUrl().choices.compare, {
    on: true, mode: "images", a: { layer: 3, head: "1", image: null }, b: { layer: 5, head: "mean", image: other },
  });
  // The page's Maps (the other images' data) stay when a link's sides are put in.
  const opened = shownState({});
  opened.compare = { on: false, mode: "heads", a: null, b: null, others: new Map([["k", 1]]) };
  applyChoices(opened, readUrl().choices);
  assert.equal(opened.compare.others.get("k"), 1);
  assert.equal(opened.compare.mode, "images");
  // A sample on its way is not written (the side's image is written once it is the server's).
  s.compare.b.image = "sample:/static/samples/cat.png";
  syncUrl(s);
  assert.equal(new URLSearchParams(location.search).get("b"), "5,mean");
  s.compare.on = false;
  syncUrl(s);
  assert.equal(new URLSearchParams(location.search).get("compare"), null);
  for (const bad of ["?compare=pixels&a=1,1&b=2,2", "?compare=heads&a=1,1", "?compare=heads&a=1,x&b=2,2",
    "?compare=heads&a=1,1&b=2,2,nothex", "?compare=heads&a=1,1&b=2,2,abcdef01,9"]) {
    fakeAddressBar(bad);
    assert.equal(readUrl().choices.compare, undefined, bad);
  }
});

test("a link carries the display choices: colour map, opacity, grid, smoothing, mass mask, chart modes, importance method", () => {
  fakeAddressBar();
  const chosen = shownState({
    colormap: "magma", opacity: 0.85, showGrid: true, smooth: true, mask: true, massFraction: 0.45,
    entropyKind: "all", sinkKind: "artifacts", simKind: "cos",
    ablation: { ...state.ablation, method: "gradient" },
  });
  syncUrl(chosen);
  const q = new URLSearchParams(location.search);
  assert.deepEqual(
    ["cmap", "opacity", "grid", "smooth", "mask", "entropy", "sinks", "sim", "importance"].map((k) => q.get(k)),
    ["magma", "0.85", "1", "1", "0.45", "all", "artifacts", "cos", "gradient"],
  );
  const opened = shownState({});
  applyChoices(opened, readUrl().choices);
  for (const k of ["colormap", "opacity", "showGrid", "smooth", "mask", "massFraction", "entropyKind", "sinkKind", "simKind"]) {
    assert.deepEqual(opened[k], chosen[k], k);
  }
  assert.equal(opened.ablation.method, "gradient");
  assert.deepEqual(opened.ablation.off, []); // patched, not replaced
  const before = location.search;
  syncUrl(opened);
  assert.equal(location.search, before); // the round trip is the identity
  // The mask off keeps its fraction out of the link; the defaults add nothing.
  syncUrl(shownState({ massFraction: 0.3 }));
  assert.equal(location.search, "?image=596aa1e7cb875eb79f437e31&model=dinov2-s14-focus&layer=3&head=1&q=cls");
});

test("a link's malformed display choices are left out", () => {
  fakeAddressBar("?cmap=jet&opacity=1.5&grid=yes&smooth=0&mask=0.05&entropy=row&sinks=all&sim=l2&importance=shapley");
  assert.deepEqual(readUrl().choices, {});
  for (const [text, want] of [["0", 0], ["1", 1], ["0.3", 0.3], ["-0.1", undefined], ["1e-1", undefined], [".5", undefined], ["NaN", undefined]]) {
    fakeAddressBar(`?opacity=${text}`);
    assert.equal(readUrl().choices.opacity, want, text);
  }
  fakeAddressBar("?mask=0.95");
  assert.deepEqual(readUrl().choices, { mask: true, massFraction: 0.95 });
});
