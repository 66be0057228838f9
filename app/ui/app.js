// Lethe's dashboard: plain JavaScript on the JSON API, no third-party code. The API key
// lives in sessionStorage (this tab only) and goes out as a Bearer header; every value from
// the API is inserted as text (never as HTML). Charts are SVG built here: each point is a
// <circle class="point" data-x data-y>, so a test can read back what was drawn.
"use strict";

const KEY = "lethe.key";
const LIVE_MS = 2000;
let timer = null;
let rendering = 0;  // the latest render's number: an older one still awaiting the API draws nothing

// GET `path`, or POST `payload` as JSON to it (with `headers` added); never throws on an
// HTTP error.
async function api(path, payload, headers = {}) {
  const init = { headers: { Authorization: `Bearer ${sessionStorage.getItem(KEY) || ""}`,
                            ...headers } };
  if (payload !== undefined) {
    init.method = "POST";
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(payload);
  }
  return answer(await fetch(path, init));
}

// An API answer as { status, ok, body }: the JSON body, or null when there is none.
async function answer(response) {
  let body = null;
  try { body = await response.json(); } catch (_) { body = null; }
  return { status: response.status, ok: response.ok, body };
}

function errorText(result) {
  const e = result.body && result.body.error;
  return e ? `${result.status} ${e.code}: ${e.message}` : `HTTP ${result.status}`;
}

function fmt(x, digits = 3) {
  if (x === null || x === undefined) return "—";
  return typeof x === "number" ? Number(x.toPrecision(digits)).toString() : String(x);
}

function asSeconds(s) { return typeof s === "number" ? `${s.toPrecision(3)} s` : "—"; }
// A duration in words: "42.0 s", "5 min 58 s", "2 h 03 min".
function duration(s) {
  if (typeof s !== "number" || !isFinite(s)) return "—";
  if (s < 60) return `${s.toFixed(1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(Math.round(s % 60)).padStart(2, "0")} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
}
// A time of day, 24-hour, as the timeline's axis writes it.
function hms(at) { return new Date(at).toLocaleTimeString([], { hour12: false }); }
function asPercent(f) { return typeof f === "number" ? `${(100 * f).toPrecision(3)}%` : "—"; }

function status(s) { return el("span", { class: `status ${s}` }, s); }

// What a certificate answers: a deletion request, an append its model learned, or an audit
// (the last two have no request: their request_id is 0).
function answers(c) {
  if (c.kind === "learned") return "append";
  if (c.kind === "privacy_audit") return "audit";
  return c.request_id ? `request ${c.request_id}` : "—";
}

// ---- charts ---------------------------------------------------------------------------------

// A step of 1, 2 or 5 × 10^k giving about `count` intervals over `span`.
function niceStep(span, count) {
  const raw = span / count, power = 10 ** Math.floor(Math.log10(raw)), f = raw / power;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * power;
}

// The y axis: the data's range padded (never narrower than `minSpan`, never past `bounds`),
// widened to whole steps, with a tick at each step (a 0.3-point change no longer
// fills the chart).
function yAxis(values, { min = null, minSpan = 0, bounds = [-Infinity, Infinity] }) {
  let lo = min ?? Math.min(...values), hi = Math.max(...values);
  const pad = Math.max((hi - lo) * 0.15, (minSpan - (hi - lo)) / 2, 0) || Math.abs(hi) * 0.1 || 1;
  if (min === null) lo -= pad;
  hi += pad;
  lo = Math.max(lo, bounds[0]);
  hi = Math.min(hi, bounds[1]);
  const step = niceStep(hi - lo, 4);
  lo = Math.max(Math.floor(lo / step + 1e-9) * step, bounds[0]);
  hi = Math.min(Math.ceil(hi / step - 1e-9) * step, bounds[1]);
  const ticks = [];
  for (let v = lo; v <= hi + step / 2; v += step) ticks.push(Number(v.toPrecision(12)));
  return { lo, hi, ticks, step };
}

// Versions are integers: one tick each (every few when there are many); one version, one tick.
function xTicks(x0, x1) {
  const step = Math.max(1, Math.ceil((x1 - x0) / 10));
  const ticks = [];
  for (let v = x0; v <= x1; v += step) ticks.push(v);
  if (ticks[ticks.length - 1] !== x1) ticks.push(x1);
  return ticks;
}

function lineChart(id, points, { yLabel, xLabel = "version", yMin = null, percent = false,
                                 budget = null }) {
  const W = 460, H = 230, L = 56, R = 16, T = 24, B = 40;
  const svg = el("svg", { class: "chart", id, width: W, height: H, viewBox: `0 0 ${W} ${H}`,
                          role: "img", "aria-label": `${yLabel} by ${xLabel}` });
  if (points.length === 0) {
    svg.append(el("text", { x: W / 2 - 40, y: H / 2 }, "no data yet"));
    return svg;
  }
  const xs = points.map(p => p.x);
  const ys = [...points.map(p => p.y), ...(typeof budget === "number" ? [budget] : [])];
  const x0 = Math.min(...xs), x1 = Math.max(...xs);
  const y = yAxis(ys, percent ? { minSpan: 0.04, bounds: [0, 1] } : { min: yMin });
  const label = v => percent ? `${(v * 100).toFixed(y.step * 100 < 1 ? 1 : 0)} %` : fmt(v);
  const value = v => percent ? `${(v * 100).toFixed(2)} %` : fmt(v, 4);
  const sx = x => L + (x1 === x0 ? (W - L - R) / 2 : (x - x0) / (x1 - x0) * (W - L - R));
  const sy = v => H - B - (v - y.lo) / (y.hi - y.lo || 1) * (H - T - B);
  for (const v of y.ticks) {
    svg.append(el("line", { class: "grid", x1: L, y1: sy(v), x2: W - R, y2: sy(v) }));
    svg.append(el("text", { class: "tick y", x: L - 6, y: sy(v) + 4, "text-anchor": "end" },
                  label(v)));
  }
  for (const v of xTicks(x0, x1)) {
    svg.append(el("line", { class: "axis", x1: sx(v), y1: H - B, x2: sx(v), y2: H - B + 4 }));
    svg.append(el("text", { class: "tick x", x: sx(v), y: H - B + 16, "text-anchor": "middle" },
                  `v${v}`));
  }
  svg.append(el("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  svg.append(el("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  if (typeof budget === "number") {  // the lineage's ε budget
    svg.append(el("line", { class: "budget", id: `${id}-budget`, x1: L, y1: sy(budget),
                            x2: W - R, y2: sy(budget), "data-y": budget }));
    svg.append(el("text", { class: "tick budget", x: W - R - 4, y: sy(budget) - 4,
                            "text-anchor": "end" }, `budget ${fmt(budget)}`));
  }
  svg.append(el("text", { class: "title", x: L, y: T - 10 }, yLabel));
  svg.append(el("text", { class: "title", x: W - R, y: H - 6, "text-anchor": "end" }, xLabel));
  if (points.length > 1) {
    svg.append(el("polyline", { class: "line",
                                points: points.map(p => `${sx(p.x)},${sy(p.y)}`).join(" ") }));
  }
  for (const p of points) {
    const text = `${xLabel} ${p.x}: ${value(p.y)}`;
    svg.append(el("circle", { class: "point", cx: sx(p.x), cy: sy(p.y), r: 5, tabindex: 0,
                              "data-x": p.x, "data-y": p.y, "data-label": text },
                  el("title", {}, text)));
  }
  // hover (or focus) a point: its value in the chart's corner, not only in a tooltip
  const readout = el("text", { class: "readout", x: W - R, y: T - 10, "text-anchor": "end" }, "");
  svg.append(readout);
  svg.addEventListener("pointerover", e => {
    if (e.target.classList && e.target.classList.contains("point")) {
      readout.textContent = e.target.getAttribute("data-label");
    }
  });
  svg.addEventListener("focusin", e => { readout.textContent = e.target.getAttribute("data-label") || ""; });
  svg.addEventListener("pointerleave", () => { readout.textContent = ""; });
  return svg;
}

// A clock time, with milliseconds when the axis' step is under a second.
function clock(ms, step) {
  const d = new Date(ms);
  const time = hms(ms);
  return step < 1000 ? `${time}.${String(d.getMilliseconds()).padStart(3, "0")}` : time;
}

function timeline(id, requests) {
  const W = 700, rowH = 16, L = 70, R = 30;
  const items = requests.filter(r => r.created_at);
  const H = Math.max(60, items.length * rowH + 44);
  const svg = el("svg", { class: "chart", id, width: W, height: H, viewBox: `0 0 ${W} ${H}`,
                          role: "img", "aria-label": "deletion requests over time" });
  if (items.length === 0) { svg.append(el("text", { x: 20, y: 24 }, "no requests")); return svg; }
  const now = Date.now();
  const t = r => [Date.parse(r.created_at), r.finished_at ? Date.parse(r.finished_at) : now];
  const t0 = Math.min(...items.map(r => t(r)[0])), t1 = Math.max(...items.map(r => t(r)[1]));
  const sx = v => L + (t1 === t0 ? 0 : (v - t0) / (t1 - t0) * (W - L - R));
  items.forEach((r, i) => {
    const [a, b] = t(r), y = 10 + i * rowH;
    svg.append(el("text", { x: 4, y: y + 10 }, `#${r.id}`));
    svg.append(el("rect", { class: "span", x: sx(a), y, height: rowH - 4,
                            width: Math.max(2, sx(b) - sx(a)), "data-id": r.id,
                            "data-status": r.status },
                  el("title", {}, `request ${r.id}: ${r.status}`)));
  });
  // a time axis: clock times at whole steps of the span shown
  const axisY = H - 18;
  svg.append(el("line", { class: "axis", x1: L, y1: axisY, x2: W - R, y2: axisY }));
  const span = Math.max(t1 - t0, 1);
  let step = niceStep(span, 4);  // a nice step can leave one tick in a short span: two at least
  while (step > 1 && Math.floor(t1 / step) - Math.ceil(t0 / step) + 1 < 2) step /= 2;
  for (let v = Math.ceil(t0 / step) * step; v <= t1; v += step) {
    svg.append(el("line", { class: "axis", x1: sx(v), y1: axisY, x2: sx(v), y2: axisY + 4 }));
    svg.append(el("text", { class: "tick x time", x: sx(v), y: axisY + 15,
                            "text-anchor": "middle" }, clock(v, step)));
  }
  svg.append(el("text", { class: "tick span", x: 4, y: axisY + 15 },
                `over ${duration(span / 1000)}`));
  return svg;
}

