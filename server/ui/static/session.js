// One session, turn by turn: the prompt's blocks to scale with the cached part shaded and the block
// where the cache broke marked with why; inputs, tool calls and results, governor actions and
// compactions inline; the reply's tokens coloured by concept; cached vs prompt tokens per turn.

import { getJSON } from "./api.js";
import { cacheChart } from "./charts.js";
import { errorBox, fmt, h, mount } from "./dom.js";
import { TokenView } from "./tokens.js";

const POLL_MS = 3000;
const TURNS_PER_PAGE = 100;
const BLOCK_LABELS = { identity: "Identity", codex: "Codex", karma: "Karma", state: "State", query: "Query",
  prompt: "Prompt" };

function blocksBar(turn, maxPrompt) {
  const blocks = turn.blocks || [];
  const total = blocks.reduce((n, b) => n + b.tokens, 0) || 1;
  const prompt = turn.prompt_tokens || total;
  // The whole prompt (blocks plus chat template) to one scale across the session's turns.
  const bar = h("div", { class: "blocks", style: { width: `${Math.max(4, (100 * prompt) / maxPrompt)}%` },
    role: "img", "aria-label": `prompt blocks of turn ${turn.index}`, dataset: { prompt } });
  for (const b of blocks) {
    const changed = b.name === turn.first_changed_block;
    bar.append(h("div", {
      class: `block block-${b.name}${changed ? " changed" : ""}`,
      style: { flexGrow: String(Math.max(b.tokens, 0.5)) },
      title: `${BLOCK_LABELS[b.name] || b.name}: ${fmt.int(b.tokens)} tokens · sha256 ${b.sha256.slice(0, 12)}…` +
        (changed ? `\ncache broke here: ${turn.reason || "changed"}` : ""),
      dataset: { block: b.name, tokens: b.tokens },
    }, h("span", { class: "block-label" }, `${BLOCK_LABELS[b.name] || b.name} ${fmt.int(b.tokens)}`)));
  }
  // Tokens the chat template and tool schemas add around the blocks: part of the prompt, no block's.
  // Drawn first, where a template puts its system header and tool schemas, so the cached shade lines up.
  if (turn.prompt_tokens && turn.prompt_tokens > total) {
    const extra = turn.prompt_tokens - total;
    bar.prepend(h("div", { class: "overhead", style: { flexGrow: String(extra) },
      title: `${fmt.int(extra)} tokens of chat template and tool schemas, spread through the prompt` },
    h("span", { class: "block-label" }, `template ${fmt.int(extra)}`)));
  }
  if (turn.cached_tokens && prompt) {
    bar.append(h("div", { class: "cached-shade", style: { width: `${Math.min(100, (100 * turn.cached_tokens) / prompt)}%` },
      title: `${fmt.int(turn.cached_tokens)} tokens read from the prefix cache` }));
  }
  return bar;
}

function eventItem(event) {
  const kinds = { input: event.role === "assistant" ? "assistant" : "input", tool_call: "tool call",
    tool_result: "tool result", system: "system", steering: "steering" };
  const label = kinds[event.event_type] || event.event_type;
  let body = event.content ?? "";
  if (event.event_type === "tool_call") {
    try { body = JSON.stringify(JSON.parse(body), null, 2); } catch (_) { /* shown as stored */ }
  }
  const long = body.length > 400 || body.split("\n").length > 6;
  const text = h("pre", { class: "event-text" }, body, event.truncated ? " …(cut)" : "");
  return h("li", { class: `event event-${event.event_type}`, dataset: { tick: event.tick } },
    h("span", { class: "event-kind" }, label),
    long ? h("details", {}, h("summary", {}, body.slice(0, 160).replace(/\s+/g, " "), "…"), text) : text);
}

function compactionItem(c) {
  return h("li", { class: "event event-compaction" }, h("span", { class: "event-kind" }, "compaction"),
    h("span", {}, `${c.trigger}: ticks ${c.range_start}–${c.range_end}, ${fmt.int(c.tokens_before)} → `,
      `${fmt.int(c.tokens_after)} tokens`), h("details", {}, h("summary", {}, "summary"), h("pre", {}, c.summary)));
}

function turnSection(turn, sessionId, maxPrompt, views) {
  const ratio = turn.prompt_tokens ? turn.cached_tokens / turn.prompt_tokens : null;
  const broke = turn.first_changed_block
    ? h("p", { class: "break" }, "Cache broke at ", h("strong", {}, BLOCK_LABELS[turn.first_changed_block] ||
      turn.first_changed_block), turn.reason ? `: ${turn.reason}` : "")
    : h("p", { class: "break muted" }, turn.reason || "prefix unchanged: every block above the Query reused");
  const tokensBox = h("div", { class: "reply" });
  const view = new TokenView(tokensBox, sessionId, turn.tick_from, turn.tick_to);
  views.set(turn.index, view);
  const governor = (turn.governor || []).map((a) => h("span", { class: "pill governor" }, a));
  return h("section", { class: "turn", id: `turn-${turn.index}`, dataset: { turn: turn.index,
    tickFrom: turn.tick_from, tickTo: turn.tick_to } },
    h("header", {}, h("h2", {}, `Turn ${turn.index}`),
      h("span", { class: `pill mode mode-${turn.mode}` }, (turn.mode || "").toUpperCase()), governor,
      h("span", { class: "muted" }, fmt.time(turn.created_at)),
      h("span", { class: "figures" }, `${fmt.int(turn.prompt_tokens)} prompt · ${fmt.int(turn.cached_tokens)} cached `,
        `(${fmt.ratio(ratio)}) · ${fmt.int(turn.completion_tokens)} generated`)),
    blocksBar(turn, maxPrompt), broke,
    h("ul", { class: "events" }, turn.events.map(eventItem), turn.compactions.map(compactionItem)),
    h("h3", {}, "Reply"), tokensBox);
}

