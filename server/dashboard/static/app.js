// Charts of the run page: uPlot fed by /runs/{id}/charts.json, refreshed every 2 s.
// Each chart's spec names its axes: x "int" (versions, steps, staleness: integer ticks) or
// "time"; y "count" (integers from 0), "zero" (from 0), "compact" (from 0, 1.2k labels),
// "ratio" (a narrow band around 1, enough decimals) or "auto".
(function () {
  "use strict";
  const COLORS = ["#0b5cad", "#b42318", "#1a7f37", "#8250df", "#c26a00", "#0a7ea4", "#6e7781"];
  const REFERENCE = /threshold|budget/;
  const INT_INCRS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1e3, 2e3, 2.5e3, 5e3, 1e4, 2e4,
    5e4, 1e5, 2e5, 5e5, 1e6, 2e6, 5e6, 1e7, 1e8, 1e9];
  const RATIO_MIN_HALF_SPAN = 0.01;
  const charts = {};

  function decimalsOf(incr) {
    const text = String(+Number(incr).toPrecision(6));
    return text.indexOf("e-") >= 0 ? 6 : (text.split(".")[1] || "").length;
  }

  function fixed(_u, splits, _axis, _space, incr) {
    const d = Math.min(6, decimalsOf(incr));
    return splits.map(function (v) { return v == null ? "" : v.toFixed(d); });
  }

  function compactNumber(v, d) {
    const a = Math.abs(v);
    const scaled = a >= 1e9 ? [v / 1e9, "G"] : a >= 1e6 ? [v / 1e6, "M"] : a >= 1e3 ? [v / 1e3, "k"] : null;
    if (!scaled) { return v.toFixed(d); }
    return String(+scaled[0].toFixed(Math.abs(scaled[0]) >= 100 ? 0 : 1)) + scaled[1];
  }

  function compact(_u, splits, _axis, _space, incr) {
    const d = Math.min(6, decimalsOf(incr));
    return splits.map(function (v) { return v == null ? "" : compactNumber(v, d); });
  }

  function clock(u, splits, _axis, _space, incr) {
    const span = u.scales.x.max - u.scales.x.min;
    const fmt = uPlot.fmtDate(span > 2 * 86400 ? "{MMM} {D}" : incr < 60 ? "{HH}:{mm}:{ss}" : "{HH}:{mm}");
    return splits.map(function (v) { return v == null ? "" : fmt(new Date(v * 1000)); });
  }

  // Wide enough for the longest tick label (no "0,000" cut at the left edge).
  function labelWidth(u, values, axisIdx) {
    if (!values || !values.length) { return 50; }
    u.ctx.font = u.axes[axisIdx].font[0];
    const widest = values.reduce(function (w, v) { return Math.max(w, u.ctx.measureText(String(v)).width); }, 0);
    return Math.max(40, Math.ceil(widest / uPlot.pxRatio) + 20);
  }

  function fromZero(_u, _min, max) { return [0, max > 0 ? max * 1.1 : 1]; }

  function ratioBand(_u, min, max) {
    if (min == null || max == null) { return [0.99, 1.01]; }
    const mid = (min + max) / 2;
    const half = Math.max((max - min) / 2 * 1.15, RATIO_MIN_HALF_SPAN);
    return [mid - half, mid + half];
  }

  function xAxis(spec) {
    if (spec.time) { return { values: clock, size: 36, space: 70 }; }
    return spec.x === "int" ? { incrs: INT_INCRS, values: fixed, size: 36 } : { values: fixed, size: 36 };
  }

  function yAxis(spec) {
    const y = spec.y || "auto";
    const axis = { size: labelWidth, values: y === "compact" || y === "count" ? compact : fixed };
    if (y === "count") { axis.incrs = INT_INCRS; }
    return axis;
  }

  function yScale(spec) {
    const y = spec.y || "auto";
    if (y === "ratio") { return { range: ratioBand }; }
    return y === "auto" ? {} : { range: fromZero };
  }

  function xScale(spec) {
    const xs = spec.data[0];
    const scale = { time: !!spec.time };
    if (spec.bars) {
      scale.range = function () { return [Math.min.apply(null, xs) - 0.5, Math.max.apply(null, xs) + 0.5]; };
    } else if (xs.length === 1) {
      const pad = spec.time ? 60 : 1;
      // Versions, steps and staleness are never negative.
      scale.range = [spec.x === "int" ? Math.max(0, xs[0] - pad) : xs[0] - pad, xs[0] + pad];
    }
    return scale;
  }

  // The first colours by hand; beyond them (a compare view of up to 32 runs) hues spread by
  // the golden angle, so that neighbours differ.
  function color(i) {
    return i < COLORS.length ? COLORS[i] : "hsl(" + Math.round((i * 137.508) % 360) + ", 70%, 38%)";
  }

  function series(spec) {
    const labels = spec.labels;
    return [{ label: labels[0] }].concat(labels.slice(1).map(function (label, i) {
      const dashed = REFERENCE.test(label);
      return { label: label, stroke: dashed ? "#c26a00" : color(i), spanGaps: true,
               width: dashed ? 1.5 : 2, dash: dashed ? [6, 4] : undefined,
               points: { show: spec.data[0].length < 40 } };
    }));
  }

  // Any measured point (reference lines such as a threshold do not count).
  function hasPoints(spec) {
    return spec.data.slice(1).some(function (values, i) {
      return !REFERENCE.test(spec.labels[i + 1]) && values.some(function (v) { return v != null; });
    });
  }

  function ticksOf(axis) {
    return (axis._values || []).filter(function (v) { return v != null && v !== ""; }).join("|");
  }

  function recordTicks(el) {
    // The drawn tick labels, read by the browser tests (uPlot draws them on a canvas).
    return function (u) {
      el.setAttribute("data-x-ticks", ticksOf(u.axes[0]));
      el.setAttribute("data-y-ticks", ticksOf(u.axes[1]));
    };
  }

  function draw(el, spec) {
    const key = el.dataset.chart;
    const width = Math.max(300, el.clientWidth || 380);
    const signature = spec.labels.join("|");
    const drawable = hasPoints(spec);
    if (drawable && charts[key] && charts[key].signature === signature && spec.data[0].length > 1) {
      charts[key].plot.setData(spec.data);
      return;
    }
    if (charts[key]) { charts[key].plot.destroy(); delete charts[key]; }
    el.innerHTML = "";
    if (!drawable) {
      el.innerHTML = '<p class="muted empty-chart">nothing yet</p>';
      return;
    }
    const s = series(spec);
    if (spec.bars) {
      s.slice(1).forEach(function (x) { x.paths = uPlot.paths.bars({ size: [0.6, 60] }); x.fill = x.stroke; });
    }
    const opts = {
      width: width, height: 220, series: s, legend: { live: false },
      padding: [12, spec.time ? 40 : 24, 0, 0],  // room for the last x label (a clock is wide)
      scales: { x: xScale(spec), y: yScale(spec) },
      axes: [xAxis(spec), yAxis(spec)],
      hooks: { draw: [recordTicks(el)] },
    };
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

  // A table with data-sortable: a header button sorts its rows by the cells' data-sort
  // values (data-sort-key "number": empty cells last; "text"), a second click reverses.
  function sortBy(table, column, numeric, button) {
    const body = table.tBodies[0];
    const ascending = button.getAttribute("aria-sort") !== "ascending";
    const rows = Array.prototype.slice.call(body.rows);
    function key(row) {
      const raw = row.cells[column].getAttribute("data-sort") || "";
      return numeric ? (raw === "" ? null : parseFloat(raw)) : raw.toLowerCase();
    }
    rows.sort(function (a, b) {
      const x = key(a), y = key(b);
      if (x === y) { return 0; }
      if (x === null) { return 1; }
      if (y === null) { return -1; }
      return (x < y ? -1 : 1) * (ascending ? 1 : -1);
    });
    rows.forEach(function (row) { body.appendChild(row); });
    table.querySelectorAll("th button").forEach(function (b) { b.removeAttribute("aria-sort"); });
    button.setAttribute("aria-sort", ascending ? "ascending" : "descending");
  }

  function sortable(table) {
    table.querySelectorAll("thead th button[data-sort-key]").forEach(function (button) {
      const column = button.closest("th").cellIndex;
      button.addEventListener("click", function () {
        sortBy(table, column, button.dataset.sortKey === "number", button);
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("table[data-sortable]").forEach(sortable);
    const root = document.querySelector("[data-charts-url]");
    if (!root || typeof uPlot === "undefined") { return; }
    refresh(root);
    const every = parseInt(root.dataset.refreshMs || "2000", 10);
    setInterval(function () { refresh(root); }, every);
  });
})();
