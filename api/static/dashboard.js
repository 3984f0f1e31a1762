// fsched /dashboard: polls /dashboard/api/state with the key as a Bearer header and draws it.
(function () {
  "use strict";
  const POLL_MS = 1000;
  const KEEP_S = 900;
  const KEY_SLOT = "fsched-dashboard-key";
  const CLASSES = ["realtime", "streaming", "batch"];
  const CLASS_COLOURS = { realtime: "#d62728", streaming: "#ff7f0e", batch: "#1f77b4" };
  const TENANT_COLOURS = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#ff7f0e"];
  const $ = (id) => document.getElementById(id);

  let key = sessionStorage.getItem(KEY_SLOT);
  let history = [];
  let timer = null;
  let last = null;
  const charts = {};

  // -- formatting ----------------------------------------------------------------------------
  const pct = (v) => (v == null ? "–" : (v * 100).toFixed(0) + "%");
  const num = (v) => (v == null ? "–" : Number(v).toLocaleString("en-US"));
  const secs = (v) => (v == null ? "–" : v < 1 ? (v * 1000).toFixed(0) + " ms" : v.toFixed(2) + " s");
  const age = (s) => (s < 60 ? s.toFixed(0) + "s" : s < 3600 ? Math.floor(s / 60) + "m" : Math.floor(s / 3600) + "h");

  function cell(text, opts) {
    const td = document.createElement("td");
    td.textContent = text;
    opts = opts || {};
    if (opts.cls) td.className = opts.cls;
    if (opts.metric) {
      td.dataset.metric = opts.metric;
      td.dataset.value = opts.value == null ? "" : String(opts.value);
      Object.entries(opts.labels || {}).forEach(([k, v]) => (td.dataset["label" + k[0].toUpperCase() + k.slice(1)] = v));
    }
    if (opts.field) td.dataset.field = opts.field;
    return td;
  }

  function table(id, headers, rows, empty) {
    const t = $(id);
    t.replaceChildren();
    const head = document.createElement("tr");
    headers.forEach((h) => {
      const th = document.createElement("th");
      const [label, left] = Array.isArray(h) ? h : [h, false];
      th.textContent = label;
      if (left) th.className = "l";
      head.appendChild(th);
    });
    t.appendChild(head);
    rows.forEach((r) => t.appendChild(r));
    if (!rows.length) {
      const tr = document.createElement("tr");
      const td = cell(empty, { cls: "l dim" });
      td.colSpan = headers.length;
      tr.appendChild(td);
      t.appendChild(tr);
    }
  }

  function row(cells, attrs) {
    const tr = document.createElement("tr");
    cells.forEach((c) => tr.appendChild(c));
    Object.entries(attrs || {}).forEach(([k, v]) => (tr.dataset[k] = v));
    return tr;
  }

  // -- tables --------------------------------------------------------------------------------
  function tenantsTable(s) {
    const admin = s.viewer.admin;
    const focused = document.activeElement;
    const caret = focused && focused.matches("#tenants input.weight")
      ? [focused.closest("tr").dataset.tenant, focused.selectionStart, focused.selectionEnd] : null;
    const rows = s.tenants.map((t) => {
      const off = t.active && t.served_share != null && Math.abs(t.served_share - t.entitled_share) > 0.05;
      const weight = cell(String(t.weight), { field: "weight" });
      if (admin) weight.replaceChildren(weightEditor(t));
      return row([
        cell(t.name, { cls: "l" }), weight,
        cell(t.active ? pct(t.entitled_share) : "(" + pct(t.entitled_share) + ")",
          { metric: "fsched:tenant_entitled_share", value: t.entitled_share, labels: { tenant: t.name },
            cls: t.active ? "" : "dim" }),
        cell(pct(t.served_share), { metric: "fsched:tenant_served_share", value: t.served_share,
          labels: { tenant: t.name }, cls: off ? "off" : "" }),
        cell(onTarget(t.slo)),
        cell(num(t.queued)), cell(num(t.running)),
        cell(num(t.generated_tokens), { metric: "fsched:generation_tokens_total", value: t.generated_tokens,
          labels: { tenant: t.name } }),
        cell(num(t.prompt_tokens), { metric: "fsched:prompt_tokens_total", value: t.prompt_tokens,
          labels: { tenant: t.name } }),
        cell(num(t.requests.done) + " / " + num(t.requests.failed) + " / " + num(t.requests.cancelled)),
      ], { tenant: t.name });
    });
    table("tenants", [["tenant", true], "weight", "entitled", "served recently", "first token on target",
      "queued", "running",
      "generated tokens", "prompt tokens", "done / failed / cancelled"], rows, "no tenants yet");
    if (caret) {
      const tr = [...$("tenants").querySelectorAll("tr")].find((r) => r.dataset.tenant === caret[0]);
      const again = tr && tr.querySelector("input.weight");
      if (again) {
        again.focus();
        again.setSelectionRange(caret[1], caret[2]);
      }
    }
  }

  // A tenant's first tokens on target per class, over the live daemons since they started.
  function onTarget(slo) {
    const parts = CLASSES.filter((c) => slo[c] && slo[c].first_tokens).map((c) =>
      c + " " + pct(slo[c].on_target / slo[c].first_tokens) + " of " + num(slo[c].first_tokens));
    return parts.length ? parts.join("  ") : "–";
  }

  // A refresh rebuilds the tenants table every few seconds: what an admin is typing into a
  // weight field is kept here (by tenant) so that the rebuild neither wipes it nor steals focus.
  const weightDrafts = new Map();

  function weightEditor(t) {
    const form = document.createElement("form");
    const input = document.createElement("input");
    input.className = "weight";
    input.value = weightDrafts.has(t.name) ? weightDrafts.get(t.name) : String(t.weight);
    input.setAttribute("aria-label", "weight of " + t.name);
    input.addEventListener("input", () => weightDrafts.set(t.name, input.value));
    const button = document.createElement("button");
    button.type = "submit";
    button.textContent = "set";
    form.append(input, button);
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const answer = await api("POST", "/dashboard/api/weights", { tenant: t.name, weight: Number(input.value) });
      if (answer.ok) {
        weightDrafts.delete(t.name);
        await refresh();
      }
      else alert((await answer.json()).error.message);
    });
    return form;
  }

  function queuesTable(s) {
    const rows = s.queues.map((q) => row([
      cell(q.tenant, { cls: "l" }), cell(q.class, { cls: "l" }),
      cell(num(q.waiting), { metric: "fsched:num_requests_waiting", value: q.waiting,
        labels: { tenant: q.tenant, class: q.class } }),
      cell(num(q.running), { metric: "fsched:num_requests_running", value: q.running,
        labels: { tenant: q.tenant, class: q.class } }),
    ]));
    table("queues", [["tenant", true], ["class", true], "waiting", "running"], rows, "nothing queued");
  }

  function daemonsTable(s) {
    const rows = s.daemons.map((d) => row([
      cell(d.id, { cls: "l" }), cell(d.host, { cls: "l" }), cell(d.device, { cls: "l" }),
      cell(d.state, { cls: "l state-" + d.state }), cell(age(d.heartbeat_age_s) + " ago"),
      cell(d.batch == null ? "" : String(d.batch)), cell(d.tok_s == null ? "" : d.tok_s.toFixed(0)),
      d.state === "alive" ? cell(pct(d.kv_use), { metric: "fsched:kv_cache_usage_perc", value: d.kv_use,
        labels: { daemon: d.id } }) : cell(""),
      d.state === "alive" && d.preemptions != null ? cell(num(d.preemptions), {
        metric: "fsched:num_preemptions_total", value: d.preemptions, labels: { daemon: d.id } }) : cell(""),
    ]));
    table("daemons", [["daemon", true], ["host", true], ["device", true], ["state", true], "heartbeat",
      "batch", "tokens/s", "KV in use", "preemptions"], rows, "no daemon has run on this table");
  }

  function jobsTable(s) {
    const rows = s.jobs.map((j) => {
      const bar = document.createElement("span");
      bar.className = "bar";
      const fill = document.createElement("span");
      fill.style.width = (j.progress * 100).toFixed(1) + "%";
      bar.appendChild(fill);
      const progress = cell("");
      progress.appendChild(bar);
      return row([
        cell(String(j.id), { field: "id" }), cell(j.name, { cls: "l", field: "name" }), cell(j.tenant, { cls: "l" }),
        cell(j.class, { cls: "l" }), cell(j.state, { cls: "l state-" + j.state, field: "state" }), progress,
        cell(j.num_done + "/" + j.num_requests + (j.num_failed ? " (" + j.num_failed + " failed)" : ""),
          { field: "done" }),
        cell(num(j.num_running), { field: "num_running" }), cell(num(j.num_waiting), { field: "num_waiting" }),
        cell(num(j.num_output_tokens), { field: "num_output_tokens" }), cell(age(j.age_s)),
      ], { jobId: String(j.id), numDone: String(j.num_done), numRequests: String(j.num_requests),
        tenant: j.tenant });
    });
    table("jobs", ["id", ["name", true], ["tenant", true], ["class", true], ["state", true], "progress",
      "done", "running", "waiting", "tokens", "age"], rows, "no jobs");
  }

  function onlineTable(s) {
    const rows = s.online.map((g) => row([
      cell(g.tenant, { cls: "l" }), cell(g.key_id || "(generate)", { cls: "l" }), cell(num(g.requests)),
      cell(num(g.in_flight)), cell(num(g.done)), cell(num(g.failed)), cell(num(g.cancelled)),
      cell(num(g.generated_tokens)), cell(secs(g.ttft_p50_s)), cell(secs(g.ttft_p99_s)),
    ], { tenant: g.tenant }));
    table("online", [["tenant", true], ["key", true], "requests", "in flight", "done", "failed", "cancelled",
      "tokens", "first token p50", "p99"], rows, "no online requests");
  }

  function whyTable(s) {
    const rows = s.why.map((w) => row([
      cell(w.id), cell(w.tenant, { cls: "l" }), cell(w.class, { cls: "l" }), cell(w.state, { cls: "l" }),
      cell(w.state === "running" ? "" : w.waited_s.toFixed(1) + "s"), cell(num(w.generated)),
      cell(w.why, { cls: "why" }),
    ], { tenant: w.tenant, requestId: w.id }));
    table("why", ["request", ["tenant", true], ["class", true], ["state", true], "waited", "generated",
      ["why", true]], rows, "nothing running or waiting");
  }

  function tiles(s) {
    const d = $("tile-daemons");
    d.textContent = String(s.daemons_alive);
    d.dataset.value = String(s.daemons_alive);
    $("tile-toks").textContent = s.engine.tok_s.toFixed(0);
    const kv = s.daemons.filter((x) => x.state === "alive" && x.kv_use != null).map((x) => x.kv_use);
    $("tile-kv").textContent = kv.length ? pct(Math.max(...kv)) : "–";
    $("tile-preempt").textContent = num(s.engine.preemptions) + (s.engine.preemption_cost == null ? "" :
      " (" + (100 * s.engine.preemption_cost).toFixed(2) + "% of tokens)");
    const jain = $("tile-jain");
    jain.textContent = s.fairness_jain == null ? "–" : s.fairness_jain.toFixed(3);
    jain.dataset.value = s.fairness_jain == null ? "" : String(s.fairness_jain);
    const parts = CLASSES.filter((c) => s.ttft[c]).map((c) => c + " " + secs(s.ttft[c].p50) + " / " +
      secs(s.ttft[c].p99) + " (" + s.ttft[c].count + ")");
    $("tile-ttft").textContent = parts.length ? parts.join("   ") : "no first token in the last minute";
  }

  // -- charts --------------------------------------------------------------------------------
  function size(box) {
    return { width: Math.max(320, box.clientWidth - 10), height: 220 };
  }

  function draw(name, box, series, columns, yOpts) {
    const labels = series.map((s) => s.label).join("|");
    const c = charts[name];
    if (c && c.labels === labels) {
      c.plot.setData(columns);
      return;
    }
    if (c) c.plot.destroy();
    const opts = Object.assign({ ...size(box), scales: { y: yOpts || {} }, legend: { live: false },
      series: [{}, ...series], axes: [{}, { size: 60 }] });
    charts[name] = { labels, plot: new uPlot(opts, columns, box) };
  }

  function tenantNames() {
    const names = new Set();
    history.forEach((h) => Object.keys(h.entitled).concat(Object.keys(h.served)).forEach((n) => names.add(n)));
    return [...names].sort();
  }

  function renderCharts() {
    const t = history.map((h) => h.t);
    const tenants = tenantNames();
    const colour = (i) => TENANT_COLOURS[i % TENANT_COLOURS.length];
    const shareSeries = [], shareCols = [t];
    tenants.forEach((n, i) => {
      shareSeries.push({ label: n + " served", stroke: colour(i), width: 2 });
      shareCols.push(history.map((h) => (n in h.served ? h.served[n] : null)));
      shareSeries.push({ label: n + " entitled", stroke: colour(i), width: 1, dash: [6, 4] });
      shareCols.push(history.map((h) => (n in h.entitled ? h.entitled[n] : null)));
    });
    draw("shares", $("chart-shares"), shareSeries, shareCols, { range: [0, 1] });

    const qSeries = [], qCols = [t];
    CLASSES.forEach((c) => {
      qSeries.push({ label: c + " waiting", stroke: CLASS_COLOURS[c], width: 2 });
      qCols.push(history.map((h) => h.waiting[c]));
      qSeries.push({ label: c + " running", stroke: CLASS_COLOURS[c], width: 1, dash: [4, 3] });
      qCols.push(history.map((h) => h.running[c]));
    });
    draw("queues", $("chart-queues"), qSeries, qCols);

    const lSeries = [], lCols = [t];
    CLASSES.forEach((c) => {
      lSeries.push({ label: c + " p50", stroke: CLASS_COLOURS[c], width: 2 });
      lCols.push(history.map((h) => (c in h.ttft_p50 ? h.ttft_p50[c] : null)));
      lSeries.push({ label: c + " p99", stroke: CLASS_COLOURS[c], width: 1, dash: [6, 4] });
      lCols.push(history.map((h) => (c in h.ttft_p99 ? h.ttft_p99[c] : null)));
    });
    draw("ttft", $("chart-ttft"), lSeries, lCols);

    const kSeries = [{ label: "all (engine)", stroke: "#1d2330", width: 2 }], kCols = [t, history.map((h) => h.tok_s)];
    tenants.forEach((n, i) => {
      kSeries.push({ label: n, stroke: colour(i), width: 1.5 });
      kCols.push(history.map((h) => (n in h.tok_s_by_tenant ? h.tok_s_by_tenant[n] : null)));
    });
    draw("tokens", $("chart-tokens"), kSeries, kCols);
  }

  // -- the loop ------------------------------------------------------------------------------
  function api(method, path, body) {
    const headers = { Authorization: "Bearer " + key };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    return fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store" });
  }

  function status(text, error) {
    const el = $("status");
    el.textContent = text;
    el.className = "status" + (error ? " error" : "");
  }

  async function refresh() {
    const since = history.length ? history[history.length - 1].t : null;
    const answer = await api("GET", "/dashboard/api/state" + (since == null ? "" : "?since=" + since));
    if (answer.status === 401) {
      forget("that key was refused (unknown, malformed or revoked)");
      return null;
    }
    if (!answer.ok) {
      status("the server answered " + answer.status, true);
      return null;
    }
    const s = await answer.json();
    history = history.concat(s.history).filter((h) => h.t > s.now - KEEP_S);
    last = s;
    $("viewer").textContent = "tenant " + s.viewer.tenant + (s.viewer.admin ? " (admin)" : "");
    tiles(s); tenantsTable(s); queuesTable(s); daemonsTable(s); jobsTable(s); onlineTable(s); whyTable(s);
    renderCharts();
    document.body.dataset.updated = String(s.now);
    status("live, updated " + new Date(s.now * 1000).toLocaleTimeString());
    return s;
  }

  async function tick() {
    try {
      await refresh();
    } catch (err) {
      status("cannot reach the server: " + err.message, true);
    }
    if (key) timer = setTimeout(tick, POLL_MS);
  }

  function start() {
    $("login").hidden = true;
    $("main").hidden = false;
    $("forget").hidden = false;
    tick();
  }

  function forget(why) {
    clearTimeout(timer);
    key = null;
    sessionStorage.removeItem(KEY_SLOT);
    history = [];
    $("main").hidden = true;
    $("login").hidden = false;
    $("forget").hidden = true;
    $("viewer").textContent = "";
    status(why || "not connected", Boolean(why));
  }

  $("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    key = $("key").value.trim();
    $("key").value = "";
    sessionStorage.setItem(KEY_SLOT, key);
    start();
  });
  $("forget").addEventListener("click", () => forget());
  window.addEventListener("resize", () => Object.values(charts).forEach((c) => c.plot.setSize(size(c.plot.root.parentNode))));
  // For tests and scripts: read once now, and the last state read.
  window.fschedDashboard = { refresh, state: () => last };
  if (key) start();
})();
