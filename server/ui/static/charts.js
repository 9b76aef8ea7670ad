// Inline SVG charts: no library, a few shapes each.

import { s, fmt } from "./dom.js";

// Prompt tokens per turn as bars, the cached part of each drawn over it.
export function cacheChart(turns, { width = 720, height = 160 } = {}) {
  const pad = { left: 48, right: 8, top: 10, bottom: 22 };
  const innerW = width - pad.left - pad.right;
  const innerH = height - pad.top - pad.bottom;
  const max = Math.max(1, ...turns.map((t) => t.prompt_tokens || 0));
  const step = innerW / Math.max(1, turns.length);
  const barW = Math.max(1, Math.min(28, step * 0.8));
  const y = (v) => pad.top + innerH - (innerH * v) / max;
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart cache-chart", role: "img",
    "aria-label": "cached and prompt tokens per turn" });
  svg.append(s("line", { x1: pad.left, x2: width - pad.right, y1: y(0), y2: y(0), class: "axis" }));
  svg.append(s("text", { x: pad.left - 6, y: y(max) + 4, class: "tick", "text-anchor": "end" }, fmt.int(max)));
  svg.append(s("text", { x: pad.left - 6, y: y(0), class: "tick", "text-anchor": "end" }, "0"));
  turns.forEach((t, i) => {
    const x = pad.left + i * step + (step - barW) / 2;
    const prompt = t.prompt_tokens || 0;
    const cached = t.cached_tokens || 0;
    const label = `turn ${t.index}: ${fmt.int(cached)} of ${fmt.int(prompt)} prompt tokens cached`;
    svg.append(s("rect", { x, y: y(prompt), width: barW, height: y(0) - y(prompt), class: "bar-prompt",
      "data-turn": t.index }, s("title", {}, label)));
    svg.append(s("rect", { x, y: y(cached), width: barW, height: y(0) - y(cached), class: "bar-cached",
      "data-turn": t.index }, s("title", {}, label)));
    if (turns.length <= 40 || i % Math.ceil(turns.length / 40) === 0) {
      svg.append(s("text", { x: x + barW / 2, y: height - 6, class: "tick", "text-anchor": "middle" }, t.index));
    }
  });
  return svg;
}

// A line over time (e.g. theorems per knowledge version).
export function lineChart(points, { width = 720, height = 140, label = "" } = {}) {
  const pad = { left: 40, right: 8, top: 10, bottom: 22 };
  const innerW = width - pad.left - pad.right;
  const innerH = height - pad.top - pad.bottom;
  const max = Math.max(1, ...points.map((p) => p.y));
  const x = (i) => pad.left + (points.length <= 1 ? innerW / 2 : (innerW * i) / (points.length - 1));
  const y = (v) => pad.top + innerH - (innerH * v) / max;
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart line-chart", role: "img",
    "aria-label": label });
  svg.append(s("line", { x1: pad.left, x2: width - pad.right, y1: y(0), y2: y(0), class: "axis" }));
  svg.append(s("text", { x: pad.left - 6, y: y(max) + 4, class: "tick", "text-anchor": "end" }, fmt.int(max)));
  if (points.length) {
    const d = points.map((p, i) => `${i ? "L" : "M"}${x(i).toFixed(1)},${y(p.y).toFixed(1)}`).join(" ");
    svg.append(s("path", { d, class: "line" }));
    points.forEach((p, i) => svg.append(s("circle", { cx: x(i), cy: y(p.y), r: 3, class: "dot" },
      s("title", {}, p.title || `${p.y}`))));
  }
  return svg;
}
