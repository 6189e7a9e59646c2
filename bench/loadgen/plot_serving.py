#!/usr/bin/python3
"""Disaggregated vs colocated: plots and a comparison table from two pdserve-loadgen results.

usage: plot_serving.py DISAGGREGATED.json COLOCATED.json OUT_DIR

Writes OUT_DIR/serving_compare.md (per request rate: TPOT p50/p99 of the decoding ("short")
requests, TTFT p50/p99 of all, goodput, and the p99 TPOT ratio against the goal <= 0.5) and,
when matplotlib is present, OUT_DIR/serving_latency_vs_rate.png. Only the benchmark runs this;
no test depends on it.
"""
import json
import os
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def points(result):
    """(rate, decoding-request summary, all-request summary) per sweep point."""
    out = []
    for run in result.get("runs", []):
        rate = run["request_rate"]
        rate = float("inf") if rate == "inf" else float(rate)
        short = run.get("by_kind", {}).get("short", run["all"])
        out.append((rate, short, run["all"]))
    return out


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    dis, col = load(sys.argv[1]), load(sys.argv[2])
    out_dir = sys.argv[3]
    os.makedirs(out_dir, exist_ok=True)
    pd, pc = points(dis), points(col)
    slo = dis.get("slo", {})
    ds = dis.get("dataset", {})
    lines = [
        "# Disaggregated vs colocated serving (pdserve-loadgen, mixed workload)\n",
        f"CPU: {dis.get('machine', '?')}  ",
        f"Commit: {dis.get('commit', '?')}  ",
        f"Workload: {ds.get('num_requests')} requests per rate, Poisson arrivals; decoding requests "
        f"{ds.get('input_len')} -> {ds.get('output_len')} tokens (+-{100 * ds.get('range_ratio', 0):.0f}%), "
        f"{100 * ds.get('long_fraction', 0):.0f}% long prompts of {ds.get('long_input_len')} tokens "
        f"(-> {ds.get('long_output_len')} tokens) arriving among them  ",
        f"SLO: TTFT <= {slo.get('ttft_ms', 0):.0f} ms, TPOT <= {slo.get('tpot_ms', 0):.0f} ms  ",
        "Disaggregated: router + 1 prefill + 1 decode worker; colocated: router + 2 colocated workers; "
        "one compute thread per worker in both.\n",
        "TPOT columns are the decoding (short) requests; TTFT and goodput are over all requests.\n",
        "| rate req/s | TPOT p50 ms dis / col | TPOT p99 ms dis / col | p99 TPOT ratio dis/col (goal <= 0.5) "
        "| TTFT p50 ms dis / col | TTFT p99 ms dis / col | goodput req/s dis / col | failed dis / col |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_rate_c = {r: (s, a) for r, s, a in pc}
    for rate, sd, ad in pd:
        if rate not in by_rate_c:
            continue
        sc, ac = by_rate_c[rate]
        t99d, t99c = sd["tpot"]["p99_ms"], sc["tpot"]["p99_ms"]
        ratio = t99d / t99c if t99c > 0 else float("nan")
        lines.append(
            f"| {rate:g} | {sd['tpot']['p50_ms']:.2f} / {sc['tpot']['p50_ms']:.2f} | {t99d:.2f} / {t99c:.2f} | "
            f"{ratio:.2f}{' (met)' if ratio <= 0.5 else ''} | {ad['ttft']['p50_ms']:.0f} / {ac['ttft']['p50_ms']:.0f} | "
            f"{ad['ttft']['p99_ms']:.0f} / {ac['ttft']['p99_ms']:.0f} | {ad['goodput_rps']:.2f} / "
            f"{ac['goodput_rps']:.2f} | {ad['failed']} / {ac['failed']} |")
    md = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "serving_compare.md"), "w") as f:
        f.write(md)
    print(md)

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_serving: matplotlib missing (apt install python3-matplotlib); no PNG written")
        return
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    for pts, name, color in ((pd, "disaggregated", "tab:blue"), (pc, "colocated", "tab:orange")):
        rates = [p[0] for p in pts]
        ax[0].plot(rates, [p[1]["tpot"]["p50_ms"] for p in pts], "o--", color=color, label=f"{name} p50")
        ax[0].plot(rates, [p[1]["tpot"]["p99_ms"] for p in pts], "o-", color=color, label=f"{name} p99")
        ax[1].plot(rates, [p[2]["ttft"]["p50_ms"] for p in pts], "o--", color=color, label=f"{name} p50")
        ax[1].plot(rates, [p[2]["ttft"]["p99_ms"] for p in pts], "o-", color=color, label=f"{name} p99")
        ax[2].plot(rates, [p[2]["goodput_rps"] for p in pts], "o-", color=color, label=name)
    ax[0].set_title("TPOT of decoding requests")
    ax[0].set_ylabel("ms")
    ax[1].set_title("TTFT (all requests)")
    ax[1].set_ylabel("ms")
    ax[1].set_yscale("log")
    ax[2].set_title(f"goodput (TTFT <= {slo.get('ttft_ms', 0):.0f} ms, TPOT <= {slo.get('tpot_ms', 0):.0f} ms)")
    ax[2].set_ylabel("requests/s")
    for a in ax:
        a.set_xlabel("request rate (req/s)")
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    png = os.path.join(out_dir, "serving_latency_vs_rate.png")
    fig.savefig(png, dpi=90)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
