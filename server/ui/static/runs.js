// Discovery runs: what the runs learned across runs (per strategy, the laws refuted most often), each
// run's journal (interaction_log), its theorems over time (meta_knowledge versions) and its report image.

import { ApiError, getBlobURL, getJSON, seg } from "./api.js";
import { lineChart } from "./charts.js";
import { errorBox, fmt, h, mount } from "./dom.js";

function history(past) {
  if (!past.strategies.length) return null;
  const strategies = past.strategies.map((s) => h("tr", {},
    h("td", {}, s.strategy), h("td", { class: "num" }, fmt.int(s.runs)), h("td", { class: "num" }, fmt.int(s.solved)),
    h("td", { class: "num" }, fmt.int(s.min_turns)), h("td", { class: "num" }, s.mean_turns ?? "–")));
  const laws = past.failed_laws.map((f) => h("li", {},
    h("code", {}, JSON.stringify(f.law)), ` · refuted ${fmt.int(f.fails)} times in ${fmt.int(f.runs)} runs`,
    f.detail ? h("span", { class: "muted" }, ` (${f.detail})`) : null));
  return [h("h2", {}, "Across runs"),
    h("table", { class: "grid", id: "strategies" }, h("thead", {}, h("tr", {}, ["Strategy", "Runs", "Solved",
      "Fewest turns", "Mean turns solved"].map((t) => h("th", {}, t)))), h("tbody", {}, strategies)),
    laws.length ? [h("h3", {}, "Laws refuted most often"), h("ul", { id: "failed-laws" }, laws)] : null];
}

export async function runsPage(root) {
  mount(root, h("h1", {}, "Discovery runs"), h("p", { class: "muted" }, "Loading…"));
  try {
    const [runs, past] = await Promise.all([getJSON("/v1/xdb/runs").then((r) => r.data),
      getJSON("/v1/xdb/runs/history")]);
    const rows = runs.map((r) => h("tr", {},
      h("td", {}, h("a", { href: `#/runs/${seg(r.run_id)}` }, r.run_id)),
      h("td", { class: "num" }, fmt.int(r.turns)), h("td", { class: "num" }, fmt.int(r.theorems)),
      h("td", {}, fmt.time(r.first_at)), h("td", {}, fmt.ago(r.last_at)), h("td", {}, r.has_report ? "yes" : "–")));
    mount(root, h("h1", {}, "Discovery runs"), runs.length
      ? h("table", { class: "grid", id: "runs" }, h("thead", {}, h("tr", {}, ["Run", "Journal entries", "Theorems",
        "Started", "Last entry", "Report"].map((t) => h("th", {}, t)))), h("tbody", {}, rows))
      : h("p", { class: "muted" }, "No discovery run has used this server yet (ahc discover --base-url …)."),
      history(past));
  } catch (e) {
    mount(root, h("h1", {}, "Discovery runs"), errorBox(e));
  }
}

function theorems(version) {
  try {
    return JSON.parse(version.theorems_json || "[]");
  } catch (_) {
    return [];
  }
}

function journalEntry(row) {
  return h("li", { class: "journal-entry" },
    h("span", { class: "muted" }, `#${row.turn_id} · ${fmt.time(row.timestamp)}`),
    row.journal_entry ? h("p", {}, row.journal_entry) : null,
    row.tool_call_json ? h("details", {}, h("summary", {}, "tool call"), h("pre", {}, row.tool_call_json)) : null,
    row.tool_result_json ? h("details", {}, h("summary", {}, "tool result"), h("pre", {}, row.tool_result_json)) : null);
}

export async function runPage(root, runId) {
  const back = h("p", {}, h("a", { href: "#/runs" }, "← Discovery runs"));
  mount(root, back, h("h1", {}, runId), h("p", { class: "muted" }, "Loading…"));
  try {
    const [journal, knowledge, lineage] = await Promise.all([
      getJSON("/v1/xdb/interactions", { run_id: runId }),
      getJSON("/v1/xdb/meta_knowledge", { run_id: runId, all: true }),
      getJSON("/v1/xdb/theorem_versions", { run_id: runId }),
    ]);
    const versions = knowledge.data;
    const latest = versions.length ? theorems(versions[versions.length - 1]) : [];
    const image = h("div", { id: "run-report" }, h("p", { class: "muted" }, "Loading the report…"));
    mount(root, back, h("h1", {}, runId),
      h("h2", {}, "Report"), image,
      h("h2", {}, "Theorems over time"),
      lineChart(versions.map((v) => ({ y: theorems(v).length,
        title: `version ${v.version_id} · ${fmt.time(v.created_at)} · ${theorems(v).length} theorems` })),
      { label: "theorems per knowledge version" }),
      latest.length ? h("ul", { id: "theorems" }, latest.map((t) => h("li", {},
        h("strong", {}, t.name || t.theorem_id || "theorem"), t.status ? ` (${t.status})` : "",
        t.description ? `: ${t.description}` : ""))) : h("p", { class: "muted" }, "No theorems yet."),
      lineage.data.length ? [h("h2", {}, "Theorem lineage"), h("ol", { id: "lineage" }, lineage.data.map((v) =>
        h("li", { dataset: { theorem: v.theorem_id, version: v.version } },
          h("strong", {}, `${v.theorem_id} v${v.version}`), ` ${v.change} at turn ${v.turn}`,
          v.parent_version ? h("span", { class: "muted" }, ` (from v${v.parent_version})`) : null,
          v.reason ? `: ${v.reason}` : "")))] : null,
      h("h2", {}, `Journal (${journal.data.length} entries)`),
      h("ol", { class: "journal", id: "journal" }, journal.data.map(journalEntry)));
    try {
      const url = await getBlobURL(`/v1/xdb/runs/${seg(runId)}/report.png`);
      mount(image, h("img", { src: url, alt: "coverage and accuracy over turns, cache hit ratio per turn" }));
    } catch (e) {
      mount(image, e instanceof ApiError && e.status === 404
        ? h("p", { class: "muted" }, "The run has not uploaded a report yet (it does when it ends).") : errorBox(e));
    }
  } catch (e) {
    mount(root, back, h("h1", {}, runId), errorBox(e));
  }
}
