// thunderviz per-rank status chips (anywidget front end). Text from ranks goes in through textContent only.
//
// A rank in a phase that takes time (starting, importing, configuring, running, collecting) shows how long it has
// been in it, ticking, so a pool that takes seconds to start never reads as stuck at "starting (0.0 s)"; a rank that
// finished shows when it got there.
const LIVE = new Set(["starting", "importing", "configuring", "running", "compiling", "collecting"]);

function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "tv-ranks";
  el.append(root);
  const since = new Map(); // rank -> [state, seconds at entry, page time it was received]
  const text = (r) => {
    const detail = r.detail ? ` \u2014 ${r.detail}` : "";
    const entry = since.get(r.rank);
    if (LIVE.has(r.state) && entry) {
      const elapsed = (performance.now() - entry[2]) / 1000;
      return `rank ${r.rank}: ${r.state}${detail} \u00b7 ${elapsed.toFixed(1)} s`;
    }
    return `rank ${r.rank}: ${r.state}${detail} (at ${Number(r.seconds).toFixed(1)} s)`;
  };
  let chips = [];
  const draw = () => {
    const label = document.createElement("span");
    label.textContent = model.get("label");
    const rows = model.get("ranks");
    for (const r of rows) {
      const prev = since.get(r.rank);
      if (!prev || prev[0] !== r.state || prev[1] !== r.seconds) since.set(r.rank, [r.state, r.seconds, performance.now()]);
    }
    chips = rows.map((r) => {
      const c = document.createElement("span");
      c.className = "tv-rank";
      c.dataset.rank = String(r.rank);
      c.dataset.state = r.state;
      c.textContent = text(r);
      return c;
    });
    root.replaceChildren(label, ...chips);
  };
  const tick = setInterval(() => {
    const rows = model.get("ranks");
    rows.forEach((r, i) => { if (chips[i] && LIVE.has(r.state)) chips[i].textContent = text(r); });
  }, 200);
  model.on("change:ranks", draw);
  model.on("change:label", draw);
  draw();
  return () => clearInterval(tick);
}
export default { render };
