// thunderviz trace view (anywidget front end): lays out the kernel's DOT with a vendored Graphviz WASM build,
// then handles zoom, pan, search, click-for-details, expand/collapse and the panels.
//
// Safety: every string that comes from user code (module and parameter names, source lines) reaches the page
// through textContent or setAttribute, never through an HTML parser. Graphviz's SVG is parsed as XML (scripts never run in
// a parsed document) and scrubbed of script/foreignObject elements, event attributes and non-local links
// before it is adopted into the page.

const GV_KEY = "__thunderviz_graphviz_wasm_1_29_2";
// No text is drawn smaller than this, at the default view, at "fit" or after zooming out.
const MIN_TEXT_PX = 11;
// "fit" leaves this much room (px) between the graph and the pane's edges: nodes are never cut by the edge.
const FIT_MARGIN_PX = 12;

// Layout runs in a Web Worker so a big expanded block (hundreds of ops, ~0.5 s of Graphviz) never blocks the
// page; if a worker cannot be made (very old browser, strict CSP), it runs on the main thread instead.
const WORKER_SRC = `
let gv = null;
self.onmessage = async (ev) => {
  const { id, dot, libUrl } = ev.data;
  try {
    if (!gv) gv = import(libUrl).then((m) => m.Graphviz.load());
    const svg = (await gv).layout(dot, "svg", "dot");
    self.postMessage({ id, svg });
  } catch (err) {
    self.postMessage({ id, error: String((err && err.message) || err) });
  }
};`;

function layoutService(model) {
  // One library URL, one worker and one WASM instance per page, shared by every widget.
  if (globalThis[GV_KEY]) return globalThis[GV_KEY];
  const libUrl = URL.createObjectURL(new Blob([model.get("_graphviz_js")], { type: "text/javascript" }));
  let worker = null;
  try {
    worker = new Worker(URL.createObjectURL(new Blob([WORKER_SRC], { type: "text/javascript" })), { type: "module" });
  } catch (err) {
    worker = null;
  }
  const pending = new Map();
  let next = 0;
  let mainThread = null;
  const onMain = (dot) => {
    if (!mainThread) mainThread = import(/* webpackIgnore: true */ libUrl).then((m) => m.Graphviz.load());
    return mainThread.then((gv) => gv.layout(dot, "svg", "dot"));
  };
  if (worker) {
    worker.onmessage = (ev) => {
      const p = pending.get(ev.data.id);
      pending.delete(ev.data.id);
      if (!p) return;
      if (ev.data.error) p.reject(new Error(ev.data.error));
      else p.resolve(ev.data.svg);
    };
    worker.onerror = (ev) => {
      ev.preventDefault();
      worker = null;
      for (const [, p] of pending) p.fallback();
      pending.clear();
    };
  }
  const service = {
    where: () => (worker ? "worker" : "main thread"),
    layout(dot) {
      if (!worker) return onMain(dot);
      return new Promise((resolve, reject) => {
        const id = next++;
        pending.set(id, { resolve, reject, fallback: () => onMain(dot).then(resolve, reject) });
        worker.postMessage({ id, dot, libUrl });
      });
    },
  };
  globalThis[GV_KEY] = service;
  return service;
}

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = String(v);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function scrubSvg(svgText) {
  const doc = new DOMParser().parseFromString(svgText, "image/svg+xml");
  const svg = doc.documentElement;
  if (!svg || svg.nodeName.toLowerCase() !== "svg") throw new Error("Graphviz returned no SVG");
  for (const bad of svg.querySelectorAll("script, foreignObject, iframe")) bad.remove();
  for (const el of [svg, ...svg.querySelectorAll("*")]) {
    for (const a of [...el.attributes]) {
      const n = a.name.toLowerCase();
      if (n.startsWith("on")) el.removeAttribute(a.name);
      else if ((n === "href" || n === "xlink:href") && !a.value.startsWith("#")) el.removeAttribute(a.name);
    }
  }
  return document.importNode(svg, true);
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "";
  let v = Number(n);
  for (const u of ["B", "KiB", "MiB", "GiB"]) {
    if (v < 1024 || u === "GiB") return u === "B" ? `${v} B` : `${v.toFixed(1)} ${u}`;
    v /= 1024;
  }
  return `${n} B`;
}

const shapeText = (s) => (s === null || s === undefined ? "" : `[${s.join(", ")}]`);

function table(headers, rows, rowAttrs) {
  const thead = h("thead", {}, h("tr", {}, ...headers.map((x) => h("th", { text: x }))));
  const tbody = h("tbody");
  rows.forEach((r, i) => {
    const tr = h("tr", rowAttrs ? rowAttrs(i) : {}, ...r.map((c) => h("td", { text: c ?? "" })));
    tbody.append(tr);
  });
  return h("table", { class: "tv-table" }, thead, tbody);
}

// ---------------------------------------------------------------- the Memory view (memory_tab.memory_panel)
const SVG_NS = "http://www.w3.org/2000/svg";

function svgEl(tag, attrs, text) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = String(text);
  return el;
}

