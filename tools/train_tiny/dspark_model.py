"""The DSpark draft in PyTorch, mirroring m3serve's C++ forward (src/model/minimax_m3/dspark/), and
the frozen m3-tiny target loaded from its checkpoint into fast_model.FastM3 with hidden-state capture.

Conventions mirrored from the C++ code (dspark_draft.cpp, dspark_attention.cpp, target_features.cpp,
the CPU backend's ops), so trained weights mean the same thing there:
  * features: for each committed token the target's residual stream after every layer in
    dspark_target_layer_ids, concatenated in that order ([T, n_ids * H]). Under "final_norm_last"
    the entry of the target's LAST layer (id == num_layers - 1) is the target's final-norm output
    instead (target_features.cpp); every other entry is identical under both conventions.
  * context: c = hidden_norm(fc(features)); per draft layer K = RoPE_j(k_norm(k_proj(c))),
    V = v_proj(c) at the token's own position j. NO input_layernorm on c.
  * query block: slot 0 = target Embed[anchor], slots 1..B-1 = target Embed[noise_token_id], at
    positions p..p+B-1 (p = anchor position = number of committed context tokens).
  * layers: pre-norm; q/k per-head Gemma RMSNorm, then RoPE (NeoX half-split on the first
    rotary_dim dims, inv_freq = 1 / theta^(2i / rotary_dim) in float32); GQA with query head n
    using KV head n // (H / Hkv); scale 1/sqrt(head_dim); no biases.
  * attention: block slot k (position q = p + k) sees context positions j < p with
    j >= q - W + 1 (sliding window measured from the query's own position) and all B block slots
    bidirectionally; the block K/V are never stored.
  * o_proj, residual; post_attention_layernorm; dense SwiGLU-OAI MLP (gate clamped above at
    limit, up clamped to [-limit, limit], gate * sigmoid(alpha * gate) * (up + 1)); residual.
  * final_norm, then the TARGET's lm_head: base logits.
  * Markov head: logits_k = base_k + markov_w2 @ markov_w1[prev], prev = anchor for slot 0, then
    the previous slot's chosen draft (inference) or the ground-truth token (teacher forcing);
    greedy picks the lowest id among the maxima (torch.argmax returns the first maximum).
  * Gemma RMSNorm everywhere: x / sqrt(mean(x^2) + eps) * (1 + w) (use_gemma_norm true).
  * confidence head: proj([final_norm(x)_k ; markov_w1[prev_k]]) (trained, not used by m3serve).
Tensor names (state_dict keys) equal the loader's logical names (dspark_weights.cpp): fc.weight,
hidden_norm.weight, final_norm.weight, markov_head.markov_w{1,2}.weight,
confidence_head.proj.{weight,bias}, layers.{i}.decoder_layer.{input_layernorm,
post_attention_layernorm,self_attn.{q,k,v,o}_proj,self_attn.{q,k}_norm,mlp.{gate,up,down}_proj}.weight.
"""

import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from fast_model import FastM3, GemmaRMSNorm, read_safetensors, swiglu_oai

PREFIX = "language_model.model.dspark."  # the released folder's prefix (the loader accepts it)


# ------------------------------------------------------------------------------------------------
# Target
# ------------------------------------------------------------------------------------------------
def target_dict(target_dir):
    with open(os.path.join(target_dir, "config.json")) as f:
        cfg = json.load(f)
    t = cfg.get("text_config", cfg)
    hd = t["head_dim"]
    rot = int(hd * t["partial_rotary_factor"]) if t.get("partial_rotary_factor") else t.get("rotary_dim", hd)
    sp = t.get("sparse_attention_config") or {}
    return {
        "vocab": t["vocab_size"], "hidden": t["hidden_size"], "heads": t["num_attention_heads"],
        "kv_heads": t["num_key_value_heads"], "head_dim": hd, "rotary_dim": rot,
        "rope_theta": t["rope_theta"], "eps": t["rms_norm_eps"],
        "index_heads": sp.get("sparse_num_index_heads", 1), "index_dim": sp.get("sparse_index_dim", hd),
        "experts": t["num_local_experts"], "topk_experts": t["num_experts_per_tok"],
        "expert_inter": t["intermediate_size"], "shared_inter": t["shared_intermediate_size"],
        "dense_inter": t["dense_intermediate_size"], "alpha": t["swiglu_alpha"], "limit": t["swiglu_limit"],
        "routed_scale": t["routed_scaling_factor"], "moe_layer_freq": t["moe_layer_freq"],
        "eos": t.get("eos_token_id"), "max_sparse_len": sp.get("sparse_topk_blocks", 32) * sp.get("sparse_block_size", 32),
    }


