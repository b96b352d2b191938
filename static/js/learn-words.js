// "Inside a head": words. A key's name, and what this model's attention does differently from the
// textbook ViT (one note per difference).

import { prefixLabel } from "./state.js";
import { isWindowAnswer, windowNotes } from "./learn-window.js";

/** A key's name: a prefix token, a patch, or (windowed) a stage cell. */
export function tokenLabel(tokens, t) {
  if (tokens.window) return `cell (${Math.floor(t / tokens.grid[1])}, ${t % tokens.grid[1]})`; // swin: a stage cell
  if (t < tokens.num_prefix) return `${prefixLabel(t, tokens)} (token ${t})`;
  const p = t - tokens.num_prefix;
  return `patch (${Math.floor(p / tokens.grid[1])}, ${p % tokens.grid[1]})`;
}

/** What this model's attention does differently from the textbook ViT, one item per difference. */
export function notes(ans) {
  if (isWindowAnswer(ans)) return windowNotes(ans);
  const t = ans.tokens;
  const kinds = t.prefix.map((p) => p.kind);
  const regs = kinds.filter((k) => k === "reg").length;
  const out = [];
  if (!kinds.includes("cls")) {
    out.push(["no-cls", `No CLS token: every one of the ${t.count} tokens is an image patch, so the query `
      + "defaults to the first patch; pick any other on the left or click the maps."]);
  }
  if (regs) {
    out.push(["registers", `${regs} register token${regs > 1 ? "s" : ""} (tokens ${kinds.indexOf("reg")}…`
      + `${kinds.lastIndexOf("reg")}): extra learned tokens that take part in attention like patches but have no `
      + "place on the picture; their scores and weights are listed beside the maps."]);
  }
  if (kinds.includes("dist")) {
    out.push(["dist", "A distillation token (DeiT) sits next to CLS: it attends and is attended to like any token."]);
  }
  if (ans.steps.rope) {
    out.push(["rope", "RoPE: q and k are rotated by their patch position after the projections (prefix tokens are "
      + "not rotated), so the q and k shown here, and their dot products, already carry position."]);
  }
  if (ans.steps.relative_bias) {
    out.push(["bias", "Relative position bias: a learned number per head and relative offset between two patches is "
      + "added to every score, score = q·k/√d + b. Hover or tap a patch to see it."]);
  }
  if (ans.steps.qk_norm) out.push(["qk-norm", "QK-norm: q and k are normalised per head before the dot product."]);
  if (ans.steps.inner_norm) {
    out.push(["inner-norm", "A norm sits between the concatenated heads and W_O here: W_O multiplies the normalised "
      + "concatenation, so each share below is W_O's columns times the normalised slice of the head."]);
  }
  if (!ans.steps.rope && !ans.steps.relative_bias && ans.steps.absolute_pos) {
    out.push(["abs-pos", "Position enters as embeddings added to the tokens before the first block: nothing in "
      + "this layer's attention knows where a patch is except through X."]);
  }
  return out;
}
