// The page of `tuner serve`: it reads the JSON API of the same process and draws what it gets.
// Studies (polled every few seconds) -> a click opens one: its best-so-far curve (SVG) and trials.
// Winners per GPU and coverage come from /coverage of each family in /families.
// Jobs (polled with the studies): their progress, a form that submits one, a button that cancels
// one; the token typed in is kept until the tab closes and sent as `Authorization: Bearer`.
"use strict";

const POLL_MS = 3000;
let chosen = null;        // the id of the study open below the list
let families = [];

const $ = (sel) => document.querySelector(sel);
const fmt = (v, digits = 4) => (v === null || v === undefined) ? "-" : Number(v).toFixed(digits);
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const problemKey = (shape, dtype, flags) =>
  shape.join("x") + "-" + dtype + Object.keys(flags).sort().map((k) =>
    flags[k] === true ? "-" + k : (flags[k] === false ? "" : "-" + k + "=" + flags[k])).join("");
const params = (p) => Object.entries(p).map(([k, v]) => k + "=" + v).join(" ");

// Set an element's HTML only where it changed: a refresh that brings nothing new redraws
// nothing (no flicker, and what a reader points at stays).
const drawn = new WeakMap();
function setHTML(el, html) {
  if (drawn.get(el) !== html) {
    el.innerHTML = html;
    drawn.set(el, html);
  }
}

const TOKEN_KEY = "tuner-token";
const token = () => sessionStorage.getItem(TOKEN_KEY) || "";

// A call to the API of this server, with the token where one was given; a refusal is an Error
// whose message is the server's one line.
async function call(method, path, body) {
  const headers = {Accept: "application/json"};
  if (token()) headers.Authorization = "Bearer " + token();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const answer = await fetch(path, {method, headers, body: body === undefined ? undefined : JSON.stringify(body)});
  let found = null;
  try {
    found = await answer.json();
  } catch (error) {
    if (answer.ok) throw new Error(`${path}: not JSON`);
  }
  if (!answer.ok) throw new Error(String((found && found.detail) || `${answer.status} ${answer.statusText}`).split("\n")[0]);
  return found;
}
const get = (path) => call("GET", path);

function status(text, bad) {
  const el = $("#status");
  el.textContent = text;
  el.className = "status" + (bad ? " error" : "");
}

// -- studies ------------------------------------------------------------------------------------
async function loadStudies() {
  const studies = await get("/studies");
  const rows = studies.map((s) => {
    const budget = s.settings && s.settings.trials;
    const share = budget ? Math.min(1, s.n_trials / budget) : (s.status === "finished" ? 1 : 0);
    const progress = `<span class="bar"><i style="width:${(100 * share).toFixed(0)}%"></i></span> ` +
      `${s.n_trials}${budget ? " / " + budget : ""}`;
    return `<tr class="pick${s.id === chosen ? " chosen" : ""}" data-id="${s.id}" title="${esc(s.name)}">` +
      `<td>${s.id}</td><td>${esc(s.family)}</td><td>${esc(problemKey(s.shape, s.dtype, s.flags))}</td>` +
      `<td>${esc(s.device_name)}</td><td class="st-${esc(s.status)}">${esc(s.status)}${s.replay ? " (replay)" : ""}</td>` +
      `<td>${progress}</td><td class="num">${s.n_ok} / ${s.n_failed}</td>` +
      `<td class="num">${fmt(s.best_median_ms)}</td><td class="muted">${esc(s.updated_at.slice(0, 19))}</td></tr>`;
  });
  setHTML($("#study-list tbody"), rows.join("") ||
    '<tr><td colspan="9" class="muted">no studies stored</td></tr>');
  for (const row of document.querySelectorAll("#study-list tbody tr.pick")) {
    row.onclick = () => openStudy(Number(row.dataset.id));
  }
  return studies;
}

