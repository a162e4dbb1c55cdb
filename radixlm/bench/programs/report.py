"""Tables (markdown, printed and written), the JSON file, and PNG bar plots when matplotlib is installed."""
from __future__ import annotations

import json
import os
from typing import Optional

BASELINE = "all_off"


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1%}"


def _num(x: Optional[float], fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def workload_table(results: dict[str, dict]) -> str:
    """One variant: a row per workload."""
    head = ("| workload | programs | failed | p/s | mean latency (s) | out tok/s | hit rate | optimal | "
            "achieved/optimal | accuracy |")
    rows = [head, "|" + "|".join("---" for _ in range(10)) + "|"]
    for name, r in results.items():
        if "skipped" in r:
            rows.append(f"| {name} | skipped: {r['skipped']} |" + " |" * 8)
            continue
        rows.append(f"| {name} | {r['programs']} | {r['failed']} | {r['programs_per_s']:.2f} | "
                    f"{_num(r['mean_latency_s'])} | {r['output_tokens_per_s']:.1f} | {_pct(r['cache_hit_rate'])} | "
                    f"{_pct(r.get('optimal_hit_rate'))} | {_pct(r.get('achieved_over_optimal'))} | "
                    f"{_pct(r.get('accuracy'))} |")
    return "\n".join(rows)


def ablation_table(by_variant: dict[str, dict[str, dict]], metric: str = "programs_per_s") -> str:
    """A row per workload, a column per variant: the metric, and its ratio to all_off's where that ran."""
    variants = list(by_variant)
    workloads = list(next(iter(by_variant.values()))) if by_variant else []
    rows = ["| workload | " + " | ".join(variants) + " |",
            "|" + "|".join("---" for _ in range(len(variants) + 1)) + "|"]
    for w in workloads:
        base = by_variant.get(BASELINE, {}).get(w, {}).get(metric)
        cells = []
        for v in variants:
            r = by_variant[v].get(w, {})
            x = r.get(metric)
            if x is None:
                cells.append("skipped" if "skipped" in r else "-")
                continue
            cell = f"{x:.2f}"
            if base and v != BASELINE:
                cell += f" ({x / base:.2f}x)"
            if r.get("failed"):
                cell += f" [{r['failed']} failed]"
            cells.append(cell)
        rows.append(f"| {w} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def spread_table(by_variant: dict[str, dict[str, dict]]) -> str:
    """A row per workload, a column per variant: max/min of programs/s over the runs, and how many ran."""
    variants = list(by_variant)
    workloads = list(next(iter(by_variant.values()))) if by_variant else []
    rows = ["| workload | " + " | ".join(variants) + " |",
            "|" + "|".join("---" for _ in range(len(variants) + 1)) + "|"]
    for w in workloads:
        cells = []
        for v in variants:
            r = by_variant[v].get(w, {})
            if "runs" not in r:
                cells.append("skipped" if "skipped" in r else "-")
                continue
            spread = r.get("programs_per_s_spread")
            cells.append(f"{_num(spread)} ({len(r['runs'])} run{'s' if len(r['runs']) > 1 else ''})")
        rows.append(f"| {w} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def hit_rate_table(results: dict[str, dict]) -> str:
    rows = ["| workload | achieved | optimal | achieved/optimal | optimal (prompt tokens only) |",
            "|---|---|---|---|---|"]
    ratios = []
    for name, r in results.items():
        if "skipped" in r:
            continue
        ratio = r.get("achieved_over_optimal")
        if ratio is not None:
            ratios.append(ratio)
        rows.append(f"| {name} | {_pct(r['cache_hit_rate'])} | {_pct(r.get('optimal_hit_rate'))} | {_pct(ratio)} | "
                    f"{_pct(r.get('optimal_hit_rate_prompts_only'))} |")
    if ratios:
        rows.append(f"| **mean** | | | {sum(ratios) / len(ratios):.1%} | |")
    return "\n".join(rows)


def markdown(out: dict) -> str:
    cfg = out["config"]
    env = " ".join(f"{k}={v}" for k, v in cfg.get("env", {}).items())
    counts = {w: n for w, n in cfg.get("num_programs_per_workload", {}).items() if n != cfg["num_programs"]}
    per = f" ({', '.join(f'{w} {n}' for w, n in counts.items())})" if counts else ""
    parts = [f"# LM programs benchmark\n\nCommand: `{(env + ' ') if env else ''}{cfg['command']}`\n\n"
             f"Backend: {cfg['backend']} ({cfg.get('model', '')}); {cfg['num_programs']} programs per workload{per}, "
             f"scale {cfg['scale']}, seed {cfg['seed']}, {cfg['num_threads']} threads.\n"]
    warm = cfg.get("warm_up") or {}
    if warm.get("max_programs"):
        parts.append(f"Warm-up: before each variant's measured run of a workload, up to {warm['max_programs']} "
                     f"programs of it (seed {warm['seed']}, in parallel) ran unmeasured"
                     + ("; the cache was flushed before the measured run" if cfg.get("flush", True) else "")
                     + ".\n")
    rep = cfg.get("repeat") or {}
    if rep.get("runs", 1) > 1:
        parts.append(f"Repeats: {rep['rule']}"
                     + ("; the cache flushed before each" if rep.get("flushed_before_each", True) else "")
                     + f"; every figure is the {rep.get('stat', 'median')} over a cell's runs.\n")
    parts += [f"- {n}" for n in cfg.get("notes", [])]
    if cfg.get("notes"):
        parts.append("")
    runs = out["variants"]
    if len(runs) > 1:
        parts.append("## Throughput (programs/s; in brackets: speedup over all_off)\n\n" + ablation_table(runs) + "\n")
    if any("runs" in r for res in runs.values() for r in res.values()):
        parts.append("## Run-to-run spread (max/min of programs/s over a cell's runs; in brackets: how many)\n\n"
                     + spread_table(runs) + "\n")
    if len(runs) > 1:
        parts.append("## Mean latency per program (s; in brackets: ratio to all_off's, lower is better)\n\n"
                     "Variants with frontend parallelism run the whole batch at once, so their latency is under "
                     "load; sequential variants (no_frontend_parallelism, all_off) give one-program-at-a-time "
                     "latency, the paper's latency setting.\n\n" + ablation_table(runs, "mean_latency_s") + "\n")
    for v, res in runs.items():
        parts.append(f"## {v}\n\n" + workload_table(res) + "\n")
    first = runs.get("full") or next(iter(runs.values()))
    if any("optimal_hit_rate" in r for r in first.values()):
        parts.append("## Cache hit rate vs. the optimal (DFS order, unbounded cache)\n\n" + hit_rate_table(first)
                     + "\n")
    return "\n".join(parts)


def plot(out: dict, path: str) -> Optional[str]:
    """Bars of programs/s per workload and variant, normalized to all_off (like the paper's Fig. 5 / 8c);
    None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    runs = out["variants"]
    variants = list(runs)
    workloads = [w for w in next(iter(runs.values()))
                 if any(runs[v].get(w, {}).get("programs_per_s") for v in variants)]
    if not workloads:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(workloads) * max(1, len(variants)) / 3), 4))
    width = 0.8 / len(variants)
    for j, v in enumerate(variants):
        ys = []
        for w in workloads:
            x = runs[v].get(w, {}).get("programs_per_s") or 0.0
            base = runs.get(BASELINE, {}).get(w, {}).get("programs_per_s")
            ys.append(x / base if base else x)
        ax.bar([i + j * width for i in range(len(workloads))], ys, width, label=v)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))], workloads, rotation=30, ha="right")
    ax.set_ylabel("throughput (normalized to all_off)" if BASELINE in runs else "programs/s")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write(out: dict, json_path: Optional[str]) -> dict[str, str]:
    """Writes the JSON, the markdown next to it and the plot (if possible); returns the paths written."""
    written: dict[str, str] = {}
    if not json_path:
        return written
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "w") as f:
        json.dump(out, f, indent=2)
    written["json"] = json_path
    stem = json_path[:-5] if json_path.endswith(".json") else json_path
    with open(stem + ".md", "w") as f:
        f.write(markdown(out))
    written["markdown"] = stem + ".md"
    png = plot(out, stem + ".png")
    if png:
        written["png"] = png
    return written
