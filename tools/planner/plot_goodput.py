#!/usr/bin/env python3
"""Goodput against the prefill:decode split, from a `pdserve plan --json` report.

Usage: plot_goodput.py REPORT.json OUT.png

Compiled into `pdserve plan` (planner/CMakeLists.txt), which runs it for --plot; it can also be
run by hand on a saved report. Needs matplotlib (Debian's python3-matplotlib, scripts/setup.sh).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_goodput.py REPORT.json OUT.png")
    with open(sys.argv[1]) as f:
        r = json.load(f)
    sweep = r.get("ratio_sweep") or []
    if not sweep:
        sys.exit("the report has no ratio_sweep (a disaggregated plan with the search on is needed)")
    labels = ["%d:%d" % (p["prefill_instances"], p["decode_instances"]) for p in sweep]
    goodput = [p["max_goodput_rps"] for p in sweep]
    per_device = [p["max_goodput_rps"] / p["devices"] if p["devices"] else 0 for p in sweep]

    fig, ax = plt.subplots(figsize=(7, 4.2))
    x = range(len(sweep))
    bars = ax.bar(x, goodput, color="#4c72b0", label="max goodput (req/s)")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels)
    ax.set_xlabel("prefill : decode instances")
    ax.set_ylabel("max goodput (req/s)")
    best = r.get("best_plan")
    if best:
        for i, p in enumerate(sweep):
            if (p["prefill_instances"], p["decode_instances"]) == (best["prefill_instances"], best["decode_instances"]):
                bars[i].set_color("#dd8452")
    ax2 = ax.twinx()
    ax2.plot(list(x), per_device, color="#55a868", marker="o", label="per device")
    ax2.set_ylabel("max goodput per device (req/s)")
    ax2.set_ylim(bottom=0)
    slo = r["slo"]
    w = r["workload"]
    ax.set_title("%s on %s: %d -> %d tokens, SLO TTFT %.0f ms, TPOT %.0f ms (%.0f%%)"
                 % (r["model"]["name"], r["hardware"]["name"], w["input_len"], w["output_len"],
                    slo["ttft_s"] * 1e3, slo["tpot_s"] * 1e3, slo["attainment"] * 100), fontsize=9)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)


if __name__ == "__main__":
    main()