function memoryBars(bars, budget) {
  // One stacked bar per candidate (predicted) or rank (measured), one scale, the budget as a dashed line; the
  // layout of render/memory_view.py's bars_svg: room right of the longest bar for its total, a total that the
  // budget line would cross moved right of the line, the budget's label left of the line near the right edge.
  const labelW = 190, barH = 18, gap = 8, top = 22, width = 640, valueRoom = 76, plotW = width - labelW - valueRoom;
  const textPx = (s) => 6.4 * s.length, clear = 3;
  const max = Math.max(1, budget || 0, ...bars.map((b) => b.total));
  const bx = budget ? labelW + (budget / max) * plotW : null;
  const height = top + bars.length * (barH + gap) + 8;
  const svg = svgEl("svg", { class: "tv-memory-bars", width, height, viewBox: `0 0 ${width} ${height}`, "font-size": 11 });
  bars.forEach((bar, i) => {
    const y = top + i * (barH + gap);
    const mark = bar.fits === null || bar.fits === undefined ? "" : bar.fits ? " \u2713" : " \u2717";
    const g = svgEl("g", { class: `tv-membar tv-${bar.kind}`, "data-label": bar.label, "data-total": bar.total });
    g.append(svgEl("text", { x: 0, y: y + 13 }, bar.label + mark));
    let x = labelW;
    for (const seg of bar.segments) {
      const w = (seg.bytes / max) * plotW;
      const r = svgEl("rect", { class: "tv-memseg", "data-category": seg.category, "data-bytes": seg.bytes, x: x.toFixed(1), y, width: w.toFixed(1), height: barH, fill: seg.color });
      r.append(svgEl("title", {}, `${seg.category}: ${fmtBytes(seg.bytes)}`));
      g.append(r);
      x += w;
    }
    const value = fmtBytes(bar.total);
    let vx = x + 4;
    if (bx !== null && vx - clear < bx && bx < vx + textPx(value) + clear) vx = bx + clear + 1;
    g.append(svgEl("text", { class: "tv-memvalue", x: vx.toFixed(1), y: y + 13 }, value));
    svg.append(g);
  });
  if (budget) {
    const said = `budget ${fmtBytes(budget)}`;
    svg.append(svgEl("line", { class: "tv-budget", "data-bytes": budget, x1: bx.toFixed(1), x2: bx.toFixed(1), y1: top - 6, y2: height - 8, stroke: "#b3261e", "stroke-width": 2, "stroke-dasharray": "4 3" }));
    const right = bx + 3 + textPx(said) <= width;
    svg.append(svgEl("text", { x: (right ? bx + 3 : bx - 3).toFixed(1), y: top - 8, fill: "#b3261e", "text-anchor": right ? "start" : "end" }, said));
  }
  const legend = h("div", { class: "tv-mem-legend" });
  const seen = new Map();
  for (const b of bars) for (const s of b.segments) seen.set(s.category, s);
  for (const [c, s] of seen) legend.append(h("span", { class: "tv-mem-key" }, h("span", { class: "tv-mem-swatch", style: `background:${s.color}` }), s.legend || c));
  return h("div", { class: "tv-mem-chart" }, svg, legend);
}

function memoryView(mv) {
  const box = h("div", { class: "tv-memory" });
  if (mv.bars.length) box.append(h("h5", { text: "Per-rank peak of one step" }), memoryBars(mv.bars, mv.budget));
  for (const line of mv.comparison) box.append(h("p", { class: "tv-mem-compare", text: line }));
  if (mv.saved_by_group.length) {
    box.append(h("h5", { text: "Saved tensors (trace), per group" }));
    box.append(table(["group", "tensors", "bytes"], mv.saved_by_group.map((r) => [r.key, r.tensors, fmtBytes(r.bytes)])));
    box.append(h("h5", { text: "Saved tensors (trace), per source line" }));
    box.append(table(["source line", "code", "tensors", "bytes"], mv.saved_by_line.map((r) => [r.key, r.code, r.tensors, fmtBytes(r.bytes)])));
  }
  if (mv.eager) {
    box.append(h("h5", { text: "Saved tensors: thunder vs eager" }), h("p", { class: "tv-eager-summary", text: mv.eager.summary }));
    const rows = mv.eager.lines.map((c) => [c.line, c.code, fmtBytes(c.thunder_bytes), fmtBytes(c.eager_bytes), `${c.extra >= 0 ? "+" : "-"}${fmtBytes(Math.abs(c.extra))}`, c.thunder.join(", ")]);
    box.append(table(["source line", "code", "thunder", "eager", "thunder extra", "thunder's tensors"], rows, (i) => ({ class: mv.eager.lines[i].extra > 0 ? "tv-eager-row tv-more" : "tv-eager-row" })));
  }
  return box;
}

class Pane {
  constructor(view, index) {
    this.view = view;
    this.index = index;
    this.title = h("div", { class: "tv-pane-title" });
    this.box = h("div", { class: "tv-graph", "data-pane": index });
    this.el = h("div", { class: "tv-pane" }, this.title, this.box);
    this.dot = null;
    this.svg = null;
    this.base = null;
    this.data = null;
  }

  // The smallest font in this graph (Graphviz writes font-size on every text); the view never scales text below
  // MIN_TEXT_PX: a graph too big for the pane at that size is panned or collapsed, not shrunk.
  minFont() {
    if (this._minFont === undefined) {
      const sizes = [...this.svg.querySelectorAll("text")].map((t) => parseFloat(t.getAttribute("font-size"))).filter((x) => x > 0);
      this._minFont = sizes.length ? Math.min(...sizes) : 12;
    }
    return this._minFont;
  }

  // The drawing area inside the pane's border: what the SVG fills (the border would make two panes' scales differ).
  size() {
    return { width: this.box.clientWidth, height: this.box.clientHeight };
  }

