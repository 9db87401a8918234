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
    head.appendChild(el("span", "score", "reward " + fmt(r.reward) + (run.has_rm ? " · RM " + fmt(r.rm) : "") +
                        (r.rubric ? " · rubric " + fmt(r.rubric.masked) + " masked, " + fmt(r.rubric.full) + " full" : "") +
                        Object.entries(r.rewards || {}).map(([name, v]) => " · " + name + " " + fmt(v)).join("") +
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
    if (r.rubric) c.appendChild(criteriaTable(r.rubric));
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

  // A training rollout's criteria: its verdict per reply, dropped ones marked (they do not count in
  // the masked score, only in the full one).
  function criteriaTable(rubric) {
    const box = el("details", "criteria");
    const met = rubric.replies.map((rows) => rows.filter((x) => x[2] && !x[4]).length);
    box.appendChild(el("summary", "", "criteria: " + rubric.replies.map((rows, i) => met[i] + " of " +
                       rows.filter((x) => !x[4]).length + " kept met").join("; ") + " · " + rubric.dropped + " dropped"));
    rubric.replies.forEach((rows) => {
      const t = el("table", "verdicts");
      for (const [id, text, verdict, failed, dropped] of rows) {
        const tr = el("tr", dropped ? "dropped" : "");
        tr.appendChild(el("td", "cid", id));
        tr.appendChild(el("td", "", text));
        tr.appendChild(el("td", "v " + (failed ? "failed" : verdict ? "met" : "unmet"),
                          failed ? "no verdict" : verdict ? "met" : "not met"));
        tr.appendChild(el("td", "note", dropped ? "dropped" : ""));
        t.appendChild(tr);
      }
      box.appendChild(t);
    });
    return box;
  }

  // Held-out replies of a rubric run: every criterion under both judges, disagreements marked.
  function heldOut(root) {
    const run = data.runs[Number(root.dataset.run)];
    root.appendChild(el("h3", "", run.name + ": held-out replies"));
    if (!run.held_out.length) {
      root.appendChild(el("p", "note", "No held-out replies graded in this run."));
      return;
    }
    const controls = el("div", "controls");
    const step = el("select", "hstep");
    run.held_out.forEach((s, i) => option(step, String(i), "evaluation at step " + s.step));
    step.value = String(run.held_out.length - 1);
    const filter = el("select", "hfilter");
    for (const [label, input] of [["evaluation", step], ["show", filter]]) {
      const wrap = el("label", "", label + " ");
      wrap.appendChild(input);
      controls.appendChild(wrap);
    }
    root.appendChild(controls);
    root.appendChild(el("p", "note", "Highlighted: criteria where the proxy (training) judge and the gold judge disagree."));
    const count = el("p", "count");
    root.appendChild(count);
    const list = el("div", "list");
    root.appendChild(list);

    function fillFilter() {
      const replies = run.held_out[Number(step.value)].replies;
      const ids = [...new Set(replies.flatMap((x) => x.disagree))];
      filter.replaceChildren();
      option(filter, "all", "all replies");
      option(filter, "disagree", "replies where the judges disagree");
      for (const id of ids) option(filter, "c:" + id, "disagree on " + id);
    }

    function render() {
      const replies = run.held_out[Number(step.value)].replies;
      const f = filter.value;
      const shown = replies.filter((x) => f === "all" || (f === "disagree" ? x.disagree.length > 0
                                                          : x.disagree.includes(f.slice(2))));
      count.textContent = shown.length + " of " + replies.length + " replies";
      list.replaceChildren(...shown.map((x) => {
        const c = el("article", "rollout heldreply");
        const head = el("div", "head");
        head.appendChild(el("span", "pid", x.id));
        head.appendChild(el("span", "score", "proxy " + fmt(x.proxy) + " · gold " + fmt(x.gold) +
                            " · " + x.disagree.length + " disagreement" + (x.disagree.length === 1 ? "" : "s")));
        c.appendChild(head);
        const p = el("div", "msg prompt user");
        p.appendChild(el("span", "role", "user"));
        p.appendChild(el("div", "text", x.prompt));
        c.appendChild(p);
        const m = el("div", "msg assistant");
        m.appendChild(el("span", "role", "assistant"));
        m.appendChild(el("div", "text", x.reply));
        c.appendChild(m);
        const t = el("table", "verdicts");
        const h = el("tr");
        for (const name of ["criterion", "", "proxy", "gold"]) h.appendChild(el("th", "", name));
        t.appendChild(h);
        for (const [id, text, proxy, gold, failed] of x.criteria) {
          const tr = el("tr", x.disagree.includes(id) ? "disagree" : "");
          tr.dataset.criterion = id;
          tr.appendChild(el("td", "cid", id));
          tr.appendChild(el("td", "", text));
          for (const v of [proxy, gold]) {
            tr.appendChild(el("td", "v " + (failed || v === null ? "failed" : v ? "met" : "unmet"),
                              failed || v === null ? "no verdict" : v ? "met" : "not met"));
          }
          t.appendChild(tr);
        }
        c.appendChild(t);
        return c;
      }));
    }
    step.addEventListener("change", () => { fillFilter(); render(); });
    filter.addEventListener("change", render);
    fillFilter();
    render();
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
    if (run.has_penalties) {
      option(filter, "any", "any penalty triggered");
      option(filter, "none", "no penalty triggered");
    }
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
                    " steps (--rollout-steps to change)." +
                    (run.has_penalties ? " Badges: red, the penalty was triggered; green, not." : ""));
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
  document.querySelectorAll(".heldout").forEach(heldOut);
})();