async function openStudy(id) {
  chosen = id;
  for (const row of document.querySelectorAll("#study-list tbody tr.pick")) {
    row.classList.toggle("chosen", Number(row.dataset.id) === id);
  }
  const detail = await get("/studies/" + id);
  if (chosen !== id) return;
  const s = detail.study;
  $("#study-detail").hidden = false;
  $("#detail-title").textContent = `Best so far: ${s.family} ${problemKey(s.shape, s.dtype, s.flags)} on ${s.device_name}`;
  drawCurve(detail.trials);
  setHTML($("#trials tbody"), detail.trials.map((t) =>
    `<tr data-number="${t.number}"><td class="num">${t.number}</td>` +
    (t.status === "ok"
      ? `<td>ok</td><td class="num">${fmt(t.median_ms)}</td><td class="num">${fmt(t.tflops, 1)}</td>`
      : `<td class="failed" title="${esc(t.reason || "")}">${esc(t.failure || "failed")}</td><td class="num">-</td><td class="num">-</td>`) +
    `<td class="params">${esc(params(t.params))}</td></tr>`).join(""));
}

// The best-so-far curve: each ok trial a dot (its median), the running minimum a step line.
function drawCurve(trials) {
  const W = 560, H = 300, L = 58, R = 12, T = 12, B = 34;
  const ok = trials.filter((t) => t.status === "ok" && t.median_ms !== null);
  const box = $("#curve");
  if (!ok.length) {
    setHTML(box, '<p class="muted">no trial measured yet</p>');
    $("#curve-note").textContent = "";
    return;
  }
  const last = Math.max(...trials.map((t) => t.number), 1);
  const values = ok.map((t) => t.median_ms);
  const lo = Math.min(...values), hi = Math.min(Math.max(...values), lo * 4);  // outliers clipped at 4x the best
  const x = (n) => L + (W - L - R) * n / last;
  const y = (v) => T + (H - T - B) * (1 - (Math.min(v, hi) - lo) / ((hi - lo) || 1));
  let best = Infinity, path = "", steps = 0;
  for (const t of ok) {
    if (t.median_ms < best) {
      path += (path ? ` H${x(t.number).toFixed(1)} V` : `M${x(t.number).toFixed(1)},`) + y(t.median_ms).toFixed(1);
      best = t.median_ms;
      steps += 1;
    }
  }
  path += ` H${x(last).toFixed(1)}`;
  const dots = ok.map((t) => `<circle cx="${x(t.number).toFixed(1)}" cy="${y(t.median_ms).toFixed(1)}" r="2.4" fill="#9db7ea"><title>#${t.number}: ${fmt(t.median_ms)} ms</title></circle>`).join("");
  const ticks = [lo, (lo + hi) / 2, hi].map((v) =>
    `<text x="${L - 6}" y="${y(v) + 4}" text-anchor="end">${fmt(v, 3)}</text>` +
    `<line x1="${L}" x2="${W - R}" y1="${y(v)}" y2="${y(v)}" stroke="#eef0f3"/>`).join("");
  setHTML(box,
    `<svg id="curve-svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" role="img" aria-label="best so far">` +
    ticks + dots +
    `<path id="best-line" d="${path}" fill="none" stroke="#2f6fde" stroke-width="2"/>` +
    `<line x1="${L}" x2="${L}" y1="${T}" y2="${H - B}" stroke="#98a2b3"/>` +
    `<line x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}" stroke="#98a2b3"/>` +
    `<text x="${L}" y="${H - B + 16}">0</text><text x="${W - R}" y="${H - B + 16}" text-anchor="end">${last}</text>` +
    `<text x="${(L + W - R) / 2}" y="${H - 4}" text-anchor="middle">trial</text>` +
    `<text x="12" y="${(T + H - B) / 2}" transform="rotate(-90 12 ${(T + H - B) / 2})" text-anchor="middle">median ms</text>` +
    `</svg>`);
  $("#curve-note").textContent = `${ok.length} measured, ${trials.length - ok.length} failed; best ${fmt(best)} ms, ` +
    `improved ${steps} times (search medians; the stored winner may be re-timed)`;
}

