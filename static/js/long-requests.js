// The views' requests that take seconds of server work (importance, pruning, faithfulness) and
// their retries. One copy for every view that asks for them.
import { getLong, getProgress } from "./api.js";

const POLL_MS = 250;
const WAIT_S = 20; // a long request is answered within this (202 with the progress when not done)
const TRANSIENT = new Set(["busy", "timeout"]); // worth another try before the page shows an error
const TRIES = 3;

export const sleep = (ms) => new Promise((r) => { setTimeout(r, ms); });

/**
 * GET …/{what} while polling …/{what}/progress (each answer to onProgress), asking again after
 * each 202 until the answer is there.
 */
export async function longRequest(imageId, what, params, onProgress) {
  let open = true;
  const poll = async () => {
    while (open) {
      try {
        const p = await getProgress(imageId, what, params);
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
      const ans = await getLong(imageId, what, { ...params, wait: WAIT_S });
      if (ans.done) return ans.body;
    }
  } finally {
    open = false;
  }
}

/**
 * Run `promise` as request `key` of a view's data `d` (its loading, failed and retries sets): the
 * answer goes to onAnswer. A busy or slow server is asked again after a pause: the next need()
 * starts the request again once this one is off the loading list. Other errors go to app.fail.
 * `current()` says whether `d` is still the data on show (an answer for another picture is kept,
 * but does not redraw the page).
 */
export function track(d, key, promise, onAnswer, app, current) {
  d.loading.add(key);
  promise
    .then(onAnswer)
    .catch(async (e) => {
      const tries = (d.retries.get(key) || 0) + 1;
      d.retries.set(key, tries);
      if (TRANSIENT.has(e && e.code) && tries < TRIES) {
        await sleep(1000 * tries);
        return;
      }
      d.failed.add(key);
      if (current()) app.fail(e);
    })
    .finally(() => {
      d.loading.delete(key);
      if (current()) app.update();
    });
  return true;
}
