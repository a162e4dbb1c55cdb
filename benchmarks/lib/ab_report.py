"""Medians and ratios of an A/B of two trees (benchmarks/ab/ab_trees.sh, its last step): reads each run's JSON, prints
a table and writes one JSON holding the summary and every run.

    python -m benchmarks.lib.ab_report llama8b|json|host|spec RUN_DIR OUT.json

A ratio is new / base of a throughput (above 1: the new tree is faster) or base / new of a time (likewise); a tree
named new_* (a variant of the new tree, e.g. new_w0) is compared with base too."""
from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

NAME = re.compile(r"(?P<kind>llama8b|json|host|spec)_(?:(?P<constraint>regex|json_schema)_)?(?P<tree>base|new\w*)"
                  r"_r(?P<round>\d+)$")


def load(run_dir: Path) -> list[dict]:
    runs = []
    for f in sorted(run_dir.glob("*.json")):
        m = NAME.match(f.stem)
        if m:
            runs.append({**m.groupdict(), "round": int(m["round"]), "file": f.name, "result": json.loads(f.read_text())})
    return runs


def llama8b_metrics(result: dict) -> dict[str, tuple[float, str]]:
    """metric -> (value, 'time' | 'rate')."""
    ab = result["ab"]
    out = {f"decode step ms, batch {row['batch']}": (row["step_ms"], "time") for row in ab.get("decode", [])}
    for key in ("sharegpt_like", "random_1024_512", "shared_prefix"):
        if key in ab:
            out[f"{key} output tok/s"] = (ab[key]["output_tokens_per_s"], "rate")
    if "shared_prefix" in ab:
        out["shared_prefix hit rate"] = (ab["shared_prefix"]["hit_rate"], "rate")
    return out


def json_metrics(result: dict, constraint: str) -> dict[str, tuple[float, str]]:
    return {f"{constraint} {mode} wall s": (run["wall_s"], "time") for mode, run in result["runs"].items()}


def spec_metrics(result: dict) -> dict[str, tuple[float, str]]:
    """Per (workload, batch, algorithm): tokens/s, and the speed-up over off measured in the same run."""
    out = {}
    for row in result["rows"]:
        cell = f"{row['workload']} b{row['batch']} {row['algorithm']}"
        out[f"{cell} tok/s"] = (row["output_tokens_per_s"], "rate")
        if row["algorithm"] != "off":
            out[f"{cell} vs off"] = (row["speedup_vs_off"], "rate")
    return out


def summarize(kind: str, runs: list[dict]) -> dict:
    values: dict[str, dict[str, list[float]]] = {}
    sense: dict[str, str] = {}
    for run in runs:
        metrics = (llama8b_metrics(run["result"]) if kind == "llama8b" else spec_metrics(run["result"])
                   if kind == "spec" else json_metrics(run["result"], run["constraint"]))
        for name, (v, s) in metrics.items():
            values.setdefault(name, {}).setdefault(run["tree"], []).append(v)
            sense[name] = s
    rows = []
    for name, by_tree in values.items():
        base = by_tree.get("base", [])
        for tree, new in sorted(by_tree.items()):
            if tree == "base" or not base or not new:
                continue
            mb, mn = statistics.median(base), statistics.median(new)
            ratio = mn / mb if sense[name] == "rate" else mb / mn
            rows.append({"metric": name if tree == "new" else f"{name} [{tree}]", "base_median": mb, "new_median": mn,
                         "new_vs_base": ratio, "base_runs": base, "new_runs": new})
    return {"rows": rows}


def main() -> None:
    kind, run_dir, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    runs = load(run_dir)
    summary = summarize(kind, [r for r in runs if r["kind"] == kind])
    print(f"{'metric':42} {'base':>10} {'new':>10} {'new vs base':>12}  runs")
    for row in summary["rows"]:
        print(f"{row['metric']:42} {row['base_median']:10.3f} {row['new_median']:10.3f} {row['new_vs_base']:12.3f}"
              f"  {len(row['base_runs'])}+{len(row['new_runs'])}")
    out.write_text(json.dumps({"benchmark": f"ab_{kind}", **summary, "runs": runs}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
