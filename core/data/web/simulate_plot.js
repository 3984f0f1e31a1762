// fsched simulate --plot: draws window.FSCHED_PLOT (core/sim/plotdata.py) with uPlot, one row a policy.
(function () {
  "use strict";
  const data = window.FSCHED_PLOT;
  const CLASS_COLOURS = { realtime: "#d62728", streaming: "#ff7f0e", batch: "#1f77b4" };
  const TENANT_COLOURS = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"];
  const WIDTH = 420, HEIGHT = 240;

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => e.setAttribute(k, v));
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function seconds(v) {
    if (v == null) return "";
    return v < 1 ? (v * 1000).toFixed(0) + " ms" : v < 60 ? v.toFixed(1) + " s" : (v / 60).toFixed(1) + " min";
  }

  function cdfChart(p, box) {
    // uPlot wants one x array: merge the classes' latencies and leave gaps where a class has no point.
    const classes = Object.keys(p.cdf);
    const xs = Array.from(new Set(classes.flatMap((c) => p.cdf[c].x))).sort((a, b) => a - b);
    const columns = classes.map((c) => {
      const at = new Map(p.cdf[c].x.map((x, i) => [x, p.cdf[c].y[i]]));
      return xs.map((x) => (at.has(x) ? at.get(x) : null));
    });
    return new uPlot({
      title: "first-token latency CDF", width: WIDTH, height: HEIGHT,
      scales: { x: { time: false, distr: 3 }, y: { range: [0, 1] } },
      axes: [{ values: (u, vals) => vals.map(seconds) }, { values: (u, vals) => vals.map((v) => (v * 100).toFixed(0) + "%") }],
      series: [{ label: "latency", value: (u, v) => seconds(v) },
        ...classes.map((c) => ({ label: c, stroke: CLASS_COLOURS[c], width: 2, spanGaps: true,
          value: (u, v) => (v == null ? "" : (v * 100).toFixed(1) + "%") }))],
    }, [xs, ...columns], box);
  }

  function shareChart(p, box) {
    const tenants = Object.keys(p.shares);
    const series = [{ label: "time", value: (u, v) => seconds(v) }];
    const columns = [p.time];
    tenants.forEach((t, i) => {
      const colour = TENANT_COLOURS[i % TENANT_COLOURS.length];
      series.push({ label: t + " served", stroke: colour, width: 2 });
      columns.push(p.shares[t]);
      series.push({ label: t + " entitled", stroke: colour, width: 1, dash: [6, 4] });
      columns.push(p.entitled[t]);
    });
    return new uPlot({
      title: "served share (last " + seconds(p.window_s) + ") vs entitled", width: WIDTH, height: HEIGHT,
      scales: { x: { time: false }, y: { range: [0, 1] } },
      axes: [{ values: (u, vals) => vals.map(seconds) }, { values: (u, vals) => vals.map((v) => (v * 100).toFixed(0) + "%") }],
      series,
    }, columns, box);
  }

  function queueChart(p, box) {
    const classes = Object.keys(p.waiting);
    return new uPlot({
      title: "queue depth", width: WIDTH, height: HEIGHT, scales: { x: { time: false } },
      axes: [{ values: (u, vals) => vals.map(seconds) }, {}],
      series: [{ label: "time", value: (u, v) => seconds(v) },
        ...classes.map((c) => ({ label: c + " waiting", stroke: CLASS_COLOURS[c], width: 2 })),
        { label: "running", stroke: "#7f7f7f", width: 1, dash: [4, 3] }],
    }, [p.time, ...classes.map((c) => p.waiting[c]), p.running], box);
  }

  document.title = data.title;
  const root = document.getElementById("plots");
  root.appendChild(el("h1", {}, data.title));
  data.policies.forEach((p) => {
    const row = el("section", { class: "policy", "data-policy": p.policy });
    row.appendChild(el("h2", {}, p.policy));
    const charts = el("div", { class: "charts" });
    row.appendChild(charts);
    root.appendChild(row);
    [cdfChart, shareChart, queueChart].forEach((draw) => {
      const box = el("div", { class: "chart" });
      charts.appendChild(box);
      draw(p, box);
    });
  });
  window.FSCHED_PLOT_READY = true;
})();
