// The rollout browser of dynalize's HTML report (dynalize/analysis/html.py inlines this file).
// Rollout and penalty text is untrusted: it only ever goes into text nodes (textContent).
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("dynalize-data").textContent);

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function fmt(x, signed) {
    if (typeof x !== "number") return "n/a";
    return (signed && x >= 0 ? "+" : "") + x.toFixed(3);
  }

  function option(select, value, label) {
    const o = el("option", "", label);
    o.value = value;
    select.appendChild(o);
  }

  function triggered(r) {
    return Object.keys(r.verdicts).filter((id) => r.verdicts[id]);
  }

  function keep(r, filter, query) {
    const hits = triggered(r);
    if (filter === "any" && !hits.length) return false;
    if (filter === "none" && hits.length) return false;
    if (filter === "failed" && !r.failed.length && !r.left_out) return false;
    if (filter.startsWith("p:") && !hits.includes(filter.slice(2))) return false;
    if (!query) return true;
    const text = r.prompt.map((m) => m[1]).concat(r.turns.map((t) => t[1].map((s) => s[0]).join(""))).join("\n");
    return text.toLowerCase().includes(query.toLowerCase());
  }

  const SORTS = {
    "generated": null,
    "reward, high first": (a, b) => (b.reward ?? -Infinity) - (a.reward ?? -Infinity),
    "reward, low first": (a, b) => (a.reward ?? Infinity) - (b.reward ?? Infinity),
    "RM score, high first": (a, b) => (b.rm ?? -Infinity) - (a.rm ?? -Infinity),
  };

  function segments(parent, segs, run) {
    for (const [text, ids] of segs) {
      if (!ids.length) {
        parent.appendChild(document.createTextNode(text));
        continue;
      }
      const mark = el("mark", "hit", text);
      mark.dataset.penalties = ids.join(" ");
      mark.title = ids.map((id) => id + ": " + ((run.penalties[id] || {}).title || "")).join("\n");
      parent.appendChild(mark);
    }
  }

  function card(r, run) {
    const c = el("article", "rollout");
    const head = el("div", "head");
    head.appendChild(el("span", "pid", r.id + " · group " + r.group + " · policy v" + r.version));
    head.appendChild(el("span", "score", "reward " + fmt(r.reward) + " · RM " + fmt(r.rm) +
                        " · advantage " + fmt(r.advantage, true)));
    c.appendChild(head);
    const badges = el("div", "badges");
    for (const id of Object.keys(r.verdicts)) {
      const b = el("span", "badge " + (r.verdicts[id] ? "on" : "off"), id);
      b.title = (run.penalties[id] || {}).title || "";
      badges.appendChild(b);
    }
    for (const id of r.failed) badges.appendChild(el("span", "badge failed", id + ": no verdict"));
    if (r.left_out) badges.appendChild(el("span", "badge failed", "left out of the update"));
    c.appendChild(badges);
    for (const [role, content] of r.prompt) {
      const m = el("div", "msg prompt " + role);
      m.appendChild(el("span", "role", role));
      m.appendChild(el("div", "text", content));
      c.appendChild(m);
    }
    for (const [role, segs] of r.turns) {
      const m = el("div", "msg " + role);
      m.appendChild(el("span", "role", role));
      const text = el("div", "text");
      segments(text, segs, run);
      m.appendChild(text);
      c.appendChild(m);
    }
    return c;
  }

  function build(browser) {
    const run = data.runs[Number(browser.dataset.run)];
    browser.appendChild(el("h3", "", run.name));
    if (!run.steps.length) {
      browser.appendChild(el("p", "note", "No rollouts saved in this run."));
      return;
    }
    const controls = el("div", "controls");
    const step = el("select", "step");
    run.steps.forEach((s, i) => option(step, String(i), "step " + s.step));
    step.value = String(run.steps.length - 1);
    const filter = el("select", "filter");
    option(filter, "all", "all rollouts");
    option(filter, "any", "any penalty triggered");
    option(filter, "none", "no penalty triggered");
    option(filter, "failed", "verdict failed / left out");
    for (const id of Object.keys(run.penalties)) option(filter, "p:" + id, id + ": " + run.penalties[id].title);
    const sort = el("select", "sort");
    for (const name of Object.keys(SORTS)) option(sort, name, "order: " + name);
    const search = el("input", "search");
    search.type = "search";
    search.placeholder = "find text";
    for (const [label, input] of [["step", step], ["show", filter], ["", sort], ["", search]]) {
      const wrap = el("label", "", label ? label + " " : "");
      wrap.appendChild(input);
      controls.appendChild(wrap);
    }
    browser.appendChild(controls);
    const note = el("p", "note", "Rollouts of " + run.steps.length + " of the run's " + run.total_steps +
                    " steps (--rollout-steps to change). Badges: red, the penalty was triggered; green, not.");
    browser.appendChild(note);
    for (const [id, why] of Object.entries(run.unhighlighted)) {
      browser.appendChild(el("p", "note", id + ": its regex highlights nothing here: " + why));
    }
    const count = el("p", "count");
    browser.appendChild(count);
    const list = el("div", "list");
    browser.appendChild(list);

    function render() {
      const all = run.steps[Number(step.value)].rollouts;
      let shown = all.filter((r) => keep(r, filter.value, search.value.trim()));
      if (SORTS[sort.value]) shown = shown.slice().sort(SORTS[sort.value]);
      count.textContent = shown.length + " of " + all.length + " rollouts";
      list.replaceChildren(...shown.map((r) => card(r, run)));
    }
    for (const input of [step, filter, sort]) input.addEventListener("change", render);
    search.addEventListener("input", render);
    render();
  }

  document.querySelectorAll(".browser").forEach(build);
})();
