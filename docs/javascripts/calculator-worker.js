// The calculator's Python, in a Web Worker so the page stays responsive while it starts
// (started by calculator.js; see there). It estimates nothing itself: it loads Pyodide from this
// site, writes reportgen's estimator bundle (the package's own source files) into Pyodide's file
// system and answers each form with reportgen.browser.run(form JSON), a JSON string.
//
// A later visit starts from a snapshot. Starting Python is most of a first visit (about 3 of 4.5 s
// on a two-core machine, another 0.7 s importing reportgen); the heap of a started runtime, taken
// once reportgen.browser is imported and before any form is run, is kept in the browser's Cache
// Storage (30 MiB, under this site's calculator/ URL) and a later visit restores it (about 0.5 s).
// This is Pyodide's own memory snapshot (loadPyodide's _makeSnapshot / _loadSnapshot and
// pyodide.makeMemorySnapshot; pyodide/pyodide#4652, #4720): it holds no file system, so the bundle's
// files are written again after a restore; it holds no binary extension (the estimator is pure
// Python). Its key names the Pyodide folder (the version), the bundle (its content hash) and FORMAT,
// so a new version of any of them makes a new snapshot and the older ones are deleted.
// A snapshot that cannot be used (not the length written; refused by Pyodide, which checks a magic
// number and the build id but cannot enlarge the runtime's memory to a larger heap; or a form that
// fails on the restored runtime) is replaced by a note that it was refused: that version of the
// calculator then starts afresh on every visit instead of making and refusing a snapshot each time.
// No Cache Storage (a page not served over https or from localhost): no snapshot.
//
// Messages in:  {type: "boot", runtime: URL of pyodide-<version>/, bundle: URL of estimator-<hash>.json}
//               {type: "run", id, form: JSON string}
// Messages out: {type: "ready", timings, snapshot, requests} | {type: "failed", message} |
//               {type: "result", id, out, ms, requests} | {type: "result", id, failed, requests} |
//               {type: "snapshot", snapshot}
//               (requests: every URL this worker fetched; failed: the last line of what browser.run
//               raised; snapshot: "restored", "storing" and then
//               "made" once stored, or "none: <why>"; preceded by "restore failed: <why>; " when a
//               stored one was refused on this visit)

const LIB = "/opt/reportgen";  // where the bundle's files go in Pyodide's file system
const CACHE = "reportgen-calculator";  // the Cache Storage that keeps the snapshots
// bump it when what a snapshot holds changes while Pyodide and the bundle do not (LIB, the sys.path
// line, loadPyodide's options): an old heap would be restored otherwise
const FORMAT = 1;
const BYTES = "X-Reportgen-Snapshot-Bytes";  // the length stored, checked before a restore
const REFUSED = "X-Reportgen-Snapshot-Refused";  // why a snapshot of this key was refused
let ready = null;

function requests() {
  return performance.getEntriesByType("resource").map((e) => e.name);
}

function message(exc) {
  return String(exc && exc.message ? exc.message : exc);
}

function writeBundle(py, bundle) {
  for (const [path, text] of Object.entries(bundle.files)) {
    const full = `${LIB}/${path}`;
    py.FS.mkdirTree(full.slice(0, full.lastIndexOf("/")));
    py.FS.writeFile(full, text);
  }
}

async function openCache() {
  try {
    return self.caches ? await self.caches.open(CACHE) : null;
  } catch {
    return null;  // storage refused (a browser setting)
  }
}

function snapshotKey(runtime, bundleUrl) {
  return `${runtime}snapshot-${FORMAT}/${bundleUrl.split("/").pop()}`;
}

// Deletes the entries of this site's calculator other than ``key`` (older versions): before a new
// entry is stored, so that they do not fill the quota, and after a restore.
async function prune(cache, key, calculator) {
  try {
    for (const old of await cache.keys()) {
      if (old.url !== key && old.url.startsWith(calculator)) await cache.delete(old);
    }
  } catch {
    // left for a later visit
  }
}

async function put(cache, key, body, headers, calculator) {
  await prune(cache, key, calculator);
  await cache.put(key, new Response(body, { headers: { "Content-Type": "application/octet-stream", ...headers } }));
}

