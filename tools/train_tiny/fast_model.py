"""Fast pure-PyTorch MiniMax-M3 text model for training m3-tiny (same maths as the transformers
reference classes in the exact-dense regime; parameter names equal the reference's state-dict names).

Why: the reference classes run eager attention, a per-expert Python loop and the O(T^2) indexer in
every layer; training here uses SDPA (flash kernels), all 8 small experts densely in one batched
matmul (combined with the sparse top-k weights) and skips the indexer, which gets no gradient
anyway. Exact as long as every training sequence is <= sparse_topk_blocks * sparse_block_size
tokens (then the sparse attention selects every causal block and equals dense causal attention).
train.py checks logits against the reference model before training and after copying back.
"""

import json
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


class GemmaRMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * (1 + w), in fp32, cast back to the input dtype."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight.float())
        return y.to(x.dtype)


def swiglu_oai(g, u, alpha, limit):
    g = g.clamp(max=limit)
    u = u.clamp(-limit, limit)
    return g * torch.sigmoid(alpha * g) * (u + 1.0)


class Indexer(nn.Module):
    """Weights only (kept at their random init, as in the reference training): not run here."""

    def __init__(self, hidden, n_heads, dim):
        super().__init__()
        self.q_proj = nn.Linear(hidden, n_heads * dim, bias=False)
        self.k_proj = nn.Linear(hidden, dim, bias=False)
        self.q_norm = GemmaRMSNorm(dim)
        self.k_norm = GemmaRMSNorm(dim)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.nh, self.nk, self.hd, self.rot = c["heads"], c["kv_heads"], c["head_dim"], c["rotary_dim"]
        H = c["hidden"]
        self.q_proj = nn.Linear(H, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(H, self.nk * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nk * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
        self.q_norm = GemmaRMSNorm(self.hd, c["eps"])
        self.k_norm = GemmaRMSNorm(self.hd, c["eps"])
        self.indexer = Indexer(H, c["index_heads"], c["index_dim"])

    def rope(self, x, cos, sin):
        # NeoX half-split rotation on the first rot dims; the rest pass through. cos/sin fp32 [L, rot/2].
        r, h = self.rot, self.rot // 2
        xf = x[..., :r].float()
        x1, x2 = xf[..., :h], xf[..., h:]
        o1 = x1 * cos - x2 * sin
        o2 = x2 * cos + x1 * sin
        return torch.cat([o1.to(x.dtype), o2.to(x.dtype), x[..., r:]], dim=-1)

    def forward(self, h, cos, sin):
        B, L, _ = h.shape
        q = self.q_norm(self.q_proj(h).view(B, L, self.nh, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(h).view(B, L, self.nk, self.hd)).transpose(1, 2)
        v = self.v_proj(h).view(B, L, self.nk, self.hd).transpose(1, 2)
        q = self.rope(q, cos, sin)
        k = self.rope(k, cos, sin)
        rep = self.nh // self.nk
        k = k.repeat_interleave(rep, dim=1)  # query head n uses KV head n // rep (HF repeat_kv)
        v = v.repeat_interleave(rep, dim=1)
        if q.dtype != v.dtype:  # norms return the projection dtype; keep one dtype for SDPA
            q, k = q.to(v.dtype), k.to(v.dtype)
        if HAS_SDPA:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0 (local smoke tests only)
            a = (q.float() @ k.float().transpose(-1, -2)) / self.hd ** 0.5
            a = a + torch.full((L, L), float("-inf"), device=h.device).triu(1)
            o = (a.softmax(-1) @ v.float()).to(v.dtype)
        return self.o_proj(o.transpose(1, 2).reshape(B, L, self.nh * self.hd))


class DenseMLP(nn.Module):
    def __init__(self, hidden, inter, alpha, limit):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=False)  # [gate ; up]
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.inter, self.alpha, self.limit = inter, alpha, limit

    def forward(self, x):
        gu = self.gate_up_proj(x)
        return self.down_proj(swiglu_oai(gu[..., :self.inter], gu[..., self.inter:], self.alpha, self.limit))


class Router(nn.Module):
    def __init__(self, hidden, n_experts):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_experts, hidden))
        self.register_buffer("e_score_correction_bias", torch.zeros(n_experts))


