#!/usr/bin/python3
"""Writes tiny random DeepSeek-V3.2 checkpoints in Hugging Face format (config.json +
safetensors, BF16 or FP8 with weight_scale_inv), for the reference's self-tests and as a
stand-in for `pdserve make-model` until that exists.

  /usr/bin/python3 tests/reference/toy_checkpoint.py --out DIR [--seed 1] [--fp8] [--shards 2]
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds32_numerics as nx  # noqa: E402
from safetensors_lite import write_safetensors  # noqa: E402

# Small dims with deliberately partial 128-blocks (hidden 192, kv_a rows 128 + 32 = 160) so
# FP8 block scales are exercised on edges.
TOY_CONFIG = {
    "architectures": ["DeepseekV32ForCausalLM"],
    "model_type": "deepseek_v32",
    "vocab_size": 512,
    "hidden_size": 192,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 8,
    "routed_scaling_factor": 2.5,
    "kv_lora_rank": 128,
    "q_lora_rank": 96,
    "qk_rope_head_dim": 32,
    "v_head_dim": 32,
    "qk_nope_head_dim": 32,
    "n_group": 4,
    "topk_group": 2,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "norm_topk_prob": True,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "max_position_embeddings": 128,
    "index_n_heads": 4,
    "index_head_dim": 64,
    "index_topk": 8,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1,
}

FP8_QUANT_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                    "weight_block_size": [128, 128], "scale_fmt": "ue8m0"}


def toy_config(**overrides):
    cfg = json.loads(json.dumps(TOY_CONFIG))
    cfg.update(overrides)
    return cfg


def tensor_specs(cfg):
    """(name, shape, kind) for every tensor; kind is 'linear'/'linear_out' (fp8-quantizable;
    _out = writes into the residual stream), 'embed', 'norm', 'normbias',
    'plain' (bf16, never quantized) or 'bias32' (f32)."""
    D, H = cfg["hidden_size"], cfg["num_attention_heads"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    Lq, Lkv = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    IH, ID = cfg["index_n_heads"], cfg["index_head_dim"]
    E, MI = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    specs = [("model.embed_tokens.weight", (cfg["vocab_size"], D), "embed")]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        specs += [
            (p + "input_layernorm.weight", (D,), "norm"),
            (a + "q_a_proj.weight", (Lq, D), "linear"),
            (a + "q_a_layernorm.weight", (Lq,), "norm"),
            (a + "q_b_proj.weight", (H * (dn + dr), Lq), "linear"),
            (a + "kv_a_proj_with_mqa.weight", (Lkv + dr, D), "linear"),
            (a + "kv_a_layernorm.weight", (Lkv,), "norm"),
            (a + "kv_b_proj.weight", (H * (dn + dv), Lkv), "linear"),
            (a + "o_proj.weight", (D, H * dv), "linear_out"),
            (a + "indexer.wq_b.weight", (IH * ID, Lq), "linear"),
            (a + "indexer.wk.weight", (ID, D), "linear"),
            (a + "indexer.k_norm.weight", (ID,), "norm"),
            (a + "indexer.k_norm.bias", (ID,), "normbias"),
            (a + "indexer.weights_proj.weight", (IH, D), "plain"),
            (p + "post_attention_layernorm.weight", (D,), "norm"),
        ]
        m = p + "mlp."
        if l < cfg["first_k_dense_replace"]:
            I = cfg["intermediate_size"]
            specs += [(m + "gate_proj.weight", (I, D), "linear"), (m + "up_proj.weight", (I, D), "linear"),
                      (m + "down_proj.weight", (D, I), "linear_out")]
        else:
            specs += [(m + "gate.weight", (E, D), "plain"),
                      (m + "gate.e_score_correction_bias", (E,), "bias32")]
            for e in range(E):
                specs += [(f"{m}experts.{e}.gate_proj.weight", (MI, D), "linear"),
                          (f"{m}experts.{e}.up_proj.weight", (MI, D), "linear"),
                          (f"{m}experts.{e}.down_proj.weight", (D, MI), "linear_out")]
            SI = cfg["n_shared_experts"] * MI
            if SI:
                specs += [(m + "shared_experts.gate_proj.weight", (SI, D), "linear"),
                          (m + "shared_experts.up_proj.weight", (SI, D), "linear"),
                          (m + "shared_experts.down_proj.weight", (D, SI), "linear_out")]
    specs += [("model.norm.weight", (D,), "norm"), ("lm_head.weight", (cfg["vocab_size"], D), "plain")]
    # An MTP-like extra layer that inference must ignore (deliberately wrong shape).
    specs += [(f"model.layers.{cfg['num_hidden_layers']}.input_layernorm.weight", (3,), "norm")]
    return specs


def bf16_bits(x):
    """fp32 tensor -> uint16 numpy array of its RNE bf16 bits."""
    return x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def quantize_fp8_blocks(w):
    """w [out, in] fp32 -> (e4m3 codes uint8, scale_inv f32 [ceil(out/128), ceil(in/128)]).
    scale = amax/448 per 128x128 block (an arbitrary fp32, not a power of two, like real
    checkpoints), codes = e4m3(w / scale)."""
    B = nx.QUANT_BLOCK
    out, inn = w.shape
    ro, ri = (out + B - 1) // B, (inn + B - 1) // B
    scale = torch.zeros(ro, ri)
    codes = torch.zeros(out, inn, dtype=torch.int64)
    for i in range(ro):
        for j in range(ri):
            blk = w[i * B:(i + 1) * B, j * B:(j + 1) * B]
            s = (blk.abs().max().clamp(min=1e-8) / 448.0).to(torch.float32)
            scale[i, j] = s
            codes[i * B:(i + 1) * B, j * B:(j + 1) * B] = nx.e4m3_encode((blk / s).clamp(-448, 448))
    return codes.numpy().astype(np.uint8), scale.numpy().astype(np.float32)


def random_tensor(g, shape, kind):
    if kind == "norm":
        return 1.0 + 0.1 * torch.randn(shape, generator=g)
    if kind == "normbias":
        return 0.1 * torch.randn(shape, generator=g)
    if kind == "bias32":
        return 0.05 * torch.randn(shape, generator=g)
    if kind == "embed":
        return torch.randn(shape, generator=g)
    w = torch.randn(shape, generator=g) * (shape[1] ** -0.5)
    if kind == "linear_out":
        # Projections back into the residual stream are scaled down, as in trained models, so
        # that each layer nudges the stream instead of replacing it: the toy model is then
        # well conditioned and tiny rounding differences stay tiny.
        w = w * 0.3
    return w


def write_toy_checkpoint(out_dir, cfg=None, seed=1, fp8=False, shards=1):
    """Writes config.json and the weights; returns {name: fp32 tensor as generated}."""
    cfg = cfg or toy_config()
    os.makedirs(out_dir, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    generated = {}
    for name, shape, kind in tensor_specs(cfg):
        t = random_tensor(g, shape, kind).to(torch.float32)
        generated[name] = t
        if kind == "bias32":
            tensors[name] = ("F32", t.numpy())
        elif kind in ("linear", "linear_out") and fp8:
            codes, sinv = quantize_fp8_blocks(t)
            tensors[name] = ("F8_E4M3", codes)
            tensors[name[: -len("weight")] + "weight_scale_inv"] = ("F32", sinv)
        else:
            tensors[name] = ("BF16", bf16_bits(t))
    full = dict(cfg)
    if fp8:
        full["quantization_config"] = FP8_QUANT_CONFIG
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(full, f, indent=1)
    names = list(tensors)
    if shards <= 1:
        write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, {"format": "pt"})
    else:
        weight_map = {}
        for k in range(shards):
            fn = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: tensors[n] for i, n in enumerate(names) if i % shards == k}
            write_safetensors(os.path.join(out_dir, fn), part, {"format": "pt"})
            weight_map.update({n: fn for n in part})
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
    return generated


def main():
    ap = argparse.ArgumentParser(description="write a tiny random DeepSeek-V3.2 HF checkpoint")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--set", action="append", default=[],
                    help="config override KEY=JSON_VALUE, e.g. --set index_topk=16")
    args = ap.parse_args()
    over = {}
    for kv in args.set:
        k, v = kv.split("=", 1)
        over[k] = json.loads(v)
    write_toy_checkpoint(args.out, toy_config(**over), args.seed, args.fp8, args.shards)


if __name__ == "__main__":
    main()
