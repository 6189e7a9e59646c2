#!/usr/bin/python3
"""Checks the Docker build context .dockerignore leaves: a fake host build/, models/,
node_modules/ and bench/results/ planted in a copy of the tree must all be excluded, and the
files the Dockerfile's build stage uses must all be included.

The matching follows Docker's rules for the pattern forms .dockerignore uses here (paths relative
to the context root, `*` within one path element, `**` across elements, a pattern matching a
directory excluding everything under it, `!` re-including). Usage: docker_context_check.py ROOT
"""
import fnmatch
import os
import re
import subprocess
import sys
import tempfile


def load_patterns(root):
    pats = []
    path = os.path.join(root, ".dockerignore")
    if not os.path.exists(path):
        print("docker context: no .dockerignore: `COPY . .` would take the host's build/, models/ and node_modules")
        sys.exit(1)
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            neg = line.startswith("!")
            p = line[1:] if neg else line
            p = os.path.normpath(p.lstrip("/"))
            pats.append((neg, p))
    return pats


def to_regex(pattern):
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            if pattern.startswith("/", i):
                out = out[:-2] + "(?:.*/)?"
                i += 1
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile("^" + out + "$")


def excluded(path, pats):
    """Docker: the last matching pattern wins; a pattern matching a parent excludes children."""
    parts = path.split("/")
    result = False
    for neg, p in pats:
        rx = to_regex(p)
        hit = any(rx.match("/".join(parts[:k])) for k in range(1, len(parts) + 1))
        if hit:
            result = not neg
    return result


def main():
    root = sys.argv[1]
    pats = load_patterns(root)
    with tempfile.TemporaryDirectory(prefix="pdserve-docker-context-") as tmp:
        # The tracked sources, plus what a host leaves behind.
        files = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True).stdout.split()
        if not files:  # not a git checkout: walk it
            for d, _, names in os.walk(root):
                for n in names:
                    files.append(os.path.relpath(os.path.join(d, n), root))
        planted = ["build/CMakeCache.txt", "build/bin/pdserve", "build-asan/CMakeCache.txt", "build.build.log",
                   "models/demo-tiny-v128k/model-00001-of-00002.safetensors", "tools/js/node_modules/x/index.js",
                   "node_modules/y/index.js", "assets/tokenizer/deepseek_v3/tokenizer.json",
                   "bench/results/engine.json", "bench-results/loadgen.md", "tests/__pycache__/a.pyc", ".git/HEAD"]
        context = [f for f in files + planted if not excluded(f, pats)]
        leaked = [p for p in planted if p in context]
        needed = ["Dockerfile" if os.path.exists(os.path.join(root, "Dockerfile")) else "deploy/Dockerfile",
                  "CMakeLists.txt", "scripts/setup.sh", "deploy/cluster.compose.yaml", "tools/js/package.json",
                  "common/status.h", "services/router/main.cc"]
        missing = [n for n in needed if n not in context]
        if leaked or missing:
            for p in leaked:
                print("docker context: would include the host's " + p)
            for n in missing:
                print("docker context: would lack " + n + ", which the image build needs")
            sys.exit(1)
        print("docker context: %d files; excludes build outputs, models, node_modules, results; has the sources"
              % len(context))


if __name__ == "__main__":
    main()