// ---- pages ----------------------------------------------------------------------------------

function signIn(message) {
  const input = el("input", { id: "key", type: "password", placeholder: "lethe_…",
                              autocomplete: "off", "aria-label": "API key" });
  const form = el("form", { class: "signin", onsubmit: async ev => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, input.value.trim());
    const me = await api("/v1/keys/me");
    if (!me.ok) { sessionStorage.removeItem(KEY); return render(errorText(me)); }
    sessionStorage.setItem("lethe.role", me.body.role);
    location.hash = "#/models";
    render();
  } }, input, el("button", { type: "submit", id: "signin" }, "Sign in"));
  return [el("h1", {}, "Sign in with an API key"), form,
          message ? el("p", { class: "error", id: "signin-error" }, message) : null];
}

// Register a dataset and create a model (admin keys: the API allows no other role). Kept across
// live re-renders like the deletion form, so a half-filled form survives.
let setupFormsOf = null;

function setupForms() {
  const role = sessionStorage.getItem("lethe.role");
  if (role !== "admin") return null;
  if (setupFormsOf && setupFormsOf[0] === role) return setupFormsOf[1];
  const dsError = el("p", { class: "error", id: "ds-error" });
  const dsDone = el("p", { class: "notice", id: "ds-done" });
  const builtin = el("select", { id: "ds-builtin" },
    ["digits", "breast_cancer", "synthetic"].map(b => el("option", { value: b }, b)));
  // the file picker offers the suffixes of the server's formats (GET /v1/formats)
  const file = el("input", { id: "ds-file", type: "file", accept: ".npz,.csv,.parquet" });
  api("/v1/formats").then(r => {
    if (r.ok) file.accept = r.body.flatMap(f => f.suffixes).join(",");
  });
  // the column mapping of a CSV or Parquet upload: empty fields are not sent
  const mapping = [["label_column", "label column", "label"], ["id_column", "id column", ""],
                   ["subject_column", "subject column", ""], ["split_column", "split column", ""],
                   ["feature_columns", "feature columns (comma-separated)", ""]]
    .map(([field, text, value]) => [field, text,
         el("input", { id: `ds-${field.replace("_", "-")}`, value, placeholder: "—" })]);
  const onErased = el("select", { id: "ds-on-erased" },
    el("option", { value: "refuse" }, "refuse the upload"),
    el("option", { value: "skip" }, "leave those rows out"));
  // appends: the file's rows join a ready dataset, and its models learn them
  const appendTo = el("input", { id: "ds-append-to", type: "number", min: 1, placeholder: "—",
                                 list: "dataset-choices" });
  const dataset = el("form", { id: "new-dataset", class: "card action" },
    el("h2", {}, "Register a dataset, or append rows"),
    el("label", {}, "builtin ", builtin),
    el("label", {}, "or upload an .npz / CSV / Parquet file ", file),
    el("label", {}, "append the file's rows to dataset # (else a new dataset) ", appendTo),
    el("fieldset", { class: "mapping" }, el("legend", {}, "columns of a CSV or Parquet file"),
       ...mapping.map(([, text, input]) => el("label", {}, `${text} `, input))),
    el("label", {}, "rows of people erased earlier: ", onErased),
    el("button", { type: "submit", id: "ds-submit" }, "Register"), dsError, dsDone);
  dataset.addEventListener("submit", async (event) => {
    event.preventDefault();
    dsError.textContent = dsDone.textContent = "";
    let response;
    const auth = { Authorization: `Bearer ${sessionStorage.getItem(KEY) || ""}` };
    if (file.files.length) {
      const form = new FormData();
      form.append("file", file.files[0]);
      for (const [field, , input] of mapping) {
        if (input.value.trim()) form.append(field, input.value.trim());
      }
      form.append("on_erased", onErased.value);
      const target = Number(appendTo.value)
        ? `/v1/datasets/${Number(appendTo.value)}/samples` : "/v1/datasets";
      response = await fetch(target, { method: "POST", headers: auth, body: form });
    } else if (Number(appendTo.value)) {
      dsError.textContent = "choose a file to append";
      return;
    } else {
      response = await fetch("/v1/datasets", { method: "POST",
        headers: { ...auth, "Content-Type": "application/json" },
        body: JSON.stringify({ builtin: builtin.value, on_erased: onErased.value }) });
    }
    const result = await answer(response);
    if (!result.ok) {
      const code = result.body && result.body.error && result.body.error.code;
      dsError.textContent = code === "erased_rows_present"
        ? `${result.body.error.message.split(";")[0]}. To register the rest, choose "leave ` +
          `those rows out" beside "rows of people erased earlier" and send the form again.`
        : errorText(result);
      return;
    }
    const body = result.body;
    if (body.dataset_id !== undefined) {  // an append: its models learn the rows next
      dsDone.textContent = appendText(body);
      dataset.reset();
      render();
      followAppend(body, dsDone);
      return;
    }
    const skipped = body.skipped_erased
      ? ` (${body.skipped_erased} rows of erased people left out)` : "";
    if (body.status === "registering") {  // a job (202): the datasets table follows it
      dsDone.textContent = `Dataset #${body.id} is registering as a job: its progress ` +
        "shows in the datasets table.";
    } else {
      dsDone.textContent =
        `Dataset #${body.id} registered: ${body.name}, ${body.n_samples} samples.${skipped}`;
      const target = document.getElementById("m-dataset");
      target.value = body.id;
      target.dispatchEvent(new Event("change"));  // the method table for the new dataset
    }
    dataset.reset();
    render();  // the datasets table lists it
  });

  const mError = el("p", { class: "error", id: "m-error" });
  const mDone = el("p", { class: "notice", id: "m-done" });
  // filled from the method table (GET /v1/privacy/methods) once a dataset is chosen
  const method = el("select", { id: "m-method", required: "" },
    el("option", { value: "" }, "choose a dataset first"));
  const datasetId = el("input", { id: "m-dataset", type: "number", min: 1, required: "",
                                  list: "dataset-choices" });
  const epsilon = el("input", { id: "m-epsilon", type: "number", min: 0.01, step: "any",
                                value: "1" });
  const choices = el("div", { id: "m-methods" });
  // the architecture: a logistic regression, an MLP with its hidden widths, or
  // random features of a width; and the method's own options as JSON
  const architecture = el("select", { id: "m-architecture" },
    el("option", { value: "logreg" }, "logistic regression"),
    el("option", { value: "mlp" }, "MLP"),
    el("option", { value: "random_features" }, "random features"));
  const widths = el("input", { id: "m-widths", placeholder: "e.g. 128, 64", value: "128" });
  const widthLabel = el("label", { id: "m-widths-label", hidden: "" }, "hidden widths ", widths);
  architecture.addEventListener("change", () => {
    widthLabel.hidden = architecture.value === "logreg";
    widths.placeholder = architecture.value === "mlp" ? "e.g. 128, 64" : "e.g. 4096";
    widths.value = architecture.value === "mlp" ? "128" : "4096";
  });
  const options = el("input", { id: "m-options", placeholder: '{"T": 5} — empty: defaults' });
  const model = el("form", { id: "new-model", class: "card action" },
    el("h2", {}, "Create a model"),
    el("label", {}, "name ", el("input", { id: "m-name", required: "" })),
    el("label", {}, "dataset ", datasetId),
    el("label", {}, "architecture ", architecture), widthLabel,
    el("label", {}, "per-release ε ", epsilon),
    el("label", {}, "unlearning method ", method),
    el("label", {}, "method options (JSON) ", options),
    choices,
    el("button", { type: "submit", id: "m-submit" }, "Create and train"), mError, mDone);
  const choose = name => { method.value = name; markChosen(choices, name); };
  const loadChoices = () => methodChoices(choices, method, datasetId.value, epsilon.value, choose);
  datasetId.addEventListener("change", loadChoices);
  epsilon.addEventListener("change", loadChoices);
  method.addEventListener("change", () => markChosen(choices, method.value));
  model.addEventListener("submit", async (event) => {
    event.preventDefault();
    mError.textContent = mDone.textContent = "";
    let extra = {};
    try {
      extra = options.value.trim() ? JSON.parse(options.value) : {};
      if (typeof extra !== "object" || extra === null || Array.isArray(extra)) throw new Error();
    } catch {
      mError.textContent = 'method options must be a JSON object, such as {"T": 5}';
      return;
    }
    const sizes = widths.value.split(",").map(w => Number(w.trim())).filter(w => w > 0);
    const arch = architecture.value === "mlp" ? { type: "mlp", hidden: sizes }
      : architecture.value === "random_features" ? { type: "random_features", width: sizes[0] }
      : { type: "logreg" };
    const result = await api("/v1/models", {
      name: document.getElementById("m-name").value,
      dataset_id: Number(datasetId.value),
      architecture: arch,
      method: { ...extra, name: method.value },
      privacy: { epsilon: Number(epsilon.value) || 1 } });
    if (!result.ok) { mError.textContent = errorText(result); return; }
    const chosen = result.body.method.chosen_by ? ` (${result.body.method.chosen_by})` : "";
    mDone.textContent = `Model #${result.body.id} created with ${result.body.method.name}` +
      `${chosen}; training runs as a job.`;
    model.reset();
    widthLabel.hidden = true;
    choices.replaceChildren();
    render();
  });
  setupFormsOf = [role, [dataset, model]];
  return setupFormsOf[1];
}

