// The calculator page (calculator/index.md, rendered by reportgen/report/calculator.py).
//
// This file estimates nothing. It starts calculator-worker.js, which loads Pyodide from this site
// (calculator/pyodide-<version>/) and reportgen's estimator bundle (calculator/estimator-<hash>.json:
// the package's own source files), and on every change of the form sends the form as JSON to
// reportgen.browser.run, which runs `reportgen estimate --format json` through the CLI's own parser
// and returns the JSON, the command line and rows of formatted strings that this file only places.
// The form itself is rendered from TrainingSetup.model_fields; the setup lives in the URL's hash so
// a link restores it.
//
// For tests: #rg-calc gets data-first-answer-ms (ms from navigation start to the first result shown),
// data-timings (the start-up's steps), data-compute-ms (last change to result shown), data-python-ms,
// data-seq (results shown so far), data-busy ("1" until what is shown answers the form as it is now),
// data-worker-requests (the URLs the worker fetched) and
// data-snapshot (how the worker started: "restored", "storing" then "made", or "none: <why>";
// see the worker).

function $(id) { return document.getElementById(id); }

function message(exc) { return String(exc && exc.message ? exc.message : exc); }

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = v;
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

// ----- the form <-> an object <-> the URL hash ----------------------------------------------------
function controls(form) {
  return Array.from(form.elements).filter((e) => e.name && !["paste", "config", "paste_train", "train_config", "paste_launch", "launch_config", "paste_profile", "profile_text", "hub"].includes(e.name));
}

function method(form) { return form.elements["setup.method"]?.value || ""; }

function applies(control, form) {
  const box = control.closest("[data-applies]");
  const methods = box ? box.dataset.applies.split(" ").filter(Boolean) : [];
  return methods.length === 0 || methods.includes(method(form));
}

function valueOf(control) {
  return control.type === "checkbox" ? (control.checked ? "1" : "0") : control.value;
}

function setValue(control, text) {
  if (control.type === "checkbox") control.checked = text === "1" || text === "true";
  else control.value = text;
}

// a pasted accelerate launch file counts only beside a pasted training config (reportgen estimate --launch needs --from)
function launched(form) { return form.elements.paste_train.checked && form.elements.paste_launch.checked; }

function readForm(form) {
  const out = { setup: {} };
  for (const c of controls(form)) {
    if (!applies(c, form)) continue;
    if (c.name.startsWith("setup.")) {
      out.setup[c.name.slice(6)] = c.type === "checkbox" ? c.checked : c.value;
    } else {
      out[c.name] = c.value;
    }
  }
  if (form.elements.paste.checked) out.config = form.elements.config.value;
  if (form.elements.paste_train.checked) out.training_config = form.elements.train_config.value;
  if (launched(form)) out.launch_config = form.elements.launch_config.value;
  if (form.elements.paste_profile.checked) out.gpu_profile = form.elements.profile_text.value;
  return out;
}

function hashOf(form) {
  const params = new URLSearchParams();
  for (const c of controls(form)) {
    const v = valueOf(c);
    if (applies(c, form) && v !== c.dataset.default) params.set(c.name.replace(/^setup\./, ""), v);
  }
  if (form.elements.paste.checked) params.set("config", form.elements.config.value);
  if (form.elements.paste_train.checked) params.set("train", form.elements.train_config.value);
  if (launched(form)) params.set("launch", form.elements.launch_config.value);
  if (form.elements.paste_profile.checked) params.set("profile", form.elements.profile_text.value);
  return params.toString();
}