def load_target(target_dir):
    """FastM3 in float32 with the checkpoint's (bf16) values, names mapped from the original layout."""
    c = target_dict(target_dir)
    m = FastM3(c)
    raw = {}
    idx = os.path.join(target_dir, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    for fn in files:
        for k, t in read_safetensors(os.path.join(target_dir, fn)).items():
            if k.startswith("language_model."):  # not the vision tower, projector and merge MLP
                raw[k] = t
    sd = {}
    g = lambda k: raw.pop(k)  # noqa: E731
    sd["model.embed_tokens.weight"] = g("language_model.model.embed_tokens.weight")
    sd["model.norm.weight"] = g("language_model.model.norm.weight")
    sd["lm_head.weight"] = g("language_model.lm_head.weight")
    for i, moe in enumerate(c["moe_layer_freq"]):
        o, h = "language_model.model.layers.%d." % i, "model.layers.%d." % i
        for nm in ["input_layernorm", "post_attention_layernorm"]:
            sd[h + nm + ".weight"] = g(o + nm + ".weight")
        for nm in ["q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"]:
            sd[h + "self_attn.%s.weight" % nm] = g(o + "self_attn.%s.weight" % nm)
        for nm in ["q_proj", "k_proj", "q_norm", "k_norm"]:
            sd[h + "self_attn.indexer.%s.weight" % nm] = g(o + "self_attn.index_%s.weight" % nm)
        if not moe:
            sd[h + "mlp.gate_up_proj.weight"] = torch.cat([g(o + "mlp.gate_proj.weight"), g(o + "mlp.up_proj.weight")])
            sd[h + "mlp.down_proj.weight"] = g(o + "mlp.down_proj.weight")
            continue
        b = o + "block_sparse_moe."
        sd[h + "mlp.gate.weight"] = g(b + "gate.weight")
        sd[h + "mlp.gate.e_score_correction_bias"] = g(b + "e_score_correction_bias")
        E = c["experts"]
        sd[h + "mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([g(b + "experts.%d.w1.weight" % e), g(b + "experts.%d.w3.weight" % e)]) for e in range(E)])
        sd[h + "mlp.experts.down_proj"] = torch.stack([g(b + "experts.%d.w2.weight" % e) for e in range(E)])
        sd[h + "mlp.shared_experts.gate_up_proj.weight"] = torch.cat(
            [g(b + "shared_experts.gate_proj.weight"), g(b + "shared_experts.up_proj.weight")])
        sd[h + "mlp.shared_experts.down_proj.weight"] = g(b + "shared_experts.down_proj.weight")
    missing, unexpected = m.load_state_dict(sd, strict=False)
    missing = [k for k in missing if k != "inv_freq"]
    if missing or unexpected:
        raise RuntimeError("target load: missing %s unexpected %s" % (missing, unexpected))
    if raw:
        raise RuntimeError("target checkpoint tensors not used: %s" % sorted(raw)[:10])
    for p in m.parameters():
        p.requires_grad_(False)
    return m.eval(), c


@torch.no_grad()
def target_run(m, x):
    """x [N, L] -> (per-layer residual outputs [n_layers] of [N, L, H], final-normed [N, L, H])."""
    L = x.shape[1]
    pos = torch.arange(L, device=x.device, dtype=torch.float32)
    ang = pos[:, None] * m.inv_freq.float()[None, :]
    cos, sin = ang.cos(), ang.sin()
    h = m.model.embed_tokens(x)
    outs = []
    for layer in m.model.layers:
        h = layer(h, cos, sin)
        outs.append(h)
    return outs, m.model.norm(h)


def features(outs, normed, layer_ids, convention):
    """[N, L, n_ids * H] exactly as build_context_features lays them out."""
    last = len(outs) - 1
    parts = []
    for i in layer_ids:
        parts.append(normed if (convention == "final_norm_last" and i == last) else outs[i])
    return torch.cat(parts, dim=-1)


# ------------------------------------------------------------------------------------------------
# Draft
# ------------------------------------------------------------------------------------------------
class DraftAttention(nn.Module):
    def __init__(self, d):
        super().__init__()
        H, nh, nk, hd = d["hidden_size"], d["num_attention_heads"], d["num_key_value_heads"], d["head_dim"]
        self.q_proj = nn.Linear(H, nh * hd, bias=False)
        self.k_proj = nn.Linear(H, nk * hd, bias=False)
        self.v_proj = nn.Linear(H, nk * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.q_norm = GemmaRMSNorm(hd, d["rms_norm_eps"])
        self.k_norm = GemmaRMSNorm(hd, d["rms_norm_eps"])


class DraftMLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        H, I = d["hidden_size"], d["dspark_ffn_hidden_size"]
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)
        self.alpha, self.limit = d["swiglu_alpha"], d["swiglu_limit"]

    def forward(self, x):
        return self.down_proj(swiglu_oai(self.gate_proj(x), self.up_proj(x), self.alpha, self.limit))


class DecoderLayer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.input_layernorm = GemmaRMSNorm(d["hidden_size"], d["rms_norm_eps"])
        self.post_attention_layernorm = GemmaRMSNorm(d["hidden_size"], d["rms_norm_eps"])
        self.self_attn = DraftAttention(d)
        self.mlp = DraftMLP(d)


class LayerBox(nn.Module):  # gives the "layers.{i}.decoder_layer." names
    def __init__(self, d):
        super().__init__()
        self.decoder_layer = DecoderLayer(d)


class MarkovHead(nn.Module):
    def __init__(self, V, r):
        super().__init__()
        self.markov_w1 = nn.Embedding(V, r)
        self.markov_w2 = nn.Linear(r, V, bias=False)
        nn.init.normal_(self.markov_w1.weight, std=0.02)
        nn.init.zeros_(self.markov_w2.weight)  # starts as no correction


class ConfidenceHead(nn.Module):
    def __init__(self, n_in):
        super().__init__()
        self.proj = nn.Linear(n_in, 1, bias=True)


def rope(x, pos, inv_freq, rot):
    """x [..., T, heads, D], pos [..., T] int: NeoX half-split on the first `rot` dims (fp32)."""
    h = rot // 2
    ang = pos.float()[..., None] * inv_freq  # [..., T, rot/2]
    cos, sin = ang.cos()[..., None, :], ang.sin()[..., None, :]
    xf = x[..., :rot].float()
    x1, x2 = xf[..., :h], xf[..., h:]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
    return torch.cat([out, x[..., rot:]], dim=-1)


class DSparkDraft(nn.Module):
    def __init__(self, d, n_ids):
        super().__init__()
        self.d = d
        H = d["hidden_size"]
        self.fc = nn.Linear(n_ids * H, H, bias=False)
        self.hidden_norm = GemmaRMSNorm(H, d["rms_norm_eps"])
        self.final_norm = GemmaRMSNorm(H, d["rms_norm_eps"])
        self.layers = nn.ModuleList([LayerBox(d) for _ in range(d["num_hidden_layers"])])
        self.markov_head = MarkovHead(d["vocab_size"], d["dspark_markov_rank"])
        self.confidence_head = ConfidenceHead(H + d["dspark_markov_rank"])
        rot = d["rotary_dim"]
        inv = 1.0 / (float(d["rope_theta"]) ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
        self.register_buffer("inv_freq", inv, persistent=False)

    def block_hidden(self, feats, embed, anchor_tok, anchor_pos):
        """feats [N, S, n_ids*H] (context features of positions 0..S-1), embed: the target's table,
        anchor_tok / anchor_pos [N, A]: A blocks per sequence; block a sees context j < anchor_pos.
        Returns final_norm(x) [N, A, B, H]."""
        d = self.d
        N, S, _ = feats.shape
        A = anchor_tok.shape[1]
        B, W = d["dspark_block_size"], d["sliding_window"]
        nh, nk, hd, rot = d["num_attention_heads"], d["num_key_value_heads"], d["head_dim"], d["rotary_dim"]
        dev = feats.device
        c = self.hidden_norm(self.fc(feats))  # [N, S, H]
        ctx_pos = torch.arange(S, device=dev)
        slot = torch.arange(B, device=dev)
        qpos = anchor_pos[:, :, None] + slot  # [N, A, B]
        ids = torch.full((N, A, B), d["dspark_noise_token_id"], dtype=torch.long, device=dev)
        ids[:, :, 0] = anchor_tok
        x = embed[ids].reshape(N, A * B, -1).to(c.dtype)
        qp = qpos.reshape(N, A * B)
        # Visibility [N, A*B, S + A*B]: context j < p and q - j < W; the own block, bidirectional.
        ctx_ok = (ctx_pos[None, None, :] < anchor_pos.repeat_interleave(B, 1)[:, :, None]) & \
                 (qp[:, :, None] - ctx_pos[None, None, :] < W)
        blk = torch.arange(A, device=dev).repeat_interleave(B)
        blk_ok = (blk[:, None] == blk[None, :]).expand(N, -1, -1)
        mask = torch.cat([ctx_ok, blk_ok], dim=-1)[:, None]  # [N, 1, AB, S+AB]
        rep = nh // nk
        scale = 1.0 / hd ** 0.5
        for box in self.layers:
            lyr = box.decoder_layer
            at = lyr.self_attn
            kc = at.k_norm(at.k_proj(c).view(N, S, nk, hd))
            kc = rope(kc, ctx_pos[None].expand(N, -1), self.inv_freq, rot)
            vc = at.v_proj(c).view(N, S, nk, hd)
            h = lyr.input_layernorm(x)
            q = at.q_norm(at.q_proj(h).view(N, A * B, nh, hd))
            kb = at.k_norm(at.k_proj(h).view(N, A * B, nk, hd))
            vb = at.v_proj(h).view(N, A * B, nk, hd)
            q = rope(q, qp, self.inv_freq, rot)
            kb = rope(kb, qp, self.inv_freq, rot)
            k = torch.cat([kc, kb], dim=1).transpose(1, 2).repeat_interleave(rep, dim=1)
            v = torch.cat([vc, vb], dim=1).transpose(1, 2).repeat_interleave(rep, dim=1)
            q = q.transpose(1, 2)
            dt = v.dtype
            if hasattr(F, "scaled_dot_product_attention"):
                o = F.scaled_dot_product_attention(q.to(dt), k.to(dt), v, attn_mask=mask, scale=scale)
            else:  # torch < 2.0 (the CPU fixture regeneration, dspark_fixture.py)
                a = (q.to(dt) @ k.to(dt).transpose(-1, -2)) * scale
                o = a.masked_fill(~mask, float("-inf")).softmax(-1) @ v
            x = x + at.o_proj(o.transpose(1, 2).reshape(N, A * B, nh * hd))
            x = x + lyr.mlp(lyr.post_attention_layernorm(x))
        return self.final_norm(x).view(N, A, B, -1)

    def markov(self, prev):
        return self.markov_head.markov_w2(self.markov_head.markov_w1(prev))

    @torch.no_grad()
    def propose(self, feats, embed, lm_head, anchor, temperature=0.0, gen=None):
        """One sequence: feats [p, n_ids*H] of the committed positions, anchor at p. Returns
        (tokens [B], corrected logits [B, V], base logits [B, V]) with the sequential Markov chain;
        temperature 0: argmax (lowest id on ties), else a sample from softmax(logits / T)."""
        p = feats.shape[0]
        dev = feats.device
        y = self.block_hidden(feats[None], embed, torch.tensor([[anchor]], device=dev),
                              torch.tensor([[p]], device=dev))[0, 0]
        base = y @ lm_head.t()
        prev = anchor
        toks, rows = [], []
        for k in range(base.shape[0]):
            row = base[k] + self.markov(torch.tensor([prev], device=dev))[0]
            rows.append(row)
            if temperature <= 0:
                t = int(torch.argmax(row))
            else:
                pr = torch.softmax(row.double() / temperature, -1)
                t = int(torch.multinomial(pr, 1, generator=gen))
            toks.append(t)
            prev = t
        return toks, torch.stack(rows), base


def draft_config(target_c, args, convention):
    """The draft's config.json (M3.1 field names plus m3serve's capture convention)."""
    L = len(target_c["moe_layer_freq"])
    n = min(5, L - 1)
    ids = sorted(set(1 + (i * (L - 2)) // max(1, n - 1) for i in range(n)))
    return {
        "architectures": ["DSparkMiniMaxDraftModel"],
        "model_type": "dspark_minimax_m3",
        "num_hidden_layers": args.layers,
        "hidden_size": target_c["hidden"],
        "num_attention_heads": target_c["heads"],
        "num_key_value_heads": target_c["kv_heads"],
        "head_dim": target_c["head_dim"],
        "vocab_size": target_c["vocab"],
        "dense_intermediate_size": args.ffn,
        "dspark_ffn_hidden_size": args.ffn,
        "dspark_use_dense_ffn": True,
        "moe_layer_freq": [0] * args.layers,
        "hidden_act": "swigluoai",
        "swiglu_alpha": target_c["alpha"],
        "swiglu_limit": target_c["limit"],
        "layer_types": ["sliding_attention"] * args.layers,
        "sliding_window": args.window,
        "sparse_attention_config": None,
        "dspark_block_size": 7,
        "dspark_noise_token_id": target_c["vocab"] - 6,
        "dspark_target_layer_ids": ids,
        "dspark_markov_rank": args.markov_rank,
        "dspark_markov_head_type": "vanilla",
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "dspark_hybrid_context_fusion": False,
        "use_gemma_norm": True,
        "rms_norm_eps": target_c["eps"],
        "rope_theta": target_c["rope_theta"],
        "rotary_dim": target_c["rotary_dim"],
        "dspark_target_hidden_convention": convention,
        "torch_dtype": "bfloat16",
    }


# ------------------------------------------------------------------------------------------------
# A released draft folder, and the parity cases of the C++ test
# ------------------------------------------------------------------------------------------------
def load_draft(draft_dir):
    """(DSparkDraft in float32 with the folder's bf16 values, its config.json dict)."""
    with open(os.path.join(draft_dir, "config.json")) as f:
        dcfg = json.load(f)
    draft = DSparkDraft(dcfg, len(dcfg["dspark_target_layer_ids"]))
    sd = {k[len(PREFIX):] if k.startswith(PREFIX) else k: v
          for k, v in read_safetensors(os.path.join(draft_dir, "model.safetensors")).items()}
    missing, unexpected = draft.load_state_dict(sd, strict=False)
    missing = [k for k in missing if k != "inv_freq"]
    if missing or unexpected:
        raise RuntimeError("draft load: missing %s unexpected %s" % (missing, unexpected))
    return draft.eval(), dcfg


@torch.no_grad()
def parity_cases(target, draft, dcfg, convention, cases):
    """What tests/model/dspark_parity_test.cpp compares m3serve's draft with, computed on the CPU in
    float32 (both models must be there): per case (name, context ids, anchor id) the greedy block
    and, per slot, the corrected and base logits at the top 8 ids plus 0, the anchor, the noise
    token and the last id."""
    embed, lm_head = target.model.embed_tokens.weight, target.lm_head.weight
    V = dcfg["vocab_size"]
    out = []
    for name, ctx, anchor in cases:
        outs, normed = target_run(target, torch.tensor([ctx]))
        feats = features(outs, normed, dcfg["dspark_target_layer_ids"], convention)[0]
        toks, corr, base = draft.propose(feats, embed, lm_head, anchor, 0.0)
        slots = []
        for k in range(len(toks)):
            top = torch.topk(corr[k], 8)
            fixed = [0, anchor, dcfg["dspark_noise_token_id"], V - 1]
            sel = sorted(set([int(i) for i in top.indices] + fixed))
            srt = torch.sort(corr[k], descending=True).values
            slots.append({"token": toks[k], "margin": float(srt[0] - srt[1]), "ids": sel,
                          "logits": [float(corr[k, i]) for i in sel],
                          "base_logits": [float(base[k, i]) for i in sel]})
        out.append({"name": name, "context_tokens": ctx, "anchor": anchor, "slots": slots})
    return out