// The model form's method table (GET /v1/privacy/methods): each method's guarantee, the σ of
// its first release at the chosen ε, whether it can serve this dataset (else the API's own
// refusal) and one deletion's cost; a row's button chooses it.
// What an append's answer says: its rows, and each model's learning of them so far.
function appendText(a) {
  if (a.status === "registering") {
    return `Append #${a.id} to dataset #${a.dataset_id} runs as a job` +
      (a.progress ? ` (${a.progress.rows_done} of ${a.progress.rows_total} rows).` : ".");
  }
  if (a.status === "failed") {
    return `Append #${a.id} to dataset #${a.dataset_id} failed: ` +
      (a.error ? `${a.error.code}: ${a.error.message}` : "see the API");
  }
  const skipped = a.skipped_erased ? ` (${a.skipped_erased} rows of erased people left out)` : "";
  const head = `Appended ${a.n_samples} rows to dataset #${a.dataset_id}${skipped}`;
  if (!a.learning.length) return `${head}; no model learns them.`;
  const learning = a.learning.map(t => t.status === "done"
    ? `model #${t.model_id} learned ${t.n_added} rows (a "learned" version)`
    : `model #${t.model_id} ${t.status === "failed" ? "failed to learn them" : "is learning them"}`);
  return `${head}; ${learning.join("; ")}.`;
}

// Follow an append until it failed or every model's learning of it ended: a long poll
// (`?wait=`) that the worker's commit answers, shown in `out` as it moves.
async function followAppend(a, out) {
  const settled = x => x.status === "failed" || (x.status === "ready" &&
    x.learning.every(t => t.status === "done" || t.status === "failed"));
  let current = a;
  while (!settled(current)) {
    let result;
    try {
      result = await api(`/v1/datasets/${a.dataset_id}/appends/${a.id}?wait=25`);
    } catch (_) {  // the network went away: say so, not an unhandled rejection
      out.textContent += " (following it stopped: the API did not answer)";
      return;
    }
    if (!result.ok) { out.textContent += ` (following it stopped: ${errorText(result)})`; return; }
    current = result.body;
    out.textContent = appendText(current);
  }
  render();  // the models' new versions
}

async function methodChoices(box, select, datasetId, epsilon, choose) {
  if (!Number(datasetId)) { box.replaceChildren(); return; }
  const eps = Number(epsilon) > 0 ? Number(epsilon) : 1;
  const result = await api(`/v1/privacy/methods?dataset=${Number(datasetId)}&epsilon=${eps}`);
  if (!result.ok) {
    box.replaceChildren(el("p", { class: "error", id: "m-methods-error" }, errorText(result)));
    return;
  }
  const body = result.body;
  const available = body.methods.filter(c => c.available).map(c => c.method);
  const before = select.value;  // kept if this dataset allows it, else auto
  select.replaceChildren(el("option", { value: "auto" }, "auto: Lethe chooses"),
                         ...available.map(m => el("option", { value: m }, m)));
  select.value = available.includes(before) ? before : "auto";
  box.replaceChildren(
    el("p", {}, `${body.n_train} training samples · one deletion's cost is a share of a full ` +
                `retrain (${body.full_retrain_seconds === null ? "none measured yet"
                  : asSeconds(body.full_retrain_seconds)}; ${body.full_retrain_basis})`),
    el("table", { id: "method-choices" },
      el("tr", {}, ...["method", "guarantee", "σ of a release", "meets the target",
                       "one deletion", "share of a retrain", ""].map(h => el("th", {}, h))),
      body.methods.map(c => el("tr",
        { "data-method": c.method, class: c.available ? "" : "refused", title: c.summary },
        el("td", {}, c.method),
        el("td", {}, c.guarantee),
        el("td", { class: "sigma" }, c.available ? fmt(c.sigma) : "—"),
        el("td", {}, !c.available ? "—" : c.feasible === null ? "decided per update"
                      : c.feasible ? "yes" : "no: retrains exactly"),
        el("td", {}, c.available ? asSeconds(c.expected_compute_seconds) : "—"),
        el("td", { class: "share" }, c.available ? asPercent(c.fraction_of_full_retrain) : "—"),
        el("td", { class: "sentence" }, c.available
          ? el("button", { type: "button", class: "choose",
                           onclick: () => choose(c.method) }, "choose")
          : refusalText(c.refusal))))));
  markChosen(box, select.value);
}

