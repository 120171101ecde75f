// The calculator's Python, in a Web Worker so the page stays responsive while it starts
// (started by calculator.js; see there). It estimates nothing itself: it loads Pyodide from this
// site, writes reportgen's estimator bundle (the package's own source files) into Pyodide's file
// system and answers each form with reportgen.browser.run(form JSON), a JSON string.
//
// Messages in:  {type: "boot", runtime: URL of pyodide-<version>/, bundle: URL of estimator-<hash>.json}
//               {type: "run", id, form: JSON string}
// Messages out: {type: "ready", timings, requests} | {type: "failed", message} |
//               {type: "result", id, out, ms, requests}   (requests: every URL this worker fetched)

const LIB = "/opt/reportgen";  // where the bundle's files go in Pyodide's file system
let ready = null;

function requests() {
  return performance.getEntriesByType("resource").map((e) => e.name);
}

async function boot(runtime, bundleUrl) {
  const timings = { worker: Math.round(performance.now()) };
  const [{ loadPyodide }, bundle] = await Promise.all([
    import(runtime + "pyodide.mjs"),
    fetch(bundleUrl).then((r) => {
      if (!r.ok) throw new Error(`${bundleUrl}: HTTP ${r.status}`);
      return r.json();
    }),
  ]);
  timings.fetched = Math.round(performance.now());
  const py = await loadPyodide({ indexURL: runtime, packages: [] });
  timings.pyodide = Math.round(performance.now());
  for (const [path, text] of Object.entries(bundle.files)) {
    const full = `${LIB}/${path}`;
    py.FS.mkdirTree(full.slice(0, full.lastIndexOf("/")));
    py.FS.writeFile(full, text);
  }
  py.runPython(`import sys; sys.path.insert(0, ${JSON.stringify(LIB)})`);
  const browser = py.pyimport("reportgen.browser");
  timings.imported = Math.round(performance.now());
  return { browser, timings };
}

self.onmessage = async (event) => {
  const msg = event.data;
  if (msg.type === "boot") {
    ready = boot(msg.runtime, msg.bundle);
    try {
      const { timings } = await ready;
      self.postMessage({ type: "ready", timings, requests: requests() });
    } catch (exc) {
      self.postMessage({ type: "failed", message: String(exc && exc.message ? exc.message : exc) });
    }
  } else if (msg.type === "run") {
    const { browser } = await ready;
    const t0 = performance.now();
    const out = browser.run(msg.form);
    self.postMessage({ type: "result", id: msg.id, out, ms: performance.now() - t0, requests: requests() });
  }
};
