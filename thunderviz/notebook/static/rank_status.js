// thunderviz per-rank status chips (anywidget front end). Text from ranks goes in through textContent only.
function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "tv-ranks";
  el.append(root);
  const draw = () => {
    const label = document.createElement("span");
    label.textContent = model.get("label");
    const chips = model.get("ranks").map((r) => {
      const c = document.createElement("span");
      c.className = "tv-rank";
      c.dataset.rank = String(r.rank);
      c.dataset.state = r.state;
      c.textContent = `rank ${r.rank}: ${r.state}${r.detail ? ` \u2014 ${r.detail}` : ""} (${Number(r.seconds).toFixed(1)} s)`;
      return c;
    });
    root.replaceChildren(label, ...chips);
  };
  model.on("change:ranks", draw);
  model.on("change:label", draw);
  draw();
}
export default { render };