// The API's refusal without pydantic's "Value error, " prefix; an option the method needs says
// where to give it.
function refusalText(text) {
  const plain = String(text || "").replace(/^(\d+ validation errors?[^\n]*\n)?/, "")
    .replace(/Value error, /g, "");
  return /give |needs? /.test(plain) ? `${plain} (set it under "method options")` : plain;
}

function markChosen(box, name) {
  for (const row of box.querySelectorAll("tr[data-method]")) {
    row.classList.toggle("chosen", row.dataset.method === name);
  }
}

async function modelsPage() {
  const models = await api("/v1/models");
  if (!models.ok) return [el("p", { class: "error" }, errorText(models))];
  const rows = [];
  for (const m of models.body) {
    const preview = m.current_version ? await api(`/v1/privacy/preview?model=${m.id}`) : null;
    const lineage = preview && preview.ok ? preview.body.lineage : null;
    const used = lineage ? lineage.spent_epsilon / lineage.budget_epsilon : 0;
    const bar = lineage
      ? el("span", {}, el("span", { class: `bar${used > 1 ? " over" : ""}`, "data-spent": lineage.spent_epsilon,
                                    "data-budget": lineage.budget_epsilon },
                          el("span", { style: `width:${Math.min(100, used * 100)}%` })),
           ` ${fmt(lineage.spent_epsilon)} / ${fmt(lineage.budget_epsilon)}`)
      : "—";
    const progress = m.status === "training" && m.progress.epoch
      ? ` epoch ${m.progress.epoch} of ${m.progress.epochs}` : "";
    rows.push(el("tr", { "data-model": m.id },
      el("td", {}, el("a", { href: `#/models/${m.id}` }, `${m.id} ${m.name}`)),
      el("td", {}, status(m.status), progress),
      el("td", {}, m.method.name),
      el("td", {}, preview && preview.ok ? preview.body.guarantee : "—"),
      el("td", {}, m.current_version ? `v${m.current_version.number}` : "—"),
      el("td", {}, bar)));
  }
  const live = models.body.some(m => m.status === "queued" || m.status === "training");
  const datasets = await datasetsTable();
  return { live: live || datasets.live, nodes: [el("h1", {}, "Models"),
    el("table", { id: "models" },
       el("tr", {}, ...["model", "status", "method", "guarantee", "version",
                        "lineage ε spent / budget"].map(h => el("th", {}, h))),
       rows),
    ...datasets.nodes,
    ...(setupForms() || [])] };
}

// A registration's progress (rows done of the total, the rate) or a failed one's reason.
function datasetState(d) {
  if (d.progress) {
    const p = d.progress;
    const total = p.rows_total ? ` of ${p.rows_total}` : " (parsing)";
    return el("span", { class: "progress" }, ` ${p.rows_done}${total} rows, ${p.rows_per_second}/s`);
  }
  return null;
}

// The datasets (GET /v1/datasets, newest first) with their status; an admin picks one for
// the model form here, and the form's dataset field offers them too (a datalist).
async function datasetsTable() {
  const page = await api("/v1/datasets?limit=100");
  if (!page.ok) return { live: false, nodes: [el("p", { class: "error" }, errorText(page))] };
  const admin = sessionStorage.getItem("lethe.role") === "admin";
  const use = d => () => {
    const target = document.getElementById("m-dataset");
    if (!target) return;
    target.value = d.id;
    target.dispatchEvent(new Event("change"));  // the method table for this dataset
    target.scrollIntoView({ block: "center" });
  };
  const appendRows = d => () => {
    const target = document.getElementById("ds-append-to");
    if (!target) return;
    target.value = d.id;
    document.getElementById("ds-file").scrollIntoView({ block: "center" });
  };
  const rows = page.body.items.map(d => el("tr", { "data-dataset": d.id },
    el("td", {}, `${d.id} ${d.name}`),
    el("td", {}, d.kind),
    el("td", {}, d.source),
    el("td", {}, String(d.n_samples)),
    el("td", {}, d.feature_shape.join("×")),
    el("td", {}, status(d.status), datasetState(d)),
    el("td", {}, ...(admin && d.status === "ready"
      ? [el("button", { type: "button", class: "use-dataset", onclick: use(d) }, "new model"),
         el("button", { type: "button", class: "append-rows", onclick: appendRows(d) },
            "append rows")]
      : []))));
  const choices = el("datalist", { id: "dataset-choices" },
    page.body.items.filter(d => d.status === "ready")
      .map(d => el("option", { value: d.id }, `${d.name} (${d.n_samples} samples)`)));
  const shown = page.body.total > page.body.items.length
    ? el("p", {}, `the newest ${page.body.items.length} of ${page.body.total} datasets`) : null;
  return { live: page.body.items.some(d => d.status === "registering"), nodes: [
    el("h2", {}, "Datasets"),
    el("table", { id: "datasets" },
       el("tr", {}, ...["dataset", "kind", "source", "samples", "features", "status", ""]
         .map(h => el("th", {}, h))),
       rows),
    shown, choices] };
}

// A model in training: its stage, epoch k of E with a bar, the last loss and the time left at
// the pace so far (the page refreshes itself while it trains).
function trainingCard(p) {
  const card = el("div", { class: "card", id: "training", "data-stage": p.stage });
  if (!p.epochs) {
    card.append(el("p", {}, `Training: ${p.stage.replace("_", " ")}…`));
    return card;
  }
  card.append(
    el("p", { id: "training-epoch" }, `Training: epoch ${p.epoch} of ${p.epochs}`,
       p.loss !== null && p.loss !== undefined ? ` · loss ${fmt(p.loss, 4)}` : "",
       p.eta_seconds !== null && p.eta_seconds !== undefined
         ? ` · about ${duration(p.eta_seconds)} left` : ""),
    el("progress", { id: "training-bar", max: p.epochs, value: p.epoch }));
  return card;
}