  // Pixels per graph unit that show the whole graph in a pane of this size with FIT_MARGIN_PX all round.
  fitScale(width, height) {
    const r = this.size();
    const w = (width ?? r.width) - 2 * FIT_MARGIN_PX, hh = (height ?? r.height) - 2 * FIT_MARGIN_PX;
    return Math.min(Math.max(w, 1) / this.base.w, Math.max(hh, 1) / this.base.h);
  }

  // The least scale (px per graph unit) at which this graph's smallest text is still MIN_TEXT_PX.
  readableScale() {
    return MIN_TEXT_PX / this.minFont();
  }

  textPx() {
    if (!this.svg || !this.base || !this.view.viewport.s) return null;
    return this.minFont() * this.view.viewport.s;
  }

  async draw(data, gv) {
    let ms = null;
    if (data.dot !== this.dot) {
      const t0 = performance.now();
      const text = await gv.layout(data.dot);
      if (this.view.generation !== this.generation) return null; // a newer state arrived meanwhile
      const svg = scrubSvg(text);
      const vb = svg.viewBox && svg.viewBox.baseVal;
      this.base = vb && vb.width ? { x: vb.x, y: vb.y, w: vb.width, h: vb.height } : { x: 0, y: 0, w: 100, h: 100 };
      svg.removeAttribute("width");
      svg.removeAttribute("height");
      svg.setAttribute("preserveAspectRatio", "xMidYMid meet");
      svg.classList.add("tv-svg");
      this.box.replaceChildren(svg);
      this.svg = svg;
      this._minFont = undefined;
      this.dot = data.dot;
      ms = performance.now() - t0;
    }
    this.data = data;
    this.title.textContent = `${data.title} \u2014 ${data.n_ops} ops, ${data.n_collectives} collectives, ${data.n_waits} waits`;
    this.decorate();
    this.applyView();
    return ms;
  }

  nodeEl(id) {
    return this.svg ? this.svg.querySelector(`[id="${CSS.escape(this.data.prefix + id)}"]`) : null;
  }

  decorate() {
    if (!this.svg) return;
    for (const [id, meta] of Object.entries(this.data.nodes)) {
      const el = this.nodeEl(id);
      if (!el) continue;
      el.dataset.node = id;
      el.dataset.kind = meta.kind;
      el.classList.add(`tv-kind-${meta.kind}`);
      el.classList.remove("tv-diff-add", "tv-diff-rem", "tv-diff-chg");
      delete el.dataset.diff;
    }
    // The kernel says what each node is in the comparison (viewdata.pane_data): added and removed only where the
    // other run has nothing of what the node draws; a block both runs have, with other ops, is changed.
    const cls = { added: "tv-diff-add", removed: "tv-diff-rem", changed: "tv-diff-chg" };
    for (const [id, m] of Object.entries(this.data.marks || {})) {
      const el = this.nodeEl(id);
      if (!el || !cls[m.status]) continue;
      el.classList.add(cls[m.status]);
      el.dataset.diff = m.status;
      el.dataset.diffOps = `+${m["+"]} -${m["-"]} ~${m["~"]}`;
    }
  }

  // Every pane draws at the one scale s (px per graph unit), so a block is as big in both runs of a comparison;
  // (tx, ty) place each graph's top centre the same number of pixels from its pane's top centre, so panning and
  // zooming move both graphs alike.
  applyView() {
    if (!this.svg || !this.base || !this.view.viewport.s) return;
    const { s, tx, ty } = this.view.viewport;
    const r = this.size();
    const w = Math.max(r.width, 1) / s, hh = Math.max(r.height, 1) / s;
    const x = this.base.x + this.base.w / 2 - (r.width / 2 + tx) / s;
    const y = this.base.y - ty / s;
    this.svg.setAttribute("viewBox", `${x} ${y} ${w} ${hh}`);
  }
}

