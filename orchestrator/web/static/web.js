// tcplab serve: draws the plots (plotly.js served by this app) and submits the filter form on change.
// Plot data arrives as JSON (a <script type="application/json" data-plot> block, or /run/ID/figures.json):
// no inline script, nothing from another origin.
"use strict";
const PLOT_CONFIG = {responsive: true, displaylogo: false};

function draw(target, fig) {
  return Plotly.newPlot(target, fig.data, fig.layout, PLOT_CONFIG);
}

function text(tag, value, cls) {
  const el = document.createElement(tag);
  el.textContent = value === null || value === undefined ? "–" : String(value);
  if (cls) el.className = cls;
  return el;
}

function fmt(v) {
  if (v === null || v === undefined) return "–";
  const a = Math.abs(v);
  return a >= 100 ? v.toFixed(0) : a >= 1 ? v.toFixed(2) : v.toFixed(4);
}

async function runPlots(box) {
  const status = document.getElementById("plot-status");
  try {
    const resp = await fetch(box.dataset.src, {headers: {"Accept": "application/json"}});
    const body = await resp.json();
    if (!resp.ok) throw new Error(body.error || resp.statusText);
    const metrics = document.getElementById("metrics-body");
    for (const m of body.metrics) {
      const tr = document.createElement("tr");
      tr.append(text("td", m.name), text("td", fmt(m.value), "num"), text("td", m.unit));
      metrics.append(tr);
    }
    const w = body.window;
    document.getElementById("window").textContent =
      `analysis window: ${w.rule}, from ${fmt(w.start_s)} s for ${fmt(w.length_s)} s`;
    const notes = document.getElementById("notes");
    for (const n of body.notes) notes.append(text("li", n));
    const drawn = [];
    for (const [id, fig] of Object.entries(body.figures)) {
      const div = document.getElementById("plot-" + id);
      if (!div) continue;
      if (!fig.data.length) { div.append(text("p", "no data for this plot", "note")); div.classList.add("empty"); continue; }
      drawn.push(draw(div, fig));
    }
    await Promise.all(drawn);
    status.textContent = "";
    document.body.dataset.plots = "ready";
  } catch (err) {
    status.textContent = "plots could not be made: " + err.message;
    status.className = "problem";
    document.body.dataset.plots = "error";
  }
}

document.addEventListener("DOMContentLoaded", async () => {
  for (const form of document.querySelectorAll("form.autosubmit")) {
    // empty fields stay out of the URL (the filters in the address are the ones set)
    form.addEventListener("submit", () => {
      for (const el of form.elements) if (el.name && el.value === "") el.disabled = true;
    });
    for (const sel of form.querySelectorAll("select")) {
      sel.addEventListener("change", () => {
        const page = form.querySelector("input[name=page]");
        if (page) page.value = "1";
        form.requestSubmit();
      });
    }
  }
  const box = document.getElementById("plots");
  if (box && box.dataset.src) { await runPlots(box); return; }
  const blocks = [...document.querySelectorAll("script[type='application/json'][data-plot]")];
  await Promise.all(blocks.map(b => draw(document.getElementById(b.dataset.plot), JSON.parse(b.textContent))));
  if (blocks.length) document.body.dataset.plots = "ready";
});