async function modelPage(id) {
  const [model, versions, preview] = await Promise.all([
    api(`/v1/models/${id}`), api(`/v1/models/${id}/versions`),
    api(`/v1/privacy/preview?model=${id}`)]);
  if (!model.ok) return [el("p", { class: "error" }, errorText(model))];
  const m = model.body;
  const nodes = [el("h1", {}, `Model ${m.id}: ${m.name} `, status(m.status))];
  nodes.push(el("p", {}, `${m.architecture.type} · method ${m.method.name} · dataset ${m.dataset_id}`
                 + ` · ${m.n_train} training samples`));
  if (m.method.chosen_by) nodes.push(el("p", { class: "notice", id: "chosen-by" }, m.method.chosen_by));
  if (m.status === "queued" || m.status === "training") nodes.push(trainingCard(m.progress));
  const vs = versions.ok ? versions.body : [];
  const mlflow = vs.some(v => v.mlflow);  // a column only where Lethe copies to MLflow
  nodes.push(el("h2", {}, "Version chain"));
  nodes.push(el("table", { id: "versions" },
    el("tr", {}, ...["version", "parent", "kind", "test accuracy", "samples", "sha256",
                     "weights", mlflow ? "MLflow" : null].filter(h => h).map(h => el("th", {}, h))),
    vs.map(v => el("tr", { "data-version": v.number },
      el("td", {}, `v${v.number}`), el("td", {}, v.parent ? `v${v.parent}` : "—"),
      el("td", {}, v.kind), el("td", {}, fmt(v.metrics.test_accuracy)), el("td", {}, v.n_train),
      el("td", {}, el("code", {}, v.weights_sha256.slice(0, 12))),
      el("td", {}, v.weights_available ? "available" : "purged"),
      mlflow ? el("td", { class: "mlflow", "data-status": v.mlflow ? v.mlflow.status : "" },
        mlflowCopy(v.mlflow)) : null))));
  const accuracy = vs.filter(v => typeof v.metrics.test_accuracy === "number")
                     .map(v => ({ x: v.number, y: v.metrics.test_accuracy }))
                     .sort((a, b) => a.x - b.x);
  const certificates = await api(`/v1/audit/certificates?model=${id}&limit=1000`);
  const charts = el("div", { class: "charts" },
    lineChart("plot-accuracy", accuracy, { yLabel: "test accuracy", percent: true }));
  nodes.push(el("h2", {}, "Test accuracy and cumulative ε by version"), charts);
  if (certificates.ok) {
    const byVersion = new Map();
    for (const c of certificates.body.items) {
      if (typeof c.cumulative_epsilon === "number") byVersion.set(c.to_version, c.cumulative_epsilon);
    }
    // v1 is the trained model: nothing removed, nothing spent (the chart began at v2)
    const first = vs.length ? Math.min(...vs.map(v => v.number)) : null;
    if (first !== null && !byVersion.has(first)) byVersion.set(first, 0);
    const eps = [...byVersion.entries()].map(([x, y]) => ({ x, y })).sort((a, b) => a.x - b.x);
    const budget = preview.ok ? preview.body.lineage.budget_epsilon : null;
    charts.append(lineChart("plot-epsilon", eps, { yLabel: "cumulative ε", yMin: 0, budget }));
    nodes.push(el("h2", {}, "Certificates"));
    nodes.push(el("table", { id: "certificates" },
      el("tr", {}, ...["id", "request", "versions", "guarantee", "ε", "δ", "sentence"]
                       .map(h => el("th", {}, h))),
      certificates.body.items.map(c => el("tr", { "data-certificate": c.id },
        el("td", {}, c.id), el("td", { class: "request" }, answers(c)),
        el("td", {}, `v${c.from_version} → v${c.to_version}`), el("td", {}, c.guarantee),
        el("td", {}, fmt(c.epsilon)), el("td", {}, fmt(c.delta)),
        el("td", { class: "sentence" }, sentence(c.sentence))))));
  } else {
    nodes.push(el("p", { class: "notice", id: "certificates-hidden" },
      `Certificates and the cumulative ε need an auditor or admin key (${errorText(certificates)}).`));
  }
  const audits = await auditSection(id);
  nodes.push(...audits.nodes);
  nodes.push(el("h2", {}, "Next release"));
  if (preview.ok) {
    const p = preview.body;
    const metrics = m.current_version ? m.current_version.metrics : {};
    const noiseNorm = metrics.expected_noise_norm, weightsNorm = metrics.weights_norm;
    nodes.push(el("div", { class: "card", id: "preview" },
      el("p", { id: "sigma-context" }, `${p.method} · guarantee ${p.guarantee} · σ ${fmt(p.sigma)}`
        + noiseContext(p.sigma, noiseNorm, weightsNorm)
        + ` · target ε ${fmt(p.target.epsilon)}, δ ${fmt(p.target.delta)}`),
      el("p", {}, p.would_retrain_exactly ? "The next request would retrain exactly." : "The next request would be released by the method."),
      el("p", { id: "lineage" }, `Lineage: ${fmt(p.lineage.spent_epsilon)} of ε ${fmt(p.lineage.budget_epsilon)} spent; after the release ${fmt(p.lineage.epsilon_after_release)}.`),
      el("p", { class: "notice", id: "lineage-why" }, `Spent: the ${p.lineage.releases_since_reset} `
        + `noisy release(s) since the last exact retrain composed together at the lineage's `
        + `δ ${fmt(p.lineage.budget_delta)} (${p.lineage.accountant}), not the sum of their ε: `
        + `each release's ε is stated at its own δ ${fmt(p.target.delta)}, and at the lineage's `
        + `larger δ the same noise is worth less ε. An exact retrain resets it to 0.`),
      p.reason ? el("p", { class: "notice" }, p.reason) : null));
    if (p.deletion_cost) nodes.push(costTable(p.deletion_cost));
  } else {
    nodes.push(el("p", { class: "notice" }, errorText(preview)));
  }
  const storage = m.current_version ? m.current_version.metrics.storage : null;
  if (storage) {
    const sisa = m.current_version.metrics.sisa;
    nodes.push(el("p", { id: "storage" }, `Storage: weights ${bytes(storage.weights_bytes)}, `
      + `noise-free state ${bytes(storage.state_bytes)}`
      + (sisa ? ` (${sisa.checkpoints} checkpoints)` : "")));
  }
  const training = m.status === "queued" || m.status === "training";
  return { live: training || audits.live, nodes };
}

// Where a version's copy is in MLflow: its state, MLflow's version and why it waits.
function mlflowCopy(copy) {
  if (!copy) return "—";
  const version = copy.version ? ` as ${copy.registered_model} v${copy.version}` : "";
  const retry = copy.status === "pending" && copy.last_error
    ? ` (attempt ${copy.attempts + 1}: ${copy.last_error})` : "";
  return [status(copy.status), version + retry];
}

// Privacy audits: each audit's lower bounds beside what the certificate implies.
async function auditSection(id) {
  const audits = await api(`/v1/models/${id}/audits`);
  const out = [el("h2", {}, "Privacy audits")];
  const message = el("p", { id: "audit-message" });
  const choice = (name, options) => el("select", { id: `audit-${name}`, name },
    options.map(([value, text]) => el("option", { value }, text)));
  const kind = choice("kind", [["random", "random canaries"],
    ["mislabelled", "mislabelled rows"], ["leverage", "high-leverage (logreg)"]]);
  const score = choice("score", [["margin", "margin score"], ["loss", "loss score"],
    ["weights", "weights score (white-box)"]]);
  const start = el("button", { id: "run-audit", onclick: async () => {
    start.disabled = true;
    const started = await api(`/v1/models/${id}/audits`,
      { canaries: 1000, kind: kind.value, score: score.value });
    message.textContent = started.ok ? `Audit ${started.body.id} queued.` : errorText(started);
    message.className = started.ok ? "" : "error";
    start.disabled = false;
    if (started.ok) render();
  } }, "Run an audit (1,000 canaries)");
  out.push(el("p", {}, kind, " ", score, " ", start, " ", message));
  if (!audits.ok) return { live: false, nodes: [...out, el("p", { class: "notice" }, errorText(audits))] };
  const items = audits.body;
  if (!items.length) return { live: false, nodes: [...out, el("p", { id: "no-audits" }, "No audit yet.")] };
  const r = a => a.result || {};
  const joint = a => r(a).joint || {};
  const controlJoint = a => (r(a).control && r(a).control.joint) || {};
  out.push(el("table", { id: "audits" },
    el("tr", {}, ...["audit", "status", "verdict", "audited", "certified ε", "proves ε ≥",
                     "ceiling", "control proves", "ε′ per canary", "one-run bound", "AUC",
                     "log entry"].map(h => el("th", {}, h))),
    items.map(a => el("tr", { "data-audit": a.id },
      el("td", {}, a.id), el("td", {}, status(a.status), a.stage ? ` ${a.stage}` : ""),
      el("td", { class: `verdict ${a.verdict || ""}` }, a.verdict || (a.error || "—")),
      el("td", { class: "audited" }, r(a).audited || r(a).method || "—"),
      el("td", {}, fmt(r(a).certified_epsilon)), el("td", {}, fmt(joint(a).epsilon)),
      el("td", {}, fmt(joint(a).ceiling)), el("td", {}, fmt(controlJoint(a).epsilon)),
      el("td", {}, fmt(r(a).implied_epsilon)),
      el("td", {}, fmt(r(a).one_run && r(a).one_run.epsilon)),
      el("td", {}, fmt(r(a).auc)), el("td", {}, a.certificate_id ? `#${a.certificate_id}` : "—")))));
  for (const a of items.filter(a => r(a).noise)) {  // σ measured on the rows
    const n = r(a).noise;
    out.push(el("p", { class: "audit-noise" }, `Audit ${a.id}: σ ${fmt(n.sigma)} calibrated on `
      + `${n.calibrated_on}; on the shadow with its canaries it would be ${fmt(n.sigma_on_the_shadow)}.`));
  }
  out.push(el("p", { class: "sentence" }, "The audit tests the certificate's own claim: every "
    + "release is (ε, δ)-close to one that does not depend on the canaries, so for any statistic "
    + "fixed in advance P[T ≥ t] ≤ e^ε·P₀[T ≥ t] + δ; \"proves ε ≥\" is the largest ε that "
    + "rejects at 95 % (Bonferroni over the statistics). The ceiling is the most any attack "
    + "could show with these canaries; ε′ (2ε) and the one-run bound are the older per-canary "
    + "test, kept for comparison."));
  return { live: items.some(a => a.status === "queued" || a.status === "running"), nodes: out };
}