export function sessionPage(root, signal, sessionId, params) {
  const views = new Map();
  const observer = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      if (!entry.isIntersecting) continue;
      const view = views.get(Number(entry.target.dataset.turn));
      if (view && !view.shown) view.load().catch((e) => entry.target.append(errorBox(e)));
    }
  }, { rootMargin: "400px" });
  signal.addEventListener("abort", () => observer.disconnect());
  let data = null;
  let shownTurns = 0;
  let pendingView = null;
  const summary = h("p", { class: "summary" });
  const chart = h("div", { class: "chart-box" });
  const list = h("div", { class: "turns" });
  const moreTurns = h("button", { type: "button", class: "more", hidden: true, onclick: () => showTurns(TURNS_PER_PAGE) },
    "More turns");
  const pending = h("section", { class: "turn pending", hidden: true }, h("h2", {}, "In progress"),
    h("ul", { class: "events" }), h("div", { class: "reply" }));
  const error = h("div");
  mount(root, h("p", {}, h("a", { href: "#/sessions" }, "← Sessions")), h("h1", { class: "session-id" }, sessionId),
    summary, error, h("h2", {}, "Cached vs prompt tokens per turn"), chart, list, moreTurns, pending);

  const maxPrompt = () => Math.max(1, ...data.turns.map((t) => t.prompt_tokens || 0));

  function showTurns(n) {
    const upto = Math.min(data.turns.length, shownTurns + n);
    for (const turn of data.turns.slice(shownTurns, upto)) {
      const section = turnSection(turn, sessionId, maxPrompt(), views);
      list.append(section);
      observer.observe(section);
    }
    shownTurns = upto;
    moreTurns.hidden = shownTurns >= data.turns.length;
  }

  // A longer prompt arrived: every turn's bar is redrawn to the session's new largest prompt.
  function rescale() {
    const max = maxPrompt();
    for (const bar of list.querySelectorAll(".blocks")) {
      bar.style.width = `${Math.max(4, (100 * Number(bar.dataset.prompt)) / max)}%`;
    }
  }

  function drawSummary() {
    const prompt = data.turns.reduce((n, t) => n + (t.prompt_tokens || 0), 0);
    const cached = data.turns.reduce((n, t) => n + (t.cached_tokens || 0), 0);
    const generated = data.turns.reduce((n, t) => n + (t.completion_tokens || 0), 0);
    summary.textContent = `tenant ${data.tenant} · ${data.turns.length} turns · ${fmt.int(prompt)} prompt tokens, ` +
      `${fmt.int(cached)} cached (${fmt.ratio(prompt ? cached / prompt : null)}) · ${fmt.int(generated)} generated`;
    mount(chart, cacheChart(data.turns));
  }

  function drawPending() {
    const last = data.turns.length ? data.turns[data.turns.length - 1].tick_to : -1;
    const running = data.pending.length || (data.last_tick !== null && data.last_tick > last);
    pending.hidden = !running;
    if (!running) return;
    mount(pending.querySelector(".events"), data.pending.map(eventItem));
    if (!pendingView || pendingView.tickFrom !== last + 1) {
      pendingView = new TokenView(pending.querySelector(".reply"), sessionId, last + 1, null);
    }
    pendingView.load().catch((e) => mount(error, errorBox(e)));
  }

  async function focusTick(tick) {
    const turn = data.turns.find((t) => t.tick_from <= tick && tick <= t.tick_to);
    if (!turn) return;
    while (shownTurns < turn.index) showTurns(TURNS_PER_PAGE);
    const section = document.getElementById(`turn-${turn.index}`);
    section.classList.add("focus");
    const token = await views.get(turn.index).reveal(tick);
    (token || section).scrollIntoView({ block: "center" });
    if (token) token.classList.add("focus");
  }

  async function refresh(first) {
    try {
      const fresh = await getJSON(`/v1/xdb/sessions/${encodeURIComponent(sessionId)}/turns`);
      const grew = !data || fresh.turns.length !== data.turns.length;
      const allShown = !data || shownTurns >= data.turns.length;
      data = fresh;
      mount(error);
      if (grew) {
        drawSummary();
        rescale();
        // New turns join the list when the reader is already at its end; otherwise "More turns" offers them.
        showTurns(first ? TURNS_PER_PAGE : allShown ? data.turns.length - shownTurns : 0);
      }
      drawPending();
      if (first && params.get("tick") !== null) await focusTick(Number(params.get("tick")));
    } catch (e) {
      mount(error, errorBox(e));
    }
    if (!signal.aborted) setTimeout(() => refresh(false), POLL_MS);
  }
  refresh(true);
}
