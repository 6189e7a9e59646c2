#!/usr/bin/python3
"""Regenerates the committed golden dumps tests/golden/<NAME>/ (see docs/reference.md).

For each golden NAME: write an HF checkpoint with
`pdserve make-model --preset PRESET --out DIR --seed S [--dtype fp8]` (or, with --maker toy,
with this directory's toy writer), run the Python reference on a fixed prompt with
--max-new-tokens 20, and copy the dump into tests/golden/NAME/, adding a "source" entry to its
index.json: how it was made and a sha256 of the checkpoint files, so that a test can tell
when make-model has changed and the golden must be regenerated.

  /usr/bin/python3 tests/reference/make_golden.py                       # every DEFAULT_PRESET
  /usr/bin/python3 tests/reference/make_golden.py --presets tiny2 --pdserve build/bin/pdserve
  /usr/bin/python3 tests/reference/make_golden.py --maker toy --presets toy,toy-fp8 --golden-dir /tmp/g
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

# Golden name -> (make-model preset, dtype, seed). Keep them tiny: the goldens are committed.
DEFAULT_PRESETS = {
    "tiny": ("tiny", "bf16", 1234),
    "tiny-fp8": ("tiny", "fp8", 1234),
    "tiny2": ("tiny2", "bf16", 1234),
}
TOY_PRESETS = {"toy": ("toy", "bf16", 1234), "toy-fp8": ("toy", "fp8", 1234)}

PROMPT_LEN = 48          # <= 64 keeps index_scores small; > index_topk exercises sparsity
MAX_NEW_TOKENS = 20


# Greedy steps whose top-1/top-2 logit gap is below this are near-ties: an implementation
# differing only in summation order may pick either token, so such prompts are skipped.
MIN_GREEDY_MARGIN = 0.05


def fixed_prompt(vocab, n=PROMPT_LEN, variant=0):
    """A fixed, vocabulary-independent recipe for the prompt: spread-out ids, none repeated
    for vocab >= n. `variant` shifts the recipe when a prompt has a near-tie greedy step."""
    return [(i * 7919 + 13 + 101 * variant) % vocab for i in range(n)]


def min_greedy_margin(dump_dir):
    import numpy as np
    logits = np.load(os.path.join(dump_dir, "step_logits.npy"))
    top2 = np.sort(logits, axis=1)[:, -2:]
    return float((top2[:, 1] - top2[:, 0]).min())


def make_model(maker, preset, dtype, seed, out_dir, pdserve):
    """Writes the checkpoint; returns the command (as a list) that did it."""
    if maker == "pdserve":
        cmd = [pdserve, "make-model", "--preset", preset, "--out", out_dir, "--seed", str(seed)]
        if dtype != "bf16":
            cmd += ["--dtype", dtype]
        subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
        cmd[0] = "pdserve"
        cmd[cmd.index("--out") + 1] = "<model>"
        return cmd
    import toy_checkpoint
    toy_checkpoint.write_toy_checkpoint(out_dir, toy_checkpoint.toy_config(), seed,
                                        fp8=dtype == "fp8", shards=2)
    return ["toy_checkpoint.py", "--out", "<model>", "--seed", str(seed)] + (
        ["--fp8", "--shards", "2"] if dtype == "fp8" else ["--shards", "2"])


def checkpoint_sha256(model_dir):
    """sha256 over every file of the checkpoint (name and bytes, in name order)."""
    h = hashlib.sha256()
    for fn in sorted(os.listdir(model_dir)):
        h.update(fn.encode() + b"\0")
        with open(os.path.join(model_dir, fn), "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def make_golden(name, preset, dtype, seed, golden_dir, maker="pdserve", pdserve=None,
                python=sys.executable):
    pdserve = pdserve or os.path.join(REPO, "build", "bin", "pdserve")
    with tempfile.TemporaryDirectory(prefix=f"golden-{name}-") as tmp:
        model_dir = os.path.join(tmp, "model")
        dump_dir = os.path.join(tmp, "dump")
        maker_cmd = make_model(maker, preset, dtype, seed, model_dir, pdserve)
        with open(os.path.join(model_dir, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        for variant in range(50):
            prompt = fixed_prompt(vocab, variant=variant)
            ref_cmd = [python, os.path.join(HERE, "deepseek_v32_ref.py"), "--model", model_dir,
                       "--prompt-ids", ",".join(map(str, prompt)),
                       "--max-new-tokens", str(MAX_NEW_TOKENS), "--out", dump_dir]
            subprocess.run(ref_cmd, check=True, stdout=subprocess.DEVNULL)
            if min_greedy_margin(dump_dir) >= MIN_GREEDY_MARGIN:
                break
            shutil.rmtree(dump_dir)
        else:
            raise SystemExit(f"{name}: no prompt variant without a near-tie greedy step")
        with open(os.path.join(dump_dir, "index.json")) as f:
            index = json.load(f)
        index["source"] = {
            "maker": maker, "preset": preset, "dtype": dtype, "seed": seed,
            "prompt_variant": variant, "min_greedy_margin": min_greedy_margin(dump_dir),
            "maker_command": maker_cmd, "checkpoint_sha256": checkpoint_sha256(model_dir),
            "reference_command": ["deepseek_v32_ref.py", "--model", "<model>", "--prompt-ids",
                                  "<prompt_tokens>", "--max-new-tokens", str(MAX_NEW_TOKENS)],
        }
        with open(os.path.join(dump_dir, "index.json"), "w") as f:
            json.dump(index, f, indent=1)
        dest = os.path.join(golden_dir, name)
        if os.path.exists(dest):
            shutil.rmtree(dest)
        shutil.copytree(dump_dir, dest)
    return dest


def main():
    ap = argparse.ArgumentParser(description="regenerate tests/golden/<NAME>/")
    ap.add_argument("--presets", default=None,
                    help="comma-separated golden names, optionally NAME:SEED (default: all of "
                         "DEFAULT_PRESETS, or TOY_PRESETS with --maker toy)")
    ap.add_argument("--maker", choices=["pdserve", "toy"], default="pdserve")
    ap.add_argument("--pdserve", default=os.path.join(REPO, "build", "bin", "pdserve"))
    ap.add_argument("--golden-dir", default=os.path.join(REPO, "tests", "golden"))
    args = ap.parse_args()
    known = TOY_PRESETS if args.maker == "toy" else DEFAULT_PRESETS
    presets = dict(known)
    if args.presets:
        presets = {}
        for item in args.presets.split(","):
            name, _, seed = item.partition(":")
            if name not in known:
                raise SystemExit(f"unknown golden {name!r} (have {sorted(known)})")
            p, dt, s = known[name]
            presets[name] = (p, dt, int(seed) if seed else s)
    for name, (preset, dtype, seed) in presets.items():
        dest = make_golden(name, preset, dtype, seed, args.golden_dir, args.maker, args.pdserve)
        print(f"{name}: {dest}")


if __name__ == "__main__":
    main()
