#!/usr/bin/env python3
"""Train the DSpark speculative draft of models/m3-tiny (docs/dspark.md, tools/train_tiny/README.md).

Runs on the GPU machine (torch, tokenizers, safetensors, jinja2):
  1. the frozen target (fast_model.FastM3, float32, the checkpoint's bf16 values) and a fresh corpus
     from corpus.py, tokenized with the target's tokenizer (assistant turns are the loss mask);
  2. for each capture convention (layer_output, final_norm_last; or the one --convention names):
     block-diffusion training of the draft (dspark_model.py, the C++ forward mirrored) on target
     features computed on the fly: random anchors per sequence, slot k predicts token a+k+1,
     Markov teacher forcing, loss 0.1 CE + 0.9 L1(P_draft, P_target) + 1.0 confidence BCE, slot
     weights exp(-k/4);
  3. mean accepted length (tokens committed per verify step: accepted drafts + 1, at most 8) by
     speculative decoding against the target on held-out prompts in float32 with the exported
     (bf16-rounded) weights: greedy at temperature 0, and token-wise rejection sampling at
     temperature 0.7 (accept d while u * q(d) < p(d), else a token from norm(max(p - q, 0));
     lossless);
  4. the better convention is written to <target>/dspark/ (config.json + model.safetensors, bf16)
     with a parity fixture for the C++ test (tests/fixtures/m3_tiny/dspark_parity.json), computed
     on the CPU in float32, and a report JSON.
--smoke runs the whole pipeline with tiny sizes in well under 30 s (CPU is fine).
"""

import argparse
import json
import math
import os
import random
import sys
import time
import traceback

T0 = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

ap = argparse.ArgumentParser()
ap.add_argument("--target-dir", default="models/m3-tiny")
ap.add_argument("--out-dir", default="", help="where dspark/ goes (default <target-dir>/dspark)")
ap.add_argument("--fixture", default="tests/fixtures/m3_tiny/dspark_parity.json")
ap.add_argument("--report", default="tools/train_tiny/dspark_last_run.json")
ap.add_argument("--train-seconds", type=float, default=240.0, help="total, split over the conventions")
ap.add_argument("--convention", default="both", choices=["both", "layer_output", "final_norm_last"])
ap.add_argument("--n-train", type=int, default=30000)
ap.add_argument("--n-eval", type=int, default=48, help="held-out prompts for the acceptance measurement")
ap.add_argument("--eval-new", type=int, default=96, help="tokens generated per held-out prompt")
ap.add_argument("--max-len", type=int, default=1024)
ap.add_argument("--batch", type=int, default=32, help="sequences per step")
ap.add_argument("--anchors", type=int, default=64, help="blocks per sequence")
ap.add_argument("--layers", type=int, default=2)
ap.add_argument("--ffn", type=int, default=1024)
ap.add_argument("--window", type=int, default=512)
ap.add_argument("--markov-rank", type=int, default=64)
ap.add_argument("--lr", type=float, default=1e-3)
ap.add_argument("--seed", type=int, default=4242)
ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
ap.add_argument("--smoke", action="store_true", help="tiny sizes, whole pipeline, < 30 s")
args = ap.parse_args()
if args.smoke:
    args.train_seconds = min(args.train_seconds, 6.0)
    args.n_train, args.n_eval, args.eval_new, args.batch, args.anchors = 200, 3, 16, 4, 8
    args.max_len = 700
    args.workers = 1
OUT_DIR = args.out_dir or os.path.join(args.target_dir, "dspark")
REPORT = {"args": vars(args), "warnings": [], "conventions": {}}


def log(*a):
    print("[%7.1fs]" % (time.time() - T0), *a, flush=True)


def save_report():
    REPORT["elapsed_s"] = round(time.time() - T0, 1)
    os.makedirs(os.path.dirname(args.report) or ".", exist_ok=True)
    with open(args.report, "w") as f:
        json.dump(REPORT, f, indent=1)


try:
    import torch
    import torch.nn.functional as F
    from tokenizers import Tokenizer

    import corpus
    import dspark_model as dm
