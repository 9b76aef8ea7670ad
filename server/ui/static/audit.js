// Audit: the hash chain's head and the last verification; a button verifies the whole chain now.

import { getJSON, postJSON } from "./api.js";
import { errorBox, fmt, h, mount } from "./dom.js";

function verdict(v) {
  if (!v) return h("p", { class: "muted", id: "audit-verdict" }, "Not verified since the server started.");
  return h("p", { id: "audit-verdict", class: v.ok ? "ok" : "error" },
    v.ok ? `Intact: ${fmt.int(v.records_checked)} records checked` : `BROKEN: ${v.first_bad}`,
    ` · ${fmt.time(v.finished_at)} · ${v.seconds.toFixed(2)} s`);
}

export async function auditPage(root) {
  const result = h("div");
  const button = h("button", { type: "button", id: "verify-audit" }, "Verify now");
  const head = h("dl", { class: "facts" });
  mount(root, h("h1", {}, "Audit"), h("p", { class: "muted" }, "Every recorded row is chained by SHA-256 in a " +
    "separate file; verification re-hashes the chain from its start."), head, result, button);
  async function load() {
    const audit = await getJSON("/v1/xdb/audit");
    mount(head, h("dt", {}, "Head sequence"), h("dd", { id: "audit-seq" }, fmt.int(audit.head_seq)),
      h("dt", {}, "Head hash"), h("dd", {}, h("code", { id: "audit-head" }, audit.head_sha256)));
    mount(result, verdict(audit.last_verification));
  }
  button.onclick = async () => {
    button.disabled = true;
    mount(result, h("p", { class: "muted" }, "Verifying…"));
    try {
      await postJSON("/v1/xdb/audit/verify");
      await load();
    } catch (e) {
      mount(result, errorBox(e));
    } finally {
      button.disabled = false;
    }
  };
  try {
    await load();
  } catch (e) {
    mount(result, errorBox(e));
  }
}