// -- winners per GPU and coverage ---------------------------------------------------------------
async function loadCoverage() {
  families = await get("/families");
  const reports = await Promise.all(families.map((f) => get("/coverage?family=" + encodeURIComponent(f.name))));
  const byGpu = {};
  for (const report of reports) {
    for (const row of report.rows) (byGpu[row.device] = byGpu[row.device] || []).push([report.family, row]);
  }
  setHTML($("#winner-panels"), Object.keys(byGpu).sort().map((gpu) =>
    `<div class="panel winners" data-gpu="${esc(gpu)}"><h2>${esc(gpu)}</h2><table><thead><tr><th>family</th><th>problem</th>` +
    `<th class="num">best ms</th><th class="num">TFLOPS</th><th class="num">trials</th><th>template</th><th>study</th></tr></thead><tbody>` +
    byGpu[gpu].map(([family, r]) => `<tr><td>${esc(family)}</td><td>${esc(r.problem)}</td>` +
      `<td class="num">${fmt(r.median_ms)}${r.retimed ? " re-timed" : ""}</td><td class="num">${fmt(r.tflops, 1)}</td>` +
      `<td class="num">${r.trials}</td><td>${esc(r.template_hash)}${r.current ? " (current)" : ""}</td>` +
      `<td class="muted">${esc(r.study)}</td></tr>`).join("") + "</tbody></table></div>").join("") ||
    '<div class="panel muted">no stored winners yet</div>');
  setHTML($("#coverage-panels"), reports.map((report) => {
    const rule = report.rule;
    const gpus = {};
    for (const r of report.rows) gpus[r.device] = (gpus[r.device] || 0) + 1;
    const score = rule.held.length
      ? (rule.known ? `median ${fmt(rule.median, 2)}x, worst ${fmt(rule.worst, 2)}x its best (${rule.known} known` : "no ratio known (0 known") +
        `; ${rule.unknown} unknown; ${rule.failed} failed)`
      : "no tuned problems to measure it on";
    return `<div class="panel coverage" data-family="${esc(report.family)}"><h2>${esc(report.family)} ` +
      `<span class="muted">template ${esc(report.template_hash)}</span></h2>` +
      `<p>${report.rows.length} stored best(s): ` +
      (Object.entries(gpus).map(([g, n]) => `${n} on ${esc(g)}`).join(", ") || "none") + `</p>` +
      `<p>the rule for shapes never tuned, leave-one-out over ${rule.held.length} problem(s): ${score}</p>` +
      `<p class="muted">${esc(report.peers_note)}</p></div>`;
  }).join(""));
}

// -- jobs ----------------------------------------------------------------------------------------
const OPEN = ["queued", "running"];