class Experts(nn.Module):
    def __init__(self, n, hidden, inter):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.zeros(n, 2 * inter, hidden))
        self.down_proj = nn.Parameter(torch.zeros(n, hidden, inter))


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, E, I = c["hidden"], c["experts"], c["expert_inter"]
        self.gate = Router(H, E)
        self.experts = Experts(E, H, I)
        self.shared_experts = DenseMLP(H, c["shared_inter"], c["alpha"], c["limit"])
        self.E, self.I, self.k, self.scale = E, I, c["topk_experts"], c["routed_scale"]
        self.alpha, self.limit = c["alpha"], c["limit"]
        self.last_counts = None
        self.grouped = False  # set by train.py after checking torch._grouped_mm against the dense path

    def forward(self, h):
        B, L, H = h.shape
        x = h.reshape(-1, H)
        dev_type = "cuda" if x.is_cuda else "cpu"
        with torch.autocast(device_type=dev_type, enabled=False):  # fp32 router, as in the reference
            s = torch.sigmoid(F.linear(x.float(), self.gate.weight.float()))
            _, idx = torch.topk(s + self.gate.e_score_correction_bias.float(), self.k, dim=-1)
            tw = s.gather(1, idx)
            tw = tw / tw.sum(-1, keepdim=True) * self.scale
            wdense = torch.zeros_like(s).scatter(1, idx, tw)  # [N, E], zeros for unselected experts
        counts = torch.zeros(self.E, device=x.device).scatter_add_(
            0, idx.reshape(-1), torch.ones(idx.numel(), device=x.device))
        if torch.is_grad_enabled():
            self.last_counts = counts
        shared = self.shared_experts(x)
        dt = shared.dtype  # bf16 under autocast, else the weights' dtype: run the experts the same way
        xe, gu_w, dn_w = x.to(dt), self.experts.gate_up_proj.to(dt), self.experts.down_proj.to(dt)
        if self.grouped and dt == torch.bfloat16:
            routed = self._grouped_experts(xe, idx, tw, counts.long(), gu_w, dn_w)
            return (routed + shared.to(routed.dtype)).view(B, L, H)
        gu = torch.matmul(xe.unsqueeze(0), gu_w.transpose(1, 2))  # [E, N, 2I], all experts densely
        a = swiglu_oai(gu[..., :self.I], gu[..., self.I:], self.alpha, self.limit)
        out = torch.matmul(a, dn_w.transpose(1, 2))  # [E, N, H]
        routed = torch.einsum("ne,enh->nh", wdense.to(out.dtype), out)  # zero weight off the top-k
        return (routed + shared.to(routed.dtype)).view(B, L, H)

    ALIGN = 16  # rows per expert group are padded to this (the grouped GEMM's backward needs it)

    def _grouped_experts(self, xe, idx, tw, counts, gu_w, dn_w):
        """Only the top-k experts per token, with torch._grouped_mm (Hopper), no host sync: the
        (token, expert) pairs are sorted by expert into a buffer whose groups start at multiples
        of ALIGN; padding rows are zero and give zero output and zero gradient."""
        N, H = xe.shape
        k, E, A = idx.shape[1], self.E, self.ALIGN
        flat_e = idx.reshape(-1)
        order = torch.argsort(flat_e, stable=True)
        sorted_e = flat_e.index_select(0, order)
        padded = (counts + A - 1) // A * A
        pend = torch.cumsum(padded, 0)
        cstart = torch.cumsum(counts, 0) - counts
        dest = (pend - padded).index_select(0, sorted_e) + (
            torch.arange(N * k, device=xe.device) - cstart.index_select(0, sorted_e))
        R = N * k + E * A  # static bound on the padded rows; the last group takes the remainder
        offs = torch.cat([pend[:-1], pend.new_full((1,), R)]).to(torch.int32)
        tok = order // k
        xs = xe.new_zeros(R, H).index_copy(0, dest, xe.index_select(0, tok))
        gu = torch._grouped_mm(xs, gu_w.transpose(1, 2), offs=offs)  # [R, 2I]
        a = swiglu_oai(gu[:, :self.I], gu[:, self.I:], self.alpha, self.limit)
        out = torch._grouped_mm(a, dn_w.transpose(1, 2), offs=offs)  # [R, H]
        w = tw.reshape(-1).index_select(0, order).to(out.dtype)
        contrib = out.index_select(0, dest) * w[:, None]
        return out.new_zeros(N, H).index_add(0, tok, contrib)


