// A long request the page gives up (static/js/long-requests.js): the request is closed and, once the
// server has handed this page the computation's cancel token (its first 202), the computation is
// cancelled with it. In Node, against a stand-in for the server's answers (fetch).

import assert from "node:assert/strict";
import test from "node:test";

import { isAbort, longRequest, track } from "../../static/js/long-requests.js";

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

test("track names an error by its view's data and request kind, and an answer of that kind takes it down", async () => {
  const fresh = () => ({ loading: new Set(), failed: new Set(), retries: new Map() });
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
  track(d, "map|chefer|text:a a a", Promise.reject(refused), () => {}, app, () => true);
  await settle();
  assert.deepEqual(shown.source, { data: d, family: "map" });
  track(d, "map|attention|text:a cat", Promise.resolve({}), () => {}, app, () => true, "raw");
  track(other, "map|chefer|top", Promise.resolve({}), () => {}, app, () => true);
  await settle();
  assert.ok(shown, "a raw map's answer, or another view's map, says nothing of the refused map");
  track(d, "map|chefer|text:a cat", Promise.resolve({}), () => {}, app, () => true);
  await settle();
  assert.equal(shown, null);
});
