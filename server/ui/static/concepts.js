// Concepts: the lens pack's hierarchy as a tree, and the buds growing toward new concepts (a tag's status on
// its way to a lens: candidate, ready, submitted, grafted or rejected); a concept's page lists the tokens,
// across the caller's sessions, that activated it most, each linking to its turn.

import { getJSON, seg } from "./api.js";
import { conceptHue, errorBox, fmt, h, mount } from "./dom.js";

function tree(concepts) {
  const byName = new Map(concepts.map((c) => [c.name, c]));
  const children = new Map();
  const roots = [];
  for (const c of concepts) {
    if (c.parent && byName.has(c.parent)) {
      if (!children.has(c.parent)) children.set(c.parent, []);
      children.get(c.parent).push(c);
    } else {
      roots.push(c);
    }
  }
  const node = (c) => h("li", {},
    h("span", { class: "swatch", style: { backgroundColor: `hsl(${conceptHue(c.name)}, 75%, 55%)` } }),
    h("a", { href: `#/concepts/${seg(c.name)}`, dataset: { concept: c.name } }, c.display_name || c.name),
    c.display_name && c.display_name !== c.name ? h("span", { class: "muted" }, ` (${c.name})`) : null,
    c.auto_tag_threshold !== null && c.auto_tag_threshold !== undefined
      ? h("span", { class: "muted" }, ` · auto-tag ≥ ${c.auto_tag_threshold}`) : null,
    children.has(c.name) ? h("ul", {}, children.get(c.name).map(node)) : null);
  return h("ul", { class: "tree", id: "concept-tree" }, roots.map(node));
}

export async function conceptsPage(root) {
  mount(root, h("h1", {}, "Concepts"), h("p", { class: "muted" }, "Loading…"));
  try {
    const [concepts, buds] = await Promise.all([getJSON("/v1/xdb/concepts").then((r) => r.data),
      getJSON("/v1/xdb/buds").then((r) => r.data)]);
    mount(root, h("h1", {}, "Concepts"),
      concepts.length ? tree(concepts) : h("p", { class: "muted" }, "No concepts yet: serve with a lens pack."),
      buds.length ? [h("h2", {}, "Buds"), h("table", { class: "grid", id: "buds" },
        h("thead", {}, h("tr", {}, ["Bud", "Status", "Examples", "Since"].map((t) => h("th", {}, t)))),
        h("tbody", {}, buds.map((b) => h("tr", {}, h("td", {}, b.name), h("td", {}, b.bud_status),
          h("td", { class: "num" }, fmt.int(b.examples)), h("td", {}, fmt.time(b.created_at))))))] : null);
  } catch (e) {
    mount(root, h("h1", {}, "Concepts"), errorBox(e));
  }
}

// A related concept's relation (xdb/recall/relations.py), as the page words it.
const RELATIONS = { parent: "its parent", child: "its child", sibling: "its sibling", co_activated: "often active with it" };

export async function conceptPage(root, concept) {
  mount(root, h("p", {}, h("a", { href: "#/concepts" }, "← Concepts")), h("h1", {}, concept),
    h("p", { class: "muted" }, "Loading…"));
  try {
    const [tokens, related] = await Promise.all([
      getJSON(`/v1/xdb/concepts/${seg(concept)}/top_tokens`, { limit: 100 }),
      getJSON(`/v1/xdb/concepts/${seg(concept)}/related`, { limit: 10 }).catch(() => ({ data: [] })),
    ]);
    const rows = tokens.data.map((t) => h("tr", {},
      h("td", { class: "num" }, t.activation.toFixed(3)),
      h("td", {}, h("code", { class: "tok-text" }, JSON.stringify(t.content))),
      h("td", {}, h("a", { class: "turn-link", href: `#/session/${seg(t.session_id)}?tick=${t.tick}` },
        `${t.session_id} · tick ${t.tick}`))));
    mount(root, h("p", {}, h("a", { href: "#/concepts" }, "← Concepts")), h("h1", {}, concept),
      h("h2", {}, "Tokens that activated it most"),
      rows.length ? h("table", { class: "grid", id: "top-tokens" },
        h("thead", {}, h("tr", {}, h("th", {}, "Activation"), h("th", {}, "Token"), h("th", {}, "Where"))),
        h("tbody", {}, rows)) : h("p", { class: "muted" }, "No token has activated it yet."),
      related.data.length ? [h("h2", {}, "Related"), h("ul", { id: "related" }, related.data.map((r) =>
        h("li", {}, h("a", { href: `#/concepts/${seg(r.concept)}` }, r.concept), ` · ${RELATIONS[r.relation] || r.relation}`,
          r.together ? `, ${r.together} tokens together` : "")))] : null);
  } catch (e) {
    mount(root, h("p", {}, h("a", { href: "#/concepts" }, "← Concepts")), h("h1", {}, concept), errorBox(e));
  }
}
