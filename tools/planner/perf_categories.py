import re, subprocess, sys
data, freq = sys.argv[1], float(sys.argv[2])
out = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "symbol", "-F", "sample,symbol", "--stdio", "-g", "none"],
                     capture_output=True, text=True).stdout
cats = {"gemm": 0, "attention": 0, "indexer": 0, "elementwise": 0, "kernel": 0, "other": 0}
total = 0
for line in out.splitlines():
    m = re.match(r"\s+(\d+)\s+\[(.)\]\s+(.*)", line)
    if not m: continue
    n, kind, sym = int(m.group(1)), m.group(2), m.group(3).strip()
    total += n
    if kind == "k": c = "kernel"
    elif re.search(r"MicroKernel|PackPanels|DotBlock|RunTaskIndex|RunBlocks|Gemm", sym): c = "gemm"
    elif re.search(r"DotF32|Axpy|Softmax|expf|Model::Attention|AbsorbedAttention|GatherLatent|AbsorbQueries", sym): c = "attention"
    elif re.search(r"IndexerScores|TopK|introsort|insertion_sort|Hadamard|Model::Indexer", sym): c = "indexer"
    elif re.search(r"Fp8|lround|frexp|scalbn|ldexp|RoundToBf16|SiluMul|RmsNorm|Rope|sincos|Ffn|RunPlan|memset|memmove|memcpy|Encode|Quant|Bf16", sym): c = "elementwise"
    else: c = "other"
    cats[c] += n
for k, v in cats.items():
    print("%-12s %6d samples %7.1f ms" % (k, v, v / freq * 1e3))
print("total", total, "%.1f ms" % (total / freq * 1e3))
