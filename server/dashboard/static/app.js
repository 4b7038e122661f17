// Charts of the run page: uPlot fed by /runs/{id}/charts.json, refreshed every 2 s.
(function () {
  "use strict";
  const COLORS = ["#0b5cad", "#b42318", "#1a7f37", "#8250df", "#c26a00", "#0a7ea4", "#6e7781"];
  const charts = {};

  function series(labels, spec) {
    return [{ label: labels[0] }].concat(labels.slice(1).map(function (label, i) {
      const dashed = /threshold|budget/.test(label);
      return { label: label, stroke: dashed ? "#c26a00" : COLORS[i % COLORS.length],
               width: dashed ? 1.5 : 2, dash: dashed ? [6, 4] : undefined,
               points: { show: spec.data[0].length < 40 } };
    }));
  }

  function draw(el, spec) {
    const key = el.dataset.chart;
    const width = Math.max(300, el.clientWidth || 380);
    const signature = spec.labels.join("|");
    if (charts[key] && charts[key].signature === signature && spec.data[0].length > 1) {
      charts[key].plot.setData(spec.data);
      return;
    }
    if (charts[key]) { charts[key].plot.destroy(); }
    el.innerHTML = "";
    if (!spec.data[0].length) {
      el.innerHTML = '<p class="muted">no data yet</p>';
      return;
    }
    const s = series(spec.labels, spec);
    if (spec.bars) {
      s.slice(1).forEach(function (x) { x.paths = uPlot.paths.bars({ size: [0.6, 60] }); x.fill = x.stroke; });
    }
    const x = { time: !!spec.time };
    if (spec.data[0].length === 1) {
      const v = spec.data[0][0], pad = spec.time ? 60 : 1;
      x.range = [v - pad, v + pad];
    }
    const opts = { width: width, height: 220, series: s, scales: { x: x }, legend: { live: false } };
    charts[key] = { signature: signature, plot: new uPlot(opts, spec.data, el) };
  }

  function refresh(root) {
    fetch(root.dataset.chartsUrl, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (all) {
        if (!all) { return; }
        root.querySelectorAll("[data-chart]").forEach(function (el) {
          const spec = all[el.dataset.chart];
          if (spec) { draw(el, spec); el.setAttribute("data-points", String(spec.data[0].length)); }
        });
      })
      .catch(function () { /* the next poll retries */ });
  }

  document.addEventListener("DOMContentLoaded", function () {
    const root = document.querySelector("[data-charts-url]");
    if (!root || typeof uPlot === "undefined") { return; }
    refresh(root);
    setInterval(function () { refresh(root); }, 2000);
  });
})();
