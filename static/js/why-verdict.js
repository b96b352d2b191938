// The faithfulness test's verdict in words (#41), under the chart: per method, whether its map
// beat the random one on both curves, one or neither and by how much, and where a curve rose
// above 1. The server computes the verdicts (the answer's `verdicts`, app/engine/verdicts.py);
// this only writes them, with a link to the docs' explanation.

const DOCS_PAGE = "relevance/#reading-the-verdict"; // docs/relevance.md, section "Reading the verdict"

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

/** One sentence over the methods: which beat random on both curves (the rule of `headscope report`). */
export function verdictHeadline(answer, names) {
  const rated = Object.entries(answer.verdicts).filter(([, v]) => ["both", "positive", "negative", "neither"].includes(v.verdict));
  if (!rated.length) {
    // Why the target allows none (a target of 0, a class less likely than a uniform guess): the
    // server's own first sentence.
    const why = Object.values(answer.verdicts).find((v) => v.verdict === "undefined");
    if (why) return `No verdict: ${why.text.replace(/^no verdict: /, "").split(". ")[0].replace(/\.$/, "")}.`;
    return "No verdict: the random map was not tested.";
  }
  const good = rated.filter(([, v]) => v.verdict === "both").map(([m]) => names[m] || m);
  if (!good.length) {
    return "No map beat the random one on both curves: on this picture and target, none of them explains the "
      + "output better than patches picked at random.";
  }
  const list = good.length === 1 ? good[0] : `${good.slice(0, -1).join(", ")} and ${good[good.length - 1]}`;
  return `${list} beat${good.length === 1 ? "s" : ""} the random map on both curves.`;
}

/** The verdicts to list: random's own line only where its curves need explaining (it is the baseline). */
function listed(answer) {
  return Object.entries(answer.verdicts).filter(([, v]) => !(v.verdict === "baseline" && !v.above_one));
}

/** How to read the verdicts, after them (a sentence more where a curve went above 1). */
function readingNote(answer) {
  const above = Object.values(answer.verdicts).some((v) => v.above_one);
  return "Better means a lower AUC on the positive curve and a higher one on the negative, than the random map's; a "
    + "margin under 0.05 is within the random map's own noise." + (above ? " A curve above 1: removing those "
    + "patches raised the target." : "");
}

const sentence = (t) => (/[.!?]$/.test(t.trim()) ? t.trim() : `${t.trim()}.`);

/**
 * The verdicts as one text to be read out (the live region): the headline, each method's line and
 * how to read them, as separate sentences and without the link's label. "" without verdicts.
 */
export function verdictWords(answer, names) {
  if (!answer || !answer.verdicts) return "";
  const lines = [verdictHeadline(answer, names)];
  for (const [method, v] of listed(answer)) lines.push(`${names[method] || method}: ${v.text}`);
  lines.push(readingNote(answer));
  return lines.map(sentence).join(" ");
}

/**
 * The verdict element: a headline, one line per method (the server's sentence), the link.
 * elm: the #why-verdict element; answer: GET …/faithfulness or null; names: method -> its name
 * on the page; docsUrl: the documentation site's address ("" when the page has none).
 */
export function renderVerdict(elm, answer, names, docsUrl) {
  if (!answer || !answer.verdicts) {
    elm.hidden = true;
    elm.replaceChildren();
    elm.dataset.key = "";
    return;
  }
  const key = `${answer.image_id}|${answer.model}|${answer.target}|${Object.keys(answer.verdicts)}|${answer.fractions}|${answer.ablate}`;
  elm.hidden = false;
  if (elm.dataset.key === key) return;
  elm.dataset.key = key;
  const list = el("ul", "verdict-list");
  for (const [method, v] of listed(answer)) {
    const li = el("li", `verdict verdict-${v.verdict}`);
    li.dataset.method = method;
    li.dataset.verdict = v.verdict;
    li.append(el("b", "", `${names[method] || method}: `), document.createTextNode(v.text));
    list.append(li);
  }
  const head = el("p", "verdict-head", verdictHeadline(answer, names));
  head.setAttribute("data-testid", "why-verdict-head");
  const more = el("p", "hint verdict-more");
  more.append(document.createTextNode(`${readingNote(answer)} `));
  if (docsUrl) {
    const a = el("a", "", "How to read the verdict");
    a.href = `${docsUrl.replace(/\/+$/, "")}/${DOCS_PAGE}`;
    a.target = "_blank";
    a.rel = "noopener";
    a.setAttribute("data-testid", "why-verdict-docs");
    more.append(a);
  } else {
    more.append(document.createTextNode("How to read it: "), el("code", "", "docs/relevance.md"),
      document.createTextNode(", “Reading the verdict”."));
  }
  elm.replaceChildren(head, list, more);
}
