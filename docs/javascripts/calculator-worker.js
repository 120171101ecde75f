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
// Python). Its key names the Pyodide folder (the version) and the bundle (its content hash), so a
// new version of either makes a new snapshot and the old ones are deleted; Pyodide refuses a
// snapshot of another build (magic number, build id), and any failed restore deletes it and starts
// afresh. No Cache Storage (a page not served over https or from localhost): no snapshot.
//
// Messages in:  {type: "boot", runtime: URL of pyodide-<version>/, bundle: URL of estimator-<hash>.json}
//               {type: "run", id, form: JSON string}
// Messages out: {type: "ready", timings, snapshot, requests} | {type: "failed", message} |
//               {type: "result", id, out, ms, requests} | {type: "result", id, failed, requests} |
//               {type: "snapshot", snapshot}
//               (requests: every URL this worker fetched; snapshot: "restored", "storing" and then
//               "made" once stored, or "none: <why>"; preceded by "restore failed: <why>; " when a
//               stored one was refused)

const LIB = "/opt/reportgen";  // where the bundle's files go in Pyodide's file system
const CACHE = "reportgen-calculator";  // the Cache Storage that keeps the snapshots
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
  return `${runtime}snapshot/${bundleUrl.split("/").pop()}`;
}

// Stores the snapshot and deletes the other snapshots of this site's calculator (older versions);
// resolves to what data-snapshot then says.
async function keep(cache, key, snapshot, calculator) {
  try {
    await cache.put(key, new Response(snapshot, { headers: { "Content-Type": "application/octet-stream" } }));
    for (const old of await cache.keys()) {
      if (old.url !== key && old.url.startsWith(calculator)) await cache.delete(old);
    }
    return "made";
  } catch (exc) {
    return `none: not stored (${message(exc)})`;  // quota, a private window: the next visit starts afresh
  }
}

async function start(loadPyodide, runtime, bundleUrl, bundle, timings) {
  const cache = await openCache();
  const key = snapshotKey(runtime, bundleUrl);
  let failed = "";
  const stored = cache ? await cache.match(key) : undefined;
  if (stored) {
    try {
      const snapshot = new Uint8Array(await stored.arrayBuffer());
      const py = await loadPyodide({ indexURL: runtime, packages: [], _loadSnapshot: snapshot });
      timings.pyodide = performance.now();
      writeBundle(py, bundle);  // the snapshot has no files: a later import reads them
      const browser = py.pyimport("reportgen.browser");  // already imported in the snapshot
      return { browser, snapshot: "restored", kept: null };
    } catch (exc) {
      failed = `restore failed: ${message(exc)}; `;
      await cache.delete(key);
    }
  }
  const py = await loadPyodide({ indexURL: runtime, packages: [], _makeSnapshot: !!cache });
  timings.pyodide = performance.now();
  writeBundle(py, bundle);
  py.runPython(`import sys; sys.path.insert(0, ${JSON.stringify(LIB)}); import reportgen.browser`);
  let snapshot = "none: this page has no Cache Storage", kept = null;
  if (cache) {
    try {
      // before any form runs, with no JavaScript object held by Python
      const heap = py.makeMemorySnapshot();
      kept = keep(cache, key, heap, new URL("../", runtime).href).then((said) => failed + said);
      snapshot = "storing";  // the first answer does not wait for it
    } catch (exc) {
      snapshot = `none: ${message(exc)}`;
    }
  }
  return { browser: py.pyimport("reportgen.browser"), snapshot: failed + snapshot, kept };
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
  const { browser, snapshot, kept } = await start(loadPyodide, runtime, bundleUrl, bundle, timings);
  timings.imported = performance.now();
  for (const k of Object.keys(timings)) timings[k] = Math.round(timings[k]);
  return { browser, timings, snapshot, kept };
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
      self.postMessage({ type: "result", id: msg.id, failed: message(exc), requests: requests() });
    }
  }
};
