// The page's own rules (docs/architecture.md, "The page"), read from the source of static/js:
// one `$` (dom.js), one temperature formatter, the chrome imports no other view's modules, the
// views keep what they know in the state (no module variables), and the page writes its queries
// in the API's grammar only.

import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import test from "node:test";

const DIR = new URL("../../static/js/", import.meta.url);
const files = readdirSync(DIR).filter((f) => f.endsWith(".js"));
const source = Object.fromEntries(files.map((f) => [f, readFileSync(new URL(f, DIR), "utf8")]));
const CHROME = ["actions.js", "bindings.js", "controls.js", "render.js", "intake.js", "fetching.js", "main.js"];

test("dom.js holds the one $", () => {
  const defining = files.filter((f) => /^\s*(export\s+)?((const|let|var)\s+\$\s*=|function\s+\$\s*\()/m.test(source[f]));
  assert.deepEqual(defining, ["dom.js"]);
});

test("one way to write a temperature: dom.js fmtTemperature", () => {
  const defining = files.filter((f) => /function\s+(fmtT|fmtTemperature)\b|const\s+(fmtT|fmtTemperature)\s*=/.test(source[f]));
  assert.deepEqual(defining, ["dom.js"]);
});

test("the chrome imports nothing from the Inside a head, Ablation and Why views", () => {
  for (const f of CHROME) {
    const bad = [...source[f].matchAll(/from\s+"\.\/((learn|ablation|why)[^"]*)"/g)].map((m) => m[1]);
    assert.deepEqual(bad, [], `${f} imports ${bad}`);
  }
});

test("the views keep their answers in the state: no module variables in learn*.js, ablation*.js and why*.js", () => {
  for (const f of files.filter((x) => /^(learn|ablation|why)/.test(x))) {
    const lets = source[f].split("\n").filter((line) => /^let\s/.test(line));
    assert.deepEqual(lets, [], `${f} keeps module state`);
    // (a constant in capitals, such as a set of error codes, is no state)
    const maps = source[f].split("\n").filter((line) => /^const\s+(?![A-Z0-9_]+\s)\w+\s*=\s*new\s+(Map|Set)\b/.test(line));
    assert.deepEqual(maps, [], `${f} keeps module state`);
  }
});

test("the page writes queries in the API's grammar (tok:I is only read, from old links)", () => {
  for (const f of files) {
    const code = source[f].split("\n").filter((line) => !/^\s*(\/\/|\*|\/\*\*)/.test(line)); // no comments
    // state.js reads it, in one place: parseQuery's `legacy`.
    const lines = code.filter((line) => line.includes("tok:") && !(f === "state.js" && line.includes("const legacy =")));
    assert.deepEqual(lines, [], `${f} writes "tok:"`);
  }
});
