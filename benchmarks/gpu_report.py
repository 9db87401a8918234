"""benchmarks/gpu_check.py's printed report: the tables, the ratios and the targets, from results.json's numbers."""

from __future__ import annotations

from typing import Any

PENALTY_METRICS = ("step", "rm/mean", "penalties/mean_violations", "reward/mean", "penalties/active", "penalties/adds",
                   "judge/verdicts", "time/score", "time/step")
SPEEDUP_TARGET = 3.0
"""Issue 32: dynalize's fast HF path at ≥ 3× TRL's default completion tokens/s (and ≥ TRL's fastest)."""


def report(results: dict[str, Any]):
    """The tables, as rich renderables."""
    from rich.table import Table

    env, model, s = results.get("environment", {}), results.get("model", {}), results["settings"]
    head = (f"{env.get('device')} · torch {env.get('torch')} · transformers {env.get('transformers')} · "
            f"TRL {env.get('trl')} · {model.get('parameters_m')} M parameters in {s['dtype']}")
    table = Table(title=f"RM-only GRPO: {s['shape']} random init, 8 prompts × 8 samples, ≤{s['max_new_tokens']} new "
                        f"tokens, {s['steps']} measured steps after {s['warmup']} warm-up\n{head}")
    for col in ("framework", "step s", "completion tokens/s", "generate s", "train s", "first generate s",
                "mean len", "peak GPU GiB (alloc / reserved)"):
        table.add_column(col, justify="left" if col == "framework" else "right")
    for name, r in results.get("frameworks", {}).items():
        phases = r["phases"]
        train = phases.get("train", phases.get("rest"))
        memory = ("n/a (CPU)" if r["peak_allocated_gib"] is None
                  else f"{r['peak_allocated_gib']:.1f} / {r['peak_reserved_gib']:.1f}"
                  + (f" ({r['allocated_before_gib']:.1f} before)" if r["allocated_before_gib"] > 0.05 else ""))
        table.add_row(name, f"{r['step_mean']:.2f} ± {r['step_sd']:.2f}", f"{r['tokens_per_s']:.0f}",
                      f"{phases['generate']:.2f}", f"{train:.2f}", f"{r['first_generate_s']:.1f}",
                      f"{r['mean_len']:.1f}", memory)
    out: list[Any] = [table, *targets(results.get("frameworks", {}))]
    out.append("train s: dynalize's learner step; TRL's rest of the step (reward, loss forward/backward, optimizer). "
               "dynalize with async_level ≥ 1 generates batch k+1 while batch k trains. first generate s: the "
               "first (warm-up) step's generation, compiling included; the measured steps exclude it.")
    if mem := results.get("memory"):
        import memory as memory_bench

        out += memory_bench.report(mem["cells"], mem["settings"])
    if pen := results.get("penalties"):
        t = Table(title=f"Dynalize, lexical proposer + regex judge, tiny:policy on {env.get('device')}: "
                        f"the RM pays for {pen['planted_word']!r}")
        for col in ("step", "RM", "violations", "reward = RM − λ·violations", "active penalties", "added",
                    "verdicts", "score s", "step s"):
            t.add_column(col, justify="right")
        for h in pen["steps"]:
            t.add_row(*(("–" if h.get(k) is None else f"{h[k]:.3g}") for k in PENALTY_METRICS))
        out.append(t)
        out += [f"penalty {a['id']} added at step {a['step']} (proposed at {a['proposed_at']}): {a['title']!r}, "
                f"regex {a['regex']!r}" for a in pen["added"]] or ["no penalty was added"]
    failed = [f"{n}: {p['error']}" for n, p in results.get("parts", {}).items() if not p["ok"]]
    out += [f"FAILED {f}" for f in failed]
    return out


def targets(frameworks: dict[str, Any]) -> list[str]:
    """Each dynalize row against TRL's default and its fastest setting, and the issue's targets, from the numbers."""
    trl = {n: r for n, r in frameworks.items() if n.startswith("TRL")}
    default = trl.get("TRL GRPOTrainer (default)")
    fastest = max(trl.items(), key=lambda kv: kv[1]["tokens_per_s"], default=None)
    out = []
    for name, r in frameworks.items():
        if name in trl:
            continue
        if default:
            out.append(f"{name} / TRL default: tokens/s {r['tokens_per_s'] / default['tokens_per_s']:.2f}×, "
                       f"step time {r['step_mean'] / default['step_mean']:.2f}×")
        if name.startswith("dynalize fast"):
            if default:
                x = r["tokens_per_s"] / default["tokens_per_s"]
                out.append(f"target: {name} ≥ {SPEEDUP_TARGET:g}× TRL default tokens/s: {x:.2f}× "
                           f"({'met' if x >= SPEEDUP_TARGET else 'NOT met'})")
            if fastest:
                x = r["tokens_per_s"] / fastest[1]["tokens_per_s"]
                out.append(f"target: {name} ≥ TRL's fastest measured ({fastest[0]}) tokens/s: {x:.2f}× "
                           f"({'met' if x >= 1 else 'NOT met'})")
    return out
