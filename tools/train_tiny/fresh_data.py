#!/usr/bin/env python3
"""Fresh training data for the vision-and-tools round (train.py --vision): every batch is new.

Data workers (forked processes; pure Python, numpy and the tokenizer, never torch) draw
conversations from the mix below, render them through chat_template.jinja, tokenize them
(context / trained segments, as train.py does), pack them into length-bucketed padded batches of
about --batch-tokens tokens and put them, with the encoded layouts of their images, into one queue
per worker. The training process takes the queues in turn (so the batch sequence is deterministic
for a seed), copies a batch to the device and renders its images there (fresh_vision.render with
torch.randint noise): nothing is repeated, no image ever comes from a seed.

The mix (per conversation): fresh image questions (fresh_vision.py) SHARE_IMAGE, fresh tool
schemas (fresh_tools.py; about 40% of them natural_tools.py's everyday tools) SHARE_GTOOL, the
rest corpus.training_sample (arithmetic, the six fixed tools with made-up values, chit-chat),
which already draws every sample anew.

  python3 fresh_data.py --check            asserts that nothing generated is held out (evaluation
                                           image layouts and pixels, phrasings, tool names,
                                           parameter sets, held-out words, the domains of
                                           eval_tools_natural.jsonl), that the renderer
                                           reproduces shapes.pixels and that the scene statistics
                                           match shapes.py's; exits non-zero on any failure
  python3 fresh_data.py --bench            conversations and batches per second of one worker
  python3 fresh_data.py --train-cpu        a few training steps of the fast model and the vision
                                           tower on fresh batches (CPU, float32; no transformers)
"""

import argparse
import collections
import json
import os
import queue
import random
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bpe_lite  # noqa: E402
import corpus  # noqa: E402
import fresh_tools  # noqa: E402
import fresh_vision  # noqa: E402
import multimodal_corpus  # noqa: E402
import natural_tools  # noqa: E402
import shapes  # noqa: E402

SHARE_IMAGE, SHARE_GTOOL = 0.30, 0.22
BLOCK = 32
Z_MAX = 5.0  # --check: largest |z| of a fresh-vs-shapes.py statistic


def mix_sample(rng, share_image=SHARE_IMAGE, share_gtool=SHARE_GTOOL):
    r = rng.random()
    if r < share_image:
        return fresh_vision.sample(rng, corpus)
    if r < share_image + share_gtool:
        return fresh_tools.sample(rng)
    return corpus.training_sample(rng)


def render(sample):
    text = corpus.render(sample)
    if sample.get("layouts"):
        text = multimodal_corpus.expand_image_tokens(text)
    return text, corpus.trainable_spans(text)


def encode(tok, text, spans):
    """(ids, labels): the conversation tokenized as context / trained segments (the segment
    borders sit at special tokens, so this equals encoding the whole text)."""
    segs, flags, pos = [], [], 0
    for a, b in spans:
        if a > pos:
            segs.append(text[pos:a])
            flags.append(0)
        segs.append(text[a:b])
        flags.append(1)
        pos = b
    if pos < len(text):
        segs.append(text[pos:])
        flags.append(0)
    ids, lab = [], []
    for e, f in zip(tok.encode_batch(segs, add_special_tokens=False), flags):
        ids.extend(e.ids)
        lab.extend([f] * len(e.ids))
    return ids, lab