// σ in context: the noise vector's expected norm σ√d against the norm of the
// released weights (public: anyone may download them), when the version says both.
function noiseContext(sigma, noiseNorm, weightsNorm) {
  if (typeof sigma !== "number" || sigma <= 0) return "";
  if (typeof noiseNorm !== "number") return " per coordinate";
  const share = typeof weightsNorm === "number" && weightsNorm > 0
    ? `, ${(100 * noiseNorm / weightsNorm).toPrecision(2)} % of the released weights' norm `
      + `${fmt(weightsNorm)}` : "";
  return ` per coordinate (the noise vector's expected norm σ√d is ${fmt(noiseNorm)}${share})`;
}

function bytes(n) {
  return n >= 1e6 ? `${(n / 1e6).toFixed(1)} MB` : `${(n / 1e3).toFixed(1)} kB`;
}

function costTable(cost) {
  return el("div", {},
    el("h2", {}, "Cost of one deletion, by method"),
    el("table", { id: "deletion-cost" },
      el("tr", {}, ...["method", "options", "expected compute", "share of a full retrain",
                       "basis"].map(h => el("th", {}, h))),
      cost.methods.map(c => el("tr", { "data-method": c.method },
        el("td", {}, c.method),
        el("td", {}, Object.entries(c.options).map(([k, v]) => `${k}=${v}`).join(" ") || "—"),
        el("td", {}, asSeconds(c.expected_compute_seconds)),
        el("td", {}, asPercent(c.fraction_of_full_retrain)),
        el("td", { class: "sentence" }, c.basis)))));
}

// ---- actions --------------------------------------------------------------------------------

function ids(text) {
  return text.split(/[\s,]+/).map(x => x.trim()).filter(x => x.length);
}

// File a deletion (requester or admin): by subject or sample ids, with an idempotency key, after
// a confirmation that says what it erases. The API's error is shown as it comes.
let deletionFormOf = null;  // [role, form]: kept across live re-renders, so typing survives

function deletionForm() {
  const role = sessionStorage.getItem("lethe.role");
  if (role !== "requester" && role !== "admin") return null;
  if (deletionFormOf && deletionFormOf[0] === role) return deletionFormOf[1];
  const error = el("p", { class: "error", id: "del-error" });
  const done = el("p", { class: "notice", id: "del-done" });
  const form = el("form", { id: "new-deletion", class: "card action" },
    el("h2", {}, "Forget someone"),
    el("label", {}, "dataset ", el("input", { id: "del-dataset", type: "number", min: 1,
                                             required: "" })),
    el("label", {}, "subject ids ", el("input", { id: "del-subjects",
                                                 placeholder: "person-7, person-9" })),
    el("label", {}, "or sample ids ", el("input", { id: "del-samples", placeholder: "17, 42" })),
    el("button", { type: "submit", id: "del-submit" }, "File deletion"), error, done);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.textContent = done.textContent = "";
    const dataset = Number(document.getElementById("del-dataset").value);
    const subjects = ids(document.getElementById("del-subjects").value);
    const samples = ids(document.getElementById("del-samples").value);
    if (!subjects.length && !samples.length) {
      error.textContent = "Give subject ids or sample ids.";
      return;
    }
    const what = [subjects.length ? `everything of ${subjects.length} subject(s)` : "",
                  samples.length ? `${samples.length} sample(s)` : ""]
      .filter(x => x).join(" and ");
    if (!confirm(`Forget ${what} in dataset ${dataset}? The data is erased and every model ` +
                 "trained on it is updated. This cannot be undone.")) return;
    const key = crypto.randomUUID();
    const body = { dataset_id: dataset };
    if (subjects.length) body.subject_ids = subjects;
    if (samples.length) body.sample_ids = samples;
    const result = await api("/v1/deletions", body, { "Idempotency-Key": key });
    if (!result.ok) {
      error.textContent = errorText(result);
      return;
    }
    done.textContent = `Request #${result.body.id} filed (idempotency key ${key}).`;
    form.reset();
    render();
  });
  deletionFormOf = [role, form];
  return form;
}

// The receipt of one certificate of a finished request, as a `.tlog-proof` file download.
async function downloadReceipt(requestId, certificateId, button) {
  const response = await fetch(`/v1/deletions/${requestId}/tlog-proofs/${certificateId}`, {
    headers: { Authorization: `Bearer ${sessionStorage.getItem(KEY) || ""}` } });
  if (!response.ok) {
    button.replaceWith(el("span", { class: "error" }, errorText(await answer(response))));
    return;
  }
  const text = await response.text();
  const link = el("a", { download: `deletion-${requestId}-certificate-${certificateId}.tlog-proof`,
                         href: URL.createObjectURL(new Blob([text], { type: "text/plain" })),
                         class: "receipt-file" }, `receipt #${certificateId} (saved)`);
  button.replaceWith(link);
  link.click();
}

// Each certificate links to its model's page, where its row is (ids were plain text).
function certificateLinks(r) {
  const links = r.models.filter(m => m.certificate_id !== null)
    .map(m => el("a", { href: `#/models/${m.model_id}`, "data-certificate": m.certificate_id,
                        title: `model ${m.model_id}, v${m.version}` }, `#${m.certificate_id}`));
  return links.length ? links.flatMap((a, i) => i ? [", ", a] : [a]) : "—";
}

// A certificate's sentence: its first sentence (at most about 160 characters, cut at a word),
// the whole text one click away (a 150-word wall in every row).
function sentence(text) {
  const end = text.indexOf(". ");
  let head = end > 0 && end < 200 ? text.slice(0, end + 1) : text;
  if (head.length > 200) head = head.slice(0, head.lastIndexOf(" ", 160));
  if (head.length >= text.length) return text;
  return el("details", { class: "sentence" }, el("summary", {}, `${head} …`), el("p", {}, text));
}

function receipts(r) {
  if (r.status !== "done" || !r.certificate_ids.length) return "—";
  return r.certificate_ids.map(c => el("button", { type: "button", class: "receipt",
    "data-certificate": c, onclick: (e) => downloadReceipt(r.id, c, e.currentTarget) },
    `receipt #${c}`));
}

async function deletionsPage() {
  const list = await api("/v1/deletions?limit=200");
  if (!list.ok) {
    return [el("h1", {}, "Deletion requests"),
            el("p", { class: "notice", id: "deletions-hidden" },
               `Deletion requests need a requester, auditor or admin key (${errorText(list)}).`)];
  }
  const items = list.body.items;
  const live = items.some(r => r.status !== "done" && r.status !== "failed");
  return { live, nodes: [el("h1", {}, "Deletion requests"),
    deletionForm(),
    timeline("timeline", items),
    el("p", { class: "notice" }, "A receipt checks in any browser at ",
       el("a", { href: "/verify" }, "/verify"), ", with no key."),
    el("table", { id: "deletions" },
      el("tr", {}, ...["request", "dataset", "status", "samples", "per model", "certificates",
                       "receipts", "created", "finished"].map(h => el("th", {}, h))),
      items.map(r => el("tr", { "data-request": r.id },
        el("td", {}, `#${r.id}`), el("td", { class: "dataset" }, `#${r.dataset_id}`),
        el("td", {}, status(r.status)), el("td", {}, r.n_samples),
        el("td", {}, r.models.map(m => el("div", {}, `model ${m.model_id}: `, status(m.status),
                                            m.version ? ` → v${m.version}` : ""))),
        el("td", { class: "certificates" }, certificateLinks(r)),
        el("td", {}, receipts(r)),
        el("td", {}, hms(r.created_at)),
        el("td", {}, r.finished_at ? hms(r.finished_at) : "—"))))] };
}

