// A long request the page gives up (static/js/long-requests.js): the request is closed and, once the
// server has handed this page the computation's cancel token (its first 202), the computation is
// cancelled with it. In Node, against a stand-in for the server's answers (fetch).

import assert from "node:assert/strict";
import test from "node:test";

import { ApiError } from "../../static/js/api.js";
import { forgetBusy, isAbort, longRequest, sayUnsaid, track } from "../../static/js/long-requests.js";

const json = (status, body) => new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json" } });

/** fetch as the server answers a long GET: `pending` 202s (the first with the token), then no answer until closed. */
function server(pending) {
  const calls = [];
  let asked = 0;
  globalThis.fetch = (url, options = {}) => {
    calls.push(`${options.method || "GET"} ${url.split("?")[0]}`);
    if (options.method === "DELETE") return Promise.resolve(json(200, { state: "cancelled" }));
    if (url.includes("/progress")) return Promise.resolve(json(200, { state: "running", fraction: 0.1 }));
    asked += 1;
    if (asked <= pending) return Promise.resolve(json(202, { state: "running", ...(asked === 1 ? { cancel_token: "tok-1" } : {}) }));
    return new Promise((_, reject) => {
      options.signal.addEventListener("abort", () => reject(new DOMException("closed", "AbortError")));
    });
  };
  return calls;
}

const settle = () => new Promise((r) => { setTimeout(r, 20); });

test("given up after the server's 202: the request is closed and the computation cancelled with its token", async () => {
  const calls = server(2);
  const stop = new AbortController();
  const answer = longRequest("img", "faithfulness", { methods: "chefer" }, () => {}, stop.signal);
  await settle();
  stop.abort();
  await assert.rejects(answer, (e) => isAbort(e));
  await settle();
  assert.deepEqual(calls.filter((c) => c.startsWith("DELETE")), ["DELETE /api/v1/tasks/tok-1"]);
  const asked = calls.filter((c) => c === "GET /api/v1/attention/img/faithfulness").length;
  assert.equal(asked, 3); // two 202s, then the request that was closed
});

test("given up before any 202: closing the request is all (the server cancels what nobody waits for)", async () => {
  const calls = server(0);
  const stop = new AbortController();
  const answer = longRequest("img", "faithfulness", {}, () => {}, stop.signal);
  await settle();
  stop.abort();
  await assert.rejects(answer, (e) => isAbort(e));
  await settle();
  assert.deepEqual(calls.filter((c) => c.startsWith("DELETE")), []);
});

test("an answer that comes is returned, and nothing is cancelled", async () => {
  const calls = [];
  globalThis.fetch = (url, options = {}) => {
    calls.push(`${options.method || "GET"} ${url.split("?")[0]}`);
    if (url.includes("/progress")) return Promise.resolve(json(200, { state: "done" }));
    return Promise.resolve(json(200, { auc: 0.5 }));
  };
  const stop = new AbortController();
  assert.deepEqual(await longRequest("img", "faithfulness", {}, () => {}, stop.signal), { auc: 0.5 });
  stop.abort();
  await settle();
  assert.deepEqual(calls.filter((c) => c.startsWith("DELETE")), []);
});

const fresh = () => ({ loading: new Set(), failed: new Map(), retries: new Map(), unsaid: [] });
const ON = { current: () => true, shown: () => true };

test("track names an error by its view's data and request kind, and an answer of that kind takes it down", async () => {
  const d = fresh();
  const other = fresh(); // another view's answers
  let shown = null;
  const app = {
    update() {},
    fail(e, retry, source) { shown = { e, source }; },
    settle(data, family) {
      if (!shown || shown.source.data !== data || shown.source.family !== family) return false;
      shown = null;
      return true;
    },
  };
  const refused = Object.assign(new Error("422"), { code: "bad_text" });
  track(d, "map|chefer|text:a a a", Promise.reject(refused), () => {}, app, ON);
  await settle();
  assert.deepEqual(shown.source, { data: d, family: "map" });
  track(d, "map|attention|text:a cat", Promise.resolve({}), () => {}, app, ON, "raw");
  track(other, "map|chefer|top", Promise.resolve({}), () => {}, app, ON);
  await settle();
  assert.ok(shown, "a raw map's answer, or another view's map, says nothing of the refused map");
  track(d, "map|chefer|text:a cat", Promise.resolve({}), () => {}, app, ON);
  await settle();
  assert.equal(shown, null);
});

/** An app that records what the banner would say and redraws nothing. */
function recorder() {
  const app = { banners: [], updates: 0, update() { app.updates += 1; }, fail(e, retry, source) { app.banners.push({ e, retry, source }); } };
  return app;
}

test("a failure offers a Try again that forgets it, so the next need() asks again", async () => {
  const d = fresh();
  const app = recorder();
  const refused = new ApiError(500, "internal", "boom");
  track(d, "test|top|chefer|", Promise.reject(refused), () => {}, app, ON);
  await settle();
  assert.ok(d.failed.has("test|top|chefer|"));
  assert.equal(app.banners.length, 1);
  app.banners[0].retry();
  assert.ok(!d.failed.has("test|top|chefer|") && !d.retries.has("test|top|chefer|"));
});

test("a failure of a view left meanwhile raises no banner; a busy one is forgotten, to be asked again on coming back", async () => {
  const d = fresh();
  const app = recorder();
  const away = { current: () => true, shown: () => false };
  const busy = new ApiError(429, "busy", "busy");
  d.retries.set("test|a", 2); // its third busy answer: no pause, the last try
  track(d, "test|a", Promise.reject(busy), () => {}, app, away);
  track(d, "map|b", Promise.reject(new ApiError(422, "bad_target", "no")), () => {}, app, away);
  await settle();
  assert.equal(app.banners.length, 0);
  assert.ok(!d.failed.has("test|a") && !d.retries.has("test|a"), "busy: asked again when shown");
  assert.ok(d.failed.has("map|b"), "a refusal stays: the view says it failed");
});

test("forgetBusy forgets the busy failures of what is not on show, and keeps the ones on show and the refusals", () => {
  const d = fresh();
  d.failed.set("map|chefer|top", new ApiError(429, "busy", "busy"));
  d.failed.set("map|rollout|top", new ApiError(504, "timeout", "slow"));
  d.failed.set("map|attention|class:3", new ApiError(422, "bad_target", "no"));
  d.retries.set("map|rollout|top", 3);
  forgetBusy(d, ["map|chefer|top", null]);
  assert.deepEqual([...d.failed.keys()], ["map|chefer|top", "map|attention|class:3"]);
  assert.ok(!d.retries.has("map|rollout|top"));
});

test("a refusal that came while the view was not shown is said once it is: the latest one still failed", async () => {
  const d = fresh();
  const app = recorder();
  const away = { current: () => true, shown: () => false };
  track(d, "output", Promise.reject(new ApiError(500, "internal", "first")), () => {}, app, away);
  track(d, "map|chefer|top", Promise.reject(new ApiError(422, "bad_target", "second")), () => {}, app, away, "map");
  await settle();
  assert.equal(app.banners.length, 0);
  sayUnsaid(d, app);
  await settle();
  assert.equal(app.banners.length, 1);
  assert.equal(app.banners[0].e.message, "second");
  assert.deepEqual(app.banners[0].source, { data: d, family: "map" });
  app.banners[0].retry();
  assert.ok(!d.failed.has("map|chefer|top") && d.failed.has("output"));
  sayUnsaid(d, app); // said once
  await settle();
  assert.equal(app.banners.length, 1);
});
