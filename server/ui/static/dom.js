// Building the page from data without HTML strings: every text goes in as a text node, so nothing a
// model or a client wrote can become markup.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") el.className = value;
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name === "style") Object.assign(el.style, value);
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : value);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

const SVG_NS = "http://www.w3.org/2000/svg";

export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== undefined && value !== null) el.setAttribute(name, value);
  }
  append(el, children);
  return el;
}

export function mount(root, ...children) {
  root.replaceChildren();
  append(root, children);
}

export const fmt = {
  int: (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US")),
  ratio: (r) => (r === null || r === undefined ? "–" : `${(100 * r).toFixed(1)}%`),
  time: (iso) => (iso ? new Date(iso).toLocaleString() : "–"),
  ago: (iso) => {
    if (!iso) return "–";
    const seconds = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
    if (seconds < 60) return `${Math.round(seconds)} s ago`;
    if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
    if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`;
    return `${Math.round(seconds / 86400)} d ago`;
  },
};

export function errorBox(error) {
  return h("p", { class: "error", role: "alert" }, error && error.message ? error.message : String(error));
}

// One stable colour per concept name.
export function conceptHue(name) {
  let hash = 0;
  for (const ch of name) hash = (hash * 31 + ch.codePointAt(0)) >>> 0;
  return hash % 360;
}