except Exception:  # noqa: BLE001
    traceback.print_exc()
    raise SystemExit("train_dspark: missing dependency (torch, tokenizers, safetensors, jinja2)")

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# The target in true float32 (no TF32): its features should be what m3serve's float32 path computes.
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(args.seed)
random.seed(args.seed)


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------
def _render(sample):
    t = corpus.render(sample)
    return t, corpus.trainable_spans(t)


def encode_conversations(tok, samples):
    """ids and per-token trained flags (1 inside the trained assistant turns), as train.py does."""
    if args.workers > 1:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(args.workers) as pool:
            rendered = pool.map(_render, samples, chunksize=200)
    else:
        rendered = [_render(s) for s in samples]
    seg, owner = [], []
    for i, (t, sp) in enumerate(rendered):
        pos = 0
        for a, b in sp:
            if a > pos:
                seg.append(t[pos:a]); owner.append((i, 0))
            seg.append(t[a:b]); owner.append((i, 1))
            pos = b
        if pos < len(t):
            seg.append(t[pos:]); owner.append((i, 0))
    enc = tok.encode_batch(seg, add_special_tokens=False)
    ids = [[] for _ in rendered]
    lab = [[] for _ in rendered]
    for e, (i, tr) in zip(enc, owner):
        ids[i].extend(e.ids)
        lab[i].extend([tr] * len(e.ids))
    keep = [i for i in range(len(ids)) if 8 < len(ids[i]) <= args.max_len and sum(lab[i]) > 0]
    return [ids[i] for i in keep], [lab[i] for i in keep]


def make_batches(ids):
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    batches = [order[i:i + args.batch] for i in range(0, len(order), args.batch)]
    return [b for b in batches if len(b) == args.batch or len(batches) == 1]


def batch_tensors(idx, ids, lab, eos):
    L = max(len(ids[i]) for i in idx)
    x = torch.full((len(idx), L), eos, dtype=torch.long)
    m = torch.zeros((len(idx), L), dtype=torch.bool)
    for r, i in enumerate(idx):
        x[r, :len(ids[i])] = torch.tensor(ids[i])
        m[r, :len(ids[i])] = torch.tensor(lab[i]).bool()
    return x, m


def pick_anchors(m, A, gen):
    """Anchors a with m[a + 1] (the first predicted token is trained), A per row, sorted; rows with
    fewer get repeats marked not kept."""
    N, L = m.shape
    valid = torch.zeros_like(m)
    valid[:, :-1] = m[:, 1:]
    score = torch.rand((N, L), generator=gen) + valid.float() * 2.0
    top = torch.topk(score, min(A, L), dim=1)
    keep = top.values >= 2.0
    a = top.indices
    a, o = torch.sort(a, dim=1)
    keep = keep.gather(1, o)
    return a, keep


