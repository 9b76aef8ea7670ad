// A reply's tokens, each coloured by its strongest concept; loaded a page at a time so a session of
// 100k tokens costs only what is on screen.

import { getJSON } from "./api.js";
import { conceptHue, h } from "./dom.js";

export const PAGE = 400;

function topConcept(activations) {
  let best = null;
  for (const [name, value] of Object.entries(activations || {})) {
    if (value === null) continue;
    if (!best || Math.abs(value) > Math.abs(best[1])) best = [name, value];
  }
  return best;
}

function tokenSpan(row, scale) {
  const top = topConcept(row.concept_activations);
  const ranked = Object.entries(row.concept_activations || {})
    .filter(([, v]) => v !== null).sort((a, b) => Math.abs(b[1]) - Math.abs(a[1]));
  const title = [`tick ${row.tick}`, ...ranked.map(([n, v]) => `${n}: ${v.toFixed(3)}`)].join("\n");
  const attrs = { class: "tok", title, dataset: { tick: row.tick, id: row.id } };
  if (top) {
    const strength = Math.min(1, Math.abs(top[1]) / scale);
    attrs.dataset.concept = top[0];
    attrs.style = { backgroundColor: `hsla(${conceptHue(top[0])}, 75%, 55%, ${(0.12 + 0.7 * strength).toFixed(2)})` };
  }
  return h("span", attrs, row.content === "" ? "∅" : row.content);
}

// Tokens of one session between two ticks, appended to `box` page by page.
export class TokenView {
  constructor(box, sessionId, tickFrom, tickTo) {
    Object.assign(this, { box, sessionId, tickFrom, tickTo, afterId: null, done: false, loading: null,
      scale: 0, shown: 0, pages: 0, hasMore: true });
    this.more = h("button", { type: "button", class: "more", hidden: true, onclick: () => this.load() }, "More tokens");
    this.text = h("div", { class: "tokens" });
    box.replaceChildren(this.text, this.more);
  }

  load() {
    if (this.done) return Promise.resolve();
    if (!this.loading) this.loading = this._load().finally(() => { this.loading = null; });
    return this.loading;
  }

  async _load() {
    const page = await getJSON("/v1/xdb/recall", { session_id: this.sessionId, event_types: "output",
      tick_from: this.tickFrom, tick_to: this.tickTo ?? undefined, after_id: this.afterId ?? undefined,
      limit: PAGE });
    // One scale per view, set by its first page: colours stay comparable as pages arrive.
    if (!this.scale) {
      const tops = page.data.map((r) => topConcept(r.concept_activations)).filter(Boolean).map((t) => Math.abs(t[1]));
      this.scale = Math.max(1e-6, ...tops);
    }
    this.text.append(...page.data.map((row) => tokenSpan(row, this.scale)));
    this.shown += page.data.length;
    if (page.data.length) this.afterId = page.data[page.data.length - 1].id;
    this.pages += 1;
    this.hasMore = page.has_more;
    this.done = !page.has_more && this.tickTo !== null;
    this.more.hidden = !page.has_more;
    if (!this.shown && this.done) this.text.append(h("span", { class: "muted" }, "(no generated tokens)"));
  }

  // Page until the token at `tick` is on screen (or nothing is left).
  async reveal(tick) {
    for (;;) {
      const found = this.text.querySelector(`[data-tick="${tick}"]`);
      if (found) return found;
      if (this.pages && !this.hasMore) return null;
      await this.load();
    }
  }
}