// A value the form has no place for (a model or method the page does not offer, a number the field
// refuses) is not restored as an empty field: the field keeps its default and a note names the value.
function restore(form, hash) {
  const params = new URLSearchParams(hash.replace(/^#/, ""));
  const ignored = [];
  for (const c of controls(form)) {
    const key = c.name.replace(/^setup\./, "");
    const text = params.has(key) ? params.get(key) : c.dataset.default;
    setValue(c, text);
    if (c.type !== "checkbox" && c.value !== text && c.value.trim() !== text.trim()) {
      ignored.push([key, text]);
      setValue(c, c.dataset.default);
    }
  }
  const pasted = params.has("config");
  form.elements.paste.checked = pasted;
  form.elements.config.value = pasted ? params.get("config") : "";
  const note = $("rg-link-note");
  note.hidden = ignored.length === 0;
  note.textContent = ignored.length === 0 ? "" : "This link's " +
    ignored.map(([k, v]) => `${k} ${JSON.stringify(v)}`).join(", ") +
    (ignored.length === 1 ? " is not a value this page offers: its default is shown instead." :
      " are not values this page offers: their defaults are shown instead.");
  const training = params.has("train");
  form.elements.paste_train.checked = training;
  form.elements.train_config.value = training ? params.get("train") : "";
  const launch = params.has("launch");
  form.elements.paste_launch.checked = launch;
  form.elements.launch_config.value = launch ? params.get("launch") : "";
  const profiled = params.has("profile");
  form.elements.paste_profile.checked = profiled;
  form.elements.profile_text.value = profiled ? params.get("profile") : "";
  sync(form);
}

function sync(form) {
  const pasted = form.elements.paste.checked;
  const training = form.elements.paste_train.checked;
  $("rg-config-box").hidden = !pasted;
  $("rg-train-box").hidden = !training;
  $("rg-launch-check").hidden = !training;  // the launch file goes with the training config it launches
  $("rg-launch-box").hidden = !launched(form);
  $("rg-profile-box").hidden = !form.elements.paste_profile.checked;
  form.elements.model.disabled = pasted || training;
  const launcher = launched(form) ? [] : ["setup.gpus", "setup.sharding"];
  for (const c of controls(form)) {  // a pasted training config gives the setup: only the launcher's GPUs count
    if (c.name.startsWith("setup.")) c.disabled = training && !launcher.includes(c.name);
  }
  for (const box of form.querySelectorAll("[data-applies]")) {
    const methods = box.dataset.applies.split(" ").filter(Boolean);
    box.classList.toggle("rg-calc-off", methods.length > 0 && !methods.includes(method(form)));
  }
}

// ----- a model by its Hub id: its config.json fetched by the browser, pasted as the reader would ---------
// Only on the button (or Enter): the page makes no request to another site by itself. What cannot be
// fetched says why and what to do instead: offline or blocked (CORS, an extension), gated or private
// (the page sends no token), no such repository or revision.
const HUB_ID = /^([A-Za-z0-9][A-Za-z0-9._-]{0,95})\/([A-Za-z0-9][A-Za-z0-9._-]{0,95})(?:@([A-Za-z0-9][A-Za-z0-9_.\-/]{0,199}))?$/;

function hubNote(text, bad) {
  const note = $("rg-hub-note");
  note.textContent = text;
  note.classList.toggle("rg-no", !!bad);
  note.hidden = !text;
}

async function fetchHub(form, changed) {
  const text = form.elements.hub.value.trim();
  const m = HUB_ID.exec(text);
  if (!m) { hubNote(`${JSON.stringify(text)} is not a Hub id: write ORG/NAME or ORG/NAME@REVISION, e.g. Qwen/Qwen3-14B`, true); return; }
  const [, org, name, revision] = m;
  const repo = `${org}/${name}`, page = `https://huggingface.co/${repo}`;
  const base = $("rg-calc").dataset.hubBase || "https://huggingface.co";
  const url = `${base}/${repo}/resolve/${encodeURIComponent(revision || "main")}/config.json`;
  const byHand = `download config.json from ${page}/tree/${revision || "main"} and paste it below`;
  hubNote(`fetching ${repo}'s config.json from the Hugging Face Hub ...`, false);
  let response;
  try {
    response = await fetch(url, { credentials: "omit", cache: "no-cache" });
  } catch (exc) {
    hubNote(`could not reach the Hub (offline, or the browser blocked the request): ${byHand}`, true);
    return;
  }
  if (response.status === 401 || response.status === 403) {
    hubNote(`${repo} is gated or private, and this page sends no token: accept its licence at ${page}, then ${byHand}`, true);
    return;
  }
  if (response.status === 404) {
    hubNote(revision ? `${repo} has no revision ${JSON.stringify(revision)}, or no such repository (check ${page})`
      : `no repository ${repo} on the Hub (check the spelling at ${page})`, true);
    return;
  }
  if (!response.ok) { hubNote(`the Hub answered ${response.status}: try again later, or ${byHand}`, true); return; }
  const body = await response.text();
  try { JSON.parse(body); } catch { hubNote(`the Hub's answer for ${repo} is not a config.json: ${byHand}`, true); return; }
  form.elements.paste.checked = true;
  form.elements.config.value = body;
  hubNote(`config.json of ${repo}${revision ? "@" + revision : ""} fetched from the Hub and pasted below; ` +
    `on your machine: reportgen estimate --model ${text} (the numbers are the same)`, false);
  changed();
}

// ----- the result --------------------------------------------------------------------------------
function table(section) {
  const body = el("tbody");
  for (const row of section.rows) {
    const tr = el("tr", { "data-row": row.key });
    tr.append(el("th", { scope: "row", text: row.label }));
    tr.append(el("td", { class: "rg-calc-num", "data-key": row.key, text: row.value }));
    const extra = el("td", { class: "rg-calc-note" });
    if (row.bar !== undefined) {
      extra.append(el("span", { class: "rg-calc-bar", style: `width:${(100 * row.bar).toFixed(1)}%` }));
    } else if (row.note) {
      extra.textContent = row.note;
    }
    tr.append(extra);
    body.append(tr);
  }
  return el("table", { class: section.dim ? "rg-calc-table rg-calc-dim" : "rg-calc-table", "data-section": section.id },
    el("caption", { text: section.title }), body);
}

function showResult(out, form) {
  const result = $("rg-result"), error = $("rg-error");
  $("rg-command").textContent = out.command;
  $("rg-paste-note").hidden = !form.elements.paste.checked;
  $("rg-train-note").hidden = !form.elements.paste_train.checked;
  $("rg-launch-note").hidden = !launched(form);
  $("rg-profile-note").hidden = !form.elements.paste_profile.checked;
  const from = $("rg-from");
  from.replaceChildren(...(out.from || []).map((line) => el("li", { text: line })));
  from.hidden = !out.from;
  $("rg-share").value = location.href;
  $("rg-repro").hidden = false;
  if (out.error) {
    error.replaceChildren(el("strong", { text: "error: " }), el("span", { "data-key": "error", text: out.error.message }));
    if (out.error.hint) error.append(el("div", { class: "rg-calc-hint", text: "hint: " + out.error.hint }));
    error.hidden = false;
    result.hidden = true;  // an earlier result would not match the form
    $("rg-repro-label").textContent = "The same command on your machine stops with the same error:";
    $("rg-json").textContent = "";
    $("rg-json-box").hidden = true;
    return;
  }
  error.hidden = true;
  if (launched(form)) {  // the greyed GPUs and sharding show what the launch file set, not the form's own values
    const setup = JSON.parse(out.json).setup;
    form.elements["setup.gpus"].value = setup.gpus;
    form.elements["setup.sharding"].value = setup.sharding;
  }
  $("rg-repro-label").textContent = "The same numbers on your machine (add --format json for the JSON below):";
  $("rg-json-box").hidden = false;
  const v = out.view;
  const verdict = el("div", { class: "rg-calc-verdict rg-calc-" + v.verdict.replace(/ /g, "-") },
    el("span", { class: "rg-calc-verdict-word", "data-key": "verdict", text: v.verdict }),
    el("span", { text: v.verdict_text.slice(v.verdict.length) }));  // ": needs ... GiB, ..." (the margin)
  const head = el("div", { class: "rg-calc-head" },
    el("p", { class: "rg-calc-title" }, el("span", { class: "rg-est", title: "analytic estimate", text: "est." }), " ",
      el("span", { "data-key": "title", text: v.title })),
    el("p", { class: "rg-calc-params", "data-key": "params", text: v.params }), verdict);
  const tables = el("div", { class: "rg-calc-tables" }, ...v.sections.map(table));
  const notes = el("ul", { class: "rg-calc-notes" }, ...v.notes.map((n) => el("li", { "data-key": "note", text: n })));
  result.replaceChildren(head, tables);
  if (v.notes.length) result.append(el("p", { class: "rg-calc-label", text: "Notes" }), notes);
  result.hidden = false;
  $("rg-json").textContent = out.json;
}

// ----- the Python worker -----------------------------------------------------------------------
// calculator-worker.js runs Pyodide and reportgen.browser; this side sends forms and gets JSON.
function startWorker(root) {
  if (!root.dataset.runtime) throw new Error("this build of the site has no Python runtime (see the warning above)");
  const worker = new Worker(new URL("calculator-worker.js", import.meta.url), { type: "module" });
  const waiting = new Map();
  let next = 0, onReady, onFailed;
  const ready = new Promise((resolve, reject) => { onReady = resolve; onFailed = reject; });
  worker.onmessage = (event) => {
    const msg = event.data;
    if (msg.requests) root.dataset.workerRequests = JSON.stringify(msg.requests);
    if (msg.type === "ready") { root.dataset.snapshot = msg.snapshot; onReady(msg.timings); }
    else if (msg.type === "snapshot") root.dataset.snapshot = msg.snapshot;
    else if (msg.type === "failed") onFailed(new Error(msg.message));
    else if (msg.type === "result") { waiting.get(msg.id)(msg); waiting.delete(msg.id); }
  };
  let stopped = null;  // why the worker stopped, once it has
  worker.onerror = (event) => {
    stopped = event.message || "the worker stopped";
    onFailed(new Error(stopped));  // while starting; afterwards, the runs waiting for an answer get it
    for (const [, settle] of waiting) settle({ failed: stopped });
    waiting.clear();
  };
  // the worker's clock starts when it does: its marks are shifted onto the page's
  const offset = performance.now();
  worker.postMessage({
    type: "boot",
    runtime: new URL(root.dataset.runtime, document.baseURI).href,
    bundle: new URL(root.dataset.bundle, document.baseURI).href,
  });
  return {
    ready: ready.then((t) => Object.fromEntries(Object.entries(t).map(([k, v]) => [k, Math.round(v + offset)]))),
    run(form) {
      if (stopped) return Promise.resolve({ failed: stopped });
      return new Promise((resolve) => { const id = next++; waiting.set(id, resolve); worker.postMessage({ type: "run", id, form }); });
    },
  };
}

async function main(root) {
  const started = Math.round(performance.now());
  const form = root.querySelector("form");
  const status = $("rg-status");
  restore(form, location.hash);
  let python = null, changedAt = null, seq = 0, busy = false, dirty = false;

  function showFailure(text) {  // not a user error (those come back as the CLI's message): the estimator broke
    status.textContent = "The estimator failed on this setup (please report it with the link of this page): " + text;
    status.classList.add("rg-no");
    status.hidden = false;
    for (const id of ["rg-result", "rg-error", "rg-repro", "rg-json-box", "rg-from"]) $(id).hidden = true;
  }

  async function compute() {
    if (!python || busy) { dirty = true; return; }
    busy = true;
    root.dataset.busy = "1";
    dirty = false;
    const since = changedAt ?? performance.now();
    changedAt = null;
    try {
      const answer = await python.run(JSON.stringify(readForm(form)));
      if (answer.failed) {
        showFailure(answer.failed);
      } else {
        status.classList.remove("rg-no");
        status.hidden = true;
        showResult(JSON.parse(answer.out), form);
        root.dataset.pythonMs = answer.ms.toFixed(1);
      }
    } catch (exc) {  // the worker died, or its answer could not be shown
      showFailure(message(exc));
    }
    root.dataset.computeMs = (performance.now() - since).toFixed(1);
    root.dataset.seq = String(++seq);
    busy = false;
    if (dirty) compute();  // the form changed meanwhile: what is shown is not its answer yet
    else root.dataset.busy = "0";
  }

  function changed() {
    changedAt ??= performance.now();
    sync(form);
    const hash = hashOf(form);
    history.replaceState(null, "", hash ? "#" + hash : location.pathname + location.search);
    compute();
  }

  form.addEventListener("input", (e) => { if (e.target.name !== "hub") changed(); });
  form.addEventListener("change", (e) => { if (e.target.name !== "hub") changed(); });
  $("rg-hub-fetch").addEventListener("click", () => fetchHub(form, changed));
  form.elements.hub.addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); fetchHub(form, changed); } });
  window.addEventListener("hashchange", () => { restore(form, location.hash); changed(); });
  $("rg-copy").addEventListener("click", async () => {
    const share = $("rg-share");
    share.select();
    try { await navigator.clipboard.writeText(share.value); } catch { document.execCommand?.("copy"); }
  });

  let timings;
  try {
    const worker = startWorker(root);
    timings = { script: started, ...(await worker.ready) };
    python = worker;
  } catch (exc) {
    status.textContent = "The estimator could not start: " + message(exc);
    status.classList.add("rg-no");
    return;
  }
  status.hidden = true;
  await compute();
  timings.answer = Math.round(performance.now());
  root.dataset.timings = JSON.stringify(timings);
  root.dataset.firstAnswerMs = String(timings.answer);
}

const root = document.getElementById("rg-calc");
if (root) main(root);