# ------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------
def train_one(convention, seconds, target, tc, batches, ids, lab, dcfg):
    draft = dm.DSparkDraft(dcfg, len(dcfg["dspark_target_layer_ids"])).to(DEV)
    embed = target.model.embed_tokens.weight
    lm_head = target.lm_head.weight
    B = dcfg["dspark_block_size"]
    wk = torch.exp(-torch.arange(B, dtype=torch.float32, device=DEV) / 4.0)
    opt = torch.optim.AdamW(draft.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed + (0 if convention == "layer_output" else 1))
    hist = []
    t_start = time.time()
    step = 0
    perm = []
    warm = 20
    est_steps = None
    while True:
        el = time.time() - t_start
        if el >= seconds:
            break
        if not perm:
            perm = list(range(len(batches)))
            random.Random(args.seed + step).shuffle(perm)
        x, m = batch_tensors(batches[perm.pop()], ids, lab, tc["eos"])
        a, keep = pick_anchors(m, args.anchors, gen)
        x, m, a, keep = x.to(DEV), m.to(DEV), a.to(DEV), keep.to(DEV)
        N, L = x.shape
        with torch.no_grad():
            outs, normed = dm.target_run(target, x)
            feats = dm.features(outs, normed, dcfg["dspark_target_layer_ids"], convention)
        slot = torch.arange(B, device=DEV)
        tpos = a[:, :, None] + slot  # [N, A, B]: slot k sits at a+k and predicts a+k+1
        inb = tpos + 1 < L
        tp = tpos.clamp(max=L - 1)
        lp = (tpos + 1).clamp(max=L - 1)
        sup = inb & m.gather(1, lp.view(N, -1)).view_as(tpos)
        sup = (torch.cumprod(sup.int(), dim=2) > 0) & keep[:, :, None]
        labels = x.gather(1, lp.view(N, -1)).view_as(tpos)
        prev = x.gather(1, tp.view(N, -1)).view_as(tpos)  # teacher forcing: x_{a+k}
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=DEV == "cuda"):
            y = draft.block_hidden(feats, embed, x.gather(1, a), a)  # [N, A, B, H]
        sel = sup.view(-1).nonzero().squeeze(1)
        if sel.numel() == 0:
            continue
        yk = y.reshape(-1, y.shape[-1]).index_select(0, sel).float()
        pk = prev.reshape(-1).index_select(0, sel)
        lk = labels.reshape(-1).index_select(0, sel)
        w = wk.expand(N, a.shape[1], B).reshape(-1).index_select(0, sel)
        with torch.no_grad():
            rows_t = (torch.arange(N, device=DEV)[:, None, None] * L + tp).reshape(-1).index_select(0, sel)
            ht = normed.reshape(N * L, -1).index_select(0, rows_t)  # target row a+k predicts a+k+1
            pt = torch.softmax(ht @ lm_head.t(), -1)
        w1 = draft.markov_head.markov_w1(pk)
        logits = yk @ lm_head.t() + draft.markov_head.markov_w2(w1)
        logp = torch.log_softmax(logits, -1)
        ce = -logp.gather(1, lk[:, None])[:, 0]
        l1 = (logp.exp() - pt).abs().sum(-1)
        cstar = (1.0 - 0.5 * l1.detach()).clamp(0, 1)
        conf = draft.confidence_head.proj(torch.cat([yk, w1], -1))[:, 0]
        bce = F.binary_cross_entropy_with_logits(conf, cstar, reduction="none")
        ws = w.sum()
        loss = (0.1 * (w * ce).sum() + 0.9 * (w * l1).sum() + (w * bce).sum()) / ws
        if step == 50:
            est_steps = int(50 * seconds / max(1e-3, time.time() - t_start))
        total = est_steps or max(1000, warm * 25)
        frac = min(1.0, step / total)
        lr = args.lr * min(1.0, (step + 1) / max(warm, 0.04 * total)) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or args.smoke:
            with torch.no_grad():
                accept_t1 = float(1.0 - 0.5 * l1.detach().mean())  # mean of 1 - TV over slots
                top1 = float((logits.argmax(-1) == lk).float().mean())
            rec = {"step": step, "t": round(time.time() - t_start, 1), "loss": round(float(loss), 4),
                   "ce": round(float((w * ce).sum() / ws), 4), "l1": round(float((w * l1).sum() / ws), 4),
                   "bce": round(float((w * bce).sum() / ws), 4), "top1": round(top1, 4),
                   "accept_T1": round(accept_t1, 4), "lr": round(lr, 6), "slots": int(sel.numel())}
            hist.append(rec)
            log(convention, rec)
        step += 1
    REPORT["conventions"].setdefault(convention, {})["train"] = {
        "steps": step, "seconds": round(time.time() - t_start, 1), "history": hist}
    return draft


def bf16_round_(draft):
    """The exported weights are bf16; evaluate and write fixtures with exactly those values."""
    with torch.no_grad():
        for p in draft.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return draft