// The stored snapshot (null: none), or {refused: why} when it was refused on an earlier visit;
// throws when one is stored but is not the length written.
async function stored(cache, key) {
  let response;
  try {
    response = await cache.match(key);
  } catch {
    return null;  // storage failing: as if there were none
  }
  if (!response) return null;
  if (response.headers.has(REFUSED)) return { refused: response.headers.get(REFUSED) };
  const snapshot = new Uint8Array(await response.arrayBuffer());
  const bytes = response.headers.get(BYTES);
  if (String(snapshot.length) !== bytes) {
    throw new Error(`the stored snapshot is ${snapshot.length} bytes, not the ${bytes ?? "unrecorded number"} written`);
  }
  return snapshot;
}

function refuse(cache, key, why, calculator) {
  return put(cache, key, "", { [REFUSED]: why.slice(0, 200).replace(/[^\x20-\x7e]/g, " ") }, calculator)
    .catch(() => {});
}

async function start(loadPyodide, runtime, bundleUrl, bundle, timings) {
  const cache = await openCache();
  const key = snapshotKey(runtime, bundleUrl), calculator = new URL("../", runtime).href;
  let why = "", make = !!cache;  // why there is no snapshot this visit, when there was one to restore
  try {
    const snapshot = cache ? await stored(cache, key) : null;
    if (snapshot && snapshot.refused !== undefined) {
      why = `none: a snapshot of this version was refused on an earlier visit (${snapshot.refused})`;
      make = false;
    } else if (snapshot) {
      const py = await loadPyodide({ indexURL: runtime, packages: [], _loadSnapshot: snapshot });
      timings.pyodide = performance.now();
      writeBundle(py, bundle);  // the snapshot has no files: a later import reads them
      const browser = py.pyimport("reportgen.browser");  // already imported in the snapshot
      prune(cache, key, calculator);  // not awaited
      return { browser, snapshot: "restored", kept: null, forget: (why) => refuse(cache, key, why, calculator) };
    }
  } catch (exc) {
    why = `restore failed: ${message(exc)}; none: not made again for this version`;
    make = false;
    await refuse(cache, key, message(exc), calculator);
  }
  const py = await loadPyodide({ indexURL: runtime, packages: [], _makeSnapshot: make });
  timings.pyodide = performance.now();
  writeBundle(py, bundle);
  py.runPython(`import sys; sys.path.insert(0, ${JSON.stringify(LIB)}); import reportgen.browser`);
  let snapshot = why || "none: this page has no Cache Storage", kept = null;
  if (make) {
    try {
      // before any form runs, with no JavaScript object held by Python
      const heap = py.makeMemorySnapshot();
      kept = put(cache, key, heap, { [BYTES]: String(heap.length) }, calculator)
        .then(() => "made", (exc) => `none: not stored (${message(exc)})`);  // quota, a private window
      snapshot = "storing";  // the first answer does not wait for it
    } catch (exc) {
      snapshot = `none: ${message(exc)}`;
    }
  }
  return { browser: py.pyimport("reportgen.browser"), snapshot, kept, forget: null };
}

async function boot(runtime, bundleUrl) {
  const timings = { worker: performance.now() };
  const [{ loadPyodide }, bundle] = await Promise.all([
    import(runtime + "pyodide.mjs"),
    fetch(bundleUrl).then((r) => {
      if (!r.ok) throw new Error(`${bundleUrl}: HTTP ${r.status}`);
      return r.json();
    }),
  ]);
  timings.fetched = performance.now();
  const started = await start(loadPyodide, runtime, bundleUrl, bundle, timings);
  timings.imported = performance.now();
  for (const k of Object.keys(timings)) timings[k] = Math.round(timings[k]);
  return { ...started, timings };
}

self.onmessage = async (event) => {
  const msg = event.data;
  if (msg.type === "boot") {
    ready = boot(msg.runtime, msg.bundle);
    try {
      const { timings, snapshot, kept } = await ready;
      self.postMessage({ type: "ready", timings, snapshot, requests: requests() });
      if (kept) self.postMessage({ type: "snapshot", snapshot: await kept });
    } catch (exc) {
      self.postMessage({ type: "failed", message: message(exc) });
    }
  } else if (msg.type === "run") {
    const { browser } = await ready;
    const t0 = performance.now();
    try {
      const out = browser.run(msg.form);
      self.postMessage({ type: "result", id: msg.id, out, ms: performance.now() - t0, requests: requests() });
    } catch (exc) {  // run returns user errors as JSON: this is a bug, and the page says so
      const failed = message(exc).trim().split("\n").pop();  // a Python traceback's last line
      const { forget } = await ready;
      if (forget) await forget(`a form failed on the restored runtime: ${failed}`);
      self.postMessage({ type: "result", id: msg.id, failed, requests: requests() });
    }
  }
};
