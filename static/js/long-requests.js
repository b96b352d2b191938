// The views' requests that take seconds of server work (importance, pruning, faithfulness) and
// their retries. One copy for every view that asks for them.
import { cancelTask, getLong, getProgress } from "./api.js";

const POLL_MS = 250;
const WAIT_S = 20; // a long request is answered within this (202 with the progress when not done)
const TRANSIENT = new Set(["busy", "timeout"]); // worth another try before the page shows an error
const TRIES = 3;

export const sleep = (ms) => new Promise((r) => { setTimeout(r, ms); });

/**
 * GET …/{what} while polling …/{what}/progress (each answer to onProgress), asking again after
 * each 202 until the answer is there. `signal` (an AbortController's) gives it up: the request is
 * closed, and a computation this page started is cancelled on the server (with the token of its
 * first 202; before that, closing the request is enough), so that it stops holding this client's
 * share of the server. It then rejects with an AbortError.
 */
export async function longRequest(imageId, what, params, onProgress, signal) {
  let open = true;
  let token = null;
  const poll = async () => {
    while (open && !(signal && signal.aborted)) {
      try {
        const p = await getProgress(imageId, what, params, signal);
        if (open) onProgress(p);
      } catch {
        // progress is a nicety: the answer itself reports errors
      }
      await sleep(POLL_MS);
    }
  };
  poll();
  try {
    for (;;) {
      const ans = await getLong(imageId, what, { ...params, wait: WAIT_S }, signal);
      if (ans.done) return ans.body;
      token = token || ans.body.cancel_token || null;
    }
  } finally {
    open = false;
    if (token && signal && signal.aborted) cancelTask(token).catch(() => {}); // gone already, or finished
  }
}

/** An error that only says the page gave the request up (longRequest's signal). */
export const isAbort = (e) => !!e && e.name === "AbortError";

/**
 * Run `promise` as request `key` of a view's data `d` (its loading, failed and retries sets): the
 * answer goes to onAnswer. A busy or slow server is asked again after a pause: the next need()
 * starts the request again once this one is off the loading list. Other errors go to app.fail,
 * named by `d` and the request's `family` (by default the key's part before the first "|"); an
 * answer of the same family takes such an error down (app.settle), e.g. a refused phrase once a
 * good one is in. `current()` says whether `d` is still the data on show (an answer for another
 * picture is kept, but does not redraw the page).
 */
export function track(d, key, promise, onAnswer, app, current, family = key.split("|")[0]) {
  d.loading.add(key);
  promise
    .then((ans) => {
      onAnswer(ans);
      if (current() && app.settle) app.settle(d, family); // redrawn below
    })
    .catch(async (e) => {
      if (isAbort(e)) return; // given up on purpose: not a failure, and asked again if needed again
      const tries = (d.retries.get(key) || 0) + 1;
      d.retries.set(key, tries);
      if (TRANSIENT.has(e && e.code) && tries < TRIES) {
        await sleep(1000 * tries);
        return;
      }
      d.failed.add(key);
      if (current()) app.fail(e, null, { data: d, family });
    })
    .finally(() => {
      d.loading.delete(key);
      if (current()) app.update();
    });
  return true;
}
