// The views' requests that take seconds of server work (importance, pruning, faithfulness) and
// their retries. One copy for every view that asks for them.
import { cancelTask, getLong, getProgress, isRetryable } from "./api.js";

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
 * Run `promise` as request `key` of a view's data `d` (its loading and retries, and `failed`: key
 * -> the error): the answer goes to onAnswer. A busy or slow server is asked again after a pause:
 * the next need() starts the request again once this one is off the loading list. Other errors
 * are kept in d.failed and go to app.fail, named by `d` and the request's `family` (by default the
 * key's part before the first "|"), with a Try again that forgets the failure (shown where sending
 * it again can help); an answer of the same family takes such an error down (app.settle), e.g. a
 * refused phrase once a good one is in. `on.current()` says whether `d` is still the data on show
 * (an answer for another picture is kept, but does not redraw the page), `on.shown()` whether its
 * view is too: a failure of a view left meanwhile raises no banner over another view; it is said
 * when the view is shown again (sayUnsaid, `d.unsaid`), or asked again where the server was only
 * busy or slow.
 */
export function track(d, key, promise, onAnswer, app, on, family = key.split("|")[0]) {
  d.loading.add(key);
  promise
    .then((ans) => {
      onAnswer(ans);
      if (on.current() && app.settle) app.settle(d, family); // redrawn below
    })
    .catch(async (e) => {
      if (isAbort(e)) return; // given up on purpose: not a failure, and asked again if needed again
      const tries = (d.retries.get(key) || 0) + 1;
      d.retries.set(key, tries);
      if (TRANSIENT.has(e && e.code) && tries < TRIES) {
        await sleep(1000 * tries);
        return;
      }
      // no banner over another view: a busy answer is asked again once its view shows it again
      if (!on.shown() && isRetryable(e)) {
        forget(d, key);
        return;
      }
      d.failed.set(key, e);
      if (on.shown()) say(d, app, { e, key, family });
      else d.unsaid.push({ e, key, family }); // said when the view is shown again (sayUnsaid)
    })
    .finally(() => {
      d.loading.delete(key);
      if (on.current()) app.update();
    });
  return true;
}

/**
 * Say the failures of `d` that came while its view was not shown (track), now that it is (its
 * need()): the latest one still failed, as a banner with its Try again, once the render under
 * way is done.
 */
export function sayUnsaid(d, app) {
  if (!d.unsaid.length) return;
  const last = d.unsaid.splice(0).filter(({ key }) => d.failed.has(key)).pop();
  if (!last) return;
  queueMicrotask(() => say(d, app, last));
}

/** Request `key` of `d` failed with `e`: the banner, named by `d` and `family`, with a Try again that forgets it. */
function say(d, app, { e, key, family }) {
  app.fail(e, () => { forget(d, key); app.update(); }, { data: d, family });
}

/** Forget that request `key` of `d` failed: the next need() asks for it again. */
export function forget(d, key) {
  d.failed.delete(key);
  d.retries.delete(key);
}

/**
 * Forget the failures of `d` that another try may mend (busy, timeouts: api.js isRetryable) for
 * the requests not in `keep`, the ones on show: a busy answer is asked again on coming back to
 * what it was for (another method, target or labels and back), as Inside a head does.
 */
export function forgetBusy(d, keep) {
  for (const [key, err] of d.failed) if (!keep.includes(key) && isRetryable(err)) forget(d, key);
}
