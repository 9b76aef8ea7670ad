// Sessions: a live table, sortable by any column and filtered as you type; polled every few seconds.

import { getJSON, seg } from "./api.js";
import { errorBox, fmt, h, mount } from "./dom.js";

const POLL_MS = 2000;

const COLUMNS = [
  { key: "session_id", label: "Session", value: (r) => r.session_id },
  { key: "tenant", label: "Tenant", value: (r) => r.tenant },
  { key: "turns", label: "Turns", value: (r) => r.turns, numeric: true },
  { key: "tokens", label: "Tokens", value: (r) => r.prompt_tokens + r.generated_tokens, numeric: true,
    show: (r) => `${fmt.int(r.generated_tokens)} out · ${fmt.int(r.prompt_tokens)} prompt` },
  { key: "hit_ratio", label: "Hit ratio", value: (r) => r.hit_ratio ?? -1, numeric: true,
    show: (r) => fmt.ratio(r.hit_ratio) },
  { key: "last_activity", label: "Last activity", value: (r) => r.last_activity || "",
    show: (r) => fmt.ago(r.last_activity) },
  { key: "mode", label: "Mode", value: (r) => r.mode || "", show: (r) => (r.mode || "–").toUpperCase() },
  { key: "flags", label: "Windows", value: (r) => (r.submitted ? 2 : 0) + (r.pinned ? 1 : 0),
    show: (r) => [r.pinned ? h("span", { class: "pill pinned" }, "pinned") : null,
      r.submitted ? h("span", { class: "pill submitted" }, "SUBMITTED") : null] },
];

export function sessionsPage(root, signal) {
  const state = { rows: [], sort: "last_activity", desc: true, filter: "" };
  const filter = h("input", { type: "search", id: "session-filter", placeholder: "Filter by id, tenant or mode",
    "aria-label": "filter sessions", oninput: (e) => { state.filter = e.target.value.toLowerCase(); draw(); } });
  const status = h("span", { class: "muted", id: "sessions-status" });
  const table = h("table", { class: "grid", id: "sessions" });
  const error = h("div");
  mount(root, h("h1", {}, "Sessions"), h("div", { class: "toolbar" }, filter, status), error, table);

  function draw() {
    const col = COLUMNS.find((c) => c.key === state.sort);
    const rows = state.rows
      .filter((r) => !state.filter || [r.session_id, r.tenant, r.mode || ""].some(
        (v) => v.toLowerCase().includes(state.filter)))
      .sort((a, b) => {
        const x = col.value(a), y = col.value(b);
        const order = col.numeric ? x - y : String(x).localeCompare(String(y));
        return state.desc ? -order : order;
      });
    const head = h("tr", {}, COLUMNS.map((c) => h("th", {
      scope: "col", "aria-sort": c.key === state.sort ? (state.desc ? "descending" : "ascending") : "none",
      dataset: { key: c.key },
      onclick: () => { state.desc = state.sort === c.key ? !state.desc : c.numeric || c.key === "last_activity";
        state.sort = c.key; draw(); },
    }, c.label, c.key === state.sort ? (state.desc ? " ▾" : " ▴") : "")));
    const body = rows.map((r) => h("tr", { dataset: { session: r.session_id } }, COLUMNS.map((c) => h("td",
      { class: c.numeric ? "num" : "" },
      c.key === "session_id" ? h("a", { href: `#/session/${seg(r.session_id)}` }, r.session_id)
        : c.show ? c.show(r) : c.value(r)))));
    mount(table, h("thead", {}, head), h("tbody", {}, body));
    status.textContent = `${rows.length} of ${state.rows.length} sessions · updated ${new Date().toLocaleTimeString()}`;
  }

  async function poll() {
    try {
      state.rows = (await getJSON("/v1/xdb/sessions", { limit: 500 })).data;
      mount(error);
      draw();
    } catch (e) {
      mount(error, errorBox(e));
    }
    if (!signal.aborted) setTimeout(poll, POLL_MS);
  }
  poll();
}