function eta(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  const s = Math.round(seconds);
  if (s < 60) return s + " s";
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor(s % 3600 / 60)).padStart(2, "0")} min`;
}

async function loadJobs() {
  const jobs = await get("/jobs");
  setHTML($("#job-list tbody"), jobs.map((j) => {
    const share = j.budget ? Math.min(1, j.measured / j.budget) : 0;
    const problems = j.problems.map((p) =>
      `<span class="problem${p.state === "failed" ? " failed" : ""}" title="${esc(p.reason || p.study || "")}">` +
      `${esc(problemKey(p.shape, p.dtype, p.flags))} ${Math.min(p.measured, j.trials)} / ${j.trials}` +
      `${p.best_median_ms === null ? "" : ", " + fmt(p.best_median_ms)}${p.state === "waiting" ? "" : " " + esc(p.state)}</span>`).join("");
    return `<tr data-id="${j.id}"><td>${j.id}</td><td>${esc(j.family)}</td>` +
      `<td class="st-${esc(j.state)}" title="${esc(j.reason || "")}">${esc(j.state)}${j.held && j.state !== "running" ? " (finishing a slice)" : ""}</td>` +
      `<td class="num">${j.priority}</td>` +
      `<td><span class="bar"><i style="width:${(100 * share).toFixed(0)}%"></i></span> ${j.measured} / ${j.budget}</td>` +
      `<td class="params">${problems}</td><td class="num">${fmt(j.best_median_ms)}</td>` +
      `<td class="num">${OPEN.includes(j.state) ? eta(j.eta_s) : "-"}</td>` +
      `<td class="muted">${esc((j.submitted_at || "").slice(0, 19))}</td>` +
      `<td>${OPEN.includes(j.state) ? `<button class="cancel" data-id="${j.id}">cancel</button>` : ""}</td></tr>`;
  }).join("") || '<tr><td colspan="10" class="muted">no jobs queued</td></tr>');
  return jobs;
}

// A problem line: "2,8,1024,64 fp16 causal layout=nt" -> {shape, dtype, flags}; the server
// checks it, and says in one line what it refuses.
function parseProblem(line) {
  const [shape, dtype = "", ...rest] = line.trim().split(/\s+/);
  const flags = {};
  for (const word of rest) {
    const [name, value] = word.replace(/^--/, "").split("=", 2);
    flags[name.replace(/-/g, "_")] = value === undefined ? true : value;
  }
  return {shape, dtype, flags};
}

const whole = (text) => /^-?[0-9]+$/.test(text.trim()) ? Number(text) : text;

function jobError(text) {
  $("#job-error").textContent = text;
  if (text) $("#job-note").textContent = "";
}

async function submitJob(event) {
  event.preventDefault();
  const body = {family: $("#job-family").value, trials: whole($("#job-trials").value),
                priority: $("#job-priority").value.trim() ? whole($("#job-priority").value) : undefined,
                problems: $("#job-problems").value.split("\n").filter((l) => l.trim()).map(parseProblem)};
  $("#job-submit").disabled = true;
  try {
    const job = await call("POST", "/jobs", body);
    jobError("");
    $("#job-note").textContent = `job ${job.id} queued`;
    await refresh();
  } catch (error) {
    jobError(error.message);
  } finally {
    $("#job-submit").disabled = false;
  }
}

async function cancelJob(id) {
  try {
    const job = await call("DELETE", "/jobs/" + id);
    jobError("");
    $("#job-note").textContent = `job ${job.id} ${job.state}`;
    await refresh();
  } catch (error) {
    jobError(error.message);
  }
}

async function loadFamilies() {
  if (!families.length) families = await get("/families");
  const select = $("#job-family");
  if (!select.options.length) {
    setHTML(select, families.map((f) => `<option value="${esc(f.name)}">${esc(f.name)}</option>`).join(""));
  }
}

$("#job-token").value = token();
$("#job-token").addEventListener("input", (event) => {
  const text = event.target.value.trim();
  if (text) sessionStorage.setItem(TOKEN_KEY, text); else sessionStorage.removeItem(TOKEN_KEY);
});
$("#job-form").addEventListener("submit", submitJob);
$("#job-list tbody").addEventListener("click", (event) => {
  const button = event.target.closest("button.cancel");
  if (button) cancelJob(Number(button.dataset.id));
});
loadFamilies().catch((error) => status(error.message, true));

// -- tabs and polling ----------------------------------------------------------------------------
for (const tab of document.querySelectorAll("header nav a")) {
  tab.addEventListener("click", () => {
    for (const t of document.querySelectorAll("header nav a")) t.classList.toggle("on", t === tab);
    for (const s of document.querySelectorAll("main section")) s.classList.toggle("on", s.id === tab.dataset.tab);
    if (tab.dataset.tab === "winners" || tab.dataset.tab === "coverage") loadCoverage().catch((e) => status(e.message, true));
    if (tab.dataset.tab === "jobs") loadJobs().catch((e) => status(e.message, true));
  });
}

async function refresh() {
  try {
    const [studies, jobs] = await Promise.all([loadStudies(), loadJobs()]);
    if (chosen !== null) await openStudy(chosen);
    status(`${studies.length} studies, ${jobs.length} jobs; updated ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    status(error.message, true);
  }
}

refresh();
setInterval(refresh, POLL_MS);
