// Audit: the hash chain's head and the last verification; a button verifies the whole chain now. Under an
// auditor's key the page reads the log itself (/v1/audit) and lists its latest records, hidden concepts
// included; under any other key it reads the head as the experience database shows it (/v1/xdb/audit).

import { ApiError, getJSON, postJSON } from "./api.js";
import { errorBox, fmt, h, mount } from "./dom.js";

const RECORDS = 50;

function verdict(v) {
  if (!v) return h("p", { class: "muted", id: "audit-verdict" }, "Not verified since the server started.");
  return h("p", { id: "audit-verdict", class: v.ok ? "ok" : "error" },
    v.ok ? `Intact: ${fmt.int(v.records_checked)} records checked` : `BROKEN: ${v.first_bad}`,
    ` · ${fmt.time(v.finished_at)} · ${v.seconds.toFixed(2)} s`);
}

function hidden(activations) {
  if (!activations) return "–";
  return Object.entries(activations).map(([name, value]) => `${name} ${value.toFixed(3)}`).join(", ");
}

// Where the head and its verification are read: the log's own routes for an auditor, else XDB's.
async function chainRoutes() {
  try {
    await getJSON("/v1/audit/head");
    return { head: "/v1/audit/head", verify: "/v1/audit/verify", refused: null };
  } catch (e) {
    // 403: a key that is no auditor's, or a server without keys (its log is no one's over HTTP); 404: an
    // app that mounts XDB's routes alone.
    if (!(e instanceof ApiError && (e.status === 403 || e.status === 404))) throw e;
    const refused = e.status === 404 ? "this server serves no audit log routes" : e.message;
    return { head: "/v1/xdb/audit", verify: "/v1/xdb/audit/verify", refused };
  }
}

async function latestRecords(box, headSeq) {
  const after = Math.max(-1, headSeq - RECORDS);
  const records = await getJSON("/v1/audit/records", { after, limit: RECORDS });
  const rows = records.data.slice().reverse().map((r) => h("tr", {},
    h("td", {}, fmt.int(r.seq)), h("td", {}, r.event_type), h("td", {}, r.session_id || "–"),
    h("td", {}, (r.content || "").slice(0, 80)), h("td", { class: "hidden-activations" }, hidden(r.hidden_activations))));
  mount(box, h("h2", {}, "Latest records"),
    h("table", { class: "grid", id: "audit-records" },
      h("thead", {}, h("tr", {}, ["Seq", "Event", "Session", "Content", "Hidden concepts"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows)));
}

export async function auditPage(root) {
  const result = h("div");
  const records = h("div");
  const button = h("button", { type: "button", id: "verify-audit" }, "Verify now");
  const head = h("dl", { class: "facts" });
  mount(root, h("h1", {}, "Audit"), h("p", { class: "muted" }, "Every recorded row is chained by SHA-256 in a " +
    "separate file; verification re-hashes the chain from its start."), head, result, button, records);
  let routes;
  async function load() {
    const audit = await getJSON(routes.head);
    mount(head, h("dt", {}, "Head sequence"), h("dd", { id: "audit-seq" }, fmt.int(audit.head_seq)),
      h("dt", {}, "Head hash"), h("dd", {}, h("code", { id: "audit-head" }, audit.head_sha256)));
    mount(result, verdict(audit.last_verification));
    if (routes.refused) mount(records, h("p", { class: "muted", id: "audit-records-refused" }, `Records: ${routes.refused}`));
    else await latestRecords(records, audit.head_seq);
  }
  async function verify() {
    try {
      await postJSON(routes.verify);
    } catch (e) {
      // One verification at a time, and none again moments after the last: its verdict is the one shown.
      if (!(e instanceof ApiError && e.status === 429)) throw e;
    }
  }
  button.onclick = async () => {
    button.disabled = true;
    mount(result, h("p", { class: "muted" }, "Verifying…"));
    try {
      await verify();
      await load();
    } catch (e) {
      mount(result, errorBox(e));
    } finally {
      button.disabled = false;
    }
  };
  try {
    routes = await chainRoutes();
    await load();
  } catch (e) {
    mount(result, errorBox(e));
  }
}