async function auditPage() {
  const verify = await api("/v1/audit/verify");
  if (!verify.ok) {
    return [el("h1", {}, "Audit"),
            el("p", { class: "notice", id: "audit-hidden" },
               `The audit log needs an auditor or admin key (${errorText(verify)}).`)];
  }
  const v = verify.body;
  const [head, keys] = await Promise.all([api("/v1/audit/head"), api("/v1/audit/public-key")]);
  const signed = head.ok
    ? el("div", { class: "card", id: "tree-head", "data-size": head.body.tree_size },
        el("p", {}, `Signed tree head: ${head.body.tree_size} certificates, root `,
           el("code", {}, head.body.root_hash.slice(0, 16)), `…, signed ${head.body.timestamp}`
           + ` by key ${head.body.key_id.slice(0, 12)}`),
        keys.ok ? el("p", { class: "notice" }, `Public keys: ${keys.body.keys.map(
          k => `${k.key_id.slice(0, 12)}${k.current ? " (current)" : " (retired)"}`).join(", ")}.`
          + " Receipts and proofs check offline with: lethe audit verify-receipt.") : null)
    : el("p", { class: "notice" }, errorText(head));
  const download = el("button", { id: "export", onclick: async () => {
    const response = await fetch("/v1/audit/export", {
      headers: { Authorization: `Bearer ${sessionStorage.getItem(KEY)}` } });
    const url = URL.createObjectURL(await response.blob());
    const a = el("a", { href: url, download: "lethe-audit.jsonl" });
    document.body.append(a); a.click(); a.remove();
  } }, "Export the log (JSON Lines)");
  return [el("h1", {}, "Audit"),
    el("div", { class: "card", id: "verify", "data-ok": v.ok, "data-checked": v.checked },
      el("p", {}, v.ok ? `The hash chain verifies: ${v.checked} certificates checked.`
                       : `The chain breaks at certificate ${v.first_bad.id}: ${v.first_bad.reason}`),
      v.head ? el("p", {}, "Head: ", el("code", {}, v.head)) : null),
    signed,
    download,
    el("p", { class: "notice" }, "Check an export offline with scripts/verify_audit.py."),
    ...await certificateList(v.checked)];
}

const LISTED = 1000;  // the newest certificates the Audit page lists (the export has them all)

// The newest certificates, newest first, with a search over what each row shows (the text
// filter) and, asked of the API, a data subject's.
async function certificateList(total) {
  const offset = Math.max(0, total - LISTED);
  const found = await api(`/v1/audit/certificates?offset=${offset}&limit=${LISTED}`);
  if (!found.ok) return [el("p", { class: "notice" }, errorText(found))];
  const search = el("input", { id: "certificate-search", type: "search",
                               placeholder: "model, method, guarantee, request, words…" });
  const subject = el("input", { id: "certificate-subject", placeholder: "a data subject's id" });
  const count = el("p", { class: "notice", id: "certificate-count" });
  const table = el("table", { id: "audit-certificates" });
  const show = items => {
    const words = search.value.trim().toLowerCase().split(/\s+/).filter(w => w);
    const rows = items.slice().reverse().filter(c => {
      const text = [`#${c.id}`, `model ${c.model_id}`, answers(c), c.method, c.guarantee,
                    c.sentence].join(" ").toLowerCase();
      return words.every(w => text.includes(w));
    });
    count.textContent = `${rows.length} of ${items.length} certificates shown` +
      (total > LISTED ? ` (the newest ${LISTED} of ${total})` : "");
    table.replaceChildren(
      el("tr", {}, ...["id", "model", "answers", "versions", "method", "guarantee", "ε",
                       "created"].map(h => el("th", {}, h))),
      ...rows.map(c => el("tr", { "data-certificate": c.id },
        el("td", {}, `#${c.id}`),
        el("td", {}, el("a", { href: `#/models/${c.model_id}` }, `model ${c.model_id}`)),
        el("td", {}, answers(c)), el("td", {}, `v${c.from_version} → v${c.to_version}`),
        el("td", {}, c.method || "—"), el("td", {}, c.guarantee), el("td", {}, fmt(c.epsilon)),
        el("td", {}, when(c.created_at)))));
  };
  let items = found.body.items;
  search.addEventListener("input", () => show(items));
  subject.addEventListener("change", async () => {
    const who = subject.value.trim();
    const path = who ? `/v1/audit/certificates?subject=${encodeURIComponent(who)}&limit=${LISTED}`
                     : `/v1/audit/certificates?offset=${offset}&limit=${LISTED}`;
    const again = await api(path);
    items = again.ok ? again.body.items : [];
    show(items);
  });
  show(items);
  return [el("h2", {}, "Certificates"),
          el("div", { class: "card action" }, el("label", {}, "search ", search),
             el("label", {}, "data subject ", subject), count), table];
}

// ---- webhooks: endpoints, their deliveries, replay ----------------------------------

const EVENT_TYPES = ["deletion.completed", "version.published", "audit.completed",
                     "dataset.ready", "model.withdrawn"];
let webhookFormOf = null;  // kept across re-renders: typing and a secret just shown survive

async function remove(path) {
  return answer(await fetch(path, { method: "DELETE",
    headers: { Authorization: `Bearer ${sessionStorage.getItem(KEY) || ""}` } }));
}

function when(at) { return at ? hms(at) : "—"; }

// A secret (`whsec_…`) is answered once, when made or rotated: shown in the form's notice.
function showSecret(what, hook) {
  const form = webhookForm();
  form.querySelector("#hook-done").replaceChildren(`${what} of endpoint #${hook.id}: `,
    el("code", { id: "webhook-secret", "data-webhook": hook.id }, hook.secret),
    ". Copy it now: it is not shown again.");
}

function webhookForm() {
  if (webhookFormOf) return webhookFormOf;
  const error = el("p", { class: "error", id: "hook-error" });
  const done = el("p", { class: "notice", id: "hook-done" });
  const form = el("form", { id: "new-webhook", class: "card action" },
    el("h2", {}, "Add an endpoint"),
    el("label", {}, "URL ", el("input", { id: "hook-url", type: "url", required: "",
                                          placeholder: "https://example.com/lethe-events" })),
    el("fieldset", { id: "hook-events" }, el("legend", {}, "events (none ticked: all)"),
       EVENT_TYPES.map(t => el("label", {}, el("input", { type: "checkbox", value: t }), ` ${t}`))),
    el("label", {}, "label ", el("input", { id: "hook-description", maxlength: 200 })),
    el("label", {}, el("input", { id: "hook-private", type: "checkbox" }),
       " allow a loopback, link-local or private address"),
    el("button", { type: "submit", id: "hook-submit" }, "Add endpoint"), error, done);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.textContent = "";
    done.replaceChildren();
    const events = [...form.querySelectorAll("#hook-events input:checked")].map(b => b.value);
    const result = await api("/v1/webhooks", {
      url: document.getElementById("hook-url").value, events,
      description: document.getElementById("hook-description").value,
      allow_private: document.getElementById("hook-private").checked });
    if (!result.ok) {
      error.textContent = errorText(result);
      return;
    }
    form.reset();
    showSecret("The signing secret", result.body);
    render();
  });
  webhookFormOf = form;
  return form;
}

// One endpoint's row: its state and what an admin can do to it.
function webhookRow(h, message) {
  const act = (label, cls, run) => el("button", { type: "button", class: cls, onclick: async () => {
    const result = await run();
    message.textContent = result.ok ? "" : errorText(result);
    if (result.ok && result.body && result.body.secret) showSecret("The new signing secret", result.body);
    render();
  } }, label);
  return el("tr", { "data-webhook": h.id, "data-failures": h.consecutive_failures },
    el("td", {}, el("a", { href: `#/webhooks/${h.id}` }, `#${h.id}`)),
    el("td", { class: "url" }, h.url),
    el("td", {}, h.events.length ? h.events.join(", ") : "all"),
    el("td", {}, h.description || "—"),
    el("td", { class: "state" }, status(h.disabled_at ? "disabled" : "enabled"),
       h.disabled_reason ? ` ${h.disabled_reason}` : ""),
    el("td", {}, h.consecutive_failures),
    el("td", {}, h.previous_secret_until
      ? `both sign until ${new Date(h.previous_secret_until).toLocaleString()}` : "one"),
    el("td", {},
      act("rotate secret", "rotate", async () => confirm(`Make a new secret for #${h.id}? The ` +
        "current one keeps signing beside it for 24 hours.") ? api(`/v1/webhooks/${h.id}/rotate`, {})
        : { ok: true }),
      h.disabled_at ? act("enable", "enable", () => api(`/v1/webhooks/${h.id}/enable`, {})) : null,
      act("delete", "delete", async () => confirm(`Delete endpoint #${h.id} and its delivery ` +
        "log? Nothing more is sent to it.") ? remove(`/v1/webhooks/${h.id}`) : { ok: true })));
}

