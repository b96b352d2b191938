// The Why view's words (static/js/why-view.js, why-verdict.js), in Node: one caption per method
// and target, true for it; the hint names the gradient only for gradient methods; the verdict's
// headline follows the server's verdicts.

import assert from "node:assert/strict";
import test from "node:test";

import { verdictHeadline, verdictWords } from "../../static/js/why-verdict.js";
import { METHOD_NAMES, mapCaption, methodHint } from "../../static/js/why-view.js";
import { methodOf, whyView } from "../../static/js/why.js";

const answer = (method, target = "box:60,40,150,120", extra = {}) => ({
  method, target, y: 0.977, rows: "cls", seed: method === "random" ? 0 : null, uniform: false, ...extra,
});

test("a gradient method's caption names the target; attention, rollout and random say they do not depend on it", () => {
  for (const m of ["chefer", "grad_attention"]) {
    const c = mapCaption(answer(m));
    assert.match(c, /pushed the box x 60–150, y 40–120 up/);
    assert.match(c, /gradient/);
  }
  for (const m of ["attention", "rollout"]) {
    const c = mapCaption(answer(m));
    assert.doesNotMatch(c, /pushed/);
    assert.match(c, /the same map for every target/);
    assert.doesNotMatch(c, /box/); // nothing about the target it does not depend on
  }
  const r = mapCaption(answer("random"));
  assert.match(r, /seed 0/);
  assert.match(r, /depends on neither the picture nor the target/);
  assert.doesNotMatch(r, /pushed/);
  assert.match(mapCaption(answer("chefer", "class:281", { class_label: "tabby" })), /pushed “tabby” up \(value 0.977\)/);
  assert.match(mapCaption(answer("attention", "top", { rows: "mean" })), /the mean over every token's row/);
});

test("the hint names the gradient only for the gradient methods, LRP's rules for the LRP methods", () => {
  for (const m of ["chefer", "grad_attention", "legrad"]) assert.match(methodHint(m), /combined with the gradient/);
  for (const m of ["chefer2021", "attnlrp"]) {
    assert.match(methodHint(m), /LRP rules/);
    assert.doesNotMatch(methodHint(m), /attention alone|same for every target/); // they follow the target
  }
  for (const m of ["attention", "rollout", "random"]) assert.doesNotMatch(methodHint(m), /combined with the gradient|LRP/);
  assert.match(methodHint("attention"), /no gradient/);
  assert.match(methodHint("random"), /baseline/);
});

test("the LRP methods and LeGrad have captions of their own that name the target", () => {
  assert.match(mapCaption(answer("chefer2021")), /^Chefer et al. 2021 \(LRP\): how much each patch contributed to the box x 60–150/);
  assert.match(mapCaption(answer("attnlrp")), /^AttnLRP: .*one backward pass with LRP rules; signed/);
  assert.match(methodHint("attnlrp"), /signed/); // its map is signed: not "bright patches matter most"
  assert.doesNotMatch(methodHint("attnlrp"), /Bright patches matter most/);
  assert.match(mapCaption(answer("legrad", "text:a cat")), /^LeGrad: how much each patch pushed the phrase “a cat” up/);
  for (const m of ["chefer2021", "attnlrp", "legrad"]) assert.doesNotMatch(mapCaption(answer(m)), /same map for every target/);
});

test("the verdict's headline: who beat random on both curves, or that none did", () => {
  const v = (verdict) => ({ verdict, text: "", above_one: false });
  const both = { verdicts: { chefer: v("both"), attention: v("neither"), random: v("baseline") } };
  assert.equal(verdictHeadline(both, METHOD_NAMES), "Chefer et al. beats the random map on both curves.");
  const two = { verdicts: { chefer: v("both"), grad_attention: v("both"), random: v("baseline") } };
  assert.match(verdictHeadline(two, METHOD_NAMES), /^Chefer et al. and attention × gradient beat the random map/);
  const none = { verdicts: { chefer: v("positive"), attention: v("neither"), random: v("baseline") } };
  assert.match(verdictHeadline(none, METHOD_NAMES), /^No map beat the random one on both curves/);
  assert.match(verdictHeadline({ verdicts: { chefer: v("untested") } }, METHOD_NAMES), /random map was not tested/);
  // no verdict for the target: the server's reason, its first sentence
  const improbable = {
    verdicts: {
      chefer: { verdict: "undefined", text: "no verdict: the model gives this class a probability of 1.8e-16, less than a uniform guess among its 1,000 classes would (1/1,000); a ratio swings. Explain a class the model considers." },
      random: v("baseline"),
    },
  };
  assert.equal(
    verdictHeadline(improbable, METHOD_NAMES),
    "No verdict: the model gives this class a probability of 1.8e-16, less than a uniform guess among its 1,000 classes would (1/1,000); a ratio swings.",
  );
  const zero = { verdicts: { chefer: { verdict: "undefined", text: "no verdict: the target is 0 here, so the curves have no ratio." }, random: v("baseline") } };
  assert.equal(verdictHeadline(zero, METHOD_NAMES), "No verdict: the target is 0 here, so the curves have no ratio.");
});

test("the verdicts read out: headline, each method's line and how to read them, as separate sentences", () => {
  const v = (verdict, text, aboveOne = false) => ({ verdict, text, above_one: aboveOne });
  const answer = { verdicts: {
    chefer: v("both", "better than random on both curves"),
    attention: v("positive", "better than random on the positive curve only."),
    random: v("baseline", "the baseline"),
  } };
  const words = verdictWords(answer, METHOD_NAMES);
  assert.equal(words, "Chefer et al. beats the random map on both curves. "
    + "Chefer et al.: better than random on both curves. "
    + "raw attention: better than random on the positive curve only. "
    + "Better means a lower AUC on the positive curve and a higher one on the negative, than the random map's; "
    + "a margin under 0.05 is within the random map's own noise.");
  assert.doesNotMatch(words, /How to read/);
  const above = { verdicts: { ...answer.verdicts, random: v("baseline", "its curve went above 1", true) } };
  assert.match(verdictWords(above, METHOD_NAMES), /random: its curve went above 1\. .* A curve above 1: removing those patches raised the target\.$/);
  assert.equal(verdictWords({ verdicts: null }, METHOD_NAMES), "");
});

// The Why view's running tests, as the page holds them: `d` its answers for one picture, `s` the state.
const QUICK = "output|chefer,attention,random|0,0.25,0.5,0.75";
const FULL = "output|chefer,attention,random|";

function holding() {
  const full = new AbortController();
  const d = {
    key: "img|m|", imageId: "img", model: "m", ablate: "", output: { kind: "saliency" },
    maps: new Map(), tests: new Map([[QUICK, { done: true }]]), progress: new Map(),
    running: new Map([[FULL, full]]), zeroShot: new Map(), loading: new Set([FULL]), failed: new Set(), retries: new Map(),
  };
  const s = {
    imageId: "img", model: "m", meta: { layers: 12, heads: 6, tokens: { count: 257 } }, image: {}, models: [],
    view: "why", ablation: { off: [] },
    why: { method: "chefer", target: "output", box: null, steps: "full", asked: ["img|m|"], data: d, phrase: "", labels: "" },
  };
  return { s, full };
}

test("a running test the view no longer shows is given up, also when the view goes back to one it has", () => {
  let { s, full } = holding();
  whyView.release(s);
  assert.equal(full.signal.aborted, false); // the test on show
  s.view = "viewer";
  whyView.release(s);
  assert.equal(full.signal.aborted, false); // another view shown: still the Why view's test
  s.why.steps = "quick"; // back to the quick test, answered already: nothing new starts
  whyView.release(s);
  assert.equal(full.signal.aborted, true);

  ({ s, full } = holding());
  s.why.target = "box"; // a box not drawn yet: no test on show
  whyView.release(s);
  assert.equal(full.signal.aborted, true);

  ({ s, full } = holding());
  s.imageId = "another"; // another picture (or model, or heads off), on any view
  s.view = "ablation";
  whyView.release(s);
  assert.equal(full.signal.aborted, true);
});

test("a method the target does not take is Chefer's while that target is on, and comes back after", () => {
  const why = (method, target) => ({ method, target, phrase: "a cat" });
  assert.equal(methodOf(why("attnlrp", "text"), true), "chefer"); // the LRP rules cover the image tower only
  assert.equal(methodOf(why("chefer2021", "text"), true), "chefer");
  assert.equal(methodOf(why("attnlrp", "embedding"), true), "attnlrp");
  assert.equal(methodOf(why("legrad", "embedding"), true), "chefer"); // LeGrad explains a phrase
  assert.equal(methodOf(why("legrad", "text"), true), "legrad");
  assert.equal(methodOf(why("legrad", "text"), false), "chefer"); // a model without a text tower
  assert.equal(methodOf(why("rollout", "text"), true), "rollout");
});
