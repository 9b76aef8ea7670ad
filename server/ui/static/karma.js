// Karma: the outcomes proposed for a session's or a tenant's Karma and how each was decided (who verified
// it, a person or the reviewer model, and why). A tenant's key lists its own; an auditor's or the operator's,
// every tenant's. Reviews are given over HTTP (POST /v1/context/karma/proposals/{id}/review).

import { getJSON } from "./api.js";
import { errorBox, fmt, h, mount } from "./dom.js";

function decision(p) {
  const last = p.reviews && p.reviews.length ? p.reviews[p.reviews.length - 1] : null;
  if (!last) return "–";
  return `${last.reviewer} (${last.reviewer_kind}): ${last.rationale || ""}`;
}

export async function karmaPage(root) {
  mount(root, h("h1", {}, "Karma"), h("p", { class: "muted" }, "Loading…"));
  try {
    const proposals = (await getJSON("/v1/context/karma/proposals", { limit: 1000 })).data;
    const rows = proposals.slice().reverse().map((p) => h("tr", { dataset: { proposal: p.id, status: p.status } },
      h("td", { class: "num" }, fmt.int(p.id)), h("td", {}, p.scope === "tenant" ? `tenant ${p.tenant}` : p.session_id),
      h("td", {}, p.text), h("td", {}, p.status), h("td", {}, decision(p)), h("td", {}, fmt.time(p.created_at))));
    mount(root, h("h1", {}, "Karma"), h("p", { class: "muted" }, "Outcomes proposed for Karma, newest first: an " +
      "accepted one is in every later prompt of its session (or its tenant's sessions) until it is retracted."),
    proposals.length ? h("table", { class: "grid", id: "karma-proposals" },
      h("thead", {}, h("tr", {}, ["#", "For", "Claim", "Status", "Decided by", "Proposed"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows)) : h("p", { class: "muted" }, "No outcome has been proposed for Karma yet."));
  } catch (e) {
    mount(root, h("h1", {}, "Karma"), errorBox(e));
  }
}