# ------------------------------------------------------------------------------------------------
# Acceptance: speculative decoding against the target (float32), the m3serve round
# ------------------------------------------------------------------------------------------------
@torch.no_grad()
def spec_decode(target, tc, draft, dcfg, convention, prompt, max_new, temperature, gen):
    """Returns the accepted lengths of every verify step. Context [0, p) + anchor at p; one target
    pass over [0..p] + drafts gives the verify rows and the next context's features."""
    embed, lm_head = target.model.embed_tokens.weight, target.lm_head.weight
    ids = dcfg["dspark_target_layer_ids"]
    B = dcfg["dspark_block_size"]
    x = torch.tensor([prompt], device=DEV)
    outs, normed = dm.target_run(target, x)
    feats = dm.features(outs, normed, ids, convention)[0]
    last = normed[0, -1] @ lm_head.t()

    def pick(row):
        if temperature <= 0:
            return int(torch.argmax(row))
        return int(torch.multinomial(torch.softmax(row.double() / temperature, -1), 1, generator=gen))

    seq = list(prompt) + [pick(last)]
    lens = []
    generated = 1
    while generated < max_new and seq[-1] != tc["eos"] and len(seq) + B + 1 < tc["max_sparse_len"]:
        p = len(seq) - 1
        toks, q_logits, _ = draft.propose(feats[:p], embed, lm_head, seq[-1], temperature, gen)
        xv = torch.tensor([seq + toks], device=DEV)
        outs, normed = dm.target_run(target, xv)
        rows = normed[0, p:p + B + 1] @ lm_head.t()  # rows 0..B verify d_0..d_{B-1}, then the bonus
        tau = 0
        if temperature <= 0:
            while tau < B and toks[tau] == int(torch.argmax(rows[tau])):
                tau += 1
            y = int(torch.argmax(rows[tau]))
        else:
            y = None
            while tau < B:
                pd = torch.softmax(rows[tau].double() / temperature, -1)
                qd = torch.softmax(q_logits[tau].double() / temperature, -1)
                d = toks[tau]
                u = float(torch.rand((), generator=gen, dtype=torch.float64, device=DEV))
                if u * float(qd[d]) < float(pd[d]):
                    tau += 1
                    continue
                res = (pd - qd).clamp(min=0)
                res = res / res.sum() if float(res.sum()) > 0 else pd
                y = int(torch.multinomial(res, 1, generator=gen))
                break
            if y is None:
                y = pick(rows[B])
        acc = toks[:tau] + [y]
        # stop at EOS inside the accepted run, as the engine does
        if tc["eos"] in acc:
            acc = acc[:acc.index(tc["eos"]) + 1]
        lens.append(len(acc))
        seq = seq + acc
        generated += len(acc)
        feats = dm.features(outs, normed, ids, convention)[0]  # rows < p + tau + 1 are committed
    return lens


def measure(target, tc, draft, dcfg, convention, prompts):
    res = {}
    for temp in (0.0, 0.7):
        gen = torch.Generator(device=DEV).manual_seed(args.seed + 7)
        all_lens, by_task = [], {}
        t0 = time.time()
        for task, pr in prompts:
            lens = spec_decode(target, tc, draft, dcfg, convention, pr, args.eval_new, temp, gen)
            all_lens += lens
            by_task.setdefault(task, []).extend(lens)
        mean = sum(all_lens) / max(1, len(all_lens))
        hist = [sum(1 for v in all_lens if v == i) for i in range(1, dcfg["dspark_block_size"] + 2)]
        res["T%.1f" % temp] = {"mean_accept_length": round(mean, 4), "verify_steps": len(all_lens),
                               "histogram_1_to_8": hist, "seconds": round(time.time() - t0, 1),
                               "by_task": {k: round(sum(v) / max(1, len(v)), 3) for k, v in by_task.items()}}
        log(convention, "T=%.1f mean accepted length %.3f over %d verify steps" % (temp, mean, len(all_lens)))
    return res


