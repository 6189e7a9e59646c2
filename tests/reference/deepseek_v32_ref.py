#!/usr/bin/python3
"""Reference forward pass of a DeepSeek-V3.2-architecture model (MLA + Lightning Indexer sparse
attention + MoE), written for clarity and exact rounding, not speed. It produces the golden
outputs the C++ engine is tested against; docs/reference.md describes the dump format.

Usage:
  /usr/bin/python3 tests/reference/deepseek_v32_ref.py --model DIR --prompt-ids 0,15,7 \
      --max-new-tokens 20 --out DUMP_DIR [--force-topk FILE] [--no-decode-cache]

Numeric conventions (see ds32_numerics.py): tensors are fp32 torch tensors whose values are
exactly those the model would hold (bf16 values where the model stores bf16, e4m3 values for
fp8); every reduction is exact-then-rounded-once; `bf16()` marks each point where the model
rounds to bf16. Shapes use S = query tokens of this forward, T = keys in the cache.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds32_numerics as nx  # noqa: E402
from ds32_numerics import F32, F64, bf16, f32, mm64, fp32_scalar  # noqa: E402
from safetensors_lite import Checkpoint  # noqa: E402

NEG_INF = float("-inf")


# ----------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------

class Config:
    """The hyper-parameters the forward pass needs, from a Hugging Face config.json."""

    def __init__(self, d):
        self.raw = d
        self.vocab = int(d["vocab_size"])
        self.D = int(d["hidden_size"])
        self.inter = int(d["intermediate_size"])
        self.moe_inter = int(d.get("moe_intermediate_size") or 0)
        self.n_layers = int(d["num_hidden_layers"])
        self.H = int(d["num_attention_heads"])
        self.n_shared = int(d.get("n_shared_experts") or 0)
        self.E = int(d.get("n_routed_experts") or 0)
        self.route_scale = float(d.get("routed_scaling_factor", 1.0))
        self.Lkv = int(d["kv_lora_rank"])
        self.Lq = int(d["q_lora_rank"])
        self.dr = int(d["qk_rope_head_dim"])
        self.dn = int(d["qk_nope_head_dim"])
        self.dv = int(d["v_head_dim"])
        self.n_group = int(d.get("n_group") or 1)
        self.topk_group = int(d.get("topk_group") or 1)
        self.top_k = int(d.get("num_experts_per_tok") or 1)
        self.first_dense = int(d.get("first_k_dense_replace") or 0)
        self.topk_method = d.get("topk_method", "noaux_tc")
        self.scoring_func = d.get("scoring_func", "sigmoid")
        self.theta = float(d.get("rope_theta", 10000.0))
        self.IH = int(d["index_n_heads"])
        self.ID = int(d["index_head_dim"])
        self.K = int(d["index_topk"])
        rs = d.get("rope_scaling")
        # YaRN is on whenever rope_scaling is present (Hugging Face semantics; the official
        # code's condition max_seq_len > original length holds for any long-context server).
        self.yarn = None
        if rs:
            kind = rs.get("type", rs.get("rope_type"))
            if kind != "yarn":
                raise ValueError(f"unsupported rope_scaling type {kind!r}")
            self.yarn = {
                "factor": float(rs["factor"]),
                "original_max_position_embeddings": int(rs["original_max_position_embeddings"]),
                "beta_fast": float(rs.get("beta_fast", 32)),
                "beta_slow": float(rs.get("beta_slow", 1)),
                "mscale_all_dim": float(rs.get("mscale_all_dim", 1.0)),
            }
        # MLA softmax scale: (dn+dr)^-0.5, times mscale^2 under YaRN, where
        # mscale = 0.1 * mscale_all_dim * ln(factor) + 1 (1 if factor <= 1). Computed in double,
        # used as an fp32 constant.
        self.softmax_scale = (self.dn + self.dr) ** -0.5
        if self.yarn is not None and self.yarn["factor"] > 1.0:
            m = 0.1 * self.yarn["mscale_all_dim"] * math.log(self.yarn["factor"]) + 1.0
            self.softmax_scale *= m * m
        self._validate()

    def _validate(self):
        if self.dr % 2 or self.ID < self.dr:
            raise ValueError("qk_rope_head_dim must be even and <= index_head_dim")
        if self.ID > nx.QUANT_BLOCK or (self.ID & (self.ID - 1)):
            # One fp8 scale per indexer head / key needs the whole head in one 128-block, and
            # the Hadamard rotation needs a power of two.
            raise ValueError("index_head_dim must be a power of two <= 128")
        if self.n_layers > self.first_dense:
            if self.topk_method != "noaux_tc" or self.scoring_func != "sigmoid":
                raise ValueError("only topk_method=noaux_tc with sigmoid scoring is supported")
            if self.E % self.n_group or self.topk_group > self.n_group:
                raise ValueError("bad expert grouping")

    def summary(self):
        return {
            "vocab_size": self.vocab, "hidden_size": self.D, "intermediate_size": self.inter,
            "moe_intermediate_size": self.moe_inter, "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.H, "n_shared_experts": self.n_shared,
            "n_routed_experts": self.E, "routed_scaling_factor": self.route_scale,
            "kv_lora_rank": self.Lkv, "q_lora_rank": self.Lq, "qk_rope_head_dim": self.dr,
            "qk_nope_head_dim": self.dn, "v_head_dim": self.dv, "n_group": self.n_group,
            "topk_group": self.topk_group, "num_experts_per_tok": self.top_k,
            "first_k_dense_replace": self.first_dense, "rope_theta": self.theta,
            "rope_scaling": self.raw.get("rope_scaling"), "index_n_heads": self.IH,
            "index_head_dim": self.ID, "index_topk": self.K,
            "softmax_scale": self.softmax_scale,
        }


# ----------------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------------

def dequant_fp8_block(w8, scale_inv):
    """FP8 weight [out, in] (e4m3 values) times its block scale [ceil(out/128), ceil(in/128)]
    (element (i, j) uses scale_inv[i // 128, j // 128]; edge blocks are partial), product in
    fp32, stored as bf16 -- the values a bf16 engine computes with."""
    out, inn = w8.shape
    s = scale_inv.repeat_interleave(nx.QUANT_BLOCK, 0)[:out].repeat_interleave(nx.QUANT_BLOCK, 1)[:, :inn]
    return bf16(w8 * s)


class Weights:
    """Loads tensors by Hugging Face name. FP8 tensors are dequantized to bf16 values with
    their `weight_scale_inv`; BF16 and F32 tensors are used with their stored values."""

    def __init__(self, model_dir):
        self.ckpt = Checkpoint(model_dir)

    def get(self, name):
        t = torch.from_numpy(np.array(self.ckpt.get_f32(name), dtype=np.float32))
        if self.ckpt.dtype(name) == "F8_E4M3":
            sname = name[: -len("weight")] + "weight_scale_inv"
            if sname not in self.ckpt:
                raise KeyError(f"{name} is F8_E4M3 but {sname} is missing")
            scale = torch.from_numpy(np.array(self.ckpt.get_f32(sname), dtype=np.float32))
            t = dequant_fp8_block(t, scale)
        return t


class LayerWeights:
    def __init__(self, w, cfg, l):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        g = w.get
        self.attn_norm = g(p + "input_layernorm.weight")
        self.ffn_norm = g(p + "post_attention_layernorm.weight")
        self.wq_a = g(a + "q_a_proj.weight")
        self.q_norm = g(a + "q_a_layernorm.weight")
        self.wq_b = g(a + "q_b_proj.weight")
        self.wkv_a = g(a + "kv_a_proj_with_mqa.weight")
        self.kv_norm = g(a + "kv_a_layernorm.weight")
        self.wkv_b = g(a + "kv_b_proj.weight")
        self.wo = g(a + "o_proj.weight")
        self.iq = g(a + "indexer.wq_b.weight")
        self.ik = g(a + "indexer.wk.weight")
        self.ik_norm_w = g(a + "indexer.k_norm.weight")
        self.ik_norm_b = g(a + "indexer.k_norm.bias")
        self.iw = g(a + "indexer.weights_proj.weight")
        m = p + "mlp."
        self.moe = l >= cfg.first_dense
        if not self.moe:
            self.mlp = tuple(g(m + n + ".weight") for n in ("gate_proj", "up_proj", "down_proj"))
        else:
            self.gate = g(m + "gate.weight")
            self.gate_bias = g(m + "gate.e_score_correction_bias")
            self.experts = [tuple(g(f"{m}experts.{e}.{n}.weight")
                                  for n in ("gate_proj", "up_proj", "down_proj"))
                            for e in range(cfg.E)]
            self.shared = None
            if cfg.n_shared > 0:
                self.shared = tuple(g(f"{m}shared_experts.{n}.weight")
                                    for n in ("gate_proj", "up_proj", "down_proj"))


class LayerCache:
    """Per-layer decode state, one row per token: the latent c after its fp8 round trip (what
    an fp8 cache stores: e4m3 * a power of two per 128-block), k_pe (bf16, already rotated),
    and the indexer key in fp8 (e4m3 values) with its power-of-two scale."""

    def __init__(self, cfg):
        self.c = torch.zeros(0, cfg.Lkv)
        self.kpe = torch.zeros(0, cfg.dr)
        self.k8 = torch.zeros(0, cfg.ID)
        self.ks = torch.zeros(0)

    def append_mla(self, c, kpe):
        self.c = torch.cat([self.c, c])
        self.kpe = torch.cat([self.kpe, kpe])

    def append_index(self, k8, ks):
        self.k8 = torch.cat([self.k8, k8])
        self.ks = torch.cat([self.ks, ks])

    def __len__(self):
        return self.c.shape[0]


def select_topk(scores, k):
    """Indices of the k largest scores per row, ties broken towards the smaller key position
    (a stable sort of the negated scores), returned in rank order. -inf entries sort last."""
    return torch.sort(-scores, dim=-1, stable=True).indices[..., :k]


# ----------------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------------

class DeepSeekV32Ref:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = Config(json.load(f))
        cfg = self.cfg
        w = Weights(model_dir)
        self.embed = w.get("model.embed_tokens.weight")
        self.norm = w.get("model.norm.weight")
        self.head = w.get("lm_head.weight")
        # Layers >= num_hidden_layers (the MTP module) are never loaded.
        self.layers = [LayerWeights(w, cfg, l) for l in range(cfg.n_layers)]
        self.freqs = nx.rope_frequencies(cfg.dr, cfg.theta, cfg.yarn)
        self.scale32 = fp32_scalar(cfg.softmax_scale)

    def new_cache(self):
        return [LayerCache(self.cfg) for _ in range(self.cfg.n_layers)]

    # ---------------- feed-forward ----------------

    @staticmethod
    def mlp(x, w):
        """SwiGLU MLP. The gate/up projections are stored as bf16 (as every bf16 linear
        output); silu and the product run in fp32 on those values; the product is rounded to
        bf16 before the down projection, whose output is bf16. (The spec's "fp32(x W1^T)" is
        read as the bf16 linear output widened to fp32, which is what the official code does
        with `w1(x).float()`.)"""
        w1, w3, w2 = w
        h1 = bf16(mm64(x, w1))
        h3 = bf16(mm64(x, w3))
        g = bf16(nx.silu32(h1) * h3)
        return bf16(mm64(g, w2))

    def route(self, x, lw, force_idx=None):
        """Sigmoid router with group-limited top-k. Returns (expert ids [S, k] in rank order,
        fp32 weights [S, k]). force_idx [S, k] replaces the choice (weights still follow)."""
        cfg = self.cfg
        S = x.shape[0]
        s = nx.sigmoid32(mm64(x, lw.gate))     # x (bf16 values) times gate, fp32 result
        b = s + lw.gate_bias                   # the bias only decides WHICH experts run
        per = cfg.E // cfg.n_group
        bg = b.view(S, cfg.n_group, per)
        # A group is scored by the sum of its two best biased scores (its best if it has one
        # expert); only the topk_group best groups may supply experts.
        top2 = torch.sort(bg, dim=-1, descending=True).values[..., :min(2, per)]
        gscore = top2[..., 0] + top2[..., 1] if per >= 2 else top2[..., 0]
        keep_g = torch.zeros(S, cfg.n_group, dtype=torch.bool)
        keep_g.scatter_(1, select_topk(gscore, cfg.topk_group), True)
        keep = keep_g.repeat_interleave(per, dim=1)
        idx = select_topk(b.masked_fill(~keep, NEG_INF), cfg.top_k)
        if force_idx is not None:
            idx = torch.as_tensor(np.asarray(force_idx), dtype=torch.int64).reshape(S, cfg.top_k)
        # Weights use the UNBIASED sigmoid scores of the chosen experts, normalized to sum 1
        # (sum exact-then-fp32, then an fp32 divide) and scaled by routed_scaling_factor.
        wts = s.gather(1, idx)
        wts = wts / f32(wts.to(F64).sum(dim=-1, keepdim=True))
        wts = wts * fp32_scalar(cfg.route_scale)
        return idx, wts

    def moe(self, x, lw, rec=None, force_idx=None):
        idx, wts = self.route(x, lw, force_idx)
        if rec is not None:
            rec["experts"].append(idx)
        y = torch.zeros(x.shape[0], self.cfg.D, dtype=F32)
        # fp32 accumulation, one expert at a time in increasing expert id: y += out_e * w_e
        # (an fp32 multiply, then an fp32 add), then the shared expert is added, then bf16.
        for e in range(self.cfg.E):
            rows, slots = torch.where(idx == e)
            if rows.numel() == 0:
                continue
            out = self.mlp(x[rows], lw.experts[e])
            y[rows] = y[rows] + out * wts[rows, slots][:, None]
        if lw.shared is not None:
            y = y + self.mlp(x, lw.shared)
        return bf16(y)

    # ---------------- Lightning Indexer ----------------

    def indexer(self, x, qr, cos, sin, lw, cache, start_pos):
        """Appends this forward's fp8 keys to the cache and returns the index scores [S, T]
        (fp32, -inf for future keys)."""
        cfg = self.cfg
        S = x.shape[0]
        dr = cfg.dr
        # Queries from the MLA's normalized q latent; keys from the layer input x. Here the
        # RoPE part comes FIRST in the head and is rotated in half-split pairs.
        q = bf16(mm64(qr, lw.iq)).view(S, cfg.IH, cfg.ID)
        q = torch.cat([nx.apply_rope(q[..., :dr], cos[:, None], sin[:, None], False), q[..., dr:]], -1)
        k = bf16(mm64(x, lw.ik))
        k = nx.layer_norm(k, lw.ik_norm_w, lw.ik_norm_b)
        k = torch.cat([nx.apply_rope(k[..., :dr], cos, sin, False), k[..., dr:]], -1)
        # Hadamard rotation spreads outliers across the head before fp8 quantization; it
        # leaves q.k unchanged except through that quantization.
        q = nx.hadamard_rotate(q)
        k = nx.hadamard_rotate(k)
        q8, qs = nx.act_quant(q)          # one block (= one head) per scale: qs [S, IH, 1]
        k8, ks = nx.act_quant(k)          # one scale per key: ks [S, 1]
        cache.append_index(k8, ks[:, 0])
        # Per-head weights in fp32 from fp32(x): wp(x) * IH^-0.5 * q_scale * ID^-0.5, each
        # factor a separate fp32 multiply (q_scale is a power of two, hence exact).
        w = mm64(x, lw.iw)
        w = w * fp32_scalar(cfg.IH ** -0.5)
        w = w * qs[..., 0]
        w = w * fp32_scalar(cfg.ID ** -0.5)
        # fp8 dot products are exact (float64), rounded once to fp32; ReLU per head, weighted
        # (fp32 multiply), summed over heads (exact, then fp32), times the key's scale.
        dots = f32(torch.einsum("shd,td->sht", q8.to(F64), cache.k8.to(F64)))
        contrib = torch.relu(dots) * w[:, :, None]
        score = f32(contrib.to(F64).sum(dim=1)) * cache.ks[None, :]
        T = cache.k8.shape[0]
        qpos = torch.arange(start_pos, start_pos + S)[:, None]
        future = torch.arange(T)[None, :] > qpos
        return score.masked_fill(future, NEG_INF), future

    # ---------------- MLA ----------------

    def attention(self, l, x, cos, sin, start_pos, cache, absorbed, force_sel, rec):
        cfg = self.cfg
        lw = self.layers[l]
        S = x.shape[0]
        H, dn, dr, dv, Lkv = cfg.H, cfg.dn, cfg.dr, cfg.dv, cfg.Lkv
        qr = nx.rms_norm(bf16(mm64(x, lw.wq_a)), lw.q_norm)
        q = bf16(mm64(qr, lw.wq_b)).view(S, H, dn + dr)
        q_nope = q[..., :dn]
        q_pe = nx.apply_rope(q[..., dn:], cos[:, None], sin[:, None], True)  # interleaved pairs
        kva = bf16(mm64(x, lw.wkv_a))
        c = nx.rms_norm(kva[:, :Lkv], lw.kv_norm)
        # The latent goes through fp8 (per-128 power-of-two scale) BEFORE anything uses it:
        # both this forward and later decode steps see the fp8-storable values.
        c = nx.act_quant_roundtrip(c)
        k_pe = nx.apply_rope(kva[:, Lkv:], cos, sin, True)
        cache.append_mla(c, k_pe)

        # Sparse selection: the indexer picks up to K keys per query.
        iscore, future = self.indexer(x, qr, cos, sin, lw, cache, start_pos)
        T = len(cache)
        if force_sel is None:
            sel = select_topk(iscore, min(cfg.K, T))
            allowed = torch.zeros(S, T, dtype=torch.bool)
            allowed.scatter_(1, sel, True)
        else:
            fs = torch.as_tensor(np.asarray(force_sel), dtype=torch.int64)
            allowed = torch.zeros(S, T + 1, dtype=torch.bool)  # column T absorbs -1 padding
            allowed.scatter_(1, torch.where(fs < 0, T, fs), True)
            allowed = allowed[:, :T]
        allowed &= ~future
        if rec is not None:
            rec["index_scores"].append(iscore)
            rec["allowed"].append(allowed)

        scale = self.scale32
        if not absorbed:
            # Prefill form: expand the latent into per-head k_nope and v (rows of wkv_b are
            # head-major, dn k rows then dv v rows per head).
            kv = bf16(mm64(cache.c, lw.wkv_b)).view(T, H, dn + dv)
            k = torch.cat([kv[..., :dn], cache.kpe[:, None, :].expand(T, H, dr)], -1)
            qf = torch.cat([q_nope, q_pe], -1)
            score = bf16(torch.einsum("shd,thd->sht", qf.to(F64), k.to(F64)))
            score = bf16(score * scale)
            score = score.masked_fill(~allowed[:, None, :], NEG_INF)
            p = bf16(nx.softmax32(score))
            o = bf16(torch.einsum("sht,thd->shd", p.to(F64), kv[..., dn:].to(F64)))
        else:
            # Absorbed (decode) form: fold wkv_b's k part into the query and its v part after
            # the weighted sum, attending directly over the cached latent.
            wb = lw.wkv_b.view(H, dn + dv, Lkv).to(F64)
            q_lat = bf16(torch.einsum("shd,hdc->shc", q_nope.to(F64), wb[:, :dn]))
            s_lat = bf16(torch.einsum("shc,tc->sht", q_lat.to(F64), cache.c.to(F64)))
            s_pe = bf16(torch.einsum("shr,tr->sht", q_pe.to(F64), cache.kpe.to(F64)))
            score = bf16(bf16(s_lat + s_pe) * scale)
            score = score.masked_fill(~allowed[:, None, :], NEG_INF)
            p = bf16(nx.softmax32(score))
            o_lat = bf16(torch.einsum("sht,tc->shc", p.to(F64), cache.c.to(F64)))
            o = bf16(torch.einsum("shc,hdc->shd", o_lat.to(F64), wb[:, dn:]))
        return bf16(mm64(o.reshape(S, H * dv), lw.wo))

    # ---------------- whole model ----------------

    def forward(self, tokens, start_pos, cache, force_topk=None, attn_mode="auto", rec=None,
                force_experts=None):
        """Runs tokens at positions start_pos.. through the model, appending to `cache`.
        Returns the fp32 logits of the last position.

        attn_mode "auto" follows the official rule: a multi-token forward (a prefill, which
        must start at 0) uses the expanded form, a one-token forward the absorbed form.
        "absorbed"/"expanded" force one form (used by the self-tests).
        force_topk: optional [n_layers, S, >=1] int array of selected key positions (-1 pads)
        replacing the indexer's choice; force_experts: optional [n_layers, S, top_k] expert
        ids replacing the router's choice in MoE layers (rows of dense layers are ignored).
        rec: optional dict that receives per-layer records.
        """
        cfg = self.cfg
        S = len(tokens)
        if S > 1 and start_pos != 0 and attn_mode == "auto":
            raise NotImplementedError("a multi-token forward must start at position 0")
        if len(cache[0]) != start_pos:
            raise ValueError("cache length does not match start_pos")
        absorbed = (S == 1) if attn_mode == "auto" else attn_mode == "absorbed"
        cos, sin = nx.rope_cos_sin(self.freqs, range(start_pos, start_pos + S))
        if rec is not None:
            rec.update(hidden=[], index_scores=[], allowed=[], experts=[])
        h = self.embed[torch.as_tensor(tokens, dtype=torch.int64)]
        if rec is not None:
            rec["hidden"].append(h)
        residual = h                                   # bf16 stream
        x = nx.rms_norm(h, self.layers[0].attn_norm)
        for l, lw in enumerate(self.layers):
            fs = None if force_topk is None else force_topk[l]
            a = self.attention(l, x, cos, sin, start_pos, cache[l], absorbed, fs, rec)
            s = a + residual                           # fp32 sum of two bf16 tensors
            residual = bf16(s)
            x = nx.rms_norm(s, lw.ffn_norm)            # norm of the UNROUNDED fp32 sum
            if lw.moe:
                fe = None if force_experts is None else force_experts[l]
                f = self.moe(x, lw, rec, fe)
            else:
                f = self.mlp(x, lw.mlp)
                if rec is not None:
                    rec["experts"].append(torch.full((S, cfg.top_k), -1, dtype=torch.int64))
            s = f + residual
            if rec is not None:
                rec["hidden"].append(s)
            residual = bf16(s)
            nxt = self.layers[l + 1].attn_norm if l + 1 < cfg.n_layers else self.norm
            x = nx.rms_norm(s, nxt)
        # Final norm output is bf16; the head runs in fp32 on it.
        return mm64(x[-1:], self.head)[0]

    def generate(self, prompt, max_new_tokens, decode_cache=True, force_topk=None,
                 force_experts=None):
        """Greedy continuation like the official loop: prefill the prompt, then one token per
        step (absorbed decode over the cache), argmax of the fp32 logits (first index on a
        tie). No EOS stop. force_* apply to the prompt prefill only. Returns the dump arrays.
        decode_cache=False recomputes each step as a full prefill of the whole sequence."""
        cfg = self.cfg
        P = len(prompt)
        rec = {}
        cache = self.new_cache()
        logits = self.forward(prompt, 0, cache, force_topk=force_topk, rec=rec,
                              force_experts=force_experts)
        out = {
            "hidden": torch.stack(rec["hidden"]).numpy().astype(np.float32),
            "index_scores": torch.stack(rec["index_scores"]).numpy().astype(np.float32),
            "topk": np.stack([allowed_to_topk(a, cfg.K) for a in rec["allowed"]]),
            "experts": np.stack([experts_sorted(e) for e in rec["experts"]]),
        }
        step_logits, tokens, topk_dec, experts_dec = [], [], [], []
        for i in range(max_new_tokens):
            if i > 0:
                r = {}
                if decode_cache:
                    logits = self.forward([tokens[-1]], P + i - 1, cache, rec=r)
                else:
                    logits = self.forward(prompt + tokens, 0, self.new_cache(), rec=r)
                topk_dec.append(np.stack([allowed_to_topk(a[-1:], cfg.K)[0] for a in r["allowed"]]))
                experts_dec.append(np.stack([experts_sorted(e[-1:])[0] for e in r["experts"]]))
            lg = logits.numpy().astype(np.float32)
            step_logits.append(lg)
            tokens.append(int(np.argmax(lg)))
        L = cfg.n_layers
        out["step_logits"] = (np.stack(step_logits) if step_logits
                              else np.zeros((0, cfg.vocab), np.float32))
        out["topk_decode"] = (np.stack(topk_dec) if topk_dec
                              else np.zeros((0, L, cfg.K), np.int32))
        out["experts_decode"] = (np.stack(experts_dec) if experts_dec
                                 else np.zeros((0, L, cfg.top_k), np.int32))
        out["output_tokens"] = tokens
        return out


def experts_sorted(idx):
    """[S, k] expert ids -> int32 sorted ascending (the set; -1 rows for dense layers)."""
    return np.sort(idx.numpy(), axis=-1).astype(np.int32)


def allowed_to_topk(allowed, K):
    """[S, T] bool -> [S, K] int32: allowed key positions ascending, padded with -1."""
    allowed = allowed.numpy() if isinstance(allowed, torch.Tensor) else allowed
    S, T = allowed.shape
    out = np.full((S, K), -1, dtype=np.int32)
    for s in range(S):
        pos = np.nonzero(allowed[s])[0][:K]
        out[s, :len(pos)] = pos
    return out


# ----------------------------------------------------------------------------------------------
# Dump + CLI
# ----------------------------------------------------------------------------------------------

FILE_DOCS = {
    "hidden.npy": "[n_layers+1, prompt_len, hidden] f32: row 0 embedding, row l residual stream "
                  "(fp32 sum) after layer l-1",
    "index_scores.npy": "[n_layers, prompt_len, prompt_len] f32 indexer scores, -inf = future key",
    "topk.npy": "[n_layers, prompt_len, index_topk] i32 selected keys ascending, -1 padded",
    "step_logits.npy": "[steps, vocab] f32 logits of each greedy step",
    "topk_decode.npy": "[steps-1, n_layers, index_topk] i32 decode-step selections, -1 padded",
    "experts.npy": "[n_layers, prompt_len, num_experts_per_tok] i32 routed experts ascending "
                   "(-1 for dense layers)",
    "experts_decode.npy": "[steps-1, n_layers, num_experts_per_tok] i32 routed experts of each "
                          "decode step",
}


def load_forced(path, default_name):
    """An .npy file, or a dump directory holding `default_name`."""
    if os.path.isdir(path):
        path = os.path.join(path, default_name)
    return np.load(path).astype(np.int64)


def write_dump(out_dir, model, prompt, result, decode_cache, force_topk_path,
               force_experts_path=None):
    os.makedirs(out_dir, exist_ok=True)
    arrays = {
        "hidden.npy": result["hidden"].astype(np.float32),
        "index_scores.npy": result["index_scores"].astype(np.float32),
        "topk.npy": result["topk"].astype(np.int32),
        "step_logits.npy": result["step_logits"].astype(np.float32),
        "topk_decode.npy": result["topk_decode"].astype(np.int32),
        "experts.npy": result["experts"].astype(np.int32),
        "experts_decode.npy": result["experts_decode"].astype(np.int32),
    }
    files = {}
    for name, arr in arrays.items():
        np.save(os.path.join(out_dir, name), arr)
        files[name] = {"shape": list(arr.shape), "dtype": str(arr.dtype), "desc": FILE_DOCS[name]}
    index = {
        "prompt_tokens": list(prompt),
        "output_tokens": result["output_tokens"],
        "config": model.cfg.summary(),
        "files": files,
        "decode_cache": decode_cache,
        "force_topk": force_topk_path,
        "force_experts": force_experts_path,
        "generator": "tests/reference/deepseek_v32_ref.py",
    }
    with open(os.path.join(out_dir, "index.json"), "w") as f:
        json.dump(index, f, indent=1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face model directory")
    ap.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    ap.add_argument("--max-new-tokens", type=int, default=20)
    ap.add_argument("--out", required=True, help="dump directory")
    ap.add_argument("--force-topk", default=None,
                    help="topk.npy (or a dump dir holding one) to use as the prefill selections")
    ap.add_argument("--force-experts", default=None,
                    help="experts.npy (or a dump dir holding one) to use as the prefill routing")
    ap.add_argument("--no-decode-cache", action="store_true",
                    help="recompute every step as a full prefill of the whole sequence")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    prompt = [int(t) for t in args.prompt_ids.split(",") if t.strip() != ""]
    if not prompt:
        ap.error("empty prompt")
    model = DeepSeekV32Ref(args.model)
    if any(t < 0 or t >= model.cfg.vocab for t in prompt):
        ap.error("prompt id out of range")
    force, force_e = None, None
    if args.force_topk:
        force = load_forced(args.force_topk, "topk.npy")
        if force.ndim != 3 or force.shape[:2] != (model.cfg.n_layers, len(prompt)):
            ap.error(f"--force-topk shape {force.shape} does not match "
                     f"[{model.cfg.n_layers}, {len(prompt)}, K]")
    if args.force_experts:
        force_e = load_forced(args.force_experts, "experts.npy")
        if force_e.shape != (model.cfg.n_layers, len(prompt), model.cfg.top_k):
            ap.error(f"--force-experts shape {force_e.shape} does not match "
                     f"[{model.cfg.n_layers}, {len(prompt)}, {model.cfg.top_k}]")
    res = model.generate(prompt, args.max_new_tokens, decode_cache=not args.no_decode_cache,
                         force_topk=force, force_experts=force_e)
    write_dump(args.out, model, prompt, res, not args.no_decode_cache, args.force_topk,
               args.force_experts)
    print(json.dumps({"prompt_tokens": prompt, "output_tokens": res["output_tokens"]}))


if __name__ == "__main__":
    main()