function render({ model, el }) {
  const root = h("div", { class: "tv-root", "data-mode": model.get("mode") });
  const tRender = performance.timeOrigin + performance.now();
  root.dataset.tRender = String(tRender);
  el.append(root);
  const state = { generation: 0, lastExpanded: [...model.get("expanded")], viewport: { s: 0, tx: 0, ty: 0, auto: true }, panes: [], selected: null, selectedIndex: null, tab: "details" };

  // ---------------------------------------------------------------- toolbar and layout
  const traceSel = h("select", { class: "tv-trace", title: "trace" });
  const search = h("input", { class: "tv-search", type: "search", placeholder: "search op / tensor / parameter", spellcheck: "false" });
  const status = h("span", { class: "tv-status" });
  const btn = (label, title, fn) => h("button", { class: "tv-btn", title, onclick: fn, text: label });
  const toolbar = h("div", { class: "tv-toolbar" },
    h("span", { class: "tv-title", text: model.get("title") }), traceSel, search,
    btn("\u2212", "zoom out", () => zoom(1 / 1.4)), btn("+", "zoom in", () => zoom(1.4)),
    btn("fit", "the whole graph, or as much as fits with readable text (drag to pan)", () => { fitView(); }),
    btn("collapse all", "collapse every block", () => { model.set("expanded", []); model.save_changes(); }),
    status);
  const summary = h("div", { class: "tv-summary" });
  // A comparison's verdict: bytes sent per step, why, one memory difference (viewdata.compare_verdict).
  const verdictLine = model.get("mode") === "compare" ? h("div", { class: "tv-verdict" }) : null;
  // What the comparison's outlines mean (viewdata.pane_data's marks), in the outlines' own colours, by run name.
  const legend = model.get("mode") === "compare" ? h("div", { class: "tv-legend" }) : null;
  // The two runs by name, never by side: a comparison too wide for its pane puts one run above the other.
  const runNames = () => (model.get("runs").length === 2 ? model.get("runs") : ["the first run", "the second run"]);
  function drawLegend() {
    if (!legend) return;
    const [a, b] = runNames();
    legend.replaceChildren("outlines: ",
      h("span", { class: "tv-swatch tv-swatch-add" }), ` added: only in ${b}  `,
      h("span", { class: "tv-swatch tv-swatch-rem" }), ` removed: only in ${a}  `,
      h("span", { class: "tv-swatch tv-swatch-chg" }), " changed: in both, other ops (click it for what changed)");
  }
  const matchesBox = h("div", { class: "tv-matches" });
  const panesBox = h("div", { class: "tv-panes" });
  const tabs = h("div", { class: "tv-tabs" });
  const panel = h("div", { class: "tv-panel" });
  root.append(...[toolbar, verdictLine, summary, legend, matchesBox, panesBox, tabs, panel].filter((x) => x));

  const setStatus = (text, isError) => {
    status.textContent = text;
    status.classList.toggle("tv-error", !!isError);
  };

  function applyViews() {
    for (const p of state.panes) p.applyView();
    const px = state.panes.map((p) => p.textPx()).filter((x) => x !== null);
    if (px.length) root.dataset.minTextPx = Math.min(...px).toFixed(2);
  }

  const drawn = () => state.panes.filter((p) => p.base && p.svg);
  // The one scale that shows every graph whole, each in its own pane.
  const fitAll = () => Math.min(...drawn().map((p) => p.fitScale()));
  // The least scale at which every graph's text stays readable (and no less than a fifth of the whole view).
  const minScale = () => Math.max(0.2 * fitAll(), ...drawn().map((p) => p.readableScale()));

  // Pane sizes, and in a comparison whether the panes sit side by side or one above the other: side by side when
  // both graphs fit their half at one readable scale, else one above the other when that shows them larger (a
  // person compares the same block at the same size, not a half cut off at the pane's edge). A pane grows (up to
  // 1.6x the height) when its graph needs it, then pans.
  function sizePanes() {
    const h = model.get("height");
    const ps = drawn();
    if (!ps.length) { for (const p of state.panes) p.box.style.height = `${h}px`; return; }
    const total = panesBox.getBoundingClientRect().width;
    const gap = 8, tallest = 1.6 * h;
    const readable = Math.max(...ps.map((p) => p.readableScale()));
    const scaleAt = (width) => Math.min(2, ...ps.map((p) => p.fitScale(width - 2, tallest))); // a 1px border each side
    const two = state.panes.length > 1;
    const stacked = two && scaleAt((total - gap) / 2) < readable && scaleAt(total) > scaleAt((total - gap) / 2);
    panesBox.classList.toggle("tv-two", two && !stacked);
    panesBox.classList.toggle("tv-stacked", stacked);
    root.dataset.arrangement = !two ? "single" : stacked ? "stacked" : "side-by-side";
    const s = Math.max(scaleAt(two && !stacked ? (total - gap) / 2 : total), readable);
    const need = (p) => Math.round(Math.min(tallest, p.base.h * s + 2 * FIT_MARGIN_PX));
    if (stacked) {
      for (const p of state.panes) p.box.style.height = `${p.base ? Math.max(need(p), 0.35 * h) : h}px`;
    } else {
      const hh = Math.max(0.6 * h, ...ps.map(need));
      for (const p of state.panes) p.box.style.height = `${hh}px`;
    }
  }

  // Fit: every graph whole, on one scale, FIT_MARGIN_PX clear of its pane's edges, when its text stays readable;
  // otherwise readable, from the top (where data enters).
  function fitView() {
    if (!drawn().length) return;
    state.viewport = { s: Math.max(fitAll(), minScale()), tx: 0, ty: FIT_MARGIN_PX, auto: true };
    applyViews();
  }

  // Zoom by f keeping the point at (fx, fy) (fractions of the pane) where it is, in every pane alike.
  function zoom(f, fx = 0.5, fy = 0.5, pane = null) {
    const v = state.viewport;
    const p = pane || drawn()[0];
    if (!v.s || !p) return;
    const s2 = Math.min(60 * fitAll(), Math.max(minScale(), v.s * f));
    const r = p.size();
    const px = fx * r.width - r.width / 2, py = fy * r.height;
    v.tx = px - ((px - v.tx) * s2) / v.s;
    v.ty = py - ((py - v.ty) * s2) / v.s;
    v.s = s2;
    v.auto = false;
    applyViews();
  }

  // ---------------------------------------------------------------- drawing
  async function drawPanes() {
    const data = model.get("panes");
    while (state.panes.length < data.length) {
      const p = new Pane(state, state.panes.length);
      state.panes.push(p);
      panesBox.append(p.el);
      attachPointer(p);
    }
    while (state.panes.length > data.length) state.panes.pop().el.remove();
    for (const p of state.panes) if (!p.box.style.height) p.box.style.height = `${model.get("height")}px`;
    panesBox.classList.toggle("tv-two", data.length > 1);
    setStatus("laying out\u2026");
    const gv = layoutService(model);
    const generation = ++state.generation;
    for (const p of state.panes) p.generation = generation;
    const t0 = performance.now();
    const times = (await Promise.all(data.map((d, i) => state.panes[i].draw(d, gv)))).filter((x) => x !== null);
    if (generation !== state.generation) return;
    const nodes = data.reduce((n, p) => n + Object.keys(p.nodes).length, 0);
    if (times.length) {
      const total = times.reduce((a, b) => a + b, 0);
      root.dataset.layoutMs = total.toFixed(1);
      root.dataset.tDrawn = String(performance.timeOrigin + performance.now());
      if (!root.dataset.tFirstDrawn) root.dataset.tFirstDrawn = root.dataset.tDrawn;
      setStatus(`${nodes} nodes \u00b7 drawn in ${(performance.now() - t0).toFixed(0)} ms (${gv.where()})`);
    } else {
      setStatus(`${nodes} nodes`);
    }
    const opened = model.get("expanded").filter((x) => !state.lastExpanded.includes(x));
    const closed = state.lastExpanded.filter((x) => !model.get("expanded").includes(x));
    state.lastExpanded = [...model.get("expanded")];
    sizePanes();
    if (opened.length) focusGroup(opened[opened.length - 1]);
    // a collapse redraws a smaller graph: the zoom that showed the open block would blow one node up to fill the pane
    else if (closed.length || (times.length && (state.viewport.auto || state.viewport.s < minScale()))) fitView();
    else applyViews();
    root.dataset.drawn = String(Number(root.dataset.drawn || 0) + 1);
    markMatches();
    showSelected();
  }

  function attachPointer(p) {
    let down = null;
    p.box.addEventListener("wheel", (ev) => {
      ev.preventDefault();
      const r = p.box.getBoundingClientRect();
      zoom(Math.exp(-ev.deltaY * 0.0015), (ev.clientX - r.left) / r.width, (ev.clientY - r.top) / r.height, p);
    }, { passive: false });
    p.box.addEventListener("pointerdown", (ev) => {
      down = { x: ev.clientX, y: ev.clientY, tx: state.viewport.tx, ty: state.viewport.ty, moved: false };
    });
    p.box.addEventListener("pointermove", (ev) => {
      if (!down || !p.base) return;
      const dx = ev.clientX - down.x, dy = ev.clientY - down.y;
      if (Math.abs(dx) + Math.abs(dy) > 4) down.moved = true;
      if (!down.moved) return;
      Object.assign(state.viewport, { tx: down.tx + dx, ty: down.ty + dy, auto: false });
      applyViews();
    });
    p.box.addEventListener("pointerup", () => { setTimeout(() => { down = null; }, 0); });
    p.box.addEventListener("click", (ev) => {
      if (down && down.moved) return;
      const g = ev.target.closest("g.node, g.cluster");
      if (!g || !g.dataset.node) return;
      select(p.index, g.dataset.node, null);
    });
    p.box.addEventListener("dblclick", (ev) => {
      const g = ev.target.closest("g.node, g.cluster");
      if (!g || !g.dataset.node) return;
      const meta = p.data.nodes[g.dataset.node];
      if (meta && (meta.kind === "group" || meta.kind === "cluster")) toggleGroup(meta.name);
    });
  }

  function toggleGroup(name) {
    const cur = model.get("expanded");
    const next = cur.includes(name) ? cur.filter((x) => x !== name) : [...cur, name];
    setStatus(cur.includes(name) ? `collapsing ${name}\u2026` : `expanding ${name}\u2026`);
    model.set("expanded", next);
    model.save_changes();
  }

  function focusGroup(name) {
    // Show the block just opened whole when it fits with readable text, else readable from its top (pan for the
    // rest): zooming to its width alone made a tall block's first few ops fill the pane.
    for (const p of state.panes) {
      const g = (p.data.groups || []).find((x) => x.name === name);
      const el = g && p.nodeEl(g.id);
      if (!el || !p.base) continue;
      const bb = el.getBBox();
      const m = p.svg.getScreenCTM().inverse().multiply(el.getScreenCTM());
      const x0 = m.a * bb.x + m.e, y0 = m.d * bb.y + m.f, bw = m.a * bb.width, bh = m.d * bb.height;
      const r = p.size();
      const room = (n) => Math.max(n - 2 * FIT_MARGIN_PX, 1);
      const whole = Math.min(room(r.width) / bw, room(r.height) / bh);
      const least = minScale();
      const most = Math.max(least, 18 / p.minFont()); // never more than ~18 px text either
      const s = Math.min(most, Math.max(least, whole));
      const fitsTall = bh * s <= room(r.height);
      const tx = -(x0 + bw / 2 - (p.base.x + p.base.w / 2)) * s;
      const ty = fitsTall ? r.height / 2 - (y0 + bh / 2 - p.base.y) * s : FIT_MARGIN_PX - (y0 - p.base.y) * s;
      state.viewport = { s, tx, ty, auto: false };
      applyViews();
      return;
    }
  }

  // ---------------------------------------------------------------- selection and details
  function select(pane, node, index) {
    state.selected = { pane, node };
    state.selectedIndex = index;
    model.set("selected", { pane, node });
    model.save_changes();
    showTab("details");
    showSelected();
  }

  function showSelected() {
    for (const p of state.panes) {
      if (!p.svg) continue;
      for (const e of p.svg.querySelectorAll(".tv-selected")) e.classList.remove("tv-selected");
    }
    const sel = state.selected;
    if (!sel || !state.panes[sel.pane] || !state.panes[sel.pane].data) {
      if (state.tab === "details") panel.replaceChildren(h("p", { class: "tv-hint", text: "Click a node for its details; double-click a block to open it." }));
      return;
    }
    const p = state.panes[sel.pane];
    const meta = p.data.nodes[sel.node];
    if (!meta) {
      state.selected = null;
      if (state.tab === "details") panel.replaceChildren(h("p", { class: "tv-hint", text: "Click a node for its details; double-click a block to open it." }));
      return;
    }
    const el = p.nodeEl(sel.node);
    if (el) el.classList.add("tv-selected");
    if (state.tab === "details") panel.replaceChildren(details(meta, p, sel.node));
  }

  function ledgerRow(led) {
    if (!led) return null;
    const rows = [
      ["kind", led.kind], ["tensor", led.tensor], ["shape", `${led.dtype || ""}${shapeText(led.shape)}`],
      ...(led.bucket ? [["bucket", `${led.bucket}: ${(led.params || []).length} parameters`], ["parameters", (led.params || []).join(", ")]] : []),
      ["bytes (this rank)", fmtBytes(led.bytes)],
      ["group size", led.group_size ?? ""], ["result shape", shapeText(led.out_shape)],
      ["wait distance (ops)", led.distance ?? (led.kind === "wait" ? "" : "synchronous")],
      ["ledger position", led.position], ["waits for", led.waits_for ?? ""],
    ];
    return h("div", { class: "tv-ledger-row" }, h("h5", { text: "Collectives ledger" }), table(["field", "value"], rows));
  }

  function opDetails(m) {
    const box = h("div", { class: "tv-op", "data-index": m.index });
    box.append(h("div", { class: "tv-op-head" }, h("b", { text: m.op }), ` \u00b7 op ${m.index} \u00b7 `, h("span", { text: m.module || m.group || "" })));
    box.append(h("pre", { class: "tv-python", text: m.python || m.op }));
    if (m.source) box.append(h("div", { class: "tv-source" }, h("span", { class: "tv-k", text: "source " }), h("code", { text: `${m.source.file}:${m.source.line}` }), h("pre", { text: m.source.code })));
    else box.append(h("div", { class: "tv-source tv-hint", text: "no source line (thunder records them for forward ops only)" }));
    const ts = [...m.inputs.map((x) => ["in", x]), ...m.outputs.map((x) => ["out", x])];
    if (ts.length) box.append(table(["", "tensor", "shape", "dtype", "kind"], ts.map(([d, x]) => [d, x.name, shapeText(x.shape), x.dtype || "", x.kind])));
    const led = ledgerRow(m.ledger);
    if (led) box.append(led);
    return box;
  }

  // What changed in a group from the first run to the second (trace.diff.GroupChange), said with the runs' names.
  function changeBox(c) {
    const [a, b] = c.runs;
    const head = {
      added: `only in ${b} (${a} has no ${c.name})`, removed: `only in ${a} (${b} has no ${c.name})`,
      changed: `in both runs, changed from ${a} to ${b}`, same: `the same in ${a} and ${b}`,
    }[c.status];
    const box = h("div", { class: "tv-change", "data-status": c.status }, h("div", { class: "tv-change-head" }, h("b", { text: c.name }), `: ${head}`));
    if (c.status === "changed") {
      const rows = [
        ...Object.entries(c.ops_added).map(([k, n]) => [`added in ${b}`, k, n]),
        ...Object.entries(c.ops_removed).map(([k, n]) => [`removed (only in ${a})`, k, n]),
        ...Object.entries(c.ops_changed).map(([k, n]) => ["other shapes or dtypes", k, n]),
      ];
      if (rows.length) box.append(table(["", "op", "count"], rows, (i) => ({ class: "tv-change-op" })));
    }
    const kinds = [...new Set([...Object.keys(c.collectives_a), ...Object.keys(c.collectives_b)])];
    if (kinds.length) box.append(table(["collective", a, b], kinds.map((k) => [k, c.collectives_a[k] || 0, c.collectives_b[k] || 0]), () => ({ class: "tv-change-coll" })));
    if (c.bytes_a || c.bytes_b) {
      const d = c.bytes_b - c.bytes_a;
      const delta = d ? ` (${d > 0 ? "+" : "\u2212"}${fmtBytes(Math.abs(d))})` : " (the same)";
      box.append(h("div", { class: "tv-change-bytes", text: `bytes sent on this rank: ${fmtBytes(c.bytes_a)} in ${a}, ${fmtBytes(c.bytes_b)} in ${b}${delta}` }));
    }
    return box;
  }

  function details(meta, p, node) {
    if (!meta) return h("p", { class: "tv-hint", text: "(no details)" });
    const out = h("div", { class: "tv-details", "data-kind": meta.kind });
    if (meta.change && meta.change.status !== "same") out.append(changeBox(meta.change));
    const mark = p && p.data.marks ? p.data.marks[node] : null;
    if (mark && !meta.change && model.get("runs").length === 2) {
      const [a, b] = model.get("runs");
      const said = { added: `only in ${b} (added)`, removed: `only in ${a} (removed)`, changed: `in both runs, other shapes or dtypes in ${b}` }[mark.status];
      if (said) out.append(h("div", { class: "tv-change", "data-status": mark.status }, h("div", { class: "tv-change-head", text: `this op: ${said}` })));
    }
    if (meta.kind === "cluster") {
      out.append(h("div", { class: "tv-op-head" }, h("b", { text: meta.name }), ` \u00b7 open: ${meta.n_compute} compute ops `,
        h("button", { class: "tv-btn", text: "collapse block", onclick: () => toggleGroup(meta.name) })));
      return out;
    }
    if (meta.kind === "group") {
      const open = model.get("expanded").includes(meta.name);
      out.append(h("div", { class: "tv-op-head" }, h("b", { text: meta.name }), ` \u00b7 ${meta.n_compute} compute ops (${meta.n_ops} with collectives) \u00b7 trace ops ${meta.first_index}\u2013${meta.last_index} `,
        h("button", { class: "tv-btn", text: open ? "collapse block" : "expand block", onclick: () => toggleGroup(meta.name) })));
      out.append(table(["op", "count"], Object.entries(meta.op_counts)));
      if (Object.keys(meta.collectives).length) out.append(table(["collective", "count"], Object.entries(meta.collectives)));
      if (meta.sources.length) out.append(h("h5", { text: "Source lines" }), h("pre", { text: meta.sources.join("\n") }));
      return out;
    }
    if (meta.kind === "collectives") {
      out.append(h("div", { class: "tv-op-head" }, h("b", { text: `${meta.group}: ${meta.ops.length} collectives and waits` })));
      const rows = meta.ops.map((m) => {
        const l = m.ledger || {};
        return [m.index, m.kind === "wait" ? "wait" : (l.kind || m.op), l.tensor || "", `${l.dtype || ""}${shapeText(l.shape)}`, fmtBytes(l.bytes), l.group_size ?? "", l.distance ?? ""];
      });
      out.append(table(["op", "kind", "tensor", "shape", "bytes", "group", "wait distance"], rows, (i) => ({
        class: "tv-coll-row" + (meta.ops[i].index === state.selectedIndex ? " tv-hit" : ""), "data-index": meta.ops[i].index,
      })));
      const chosen = meta.ops.find((m) => m.index === state.selectedIndex) || meta.ops[0];
      const holder = h("div", { class: "tv-op-holder" }, opDetails(chosen));
      out.append(holder);
      out.addEventListener("click", (ev) => {
        const tr = ev.target.closest("tr.tv-coll-row");
        if (!tr) return;
        const m = meta.ops.find((o) => String(o.index) === tr.dataset.index);
        for (const r of out.querySelectorAll("tr.tv-hit")) r.classList.remove("tv-hit");
        tr.classList.add("tv-hit");
        state.selectedIndex = m.index;
        holder.replaceChildren(opDetails(m));
      });
      return out;
    }
    out.append(opDetails(meta));
    return out;
  }

  // ---------------------------------------------------------------- search
  let searchTimer = null;
  search.addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => { model.set("search", search.value); model.save_changes(); }, 200);
  });

  function markMatches() {
    for (const p of state.panes) {
      if (!p.svg) continue;
      for (const e of p.svg.querySelectorAll(".tv-match")) e.classList.remove("tv-match");
    }
    const hits = model.get("matches");
    const q = model.get("searched");
    for (const m of hits) {
      const p = state.panes[m.pane];
      const e = p && p.nodeEl(m.node);
      if (e) e.classList.add("tv-match");
    }
    if (!q) { matchesBox.replaceChildren(); return; }
    const total = model.get("match_total");
    if (!total) {
      matchesBox.replaceChildren(h("div", { class: "tv-match-count tv-no-match", text: `no matches for \u201c${q}\u201d in the ${model.get("trace")} trace (search reads op names, tensor and parameter names, and modules)` }));
      return;
    }
    const list = h("ol", { class: "tv-match-list" });
    for (const m of hits.slice(0, 50)) {
      const side = state.panes.length > 1 ? `${runNames()[m.pane]}: ` : ""; // by name: the panes may stack
      list.append(h("li", { class: `tv-match-item tv-kind-${m.kind}`, "data-node": m.node, "data-index": m.index, "data-pane": m.pane,
        onclick: () => select(m.pane, m.node, m.index) }, `${side}${m.label}`, h("span", { class: "tv-hint", text: ` \u00b7 ${m.group} \u00b7 op ${m.index}` })));
    }
    matchesBox.replaceChildren(h("div", { class: "tv-match-count", text: `${total} match${total === 1 ? "" : "es"} for \u201c${q}\u201d${total > 50 ? " (first 50 listed)" : ""}` }), list);
  }

  // ---------------------------------------------------------------- panels
  const TAB_NAMES = { details: "Details", diff: "Diff", ledger: "Collectives ledger", decisions: "Decisions", memory: "Memory" };

  function drawTabs() {
    const panels = model.get("panels") || {};
    const names = ["details", ...Object.keys(TAB_NAMES).filter((k) => k !== "details" && k in panels)];
    tabs.replaceChildren(...names.map((n) => h("button", { class: "tv-tab" + (n === state.tab ? " tv-on" : ""), "data-tab": n, text: TAB_NAMES[n], onclick: () => showTab(n) })));
  }

  function showTab(name) {
    state.tab = name;
    drawTabs();
    const panels = model.get("panels") || {};
    if (name === "details") { showSelected(); return; }
    if (name === "ledger") panel.replaceChildren(ledgerPanel(panels.ledger));
    else if (name === "decisions") panel.replaceChildren(decisionsPanel(panels.decisions));
    else if (name === "memory") panel.replaceChildren(memoryPanel(panels.memory), ...(panels.memory_view ? [memoryView(panels.memory_view)] : []));
    else if (name === "diff") panel.replaceChildren(diffPanel(panels.diff));
  }

  // One line per decision; its full reasoning (mechanism, why this default, measured numbers) one click away.
  function decisionsPanel(rows) {
    if (!rows || !rows.length) return h("p", { class: "tv-hint", text: "No jit decisions were recorded for this object." });
    return h("div", { class: "tv-decisions" }, ...rows.map((d) => h("details", { class: "tv-decision" },
      h("summary", {}, h("b", { text: d.target }), ": ", h("span", { class: "tv-headline", text: d.headline || `${d.case}: ${d.action}` })),
      h("p", { class: "tv-reason", text: `${d.case} \u00b7 ${d.action}: ${d.reason}` }))));
  }

  // The memory panel (memory_tab.MemoryPanel): titled columns, sizes in KiB/MiB, "-" where a rank has no number.
  function memoryPanel(mem) {
    if (!mem || !mem.rows || !mem.rows.length) return h("p", { class: "tv-hint", text: "No memory was recorded." });
    const cols = mem.columns;
    const cell = (v, c) => (v === null || v === undefined ? "-" : c.unit === "bytes" ? fmtBytes(v) : String(v));
    // a title that already says how its number was obtained ("step peak, measured") is not told again
    const heads = ["rank", ...cols.map((c) => (c.source === "measured" && !c.title.includes("measured") ? `${c.title} (measured)` : c.title))];
    return h("div", { class: "tv-memory-ranks" }, table(heads, mem.rows.map((r) => [r.rank, ...cols.map((c) => cell(r[c.key], c))])),
      h("details", { class: "tv-hint tv-peak-note" }, h("summary", { text: "What \u201cstep peak\u201d means" }), h("p", { text: mem.note })));
  }

  function ledgerPanel(led) {
    const box = h("div", { class: "tv-ledger" });
    if (!led) return box;
    for (const msg of led.mismatches) box.append(h("div", { class: "tv-mismatch", text: msg }));
    if (!led.mismatches.length && led.ranks.length > 1) box.append(h("div", { class: "tv-ok", text: `Ranks ${led.ranks.join(", ")} issue the same ${led.rows.length} collectives.` }));
    // what each rank puts on the wire per step (ring algorithm): the number the verdicts and tables say too
    box.append(h("p", { class: "tv-sent", text: `Sent per step (ring algorithm): ${led.ranks.map((r) => `rank ${r} ${fmtBytes(led.bytes[r])}`).join(", ")}.` }));
    const bad = new Set(led.bad);
    const headers = ["#", "trace", "kind", "tensor", ...led.ranks.map((r) => `rank ${r}`), "group", "wait distance"];
    const rows = led.rows.map((cells, i) => {
      const e = cells.find((c) => c) || {};
      return [i + 1, e.trace, e.kind, e.tensor, ...cells.map((c) => (c ? `${c.dtype || ""}${shapeText(c.shape)} ${fmtBytes(c.bytes)}` : "\u2014")), e.group_size ?? "", e.distance ?? ""];
    });
    box.append(table(headers, rows, (i) => ({ class: bad.has(i) ? "tv-bad" : "" })));
    return box;
  }

  function diffPanel(d) {
    const box = h("div", { class: "tv-diff" });
    if (!d) return box;
    box.append(h("p", { text: `${d.total} differing rows, ${d.unchanged} ops aligned unchanged${d.total > d.rows.length ? ` (first ${d.rows.length} listed)` : ""}.` }));
    box.append(table(["", ...runNames()], d.rows.map((r) => [r.tag, r.a, r.b]), (i) => ({ class: `tv-row-${{ "+": "add", "-": "rem", "~": "chg" }[d.rows[i].tag]}` })));
    return box;
  }

  // ---------------------------------------------------------------- model wiring
  function drawTraces() {
    const cur = model.get("trace");
    const names = model.get("trace_names") || {};
    traceSel.replaceChildren(...model.get("traces").map((x) => { const o = h("option", { value: x, text: names[x] || x }); o.selected = x === cur; return o; }));
  }
  traceSel.addEventListener("change", () => { model.set("trace", traceSel.value); model.save_changes(); });
  const drawSummary = () => {
    summary.textContent = model.get("summary");
    summary.hidden = !model.get("summary");
    if (verdictLine) { verdictLine.textContent = model.get("verdict"); verdictLine.hidden = !model.get("verdict"); }
  };

  const redraw = () => drawPanes().catch((err) => { setStatus(`layout failed: ${err}`, true); console.error("thunderviz: layout failed", err); });
  const onTrace = () => { drawTraces(); state.selected = null; state.viewport = { s: 0, tx: 0, ty: 0, auto: true }; };
  model.on("change:panes", redraw);
  model.on("change:matches", markMatches);
  model.on("change:match_total", markMatches);
  model.on("change:searched", markMatches);
  model.on("change:trace", onTrace);
  model.on("change:traces", drawTraces);
  model.on("change:trace_names", drawTraces);
  model.on("change:summary", drawSummary);
  model.on("change:verdict", drawSummary);
  model.on("change:runs", drawLegend);
  model.on("change:panels", () => showTab(state.tab));
  model.on("change:selected", () => {
    const s = model.get("selected");
    state.selected = s && s.node !== undefined ? { pane: s.pane, node: s.node } : null;
    if (state.tab === "details") showSelected(); else showTab("details");
  });
  drawTraces();
  drawSummary();
  drawLegend();
  drawTabs();
  search.value = model.get("search");
  redraw();
  return () => { clearTimeout(searchTimer); };
}

export default { render };