# ------------------------------------------------------------------------------------------------
# Export and parity fixture
# ------------------------------------------------------------------------------------------------
def export(draft, dcfg, out_dir):
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    sd = {dm.PREFIX + k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in draft.state_dict().items()}
    save_file(sd, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(dcfg, f, indent=2)
    size = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
    log("wrote %s (%d tensors, %.2f MB)" % (out_dir, len(sd), size / 1e6))
    return size


def parity_fixture(target, draft, dcfg, convention, cases, path):
    """On the CPU in float32 (no TF32): dspark_model.parity_cases written for the C++ test."""
    out = {"draft_dir": "models/m3-tiny/dspark", "convention": convention,
           "note": "computed by tools/train_tiny/train_dspark.py in PyTorch float32 on the CPU",
           "cases": dm.parity_cases(target.to("cpu"), draft.to("cpu"), dcfg, convention, cases)}
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f)
    log("wrote %s (%d cases, %d bytes)" % (path, len(cases), os.path.getsize(path)))
    target.to(DEV)
    draft.to(DEV)


def main():
    tok = Tokenizer.from_file(os.path.join(args.target_dir, "tokenizer.json"))
    # The corpus first: its worker processes fork before CUDA is initialised.
    t = time.time()
    samples = corpus.training_corpus(args.n_train, args.seed)
    ids, lab = encode_conversations(tok, samples)
    log("device", DEV, torch.cuda.get_device_name(0) if DEV == "cuda" else "")
    target, tc = dm.load_target(args.target_dir)
    target = target.to(DEV)
    noise = tc["vocab"] - 6
    if float(target.model.embed_tokens.weight[noise].abs().max()) == 0.0:
        REPORT["warnings"].append("the target's embedding row of the noise token is all zeros")
    batches = make_batches(ids)
    log("corpus: %d conversations kept, %d batches, mean length %.0f (%.1fs)" % (
        len(ids), len(batches), sum(map(len, ids)) / max(1, len(ids)), time.time() - t))
    # Held-out prompts: the eval set's generation prompts (the target continues them).
    items = corpus.eval_set()
    rng = random.Random(args.seed)
    rng.shuffle(items)
    prompts = []
    for s in items:
        pr = tok.encode(corpus.render(s, add_generation_prompt=True), add_special_tokens=False).ids
        if len(pr) + args.eval_new + 16 < tc["max_sparse_len"]:
            prompts.append((s["task"], pr))
        if len(prompts) >= args.n_eval:
            break
    REPORT["eval_prompts"] = {"n": len(prompts), "tasks": sorted(set(t for t, _ in prompts))}
    convs = ["layer_output", "final_norm_last"] if args.convention == "both" else [args.convention]
    per = args.train_seconds / len(convs)
    best = None
    for conv in convs:
        dcfg = dm.draft_config(tc, args, conv)
        draft = train_one(conv, per, target, tc, batches, ids, lab, dcfg)
        draft = bf16_round_(draft.float()).eval()
        acc = measure(target, tc, draft, dcfg, conv, prompts)
        REPORT["conventions"][conv]["acceptance"] = acc
        save_report()
        score = acc["T0.0"]["mean_accept_length"] + acc["T0.7"]["mean_accept_length"]
        if best is None or score > best[0]:
            best = (score, conv, draft, dcfg)
    _, conv, draft, dcfg = best
    REPORT["chosen_convention"] = conv
    log("chosen convention:", conv)
    size = export(draft, dcfg, OUT_DIR)
    REPORT["draft_bytes"] = size
    # Fixture cases: a short prompt, a mid one, and the longest under the sparse limit (> window).
    by_len = sorted(prompts, key=lambda tp: len(tp[1]))
    picks = [by_len[0], by_len[len(by_len) // 2], by_len[-1]]
    long_ids = max(ids, key=len)
    cases = [("%s_%d" % (t, len(p)), p[:-1], p[-1]) for t, p in picks]
    if len(long_ids) > args.window + 8:
        cases.append(("conversation_%d" % len(long_ids), long_ids[:-1], long_ids[-1]))
    parity_fixture(target, draft, dcfg, conv, cases, args.fixture)
    REPORT["fixture"] = args.fixture
    save_report()
    a = REPORT["conventions"]
    log("SUMMARY " + json.dumps({c: {k: v["mean_accept_length"] for k, v in a[c]["acceptance"].items()} for c in a}) +
        " chosen %s, draft %.2f MB, %.0fs" % (conv, size / 1e6, time.time() - T0))


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        REPORT["error"] = traceback.format_exc()
        save_report()
        sys.exit(1)