class Layer(nn.Module):
    def __init__(self, c, moe):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MoE(c) if moe else DenseMLP(c["hidden"], c["dense_inter"], c["alpha"], c["limit"])
        self.input_layernorm = GemmaRMSNorm(c["hidden"], c["eps"])
        self.post_attention_layernorm = GemmaRMSNorm(c["hidden"], c["eps"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class TextModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab"], c["hidden"])
        self.layers = nn.ModuleList([Layer(c, f == 1) for f in c["moe_layer_freq"]])
        self.norm = GemmaRMSNorm(c["hidden"], c["eps"])


class FastM3(nn.Module):
    """c: dict with vocab hidden heads kv_heads head_dim rotary_dim rope_theta eps index_heads index_dim
    experts topk_experts expert_inter shared_inter dense_inter alpha limit routed_scale moe_layer_freq."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = TextModel(c)
        self.lm_head = nn.Linear(c["hidden"], c["vocab"], bias=False)
        r = c["rotary_dim"]
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, r, 2, dtype=torch.float32) / r))
        self.register_buffer("inv_freq", inv, persistent=False)

    def moe_blocks(self):
        return [l.mlp for l in self.model.layers if isinstance(l.mlp, MoE)]

    def hidden(self, x, img=None):
        """img: (image token id, embeddings [n, hidden], ids whose image tokens take them or None
        for x): the vision tower's outputs replace those positions' embeddings, in order."""
        L = x.shape[1]
        pos = torch.arange(L, device=x.device, dtype=torch.float32)
        ang = pos[:, None] * self.inv_freq.float()[None, :]
        cos, sin = ang.cos(), ang.sin()
        h = self.model.embed_tokens(x)
        if img is not None:
            where = (x if img[2] is None else img[2]) == img[0]
            h = h.masked_scatter(where.unsqueeze(-1), img[1].to(h.dtype))
        for layer in self.model.layers:
            h = layer(h, cos, sin)
        return self.model.norm(h)

    def forward(self, x, img=None):
        return self.lm_head(self.hidden(x, img))

    def loss(self, x, y, flat_idx=None, y_sel=None, img=None):
        """Cross entropy over the positions with a target (y != -100) only: the LM head runs on those.
        flat_idx / y_sel (precomputed per cached batch) avoid a host sync for the boolean mask."""
        h = self.hidden(x, img)
        if flat_idx is None:
            flat_idx = (y.reshape(-1) != -100).nonzero().squeeze(1)
            y_sel = y.reshape(-1)[flat_idx]
        logits = self.lm_head(h.reshape(-1, h.shape[-1]).index_select(0, flat_idx))
        return F.cross_entropy(logits.float(), y_sel)


def key_map(hf_state_keys, fast_state_keys):
    """{hf_key: fast_key} for every fast key; the routing bias may sit on the router or on the MoE block."""
    hf = set(hf_state_keys)
    out = {}
    for k in fast_state_keys:
        if k in hf:
            out[k] = k
        elif k.endswith("mlp.gate.e_score_correction_bias") and k.replace("mlp.gate.", "mlp.") in hf:
            out[k.replace("mlp.gate.", "mlp.")] = k
        else:
            raise KeyError("no reference tensor for %s" % k)
    return out


def read_safetensors(path):
    """{name: float32 tensor} of a safetensors file, read without the safetensors package."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    dt = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16}
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        t = torch.frombuffer(bytearray(data[a:b]), dtype=dt[v["dtype"]]) if b > a else torch.zeros(0)
        out[k] = t.reshape(v["shape"]).float()
    return out


def state_from_checkpoint(ckpt, tc):
    """Checkpoint tensors (train.py original_tensors' names) -> this model's state dict (the
    reference's names, routing bias on the router); tc: config.json's text_config."""
    sd = {"model.embed_tokens.weight": ckpt["language_model.model.embed_tokens.weight"],
          "model.norm.weight": ckpt["language_model.model.norm.weight"],
          "lm_head.weight": ckpt["language_model.lm_head.weight"]}
    for i, moe in enumerate(tc["moe_layer_freq"]):
        o, h = "language_model.model.layers.%d." % i, "model.layers.%d." % i
        for nm in ("input_layernorm", "post_attention_layernorm"):
            sd[h + nm + ".weight"] = ckpt[o + nm + ".weight"]
        for nm in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
            sd[h + "self_attn.%s.weight" % nm] = ckpt[o + "self_attn.%s.weight" % nm]
        for nm in ("q_proj", "k_proj", "q_norm", "k_norm"):
            sd[h + "self_attn.indexer.%s.weight" % nm] = ckpt[o + "self_attn.index_%s.weight" % nm]
        if not moe:
            sd[h + "mlp.gate_up_proj.weight"] = torch.cat([ckpt[o + "mlp.gate_proj.weight"], ckpt[o + "mlp.up_proj.weight"]])
            sd[h + "mlp.down_proj.weight"] = ckpt[o + "mlp.down_proj.weight"]
            continue
        m = o + "block_sparse_moe."
        sd[h + "mlp.gate.weight"] = ckpt[m + "gate.weight"]
        sd[h + "mlp.gate.e_score_correction_bias"] = ckpt[m + "e_score_correction_bias"]
        E = tc["num_local_experts"]
        sd[h + "mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([ckpt[m + "experts.%d.w1.weight" % e], ckpt[m + "experts.%d.w3.weight" % e]]) for e in range(E)])
        sd[h + "mlp.experts.down_proj"] = torch.stack([ckpt[m + "experts.%d.w2.weight" % e] for e in range(E)])
        sd[h + "mlp.shared_experts.gate_up_proj.weight"] = torch.cat(
            [ckpt[m + "shared_experts.gate_proj.weight"], ckpt[m + "shared_experts.up_proj.weight"]])
        sd[h + "mlp.shared_experts.down_proj.weight"] = ckpt[m + "shared_experts.down_proj.weight"]
    return sd


def load_model_dir(model_dir):
    """A saved m3-tiny folder -> (config.json as a dict, its text_config, the FastM3 config, every
    tensor of its safetensors files)."""
    import json
    import os

    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    tc = cfg["text_config"]
    ckpt = {}
    for fn in sorted(os.listdir(model_dir)):
        if fn.endswith(".safetensors"):
            ckpt.update(read_safetensors(os.path.join(model_dir, fn)))
    fc = {"vocab": tc["vocab_size"], "hidden": tc["hidden_size"], "heads": tc["num_attention_heads"],
          "kv_heads": tc["num_key_value_heads"], "head_dim": tc["head_dim"], "rotary_dim": tc["rotary_dim"],
          "rope_theta": tc["rope_theta"], "eps": tc["rms_norm_eps"],
          "index_heads": tc["sparse_attention_config"]["sparse_num_index_heads"],
          "index_dim": tc["sparse_attention_config"]["sparse_index_dim"], "experts": tc["num_local_experts"],
          "topk_experts": tc["num_experts_per_tok"], "expert_inter": tc["intermediate_size"],
          "shared_inter": tc["shared_intermediate_size"], "dense_inter": tc["dense_intermediate_size"],
          "alpha": tc["swiglu_alpha"], "limit": tc["swiglu_limit"], "routed_scale": tc["routed_scaling_factor"],
          "moe_layer_freq": tc["moe_layer_freq"]}
    return cfg, tc, fc, ckpt
