#!/usr/bin/env python3
"""Time of a `perf record` by kernel family, for the local hardware profile.

Usage: perf_categories.py PERF.DATA SAMPLE_HZ

Groups the samples of `perf report --sort symbol` into GEMM (the tiled and small-m kernels),
attention (expanded and absorbed MLA, softmax), indexer (scores, top-k, Hadamard), elementwise
(fp8 activation quantization, bf16 rounding, norms, RoPE, SiLU, memset/memcpy), kernel (page
faults and the like) and other, and prints each group's milliseconds (samples / SAMPLE_HZ).
docs/planner.md "The local profile" says which profile figure each group gives.
"""
import re
import subprocess
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: perf_categories.py PERF.DATA SAMPLE_HZ")
    data, hz = sys.argv[1], float(sys.argv[2])
    out = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "symbol", "-F", "sample,symbol",
                          "--stdio", "-g", "none"], capture_output=True, text=True).stdout
    groups = {"gemm": 0, "attention": 0, "indexer": 0, "elementwise": 0, "kernel": 0, "other": 0}
    total = 0
    for line in out.splitlines():
        m = re.match(r"\s+(\d+)\s+\[(.)\]\s+(.*)", line)
        if not m:
            continue
        n, kind, sym = int(m.group(1)), m.group(2), m.group(3).strip()
        total += n
        if kind == "k":
            g = "kernel"
        elif re.search(r"MicroKernel|PackPanels|DotBlock|RunTaskIndex|RunBlocks|Gemm", sym):
            g = "gemm"
        elif re.search(r"DotF32|Axpy|Softmax|expf|Model::Attention|AbsorbedAttention|GatherLatent|AbsorbQueries", sym):
            g = "attention"
        elif re.search(r"IndexerScores|TopK|introsort|insertion_sort|Hadamard|Model::Indexer", sym):
            g = "indexer"
        elif re.search(r"Fp8|lround|frexp|scalbn|ldexp|RoundToBf16|SiluMul|RmsNorm|Rope|sincos|Ffn|RunPlan|memset|"
                       r"memmove|memcpy|Encode|Quant|Bf16", sym):
            g = "elementwise"
        else:
            g = "other"
        groups[g] += n
    for g, n in groups.items():
        print("%-12s %7d samples %9.1f ms" % (g, n, n / hz * 1e3))
    print("%-12s %7d samples %9.1f ms" % ("total", total, total / hz * 1e3))


if __name__ == "__main__":
    main()
