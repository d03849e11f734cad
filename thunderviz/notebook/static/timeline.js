// thunderviz timeline view (anywidget front end): one lane per rank, zoom and pan, click a collective for its
// ledger row and every rank's arrival, highlight a module group's spans.
//
// Safety: the SVG is built from numbers only (coordinates, indices, colours from the kernel's fixed palette);
// every string that comes from user code (tensor and module names) reaches the page through textContent.
// Nothing is fetched: no CDN, no network.

const ROW = 18;
const LABEL_W = 150;
const RANK_GAP = 14;
// About the widest a character of a step label draws (11 px semibold: "step 12" measured 37 px): whether it fits.
const STEP_CHAR_PX = 6;
// Each lane's rows, top to bottom, as their labels read.
const ROWS = ["steps", "compute by module", "main thread", "collectives"];

function fmtMs(us) {
  const ms = us / 1000;
  return Math.abs(ms) >= 1 ? `${ms.toFixed(1)} ms` : `${ms.toFixed(2)} ms`;
}

function niceStep(ms) {
  for (const s of [0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]) if (s >= ms) return s;
  return 10000;
}

// Each module group's colour comes from the kernel (render.timeline_svg.group_colour: numbered blocks a golden
// angle apart, so blocks.0-3 never share one hue), in data.group_colours beside data.groups.
function groupColour(data, i) {
  return (data.group_colours || [])[i] || "#dbe9f6";
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function render({ model, el: host }) {
  const root = el("div", "tl-root");
  root.dataset.drawn = "0";
  host.append(root);
  const toolbar = el("div", "tl-toolbar");
  const title = el("span", "tl-title");
  const btn = (label, tip, fn) => {
    const b = el("button", "tl-btn", label);
    b.title = tip;
    b.addEventListener("click", fn);
    toolbar.append(b);
    return b;
  };
  toolbar.append(title);
  const summary = el("div", "tl-summary");
  const note = el("div", "tl-note");
  const plot = el("div", "tl-plot");
  const tip = el("div", "tl-tip");
  tip.style.display = "none";
  const legend = el("div", "tl-legend");
  const details = el("div", "tl-details");
  const groupBox = el("div", "tl-group");
  root.append(toolbar, summary, note, plot, legend, tip, groupBox, details);

  let data = model.get("data");
  const fullSpan = () => Math.max(data.span || data.duration || 1, 1); // span: a common scale across runs
  let view = [0, fullSpan()];
  let width = 960;
  let selectedKey = null;
  const byKey = new Map(); // "step:index" -> [{rank, c}]
  let items = []; // hover/click targets of the current drawing: {kind, rank, i}

  const index = () => {
    byKey.clear();
    for (const r of data.ranks) {
      r.coll.forEach((c, i) => {
        const key = `${c[1]}:${c[2]}`;
        if (!byKey.has(key)) byKey.set(key, []);
        byKey.get(key).push({ rank: r.rank, i, c });
      });
    }
  };

  btn("\u2212", "zoom out", () => zoom(2, 0.5));
  btn("+", "zoom in", () => zoom(0.5, 0.5));
  btn("fit", "show all recorded steps (on the common scale when one was set)", () => setView([0, fullSpan()]));
  const worstBtn = btn("worst wait", "select the collective that made a rank wait longest", () => {
    if (data.worst) select(data.worst);
  });
  const hint = el("span", "tl-hint", "wheel: zoom \u00b7 drag: pan \u00b7 click a collective (orange) for its arrivals");
  toolbar.append(hint);

  function setView(v) {
    const span = Math.max(v[1] - v[0], 1);
    view = [v[0], v[0] + span];
    draw();
  }

  function zoom(factor, at) {
    const span = view[1] - view[0];
    const centre = view[0] + span * at;
    const next = Math.max(span * factor, 5);
    setView([centre - next * at, centre - next * at + next]);
  }

  function x(t, plotW) {
    return LABEL_W + ((t - view[0]) / (view[1] - view[0])) * plotW;
  }

  function draw() {
    width = Math.max(root.clientWidth || 960, 480);
    const plotW = width - LABEL_W - 8;
    const c = data.colours;
    const rankH = ROWS.length * ROW + 6;
    const height = 36 + data.ranks.length * (rankH + RANK_GAP);
    const res = (view[1] - view[0]) / plotW;
    const out = [];
    items = [];
    const vis = (a, b) => b >= view[0] && a <= view[1];
    const rect = (a, b, y, h, fill, stroke, extra) => {
      const xa = x(Math.max(a, view[0]), plotW);
      const xb = x(Math.min(b, view[1]), plotW);
      out.push(`<rect x="${xa.toFixed(1)}" y="${y.toFixed(1)}" width="${Math.max(xb - xa, 0.7).toFixed(1)}" height="${h}" fill="${fill}" stroke="${stroke}" stroke-width="0.6"${extra || ""}/>`);
    };
    // axis
    const stepMs = niceStep((view[1] - view[0]) / 1000 / 8);
    for (let t = Math.ceil(view[0] / (stepMs * 1000)) * stepMs * 1000; t <= view[1]; t += stepMs * 1000) {
      const xt = x(t, plotW).toFixed(1);
      out.push(`<line x1="${xt}" y1="14" x2="${xt}" y2="${height}" stroke="#e3e8ee"/>`);
      out.push(`<text x="${xt}" y="11" text-anchor="middle" class="tl-axis">${+(t / 1000).toFixed(3)} ms</text>`);
    }
    // Step markers: where each step begins on the common clock (the first rank's steps), with its number. A label
    // stays between its marker and the next (or the plot's end): "step 5" where it fits, else "5", else none (the
    // marker's tooltip still names it), so short steps beside long ones never draw their labels over each other.
    const first = data.ranks[0];
    const shown = (first ? first.steps : []).filter((st) => st[0] >= view[0] && st[0] <= view[1]);
    shown.forEach((st, i) => {
      const xs = x(st[0], plotW);
      const room = (i + 1 < shown.length ? x(shown[i + 1][0], plotW) : x(view[1], plotW)) - xs - 6;
      const label = [`step ${st[2]}`, `${st[2]}`].find((t) => t.length * STEP_CHAR_PX <= room);
      out.push(`<line class="tl-step-marker" data-step="${st[2]}" x1="${xs.toFixed(1)}" y1="16" x2="${xs.toFixed(1)}" y2="${height}" stroke="${c.step}" stroke-dasharray="4 3"><title>step ${st[2]}</title></line>`);
      if (label) out.push(`<text x="${(xs + 3).toFixed(1)}" y="27" class="tl-step-label" data-step="${st[2]}">${label}</text>`);
    });
    const hl = model.get("highlight") || {};
    const hlSpans = hl.spans || {};
    let y = 32;
    for (const r of data.ranks) {
      out.push(`<g class="tl-lane" data-rank="${r.rank}">`);
      out.push(`<text x="4" y="${y + 14}" class="tl-rank">rank ${r.rank}</text>`);
      // the clock bound beside the rank's name (the row labels fill the rest of the label column)
      if (r.clock_us > 0) out.push(`<text x="54" y="${y + 14}" class="tl-clock">\u00b1${(r.clock_us / 1000).toFixed(r.clock_us >= 1000 ? 1 : 2)} ms</text>`);
      ROWS.forEach((name, i) => out.push(`<text x="${LABEL_W - 6}" y="${y + i * ROW + 13}" text-anchor="end" class="tl-row-label">${name}</text>`));
      for (const s of r.steps) if (vis(s[0], s[1])) rect(s[0], s[1], y, rankH - 6, "none", c.step);
      r.regions.forEach((g, i) => {
        if (!vis(g[1], g[2])) return;
        rect(g[1], g[2], y + 1, ROW - 2, c[g[0]] || c.group, c.group_border, ` data-item="${items.length}"`);
        items.push({ kind: "region", rank: r.rank, i });
      });
      const y1 = y + ROW;
      r.segments.forEach((s, i) => {
        if (!vis(s[0], s[1]) || s[1] - s[0] < res / 4) return;
        rect(s[0], s[1], y1 + 1, ROW - 2, groupColour(data, s[2]), "none", ` data-item="${items.length}"`);
        items.push({ kind: "segment", rank: r.rank, i });
      });
      const y2 = y + 2 * ROW;
      let cur = null;
      for (const b of r.busy) {
        if (!vis(b[0], b[1])) continue;
        if (cur && b[0] - cur[1] <= res) cur[1] = Math.max(cur[1], b[1]);
        else {
          if (cur) rect(cur[0], cur[1], y2 + 3, ROW - 6, c.op, "none");
      // Idle (no op, not blocked: a sleep, data loading): dotted, so a pause never reads as blank.
      (r.idle || []).forEach((d, i) => {
        if (!vis(d[0], d[1]) || d[1] - d[0] < 2 * res) return;
        rect(d[0], d[1], y2 + 3, ROW - 6, "url(#tl-idle)", c.idle_dot, ` class="tl-idle" data-item="${items.length}"`);
        items.push({ kind: "idle", rank: r.rank, i });
      });
          cur = [b[0], b[1]];
        }
      }
      if (cur) rect(cur[0], cur[1], y2 + 3, ROW - 6, c.op, "none");
      // Idle (no op, not blocked: a sleep, data loading): dotted, so a pause never reads as blank.
      (r.idle || []).forEach((d, i) => {
        if (!vis(d[0], d[1]) || d[1] - d[0] < 2 * res) return;
        rect(d[0], d[1], y2 + 3, ROW - 6, "url(#tl-idle)", c.idle_dot, ` class="tl-idle" data-item="${items.length}"`);
        items.push({ kind: "idle", rank: r.rank, i });
      });
      const y3 = y + 3 * ROW;
      r.coll.forEach((k, i) => {
        // [id, step, index, kind, tensor, issue_s, issue_e, start, end, wait_s, wait_e, group, sync, rowIdx]
        const key = `${k[1]}:${k[2]}`;
        const sel = key === selectedKey ? ' class="tl-sel"' : "";
        const blk = k[12] ? [[k[5], k[6]]] : [[k[5], k[6]]].concat(k[9] !== null ? [[k[9], k[10]]] : []);
        // Cut where the collective's work ended: what follows is the thread not yet running again, drawn apart.
        const end = k[8];
        const pieces = [];
        for (const [a, b] of blk) {
          if (end !== null && a < end && end < b) pieces.push([a, end, false], [end, b, true]);
          else pieces.push([a, b, end !== null && a >= end && !k[12]]);
        }
        for (const [a, b, after] of pieces) {
          if (vis(a, b) && b - a >= res / 2) {
            rect(a, b, y2 + 1, ROW - 2, after ? "url(#tl-after-work)" : c.wait, c.wait_border, ` data-item="${items.length}" data-key="${key}"${sel}${after ? ' data-after="1"' : ""}`);
            items.push({ kind: after ? "after" : "wait", rank: r.rank, i });
          }
        }
      });
      // Communication in flight: concurrent collectives share the row, so the longest are drawn first and the
      // shorter ones on top (a short collective is never hidden under a long one), and the selected one last.
      const inFlight = r.coll.map((k, i) => [k, i, k[7] !== null ? k[7] : k[5], k[8] !== null ? k[8] : k[6]]);
      const onTop = (k) => (`${k[1]}:${k[2]}` === selectedKey ? 1 : 0);
      inFlight.sort((p, q) => onTop(p[0]) - onTop(q[0]) || (q[3] - q[2]) - (p[3] - p[2]));
      for (const [k, i, s, e] of inFlight) {
        const key = `${k[1]}:${k[2]}`;
        if (vis(s, e)) {
          rect(s, e, y3 + 1, ROW - 2, c.collective, c.collective_border, ` class="tl-coll${key === selectedKey ? " tl-sel" : ""}" data-item="${items.length}" data-key="${key}" data-rank="${r.rank}"`);
          items.push({ kind: "coll", rank: r.rank, i });
        }
      }
      for (const sp of hlSpans[r.rank] || []) {
        if (vis(sp[0], sp[1])) rect(sp[0], sp[1], y, rankH - 6, "none", c.highlight, ' class="tl-hl" stroke-width="2"');
      }
      out.push("</g>");
      y += rankH + RANK_GAP;
    }
    const defs = '<defs><pattern id="tl-after-work" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#fff8dc"/><line x1="0" y1="0" x2="0" y2="6" stroke="#c9a400" stroke-width="2"/></pattern>'
      + `<pattern id="tl-idle" width="5" height="5" patternUnits="userSpaceOnUse"><rect width="5" height="5" fill="${c.idle}"/><circle cx="2.5" cy="2.5" r="0.9" fill="${c.idle_dot}"/></pattern></defs>`;
    plot.innerHTML = `<svg class="tl-svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}">${defs}${out.join("")}</svg>`;
    root.dataset.drawn = String(Number(root.dataset.drawn) + 1);
    root.dataset.view = `${view[0].toFixed(1)},${view[1].toFixed(1)}`;
  }

  function describe(item) {
    const r = data.ranks.find((q) => q.rank === item.rank);
    if (item.kind === "region") {
      const g = r.regions[item.i];
      return `rank ${r.rank} step ${g[3]} ${g[0]}${g[4] ? " " + g[4] : ""}: ${fmtMs(g[2] - g[1])}`;
    }
    if (item.kind === "idle") {
      const d = r.idle[item.i];
      return `rank ${r.rank} idle ${fmtMs(d[1] - d[0])}: no op ran and no collective blocked it (a sleep, data loading, Python)`;
    }
    if (item.kind === "segment") {
      const s = r.segments[item.i];
      return `rank ${r.rank} compute of ${data.groups[s[2]]} (${s[3]}): ${fmtMs(s[1] - s[0])}`;
    }
    const k = r.coll[item.i];
    const label = `${k[3]} #${k[2]} ${k[4]}`;
    if (item.kind === "wait") return `rank ${r.rank} blocked by ${label} (step ${k[1]})`;
    if (item.kind === "after") return `rank ${r.rank} still blocked after ${label} (step ${k[1]}) finished its work: the backend completing, or the waiting thread not yet running again (ranks sharing CPUs)`;
    const s = k[7] !== null ? k[7] : k[5];
    const e = k[8] !== null ? k[8] : k[6];
    return `rank ${r.rank} ${label} (step ${k[1]}): in flight ${fmtMs(e - s)}`;
  }

  function select(key) {
    selectedKey = key;
    model.set("selected", { key });
    model.save_changes();
    showDetails();
    draw();
  }

  function showDetails() {
    details.replaceChildren();
    if (!selectedKey || !byKey.has(selectedKey)) return;
    const rows = byKey.get(selectedKey);
    const k = rows[0].c;
    const w = (data.waits || {})[selectedKey];
    details.append(el("div", "tl-details-title", `${k[3]} #${k[2]} ${k[4]} (step ${k[1]})`));
    if (w) details.append(el("div", "tl-message", w.message));
    const led = data.ledger[k[13]] || {};
    const t1 = el("table", "tl-ledger");
    const head = el("tr");
    const body = el("tr");
    for (const [name, v] of Object.entries(led)) {
      head.append(el("th", "", name));
      body.append(el("td", "", v === null || v === undefined ? "" : String(v)));
    }
    t1.append(head, body);
    details.append(el("div", "tl-sub", "ledger row"), t1);
    const t2 = el("table", "tl-arrivals");
    const h2 = el("tr");
    for (const name of ["rank", "arrived (ms)", "after first (ms)", "waited for last (ms)", "blocked (ms)", ""]) h2.append(el("th", "", name));
    t2.append(h2);
    const first = Math.min(...rows.map((q) => (q.c[7] !== null ? q.c[7] : q.c[5])));
    for (const q of rows.sort((a, b) => a.rank - b.rank)) {
      const arr = q.c[7] !== null ? q.c[7] : q.c[5];
      const blocked = (q.c[6] - q.c[5]) + (!q.c[12] && q.c[9] !== null ? q.c[10] - q.c[9] : 0);
      const tr = el("tr");
      tr.dataset.rank = String(q.rank);
      const last = w && w.last === q.rank;
      if (last) tr.className = "tl-last";
      for (const v of [q.rank, (arr / 1000).toFixed(3), ((arr - first) / 1000).toFixed(3),
        w ? ((w.waited[q.rank] || 0) / 1000).toFixed(3) : "", (blocked / 1000).toFixed(3), last ? "arrived last" : ""]) tr.append(el("td", "", String(v)));
      t2.append(tr);
    }
    details.append(el("div", "tl-sub", "arrivals"), t2);
  }

  function showGroup() {
    const hl = model.get("highlight") || {};
    groupBox.replaceChildren();
    if (hl.group) {
      const n = Object.values(hl.spans || {}).reduce((a, s) => a + s.length, 0);
      groupBox.append(el("span", "", `${hl.group}: ${n} span(s) outlined`));
    }
    draw();
  }

  // ---------------------------------------------------------------- interaction
  let drag = null;
  plot.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const box = plot.getBoundingClientRect();
    const at = Math.min(Math.max((ev.clientX - box.left - LABEL_W) / (box.width - LABEL_W - 8), 0), 1);
    zoom(ev.deltaY > 0 ? 1.25 : 0.8, at);
  }, { passive: false });
  plot.addEventListener("pointerdown", (ev) => {
    drag = { x: ev.clientX, view: view.slice(), moved: false };
  });
  window.addEventListener("pointerup", () => { setTimeout(() => { drag = null; }, 0); });
  plot.addEventListener("pointermove", (ev) => {
    if (drag && ev.buttons) {
      const dx = ev.clientX - drag.x;
      if (Math.abs(dx) > 3) drag.moved = true;
      if (drag.moved) {
        const plotW = width - LABEL_W - 8;
        const dt = (dx / plotW) * (drag.view[1] - drag.view[0]);
        setView([drag.view[0] - dt, drag.view[1] - dt]);
      }
      return;
    }
    const t = ev.target.closest && ev.target.closest("[data-item]");
    if (!t) { tip.style.display = "none"; return; }
    tip.textContent = describe(items[Number(t.dataset.item)]);
    tip.style.display = "block";
    const box = root.getBoundingClientRect();
    tip.style.left = `${ev.clientX - box.left + 12}px`;
    tip.style.top = `${ev.clientY - box.top + 12}px`;
  });
  plot.addEventListener("pointerleave", () => { tip.style.display = "none"; });
  plot.addEventListener("click", (ev) => {
    if (drag && drag.moved) return;
    const t = ev.target.closest && ev.target.closest("[data-key]");
    if (t) select(t.dataset.key);
  });

  // The legend shows the colours the bars use: the region kinds, each module group's own colour, the rest.
  const drawLegend = () => {
    const c = data.colours;
    legend.replaceChildren();
    const swatch = (name, col, cls) => {
      const sw = el("span", "tl-swatch" + (cls ? ` ${cls}` : ""));
      if (col) sw.style.background = col;
      legend.append(sw, el("span", "tl-legend-text", name));
    };
    for (const [name, col] of [["forward", c.forward], ["backward", c.backward], ["optimizer", c.optimizer]]) swatch(name, col);
    const groups = data.groups || [];
    const line = el("div", "tl-legend-groups");
    line.append(el("span", "tl-legend-text", "compute by module:"));
    legend.append(line);
    for (const [i, g] of groups.slice(0, 12).entries()) {
      const sw = el("span", "tl-swatch");
      sw.style.background = groupColour(data, i);
      line.append(sw, el("span", "tl-legend-text", g));
    }
    if (groups.length > 12) line.append(el("span", "tl-legend-text", `+${groups.length - 12} more`));
    const rest = el("div", "tl-legend-rest");
    legend.append(rest);
    for (const [name, col, cls] of [["main thread busy", c.op], ["idle (no op, not blocked)", null, "tl-swatch-idle"], ["blocked by a collective", c.wait],
      ["still blocked after its work ended", null, "tl-swatch-after"], ["collective in flight", c.collective]]) {
      const sw = el("span", "tl-swatch" + (cls ? ` ${cls}` : ""));
      if (col) sw.style.background = col;
      rest.append(sw, el("span", "tl-legend-text", name));
    }
    rest.append(el("span", "tl-legend-text tl-legend-steps", "\u00b7 dashed lines: where each step begins"));
  };

  const refresh = () => {
    data = model.get("data");
    drawLegend();
    index();
    title.textContent = model.get("title");
    summary.replaceChildren(...(model.get("summary") || []).map((s) => el("div", "tl-line", s)));
    note.textContent = model.get("note") || "";
    worstBtn.disabled = !data.worst;
    const v = model.get("view");
    if (v && v.length === 2 && v[1] > v[0]) view = v.slice();
    else view = [0, fullSpan()];
    draw();
    showDetails();
  };
  model.on("change:data", refresh);
  model.on("change:highlight", showGroup);
  model.on("change:view", () => { const v = model.get("view"); if (v && v.length === 2 && v[1] > v[0]) setView(v); });
  model.on("change:selected", () => {
    const s = model.get("selected") || {};
    if (s.key !== selectedKey) { selectedKey = s.key || null; showDetails(); draw(); }
  });
  const s0 = model.get("selected") || {};
  selectedKey = s0.key || null;
  refresh();
  showGroup();
}

export default { render };
