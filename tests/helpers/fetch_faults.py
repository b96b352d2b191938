"""The page's answers late or refused on purpose: a wrapper of ``window.fetch`` put in before the
page's scripts run, so that a browser test can change something while a request is on its way
(races), or have one request answered 429 as a busy server does (what the page does next)."""

from __future__ import annotations

INIT = r"""
(() => {
  window.__delays = [];  // [{re, ms}]: answers of matching URLs handed over ms later
  window.__fails = [];   // [{re, status, code, message, times, ms}]: matching requests refused (ms later)
  window.__log = [];     // {url, method, status, error}
  const orig = window.fetch.bind(window);
  window.fetch = async (input, init) => {
    const url = typeof input === 'string' ? input : input.url;
    const entry = { url, method: (init && init.method) || 'GET', status: null, error: null };
    window.__log.push(entry);
    for (const f of window.__fails) {
      if (f.times > 0 && new RegExp(f.re).test(url)) {
        f.times -= 1;
        if (f.ms) await new Promise((ok) => setTimeout(ok, f.ms));
        entry.status = f.status;
        const body = { error: { code: f.code, message: f.message, request_id: 'test' } };
        const headers = { 'Content-Type': 'application/json', 'Retry-After': '1' };
        return new Response(JSON.stringify(body), { status: f.status, headers });
      }
    }
    try {
      const resp = await orig(input, init);
      for (const d of window.__delays) {
        if (new RegExp(d.re).test(url)) { await new Promise((ok) => setTimeout(ok, d.ms)); break; }
      }
      entry.status = resp.status;
      return resp;
    } catch (e) {
      entry.error = e && e.name;
      throw e;
    }
  };
})();
"""


def install(page) -> None:
    """Put the wrapper in (before ``open_page``: it runs before the page's own scripts)."""
    page.add_init_script(INIT)


def delay(page, pattern: str, ms: int) -> None:
    """Hand over the answers of URLs matching ``pattern`` (a JS regular expression) ``ms`` later."""
    page.evaluate("([re, ms]) => { window.__delays.push({ re, ms }); }", [pattern, ms])


def no_delay(page) -> None:
    page.evaluate("() => { window.__delays.length = 0; }")


def refuse(
    page,
    pattern: str,
    times: int = 1,
    status: int = 429,
    code: str = "busy",
    message: str = "The server is busy.",
    after_ms: int = 0,
) -> None:
    """Answer the next ``times`` requests to URLs matching ``pattern`` as a busy server does (or
    with another ``status`` and error ``code``), each ``after_ms`` after it was sent."""
    page.evaluate(
        "(f) => { window.__fails.push(f); }",
        {"re": pattern, "times": times, "status": status, "code": code, "message": message, "ms": after_ms},
    )


def requests(page, pattern: str = "") -> list[dict]:
    """The requests the page made to URLs matching ``pattern``: {url, method, status, error}."""
    return page.evaluate("(re) => window.__log.filter((e) => new RegExp(re).test(e.url))", pattern)