async function webhooksPage() {
  const list = await api("/v1/webhooks");
  if (!list.ok) {
    return [el("h1", {}, "Webhooks"), el("p", { class: "notice", id: "webhooks-hidden" },
      `Webhooks need an admin key (${errorText(list)}).`)];
  }
  const message = el("p", { class: "error", id: "hook-message" });
  return [el("h1", {}, "Webhooks"),
    el("p", {}, "Lethe POSTs each event to these endpoints as a CloudEvent, signed as Standard "
      + "Webhooks sign (webhook-id, webhook-timestamp, webhook-signature), retried with back-off "
      + "for 24 hours."),
    webhookForm(), message,
    el("table", { id: "webhooks" },
      el("tr", {}, ...["endpoint", "URL", "events", "label", "state", "failures in a row",
                       "secrets", ""].map(h => el("th", {}, h))),
      list.body.map(h => webhookRow(h, message))),
    ...await mlflowSection()];
}

// Every version's MLflow copy (GET /v1/mlflow/copies): its status, failed attempts, last
// error and next attempt; a pending one can be tried now rather than after its back-off.
async function mlflowSection() {
  const found = await api("/v1/mlflow/copies?limit=200");
  const heading = el("h2", {}, "MLflow copies");
  if (!found.ok) return [heading, el("p", { class: "notice" }, errorText(found))];
  if (!found.body.configured) {
    return [heading, el("p", { class: "notice", id: "mlflow-off" },
      "Lethe copies no version to MLflow: LETHE_MLFLOW_TRACKING_URI is not set.")];
  }
  const message = el("p", { class: "error", id: "mlflow-message" });
  const retry = c => el("button", { type: "button", class: "retry", onclick: async () => {
    const result = await api(`/v1/mlflow/copies/${c.version_id}/retry`, {});
    message.textContent = result.ok ? `Version ${c.number} of model ${c.model_id}: tried now.`
                                    : errorText(result);
    render();
  } }, "retry now");
  return [heading, message,
    el("table", { id: "mlflow-copies" },
      el("tr", {}, ...["model", "version", "status", "failed attempts", "last error",
                       "next attempt", "in MLflow", ""].map(h => el("th", {}, h))),
      found.body.items.map(c => el("tr", { "data-version-id": c.version_id, "data-status": c.status },
        el("td", {}, el("a", { href: `#/models/${c.model_id}` }, `model ${c.model_id}`)),
        el("td", {}, `v${c.number}`), el("td", {}, status(c.status)),
        el("td", { class: "attempts" }, c.attempts),
        el("td", { class: "sentence" }, c.last_error || "—"),
        el("td", {}, c.next_attempt_at ? when(c.next_attempt_at) : "—"),
        el("td", {}, c.registered_model ? `${c.registered_model} v${c.version}` : "—"),
        el("td", {}, c.status === "pending" ? retry(c) : ""))))];
}

async function webhookPage(id) {
  const [hook, page] = await Promise.all([api(`/v1/webhooks/${id}`),
                                          api(`/v1/webhooks/${id}/deliveries?limit=100`)]);
  if (!hook.ok) return [el("p", { class: "error" }, errorText(hook))];
  const h = hook.body;
  const items = page.ok ? page.body.items : [];
  const message = el("p", { class: "error", id: "delivery-message" });
  const replay = (d) => el("button", { type: "button", class: "replay", onclick: async () => {
    const result = await api(`/v1/webhooks/${h.id}/deliveries/${d.id}/replay`, {});
    message.textContent = result.ok ? "" : errorText(result);
    render();
  } }, "replay");
  return { live: items.some(d => d.status === "pending"), nodes: [
    el("h1", {}, `Webhook #${h.id} `, status(h.disabled_at ? "disabled" : "enabled")),
    el("p", {}, `${h.url} · ${h.events.length ? h.events.join(", ") : "every event"} · `
      + `${h.consecutive_failures} failure(s) in a row`
      + (h.disabled_reason ? ` · disabled: ${h.disabled_reason}` : "")),
    el("p", {}, el("a", { href: "#/webhooks" }, "All endpoints")),
    el("h2", {}, `Deliveries (${page.ok ? page.body.total : errorText(page)})`),
    message,
    el("table", { id: "deliveries" },
      el("tr", {}, ...["delivery", "webhook-id", "event", "status", "attempts", "last answer",
                       "last error", "committed", "next try", "delivered", ""]
                       .map(x => el("th", {}, x))),
      items.map(d => el("tr", { "data-delivery": d.id, "data-status": d.status,
                                "data-attempts": d.attempts },
        el("td", {}, `#${d.id}`), el("td", {}, el("code", {}, d.message_id)),
        el("td", {}, d.event_type), el("td", {}, status(d.status)), el("td", {}, d.attempts),
        el("td", {}, d.last_status ?? "—"), el("td", {}, d.last_error || "—"),
        el("td", {}, when(d.created_at)),
        el("td", {}, d.status === "pending" ? when(d.next_attempt_at) : "—"),
        el("td", {}, when(d.delivered_at)), el("td", {}, replay(d)))))] };
}

// ---- routing --------------------------------------------------------------------------------

function navigation(role) {
  const here = location.hash || "#/models";
  const links = [["#/models", "Models"], ["#/deletions", "Deletions"]];
  if (role === "admin" || role === "auditor") links.push(["#/audit", "Audit"]);
  if (role === "admin") links.push(["#/webhooks", "Webhooks"]);
  const nav = document.getElementById("nav");
  nav.replaceChildren(...links.map(([href, text]) =>
    el("a", { href, class: here.startsWith(href) ? "active" : null }, text)),
    el("a", { href: "/verify" }, "Verify a receipt"));
  document.getElementById("who").replaceChildren(
    `signed in as ${role} `,
    el("a", { href: "#/", id: "signout", onclick: () => {
      sessionStorage.clear(); deletionFormOf = setupFormsOf = webhookFormOf = null; render(); } }, "sign out"));
}

async function render(message) {
  clearTimeout(timer);
  const main = document.getElementById("main");
  const role = sessionStorage.getItem("lethe.role");
  if (!sessionStorage.getItem(KEY) || !role) {
    document.getElementById("nav").replaceChildren();
    document.getElementById("who").replaceChildren();
    main.replaceChildren(...signIn(message).filter(n => n !== null));  // no literal "null"
    return;
  }
  navigation(role);
  const mine = ++rendering;
  const hash = location.hash || "#/models";
  const model = hash.match(/^#\/models\/(\d+)$/);
  const webhook = hash.match(/^#\/webhooks\/(\d+)$/);
  let page;
  if (model) page = await modelPage(model[1]);
  else if (webhook) page = await webhookPage(webhook[1]);
  else if (hash === "#/webhooks") page = await webhooksPage();
  else if (hash === "#/deletions") page = await deletionsPage();
  else if (hash === "#/audit") page = await auditPage();
  else page = await modelsPage();
  if (mine !== rendering) {  // the user moved on (or a live refresh overtook this one)
    main.setAttribute("data-discarded", String(Number(main.getAttribute("data-discarded")) + 1));
    return;
  }
  const nodes = Array.isArray(page) ? page : page.nodes;
  main.replaceChildren(...nodes.filter(n => n !== null && n !== undefined));
  main.setAttribute("data-rendered", String(Date.now()));
  if (!Array.isArray(page) && page.live) timer = setTimeout(() => render(), LIVE_MS);
}

window.addEventListener("hashchange", () => render());
window.addEventListener("DOMContentLoaded", () => render());