def build_batch(np, items, eos):
    """items: [(ids, labels, layouts, task)] -> the arrays train.py's loop takes."""
    L = -(-max(len(it[0]) for it in items) // BLOCK) * BLOCK
    x = np.full((len(items), L), eos, dtype=np.int32)
    y = np.full((len(items), L), -100, dtype=np.int32)
    for r, (ids, lab, _, _) in enumerate(items):
        n = len(ids)
        x[r, :n] = ids
        tgt = np.array(ids[1:] + [eos], dtype=np.int32)
        msk = np.array(lab[1:] + [0], dtype=bool)
        y[r, :n] = np.where(msk, tgt, -100)
    flat = np.flatnonzero(y.reshape(-1) != -100).astype(np.int64)
    lays = [l for it in items for l in it[2]]
    return {"x": x, "y": y, "flat_idx": flat, "y_sel": y.reshape(-1)[flat].astype(np.int64),
            "layouts": np.array(lays, dtype=np.int16).reshape(-1, fresh_vision.MAX_OBJECTS, 6),
            "tasks": dict(collections.Counter(it[3] for it in items)),
            "tokens": int(sum(len(it[0]) for it in items)), "trained": int(flat.size)}


def batches(cfg, wid, tok=None):
    """Endless batches of worker `wid`. cfg: tokenizer (JSON text or path), seed, batch_tokens,
    max_len, eos, image_id, shares, pool_batches."""
    import numpy as np

    tok = tok or bpe_lite.load(cfg["tokenizer"])
    rng = random.Random("fresh:%d:%d" % (cfg["seed"], wid))
    budget, max_len = cfg["batch_tokens"], cfg["max_len"]
    per_image = multimodal_corpus.TOKENS_PER_IMAGE
    carry = []
    while True:
        pool = carry
        total = sum(-(-len(p[0]) // BLOCK) * BLOCK for p in pool)
        while total < cfg.get("pool_batches", 16) * budget:
            s = mix_sample(rng, *cfg.get("shares", (SHARE_IMAGE, SHARE_GTOOL)))
            text, spans = render(s)
            ids, lab = encode(tok, text, spans)
            if len(ids) > max_len or not any(lab):
                continue
            lays = s.get("layouts") or []
            if ids.count(cfg["image_id"]) != per_image * len(lays):
                raise RuntimeError("image tokens do not match the images: %d for %d images" % (
                    ids.count(cfg["image_id"]), len(lays)))
            pool.append((ids, lab, lays, s["task"]))
            total += -(-len(ids) // BLOCK) * BLOCK
        pool.sort(key=lambda p: len(p[0]))
        out, cur = [], []
        for p in pool:
            L = -(-len(p[0]) // BLOCK) * BLOCK
            if cur and L * (len(cur) + 1) > budget:
                out.append(cur)
                cur = []
            cur.append(p)
        carry = cur  # the longest, unfinished batch starts the next pool
        rng.shuffle(out)
        for b in out:
            yield build_batch(np, b, cfg["eos"])


def _worker(wid, cfg, q):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        for b in batches(cfg, wid):
            q.put(b)
    except Exception:  # noqa: BLE001
        q.put({"error": "worker %d: %s" % (wid, traceback.format_exc())})


class Stream:
    """Fresh batches from forked data workers, in a fixed worker order; next() returns
    (x, y, n_targets, flat_idx, y_sel, images or None, their layouts or None) on the device, as
    train.py's loop uses (the layouts feed vision_model.PerceptionProbe)."""

    def __init__(self, torch, cfg, workers, device, log=print, queue_depth=4):
        import multiprocessing as mp

        self.torch, self.cfg, self.device, self.log = torch, cfg, device, log
        ctx = mp.get_context("fork")
        self.queues = [ctx.Queue(maxsize=queue_depth) for _ in range(workers)]
        self.procs = [ctx.Process(target=_worker, args=(i, cfg, q), daemon=True) for i, q in enumerate(self.queues)]
        for p in self.procs:
            p.start()
        self.alive = list(range(workers))
        self.ready = queue.Queue(maxsize=3)
        self.error = None
        self.stopping = False
        self.wait_s = 0.0
        self.stats = collections.Counter()
        self.tasks = collections.Counter()
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(1_000_003 * (cfg["seed"] + 1))
        self.t0 = time.time()
        self.thread = threading.Thread(target=self._feed, daemon=True)
        self.thread.start()

    def _get(self, k):
        """The next batch of worker k, or None when it died."""
        while not self.stopping:
            try:
                b = self.queues[k].get(timeout=1.0)
            except queue.Empty:
                if not self.procs[k].is_alive():
                    self.log("WARNING: data worker %d exited (code %s)" % (k, self.procs[k].exitcode))
                    return None
                continue
            if "error" in b:
                self.log("WARNING: data worker failed: %s" % b["error"])
                return None
            return b
        return None

    def _feed(self):
        torch = self.torch
        pin = self.device != "cpu" and torch.cuda.is_available()
        if pin:  # this thread's CUDA context (as torch's DataLoader pin-memory thread does)
            torch.cuda.set_device(torch.device(self.device).index or 0)
        i = 0
        try:
            while not self.stopping:
                if not self.alive:
                    raise RuntimeError("every data worker has stopped")
                k = self.alive[i % len(self.alive)]
                b = self._get(k)
                if b is None:
                    if not self.stopping:
                        self.alive.remove(k)
                    continue
                i += 1
                t = {n: torch.from_numpy(b[n]) for n in ("x", "y", "flat_idx", "y_sel", "layouts")}
                if pin:
                    t = {n: v.pin_memory() if v.numel() else v for n, v in t.items()}
                t.update(tasks=b["tasks"], tokens=b["tokens"], trained=b["trained"])
                while not self.stopping:
                    try:
                        self.ready.put(t, timeout=1.0)
                        break
                    except queue.Full:
                        continue
        except Exception as e:  # noqa: BLE001
            self.error = e
            self.ready.put(None)

    def next(self):
        torch = self.torch
        t0 = time.time()
        b = self.ready.get()
        self.wait_s += time.time() - t0
        if b is None:
            raise RuntimeError("fresh data stream failed: %r" % self.error)
        dev = self.device
        x = b["x"].to(dev, non_blocking=True).long()
        y = b["y"].to(dev, non_blocking=True).long()
        fi = b["flat_idx"].to(dev, non_blocking=True)
        ys = b["y_sel"].to(dev, non_blocking=True)
        imgs = lays = None
        if b["layouts"].shape[0]:
            lays = b["layouts"].to(dev, non_blocking=True)
            imgs = fresh_vision.render_fresh(torch, lays, self.gen)
        self.stats["batches"] += 1
        self.stats["tokens"] += b["tokens"]
        self.stats["trained"] += b["trained"]
        self.stats["images"] += int(b["layouts"].shape[0])
        self.tasks.update(b["tasks"])
        return x, y, int(b["trained"]), fi, ys, imgs, lays

    def summary(self):
        el = max(1e-9, time.time() - self.t0)
        return {"batches": self.stats["batches"], "images": self.stats["images"],
                "tokens": self.stats["tokens"], "trained_tokens": self.stats["trained"],
                "trained_frac": round(self.stats["trained"] / max(1, self.stats["tokens"]), 4),
                "wait_s": round(self.wait_s, 2), "workers_alive": len(self.alive), "workers": len(self.procs),
                "tasks": dict(self.tasks), "elapsed_s": round(el, 1)}

    def close(self):
        self.stopping = True
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(timeout=5)
        for q in self.queues:
            q.cancel_join_thread()


# ------------------------------------------------------------------------------------------------
# --check: nothing generated is held out; the renderer and the scene statistics are shapes.py's.
# ------------------------------------------------------------------------------------------------
def check(n_samples=20000, n_images=2000, n_extra=200, regen_eval=True, pieces_from=None, log=print):
    """Raises AssertionError listing the violations; returns a dict of what was measured.
    regen_eval: also regenerate the held-out sets from their generators and compare them with the
    committed files (with corpus.COPY_PIECES emptied meanwhile, as when the files were written)."""
    import torch

    out = {}
    failures = []

    def expect(ok, what):
        if not ok:
            failures.append(what)
            log("CHECK FAILED: " + what)

    # 1. Evaluation files: unchanged generators, and the evaluation images are shapes.pixels(seed).
    ev_vision = multimodal_corpus.read_jsonl(multimodal_corpus.EVAL_VISION_PATH)
    ev_tools = multimodal_corpus.read_jsonl(multimodal_corpus.EVAL_TOOLS_PATH)
    if regen_eval:
        import gen_tools

        saved = list(corpus.COPY_PIECES)
        corpus.COPY_PIECES[:] = []
        try:
            expect(json.loads(json.dumps(gen_tools.eval_set())) == ev_tools,
                   "eval_tools_heldout.jsonl differs from gen_tools.eval_set()")
            regen = json.loads(json.dumps(multimodal_corpus.vision_eval_set()))
        finally:
            corpus.COPY_PIECES[:] = saved
        same = len(regen) == len(ev_vision) and all(
            a["messages"][:-1] == b["messages"][:-1] and a["messages"][-1]["content"][1:] == b["messages"][-1]["content"][1:]
            and a["expect"] == b["expect"] and a["kwargs"] == b["kwargs"] for a, b in zip(regen, ev_vision))
        expect(same, "eval_vision.jsonl's conversations differ from multimodal_corpus.vision_eval_set()")
        out["eval_files"] = "regenerated and equal"
    eval_px = {}
    for i, it in enumerate(ev_vision):
        seed = int(it["id"].split("-")[1])
        expect(seed == i and seed in fresh_vision.EVAL_SEEDS, "eval image %s is not seed %d" % (it["id"], i))
        url = it["messages"][-1]["content"][0]["image_url"]["url"]
        px = shapes.pixels(seed)
        eval_px[seed] = px
        if url != shapes.data_url(seed):  # another zlib may compress differently: compare pixels
            try:
                import base64
                import io

                from PIL import Image

                im = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")
                expect(im.tobytes() == px, "eval image %d is not shapes.pixels(%d)" % (seed, seed))
            except ImportError:
                expect(False, "eval image %d: data URL differs and PIL is missing" % seed)
    out["eval_images"] = len(eval_px)

    # 2. The vectorised renderer reproduces shapes.pixels given the seed's noise.
    lay = torch.tensor([fresh_vision.encode_layout(shapes.layout(s)) for s in fresh_vision.EVAL_SEEDS])
    bases, cells = zip(*[shapes.noise_params(s) for s in fresh_vision.EVAL_SEEDS])
    g = shapes.SIZE // shapes.NOISE_CELL
    cells_t = torch.tensor([list(c) for c in cells], dtype=torch.int64).view(-1, g, g) % shapes.NOISE_LEVELS
    img = fresh_vision.render(torch, lay, torch.tensor(bases), cells_t)
    exact = sum(bytes(img[i].contiguous().view(-1).tolist()) == eval_px[s] for i, s in enumerate(fresh_vision.EVAL_SEEDS))
    expect(exact == len(fresh_vision.EVAL_SEEDS), "renderer reproduces %d/%d evaluation images" % (
        exact, len(fresh_vision.EVAL_SEEDS)))
    extra = list(range(shapes.TRAIN_SEED_BASE, shapes.TRAIN_SEED_BASE + n_extra))
    lay2 = torch.tensor([fresh_vision.encode_layout(shapes.layout(s)) for s in extra]).view(-1, fresh_vision.MAX_OBJECTS, 6)
    exact2 = 0
    if extra:
        b2, c2 = zip(*[shapes.noise_params(s) for s in extra])
        img2 = fresh_vision.render(torch, lay2, torch.tensor(b2),
                                   torch.tensor([list(c) for c in c2]).view(-1, g, g) % shapes.NOISE_LEVELS)
        exact2 = sum(bytes(img2[i].contiguous().view(-1).tolist()) == shapes.pixels(s) for i, s in enumerate(extra))
    expect(exact2 == len(extra), "renderer reproduces %d/%d training-seed images" % (exact2, len(extra)))
    out["renderer_exact"] = "%d/%d eval + %d/%d other seeds" % (exact, len(fresh_vision.EVAL_SEEDS), exact2, len(extra))

    # 3. Scene statistics: fresh scenes vs shapes.py's, each statistic a two-sample test of the
    #    means (|z| <= Z_MAX; the samples are independent, so a real difference of rules shows up
    #    as a large z while sampling noise stays within a few units).
    def zcmp(name, a, b):
        a = torch.as_tensor(a).reshape(-1).double()
        b = torch.as_tensor(b).reshape(-1).double()
        ma, mb = a.mean().item(), b.mean().item()
        se = (a.var().item() / a.numel() + b.var().item() / b.numel()) ** 0.5
        z = 0.0 if se == 0 else (ma - mb) / se
        expect(abs(z) <= Z_MAX and (se > 0 or ma == mb), "%s: fresh %.4f vs shapes.py %.4f (z %.1f)" % (name, ma, mb, z))
        return [round(ma, 4), round(mb, 4), round(z, 2)]

    rng = random.Random("check-layouts")
    fresh = [fresh_vision.fresh_layout(rng) for _ in range(n_images * 5)]
    ref = [shapes.layout(s) for s in range(shapes.TRAIN_SEED_BASE, shapes.TRAIN_SEED_BASE + n_images * 5)]

    def per_sample(lays):
        objs = [o for l in lays for o in l]
        half = shapes.SIZE // 2
        st = {"objects per image": [len(l) for l in lays], "radius": [o[5] for o in objs],
              "cx within the quadrant": [o[3] % half for o in objs], "cy within the quadrant": [o[4] % half for o in objs]}
        for k in range(1, 5):
            st["images with %d objects" % k] = [len(l) == k for l in lays]
        for c in shapes.COLOURS:
            st["colour " + c] = [o[1] == c for o in objs]
        for k in shapes.SHAPES:
            st["shape " + k] = [o[2] == k for o in objs]
        for q in shapes.QUADRANTS:
            st["quadrant " + q] = [o[0] == q for o in objs]
        return st

    sf, sr = per_sample(fresh), per_sample(ref)
    out["layout_stats_fresh_shapes_z"] = {k: zcmp("layout: " + k, sf[k], sr[k]) for k in sr}
    gen = torch.Generator()
    gen.manual_seed(5)
    base_t, cells_f = fresh_vision.random_noise(torch, n_images, gen, "cpu")
    ref_seeds = range(shapes.TRAIN_SEED_BASE, shapes.TRAIN_SEED_BASE + n_images)
    ref_b, ref_c = zip(*[shapes.noise_params(s) for s in ref_seeds])
    ref_cells = torch.tensor([list(c) for c in ref_c], dtype=torch.int64) % shapes.NOISE_LEVELS
    noise = {"background base grey": zcmp("noise base", base_t, list(ref_b)),
             "background cell value": zcmp("noise cell", cells_f, ref_cells),
             "background cell value squared": zcmp("noise cell^2", cells_f ** 2, ref_cells ** 2)}
    expect((int(base_t.min()), int(base_t.max())) == shapes.NOISE_BASE, "noise base range")
    expect((int(cells_f.min()), int(cells_f.max())) == (0, shapes.NOISE_LEVELS - 1), "noise cell range")
    # whole images: per-image pixel mean and std, fresh vs shapes.pixels
    fl = torch.tensor([fresh_vision.encode_layout(l) for l in fresh[:n_images]])
    fimg = fresh_vision.render(torch, fl, base_t, cells_f).double().view(n_images, -1)
    n_ref = min(300, n_images)
    rimg = torch.tensor([list(shapes.pixels(s)) for s in ref_seeds[:n_ref]], dtype=torch.float64)
    noise["image pixel mean"] = zcmp("pixel mean per image", fimg.mean(1), rimg.mean(1))
    noise["image pixel std"] = zcmp("pixel std per image", fimg.std(1), rimg.std(1))
    out["noise_stats_fresh_shapes_z"] = noise
    # no fresh image equals an evaluation image; no evaluation layout is drawn
    ev_bytes = set(eval_px.values())
    fresh_bytes = [bytes(fimg[i].to(torch.uint8).view(-1).tolist()) for i in range(min(500, n_images))]
    expect(not (set(fresh_bytes) & ev_bytes), "a fresh image equals an evaluation image")
    ev_l = fresh_vision.eval_layouts()
    expect(not any(tuple(l) in ev_l for l in fresh), "a fresh layout equals an evaluation layout")

    # 4. Samples of the whole mix, as the workers draw them (with the tokenizer's letter pieces).
    if pieces_from and not corpus.COPY_PIECES:
        ptok = bpe_lite.load(pieces_from)
        corpus.set_copy_pieces([ptok.decode([i]).strip() for i in range(ptok.get_vocab_size())])
    out["copy_pieces"] = len(corpus.COPY_PIECES)
    held_phr = {k: shapes.PHRASINGS[k][1] for k in shapes.KINDS}
    for k in shapes.KINDS:
        for p in fresh_vision.TRAIN_PHRASINGS[k]:
            expect(not fresh_vision.too_close(p, held_phr[k]), "training phrasing %r is held out" % p)
    counts, names, sigs = collections.Counter(), set(), set()
    rng = random.Random("check-mix")
    for i in range(n_samples):
        s = mix_sample(rng)
        counts[s["task"]] += 1
        if s["task"] == "vision":
            objs = s["objs"]
            expect(tuple(objs) not in ev_l, "sample %d: evaluation layout" % i)
            q = s["expect"]["question"]
            qn = fresh_vision.normalise(q)
            for h in held_phr[s["expect"]["kind"]]:
                for _, c, k, _, _, _ in objs:
                    hn = fresh_vision.normalise(h.format(colour=c, shape=k))
                    if fresh_vision.word_edits(qn, hn) < fresh_vision.MIN_EDIT_WORDS:
                        expect(False, "sample %d: question %r is a held-out phrasing %r" % (i, q, h))
            parts = [p for m in s["messages"] if isinstance(m["content"], list) for p in m["content"]
                     if p.get("type") in ("image", "image_url")]
            expect(len(parts) == 1 and parts[0] == {"type": "image"}, "sample %d: image part %r" % (i, parts))
        if s.get("natural"):
            counts["natural " + s["task"]] += 1
            v = natural_tools.sample_problems(s)
            expect(not v, "sample %d (natural %s): %s" % (i, s["task"], v))
        v = fresh_tools.sample_problems(s)
        expect(not v, "sample %d (%s): %s" % (i, s["task"], v))
        for t, _ in s.get("schemas") or []:
            names.add(t["function"]["name"])
            sigs.add(fresh_tools.signature(t))
        if len(failures) > 20:
            break
    out["mix_counts"] = dict(counts)

    # 5. Everyday tools (natural_tools.py): n_samples // 2 of each kind, drawn alone, through
    #    sample_problems (held-out schemas and evaluation domains, calls that match the request).
    try:
        out["natural_tools"] = natural_tools.check(max(1, n_samples // 2), log=log)
    except AssertionError as e:
        expect(False, str(e))
    out["distinct_generated_tool_names"] = len(names)
    out["distinct_generated_signatures"] = len(sigs)
    out["eval_tool_names_held_out"] = len(fresh_tools.EVAL_NAMES)
    out["eval_signatures_held_out"] = len(fresh_tools.EVAL_SIGNATURES)
    out["train_phrasings"] = {k: len(v) for k, v in fresh_vision.TRAIN_PHRASINGS.items()}
    out["failures"] = failures
    if failures:
        raise AssertionError("%d check failures, first: %s" % (len(failures), failures[0]))
    return out


# ------------------------------------------------------------------------------------------------
# --train-cpu: a few steps of fresh-data training without transformers (checks the whole path).
# ------------------------------------------------------------------------------------------------
def load_fast(torch, model_dir):
    import fast_model
    import vision_model

    _, tc, fc, ckpt = fast_model.load_model_dir(model_dir)
    fast = fast_model.FastM3(fc)
    fast.load_state_dict(fast_model.state_from_checkpoint(ckpt, tc))
    vis = vision_model.VisionTower(vision_model.VISION_CONFIG, tc["hidden_size"], tc["hidden_size"])
    n_vis = vis.load_checkpoint_tensors(ckpt)
    return fast, vis, n_vis


def task_losses(torch, F, fast, vis, batch, image_id, tasks_of_rows):
    """Mean loss per task over a fixed batch (no gradient)."""
    x, y, _, _, _, imgs = batch
    with torch.no_grad():
        logits = fast.forward(x, img=None if imgs is None else (image_id, vis(imgs), None)).float()
        tok = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100,
                              reduction="none").view(y.shape)
    res = collections.defaultdict(lambda: [0.0, 0])
    for r, t in enumerate(tasks_of_rows):
        m = y[r] != -100
        res[t][0] += tok[r][m].sum().item()
        res[t][1] += int(m.sum().item())
        res["all"][0] += tok[r][m].sum().item()
        res["all"][1] += int(m.sum().item())
    return {k: round(v[0] / max(1, v[1]), 4) for k, v in sorted(res.items())}


def train_cpu(a):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    torch.set_num_threads(max(1, a.threads))
    tok_path = os.path.join(a.init_from, "tokenizer.json")
    with open(tok_path, encoding="utf-8") as f:
        tok_json = f.read()
    tok = bpe_lite.load(tok_json)
    corpus.set_copy_pieces([tok.decode([i]).strip() for i in range(tok.get_vocab_size())])
    eos, image_id = tok.token_to_id("[e~["), tok.token_to_id("]<]image[>[")
    cfg = {"tokenizer": tok_json, "seed": a.seed, "batch_tokens": a.batch_tokens, "max_len": 1024, "eos": eos,
           "image_id": image_id, "shares": (a.share_image, a.share_gtool), "pool_batches": 16}
    fast, vis, n_vis = load_fast(torch, a.init_from)
    print("model from %s (vision tensors loaded: %d); tokenizer %s" % (a.init_from, n_vis, type(tok).__name__))
    fast.vision = vis
    # a fixed probe batch from another seed (with the tasks of its rows), to see the loss fall
    probe_items, rng = [], random.Random("probe")
    import numpy as np

    while len(probe_items) < a.probe:
        s = mix_sample(rng, a.share_image, a.share_gtool)
        text, spans = render(s)
        ids, lab = encode(tok, text, spans)
        if len(ids) <= 1024 and any(lab):
            probe_items.append((ids, lab, s.get("layouts") or [], s["task"]))
    pb = build_batch(np, probe_items, eos)
    g = torch.Generator()
    g.manual_seed(99)
    probe_lays = torch.from_numpy(pb["layouts"]) if len(pb["layouts"]) else None
    probe = (torch.from_numpy(pb["x"]).long(), torch.from_numpy(pb["y"]).long(), pb["trained"], None, None,
             None if probe_lays is None else fresh_vision.render_fresh(torch, probe_lays, g))
    tasks = [it[3] for it in probe_items]
    fast.eval()
    before = task_losses(torch, F, fast, vis, probe, image_id, tasks)
    print("probe batch (%d conversations, %d trained tokens) loss before: %s" % (len(tasks), pb["trained"], before))
    decay, no_decay, vis_p = [], [], []
    for n, p in fast.named_parameters():
        if ".indexer." in n:
            continue
        if n.startswith("vision."):
            vis_p.append(p)
        elif p.dim() >= 2 and "embed" not in n:
            decay.append(p)
        else:
            no_decay.append(p)
    perceive = None
    if a.perception_weight > 0:
        import vision_model

        perceive = vision_model.PerceptionProbe(vis.patch_merge_mlp.linear_2.out_features, len(shapes.SHAPES),
                                                len(shapes.COLOURS), shapes.SIZE)
        vis_p += list(perceive.parameters())
        if probe_lays is not None:
            with torch.no_grad():
                perceive.loss(vis(probe[5]), probe_lays)
            print("perception probe before (untrained head): kind %.3f colour %.3f per quadrant" % tuple(
                v.item() for v in perceive.last_accuracy))
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0},
                             {"params": vis_p, "weight_decay": 0.0, "lr_scale": a.vision_lr_scale}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    stream = Stream(torch, cfg, a.workers, "cpu")
    fast.train()
    t0 = time.time()
    losses = []
    try:
        for step in range(a.steps):
            x, y, n_t, fi, ys, imgs, lays = stream.next()
            for grp in opt.param_groups:
                grp["lr"] = a.lr * min(1.0, (step + 1) / a.warmup) * grp.get("lr_scale", 1.0)
            emb = None if imgs is None else vis(imgs)
            loss = fast.loss(x, y, fi, ys, img=None if emb is None else (image_id, emb, None))
            aux = ""
            if perceive is not None and emb is not None:
                p_loss = perceive.loss(emb, lays)
                loss = loss + a.perception_weight * p_loss
                aux = "  perception %.3f (kind %.2f colour %.2f)" % (
                    p_loss.item(), *(v.item() for v in perceive.last_accuracy))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(fast.parameters(), 1.0)
            opt.step()
            with torch.no_grad():
                for m in fast.moe_blocks():
                    if m.last_counts is not None:
                        m.gate.e_score_correction_bias.add_(1e-3 * torch.sign(m.last_counts.mean() - m.last_counts))
            lv = loss.item()
            if lv != lv or lv in (float("inf"), float("-inf")):
                raise SystemExit("loss is %r at step %d" % (lv, step + 1))
            losses.append(lv)
            print("step %3d loss %.4f gnorm %.2f  batch %dx%d, %d images, %d trained tokens  %.2f s/step  data wait %.1f s%s"
                  % (step + 1, lv, gn.item(), x.shape[0], x.shape[1], 0 if imgs is None else imgs.shape[0], n_t,
                     (time.time() - t0) / (step + 1), stream.wait_s, aux), flush=True)
    finally:
        summ = stream.summary()
        stream.close()
    el = time.time() - t0
    fast.eval()
    after = task_losses(torch, F, fast, vis, probe, image_id, tasks)
    print("probe batch loss after %d steps: %s" % (a.steps, after))
    print("training: %d steps in %.1f s (%.3f steps/s on %d CPU threads); stream %s" % (
        a.steps, el, a.steps / el, torch.get_num_threads(), json.dumps(summ)))
    k = max(1, len(losses) // 3)
    print("mean loss first %d steps %.4f, last %d steps %.4f" % (k, sum(losses[:k]) / k, k, sum(losses[-k:]) / k))
    # The training loss on the fresh batches must fall (the perception head starts untrained, so it
    # does from any checkpoint); the probe batch's loss falls only from a model that has not learnt
    # these tasks yet (the shipped one has: a few CPU steps at this lr may nudge it up).
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    ok = all(v == v for v in after.values()) and last < first
    print("RESULT: %s (fresh-batch loss %.4f -> %.4f; probe loss %.4f -> %.4f)" % (
        "loss finite and falling" if ok else "FAILED", first, last, before["all"], after["all"]))
    return 0 if ok else 1


def bench(a):
    tok_path = os.path.join(a.init_from, "tokenizer.json")
    with open(tok_path, encoding="utf-8") as f:
        tok_json = f.read()
    tok = bpe_lite.load(tok_json)
    corpus.set_copy_pieces([tok.decode([i]).strip() for i in range(tok.get_vocab_size())])
    cfg = {"tokenizer": tok_json, "seed": 0, "batch_tokens": a.batch_tokens, "max_len": 1024,
           "eos": tok.token_to_id("[e~["), "image_id": tok.token_to_id("]<]image[>["),
           "shares": (a.share_image, a.share_gtool), "pool_batches": 16}
    rng = random.Random(1)
    t = {"generate": 0.0, "render": 0.0, "tokenize": 0.0}
    n, ntok = 400, 0
    for _ in range(n):
        t0 = time.time()
        s = mix_sample(rng, a.share_image, a.share_gtool)
        t1 = time.time()
        text, spans = render(s)
        t2 = time.time()
        ids, _ = encode(tok, text, spans)
        t3 = time.time()
        t["generate"] += t1 - t0
        t["render"] += t2 - t1
        t["tokenize"] += t3 - t2
        ntok += len(ids)
    per = {k: round(1000 * v / n, 3) for k, v in t.items()}
    print("per conversation (ms, %s): %s; %.0f tokens per conversation" % (type(tok).__name__, per, ntok / n))
    t0 = time.time()
    it = batches(cfg, 0, tok)
    nb, toks, tasks = 0, 0, collections.Counter()
    while time.time() - t0 < a.seconds:
        b = next(it)
        nb += 1
        toks += b["x"].size
        tasks.update(b["tasks"])
    el = time.time() - t0
    print("one worker: %d batches of ~%d tokens in %.1f s = %.2f batches/s, %.0f padded tokens/s; tasks %s" % (
        nb, a.batch_tokens, el, nb / el, toks / el, dict(tasks)))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--train-cpu", action="store_true")
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--init-from", default=os.path.join(HERE, "..", "..", "models", "m3-tiny"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--vision-lr-scale", type=float, default=3.0)
    ap.add_argument("--perception-weight", type=float, default=0.5,
                    help="weight of vision_model.PerceptionProbe's loss (0: none)")
    ap.add_argument("--share-image", type=float, default=SHARE_IMAGE)
    ap.add_argument("--share-gtool", type=float, default=SHARE_GTOOL)
    ap.add_argument("--probe", type=int, default=24)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.check:
        t0 = time.time()
        res = check(a.samples, a.images, regen_eval=True, pieces_from=os.path.join(a.init_from, "tokenizer.json"))
        print(json.dumps(res, indent=1))
        print("fresh_data --check: OK (%.1f s)" % (time.time() - t0))
    elif a.bench:
        bench(a)
    elif a.train_cpu:
        sys.exit(train_cpu(a))
    else:
        ap.print_help()
