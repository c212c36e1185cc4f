#!/usr/bin/env python3
"""Train m3-tiny, the small MiniMax-M3-architecture model bundled with m3serve, in one run.

Runs on the GPU machine (torch, transformers with minimax_m3_vl, tokenizers, safetensors):
  1. synthetic corpus through chat_template.jinja (corpus.py),
  2. byte-level BPE tokenizer with MiniMax-M3's special tokens as single tokens,
  3. MiniMax-M3 text model from the transformers reference classes (sparse attention in every
     layer, dense first layer, MoE with a shared expert), trained for a wall-clock budget,
  4. checkpoint in the real layout: legacy config.json, original tensor names, bf16 weights with
     fp32 router, tokenizer files, chat template, generation config,
  5. reload through the transformers VL class and compare logits,
  6. held-out evaluation (greedy, fp32, checkpoint-exact weights),
  7. golden greedy outputs (transformers generate, CPU, fp32) for the C++ engine's tests.

Everything is logged; every step that can fail on an unexpected transformers version is guarded and
reported. See tools/train_tiny/README.md.
"""

import argparse
import json
import math
import os
import random
import re
import sys
import time
import traceback

T0 = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import corpus  # noqa: E402
import multimodal_corpus  # noqa: E402

REPORT = {"warnings": [], "steps": {}}


def log(*a):
    print("[%7.1fs]" % (time.time() - T0), *a, flush=True)


def warn(msg):
    REPORT["warnings"].append(msg)
    log("WARNING:", msg)


def step_done(name, **info):
    REPORT["steps"][name] = dict(info, t=round(time.time() - T0, 1))


# ------------------------------------------------------------------------------------------------
# Arguments
# ------------------------------------------------------------------------------------------------
ap = argparse.ArgumentParser()
ap.add_argument("--out-model", default="models/m3-tiny")
ap.add_argument("--out-fixtures", default="tests/fixtures/m3_tiny")
ap.add_argument("--report", default="tools/train_tiny/last_run.json")
ap.add_argument("--train-seconds", type=float, default=270.0)
ap.add_argument("--n-train", type=int, default=60000)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--init-from", default="", help="continue from this m3-tiny folder (its tokenizer and weights)")
ap.add_argument("--max-len", type=int, default=1024)
ap.add_argument("--batch-tokens", type=int, default=131072)
ap.add_argument("--lr", type=float, default=1.5e-3)
ap.add_argument("--warmup", type=int, default=100)
ap.add_argument("--balance-rate", type=float, default=1e-3, help="e_score_correction_bias nudge per step")
ap.add_argument("--bpe-size", type=int, default=4032, help="BPE vocab before the 64 special slots")
ap.add_argument("--eval-seconds", type=float, default=60.0)
ap.add_argument("--eval-batch", type=int, default=100)
ap.add_argument("--round-eval-seconds", type=float, default=240.0,
                help="time limit of the held-out tool-schema evaluation of the --vision round (all 240 items)")
ap.add_argument("--eval-limit", type=int, default=0, help="only the first N items of each task (0: all)")
ap.add_argument("--eval-max-new", type=int, default=0, help="override the new-token limits (0: 220 / 160)")
ap.add_argument("--golden-new-tokens", type=int, default=64)
ap.add_argument("--golden-limit", type=int, default=0, help="only the first N golden cases (0: all)")
ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
ap.add_argument("--vision-lr-scale", type=float, default=3.0, help="the vision tower's lr / the text model's")
ap.add_argument("--perception-weight", type=float, default=0.5,
                help="fresh data: weight of the per-quadrant read-out loss on the tower's outputs "
                     "(vision_model.PerceptionProbe; 0: none)")
ap.add_argument("--vision", action="store_true",
                help="the vision-and-tools round: image questions and generated tools join the corpus "
                     "(multimodal_corpus.py), a vision tower trains with the text model (vision_model.py)")
ap.add_argument("--no-fresh", dest="fresh", action="store_false",
                help="--vision: train on the fixed corpus of --n-train conversations (multimodal_corpus.py) "
                     "instead of fresh batches drawn by data workers at every step (fresh_data.py)")
ap.add_argument("--data-workers", type=int, default=max(1, min(8, (os.cpu_count() or 2) - 2)),
                help="fresh-data worker processes")
ap.add_argument("--static-n", type=int, default=20000,
                help="with fresh data: conversations of the fixed corpus (tokenizer, checks, fallback)")
ap.add_argument("--share-image", type=float, default=None, help="fresh data: share of image questions")
ap.add_argument("--share-gtool", type=float, default=None, help="fresh data: share of generated tool schemas")
ap.add_argument("--gtool-kinds", default="",
                help="fresh data: weights of the generated tools' kinds, e.g. made_up=7.5,natural=4 "
                     "(the others keep fresh_tools.KIND_WEIGHTS)")
args = ap.parse_args()
args.fresh = args.fresh and args.vision
if not args.fresh:
    for flag, value in (("--gtool-kinds", args.gtool_kinds), ("--share-image", args.share_image),
                        ("--share-gtool", args.share_gtool)):
        if value not in (None, ""):
            sys.exit("%s applies to the fresh data of --vision rounds (without --no-fresh)" % flag)
try:
    import fresh_tools  # noqa: E402

    GTOOL_KINDS = fresh_tools.kind_weights(args.gtool_kinds)
except ValueError as e:
    sys.exit("--gtool-kinds: %s" % e)

# Model shape. Weights in bf16 stay ~30 MB; sequences up to 1024 tokens (= 32 blocks of 32, the
# top-k) are exact dense attention, so a random (untrained, non-differentiable) indexer is harmless.
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 256, 6, 8, 2, 32
EXPERTS, TOPK_EXPERTS, EXPERT_INTER, SHARED_INTER, DENSE_INTER = 8, 2, 320, 256, 1024
BLOCK, TOPK_BLOCKS, INDEX_HEADS, INDEX_DIM = 32, 32, 2, 32
# rope_theta 1e4 (the real model uses 5e6 for 1M tokens): with 16 rotary dims and sequences under
# 1K tokens, 5e6 leaves only two pairs that turn noticeably, too little position signal for the
# copy heads that tool arguments need.
ROPE_THETA, ROTARY_DIM = 10000.0, HEAD_DIM // 2
MAX_POS = 4096

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import transformers  # noqa: E402
import tokenizers  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, Regex, AddedToken  # noqa: E402
import safetensors  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

log("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__,
    "tokenizers", tokenizers.__version__, "safetensors", getattr(safetensors, "__version__", "?"))
DEV = "cuda" if torch.cuda.is_available() else "cpu"
if DEV == "cuda":
    log("gpu", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0))
else:
    warn("no CUDA device: running on CPU (only useful for a smoke test)")
torch.manual_seed(args.seed)
random.seed(args.seed)
for d in (args.out_model, args.out_fixtures, os.path.dirname(args.report) or "."):
    os.makedirs(d, exist_ok=True)


def save_report():
    REPORT["elapsed_s"] = round(time.time() - T0, 1)
    with open(args.report, "w") as f:
        json.dump(REPORT, f, indent=1, ensure_ascii=False)


# ------------------------------------------------------------------------------------------------
# 1. Corpus
# ------------------------------------------------------------------------------------------------
def _render_one(sample):
    text = corpus.render(sample)
    if sample.get("images"):
        text = multimodal_corpus.expand_image_tokens(text)
    return text, corpus.trainable_spans(text)


if args.init_from:  # the tokenizer is known before the corpus: made-up values use its pieces
    _vocab_tok = Tokenizer.from_file(os.path.join(args.init_from, "tokenizer.json"))
    corpus.set_copy_pieces([_vocab_tok.decode([i]).strip() for i in range(_vocab_tok.get_vocab_size())])
    log("copy pieces from the tokenizer: %d" % len(corpus.COPY_PIECES))
N_STATIC = min(args.n_train, args.static_n) if args.fresh else args.n_train
if N_STATIC < args.n_train:
    log("fresh data: the fixed corpus has %d conversations (tokenizer, checks, fallback); training draws new "
        "batches at every step" % N_STATIC)
samples = (multimodal_corpus.training_corpus if args.vision else corpus.training_corpus)(N_STATIC, args.seed)
if args.workers > 1:
    import multiprocessing as mp

    with mp.get_context("fork").Pool(args.workers) as pool:
        rendered = pool.map(_render_one, samples, chunksize=500)
else:
    rendered = [_render_one(s) for s in samples]
texts = [r[0] for r in rendered]
IMG_U8, IMG_OF = None, {}  # all training images (uint8 [N, S, S, 3]); conversation -> its image rows
if args.vision:
    import shapes  # noqa: E402

    seeds, row_of = [], {}
    for i, s in enumerate(samples):
        for sd_ in s.get("images") or []:
            if sd_ not in row_of:
                row_of[sd_] = len(seeds)
                seeds.append(sd_)
            IMG_OF.setdefault(i, []).append(row_of[sd_])
    import multiprocessing as mp

    with mp.get_context("fork").Pool(max(1, args.workers)) as pool:
        pix = pool.map(shapes.pixels, seeds, chunksize=200)
    IMG_U8 = torch.frombuffer(bytearray(b"".join(pix)), dtype=torch.uint8).view(-1, shapes.SIZE, shapes.SIZE, 3)
    del pix
    log("images: %d of %dx%d" % (IMG_U8.shape[0], shapes.SIZE, shapes.SIZE))
spans = [r[1] for r in rendered]
bad = sum(1 for s in spans if not s)
if bad:
    warn("%d samples without a trainable span" % bad)
from collections import Counter  # noqa: E402

log("corpus: %d conversations, %.1f M chars, tasks %s" % (
    len(texts), sum(map(len, texts)) / 1e6, dict(Counter(s["task"] for s in samples))))
log("example conversation:\n" + texts[0])
step_done("corpus", n=len(texts))

# ------------------------------------------------------------------------------------------------
# 2. Tokenizer: byte-level BPE, GPT-4o-style split regex as in MiniMax's tokenizer but with single
#    digits (\p{N}) so arithmetic sees digits; 64 special slots appended after the BPE vocab.
# ------------------------------------------------------------------------------------------------
SPLIT_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = corpus.special_tokens_in_order()
# Control tokens are "special" (skipped by skip_special_tokens); the reasoning and tool-call markers
# are plain added tokens so decoded text keeps them for the reasoning and tool parsers.
NON_SKIPPED = {"<mm:think>", "</mm:think>", corpus.NS}
special_re = re.compile("|".join(re.escape(s) for s in sorted(SPECIALS, key=len, reverse=True)))

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
])
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=args.bpe_size, min_frequency=2, show_progress=False,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])


def _bpe_texts():
    for t in texts[:15000]:
        for piece in special_re.split(t):
            if piece:
                yield piece


if args.init_from:  # continue training an earlier m3-tiny: its tokenizer, unchanged
    tok = Tokenizer.from_file(os.path.join(args.init_from, "tokenizer.json"))
    BPE_SIZE = tok.get_vocab_size() - len(SPECIALS)
    log("tokenizer from %s (BPE %d)" % (args.init_from, BPE_SIZE))
else:
    tok.train_from_iterator(_bpe_texts(), trainer=trainer)
    BPE_SIZE = tok.get_vocab_size()
    if BPE_SIZE != args.bpe_size:
        warn("BPE vocab is %d, asked for %d" % (BPE_SIZE, args.bpe_size))
    for s in SPECIALS:  # one at a time, in offset order, so the ids are consecutive
        if s in NON_SKIPPED:
            tok.add_tokens([AddedToken(s, special=False, normalized=False)])
        else:
            tok.add_special_tokens([AddedToken(s, special=True, normalized=False)])
VOCAB = tok.get_vocab_size()
for i, s in enumerate(SPECIALS):
    tid = tok.token_to_id(s)
    if tid != BPE_SIZE + i:
        warn("special %r has id %s, expected %d" % (s, tid, BPE_SIZE + i))
    enc = tok.encode("a" + s + "b", add_special_tokens=False).ids
    assert tid in enc and len(enc) == 3, "special %r is not a single token: %s" % (s, enc)
SID = {s: tok.token_to_id(s) for s in SPECIALS}
BOS, EOS, PAD = SID["]~!b["], SID["[e~["], SID["]!p~["]
log("tokenizer: BPE %d + %d special = vocab %d; BOS %d EOS %d <mm:think> %d </mm:think> %d NS %d" % (
    BPE_SIZE, len(SPECIALS), VOCAB, BOS, EOS, SID["<mm:think>"], SID["</mm:think>"], SID[corpus.NS]))
ex = tok.encode(texts[0], add_special_tokens=False)
log("example tokens (%d): %s" % (len(ex.ids), ex.tokens[:120]))
if tok.decode(ex.ids, skip_special_tokens=False) != texts[0]:
    warn("decode(encode(x)) != x for the example conversation")
tok.save(os.path.join(args.out_model, "tokenizer.json"))
step_done("tokenizer", bpe=BPE_SIZE, vocab=VOCAB)

# ------------------------------------------------------------------------------------------------
# 2b. Fresh data (--vision): data workers start now (forked before the tokenizer's thread pool is
#     used and before the model exists) and fill their queues while the model is built and checked.
#     The self-check (nothing generated is held out; the renderer is shapes.py's) runs alongside.
# ------------------------------------------------------------------------------------------------
STREAM, FRESH_CHECK = None, {}
if args.fresh:
    import threading  # noqa: E402

    import fresh_data  # noqa: E402

    fresh_tools.KIND_WEIGHTS.update(GTOOL_KINDS)  # before the workers fork, which inherit it
    if args.gtool_kinds:
        log("generated tools' kinds: %s" % fresh_tools.KIND_WEIGHTS)
    _shares = (fresh_data.SHARE_IMAGE if args.share_image is None else args.share_image,
               fresh_data.SHARE_GTOOL if args.share_gtool is None else args.share_gtool)
    STREAM_CFG = {"tokenizer": tok.to_str(), "seed": args.seed, "batch_tokens": args.batch_tokens,
                  "max_len": args.max_len, "eos": EOS, "image_id": SID["]<]image[>["], "shares": _shares,
                  "pool_batches": 16}
    try:
        STREAM = fresh_data.Stream(torch, STREAM_CFG, args.data_workers, DEV, log=log)
        log("fresh data: %d workers, shares image %.2f generated tools %.2f (the rest the text mix)" % (
            args.data_workers, _shares[0], _shares[1]))
    except Exception as e:  # noqa: BLE001
        warn("fresh data stream failed to start (%r): training on the fixed corpus" % e)
        traceback.print_exc()
        STREAM = None

    def _fresh_check():
        try:
            FRESH_CHECK["result"] = fresh_data.check(n_samples=3000, n_images=300, n_extra=0, regen_eval=False, log=log)
        except BaseException as e:  # noqa: BLE001
            FRESH_CHECK["error"] = repr(e)[:2000]

    FRESH_CHECK_THREAD = threading.Thread(target=_fresh_check, daemon=True)
    FRESH_CHECK_THREAD.start()

# ------------------------------------------------------------------------------------------------
# 3. Encode: each conversation as segments (context / trained), so labels need no offsets. The
#    segment borders sit at special tokens, so the concatenation equals encoding the whole text
#    (checked below on a sample).
# ------------------------------------------------------------------------------------------------
seg_texts, seg_owner = [], []
for i, (t, sp) in enumerate(zip(texts, spans)):
    pos = 0
    for a, b in sp:
        if a > pos:
            seg_texts.append(t[pos:a]); seg_owner.append((i, 0))
        seg_texts.append(t[a:b]); seg_owner.append((i, 1))
        pos = b
    if pos < len(t):
        seg_texts.append(t[pos:]); seg_owner.append((i, 0))
enc = tok.encode_batch(seg_texts, add_special_tokens=False)
ids = [[] for _ in texts]
lab = [[] for _ in texts]
for e, (i, trained) in zip(enc, seg_owner):
    ids[i].extend(e.ids)
    lab[i].extend([1 if trained else 0] * len(e.ids))
mism = 0
for i in range(0, len(texts), max(1, len(texts) // 300)):
    if tok.encode(texts[i], add_special_tokens=False).ids != ids[i]:
        mism += 1
if mism:
    warn("%d sampled conversations encode differently as segments" % mism)
lens = np.array([len(x) for x in ids])
log("lengths: mean %.0f p50 %d p90 %d p99 %d max %d; trained tokens %.1f%%" % (
    lens.mean(), np.percentile(lens, 50), np.percentile(lens, 90), np.percentile(lens, 99), lens.max(),
    100.0 * sum(map(sum, lab)) / lens.sum()))
keep = [i for i in range(len(ids)) if len(ids[i]) <= args.max_len and sum(lab[i]) > 0]
IMAGE_ID = tok.token_to_id("]<]image[>[")
bad_img = [i for i in range(len(ids)) if ids[i].count(IMAGE_ID) != multimodal_corpus.TOKENS_PER_IMAGE * len(IMG_OF.get(i, []))]
if bad_img:
    raise SystemExit("%d conversations whose image tokens do not match their images (first %d)" % (len(bad_img), bad_img[0]))
if len(keep) < len(ids):
    warn("dropped %d conversations longer than %d tokens" % (len(ids) - len(keep), args.max_len))
step_done("encode", tokens=int(lens.sum()), max_len=int(lens.max()), kept=len(keep))

# ------------------------------------------------------------------------------------------------
# 4. Model config (legacy M3 form, as in the real config.json) and the reference model
# ------------------------------------------------------------------------------------------------
from transformers.models.minimax_m3_vl import configuration_minimax_m3_vl as mcfg  # noqa: E402
from transformers.models.minimax_m3_vl import modeling_minimax_m3_vl as mmod  # noqa: E402

log("modeling classes:", [n for n in dir(mmod) if n.startswith("MiniMax")])
TEXT_CONFIG = {
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": EXPERT_INTER,
    "dense_intermediate_size": DENSE_INTER,
    "shared_intermediate_size": SHARED_INTER,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "hidden_act": "swigluoai",
    "swiglu_alpha": 1.702,
    "swiglu_limit": 7.0,
    "max_position_embeddings": MAX_POS,
    "rms_norm_eps": 1e-06,
    "use_gemma_norm": True,
    "use_qk_norm": True,
    "qk_norm_type": "per_head",
    "attention_output_gate": False,
    "rope_theta": ROPE_THETA,
    "rotary_dim": ROTARY_DIM,
    "partial_rotary_factor": ROTARY_DIM / HEAD_DIM,
    "num_local_experts": EXPERTS,
    "num_experts_per_tok": TOPK_EXPERTS,
    "n_shared_experts": 1,
    "scoring_func": "sigmoid",
    "use_routing_bias": True,
    "routed_scaling_factor": 2.0,
    "moe_layer_freq": [0] + [1] * (LAYERS - 1),
    "sparse_attention_config": {
        "use_sparse_attention": True,
        "sparse_num_index_heads": INDEX_HEADS,
        "sparse_index_dim": INDEX_DIM,
        "sparse_block_size": BLOCK,
        "sparse_topk_blocks": TOPK_BLOCKS,
        "sparse_score_type": "max",
        "sparse_local_block": 1,
        "sparse_init_block": 0,
        "sparse_attention_freq": [1] * LAYERS,
        "sparse_disable_index_value": [1] * LAYERS,
    },
    "tie_word_embeddings": False,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "pad_token_id": None,
    "num_mtp_modules": 0,
    "initializer_range": 0.02,
}
VISION_CONFIG = {  # tiny placeholder tower: m3-tiny is text-only; no vision weights ship
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_channels": 3, "image_size": 224, "patch_size": 14, "temporal_patch_size": 2,
    "spatial_merge_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-05,
}
EXTRA_ROPE = {}  # filled if transformers needs an explicit rope_parameters block


def make_text_config(extra=None):
    d = json.loads(json.dumps(TEXT_CONFIG))
    d.update(extra or {})
    return mcfg.MiniMaxM3VLTextConfig(**d)


def find_class(suffix_list):
    for name in suffix_list:
        c = getattr(transformers, name, None) or getattr(mmod, name, None)
        if c is not None:
            return c
    return None


CausalLM = find_class(["MiniMaxM3VLForCausalLM", "MiniMaxM3SparseForCausalLM", "MiniMaxM3ForCausalLM"])
VLClass = find_class(["MiniMaxM3SparseForConditionalGeneration", "MiniMaxM3VLForConditionalGeneration"])
log("text class:", CausalLM, "VL class:", VLClass)
if CausalLM is None:
    raise SystemExit("no text-only causal LM class found in transformers.models.minimax_m3_vl")


def build_text_model(cfg):
    try:
        m = CausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    except TypeError:
        m = CausalLM._from_config(cfg, attn_implementation="eager", torch_dtype=torch.float32)
    except Exception as e:  # noqa: BLE001
        warn("_from_config failed (%r); using the constructor" % e)
        cfg._attn_implementation = "eager"
        m = CausalLM(cfg)
    force_eager(m, "text model")
    return m.float()


def force_eager(m, label):
    """Eager attention (explicit masks; checked causal below) and the eager expert loop (the
    grouped_mm kernels may not accept fp32 weights under bf16 autocast) for every config in m."""
    seen = set()
    for mod in m.modules():
        c = getattr(mod, "config", None)
        if c is None or id(c) in seen:
            continue
        seen.add(id(c))
        before = (getattr(c, "_attn_implementation", None), getattr(c, "_experts_implementation", None))
        for attr in ("_experts_implementation", "_attn_implementation"):
            try:
                if getattr(c, attr, None) != "eager":
                    setattr(c, attr, "eager")
            except Exception as e:  # noqa: BLE001
                warn("%s: cannot set %s on %s: %r" % (label, attr, type(c).__name__, e))
        log("%s: %s attn/experts %s -> %s" % (label, type(c).__name__, before, (
            getattr(c, "_attn_implementation", None), getattr(c, "_experts_implementation", None))))


def rope_ok(model):
    inv = None
    for n, b in model.named_buffers():
        if n.endswith("rotary_emb.inv_freq"):
            inv = b.detach().float().cpu()
            break
    want = 1.0 / (ROPE_THETA ** (torch.arange(0, ROTARY_DIM, 2, dtype=torch.float32) / ROTARY_DIM))
    ok = inv is not None and inv.numel() == want.numel() and torch.allclose(inv, want, rtol=1e-5)
    log("rope inv_freq:", None if inv is None else inv.numel(), "entries; expected", want.numel(), "->", ok)
    return ok


cfg = make_text_config()
log("text config:", {k: getattr(cfg, k, None) for k in [
    "layer_types", "mlp_layer_types", "moe_layer_freq", "index_n_heads", "index_head_dim",
    "index_block_size", "index_topk_blocks", "index_local_blocks", "rope_parameters", "rotary_dim",
    "hidden_act", "_attn_implementation"]})
model = build_text_model(cfg)
if not rope_ok(model):
    EXTRA_ROPE = {"rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA,
                                      "partial_rotary_factor": ROTARY_DIM / HEAD_DIM}}
    warn("transformers did not derive the partial rotary factor from the legacy fields; "
         "config.json gets an explicit rope_parameters block")
    cfg = make_text_config(EXTRA_ROPE)
    model = build_text_model(cfg)
    if not rope_ok(model):
        raise SystemExit("cannot configure partial RoPE")
assert all(t == "minimax_m3_sparse" for t in cfg.layer_types), cfg.layer_types
model.to(DEV)
n_params = sum(p.numel() for p in model.parameters())
log("model: %.2f M parameters; attn impl %s" % (n_params / 1e6, model.config._attn_implementation))
for n, p in model.named_parameters():
    if ".layers.0." in n or ".layers.1." in n or "layers" not in n:
        log("  param %-70s %s" % (n, tuple(p.shape)))
for n, b in model.named_buffers():
    if "e_score" in n and (".layers.1." in n):
        log("  buffer %-69s %s" % (n, tuple(b.shape)))


# ------------------------------------------------------------------------------------------------
# 5. Causality self-check (a future token must not change earlier logits), also inside the local
#    sparse block. Picks how to call the model.
# ------------------------------------------------------------------------------------------------
def causal_mask_4d(L, device):
    m = torch.full((L, L), float("-inf"), device=device).triu(1)
    return m[None, None]


MASK_MODE = None


def forward(m, x, mode=None, **kw):
    mode = mode or MASK_MODE
    if mode == "none":
        return m(input_ids=x, use_cache=False, **kw)
    if mode == "ones2d":
        return m(input_ids=x, attention_mask=torch.ones_like(x), use_cache=False, **kw)
    return m(input_ids=x, attention_mask=causal_mask_4d(x.shape[1], x.device).expand(x.shape[0], 1, -1, -1),
             use_cache=False, **kw)


def causality_check(m, mode):
    m.eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, BPE_SIZE, (2, 96), generator=g).to(DEV)
    y = x.clone()
    y[:, 80] = (y[:, 80] + 7) % BPE_SIZE
    with torch.no_grad():
        la = forward(m, x, mode).logits.float()
        lb = forward(m, y, mode).logits.float()
    before = (la[:, :80] - lb[:, :80]).abs().max().item()
    after = (la[:, 80:] - lb[:, 80:]).abs().max().item()
    log("causality check (%s): max change before the edit %.3g, after %.3g" % (mode, before, after))
    m.train()
    return before < 1e-4 and after > 1e-6


for mode in ["none", "ones2d", "4d"]:
    try:
        if causality_check(model, mode):
            MASK_MODE = mode
            break
    except Exception as e:  # noqa: BLE001
        warn("forward with mask mode %s failed: %r" % (mode, e))
if MASK_MODE is None:
    raise SystemExit("no mask mode gives causal attention: refusing to train a leaking model")
log("mask mode:", MASK_MODE)
step_done("model", params=n_params, mask_mode=MASK_MODE)


def load_init_weights(m, path):
    """Weights of an earlier m3-tiny (checkpoint layout) into the text model, through the
    transformers VL class (the reload check below proves that path reproduces a trained model).
    Every language-model tensor must be found with its shape, else training starts from scratch."""
    src = {}
    try:
        vl = VLClass.from_pretrained(path, dtype=torch.float32)
        for k, v in vl.state_dict().items():
            for a, b in (("model.language_model.", "model."), ("language_model.model.", "model."),
                         ("language_model.lm_head.", "lm_head.")):
                if k.startswith(a):
                    k = b + k[len(a):]
                    break
            src[k] = v
        del vl
    except Exception as e:  # noqa: BLE001  (e.g. a vision tower transformers does not accept)
        warn("%s.from_pretrained(%s) failed (%r): reading its language-model tensors directly" % (
            VLClass.__name__, path, e))
        import fast_model  # noqa: E402

        ck = {}
        for fn in sorted(os.listdir(path)):
            if fn.endswith(".safetensors"):
                ck.update({k: v for k, v in fast_model.read_safetensors(os.path.join(path, fn)).items()
                           if k.startswith("language_model.")})
        with open(os.path.join(path, "config.json")) as f:
            src = fast_model.state_from_checkpoint(ck, json.load(f)["text_config"])
        for k in list(src):  # the reference may keep the routing bias on the MoE block
            src.setdefault(k.replace("mlp.gate.e_score_correction_bias", "mlp.e_score_correction_bias"), src[k])
    dst = m.state_dict()
    missing = [k for k in dst if "rotary" not in k and "inv_freq" not in k and
               (k not in src or tuple(src[k].shape) != tuple(dst[k].shape))]
    if missing:
        raise RuntimeError("no matching tensor for %s" % missing[:10])
    with torch.no_grad():
        for k in dst:
            if k in src:
                dst[k].copy_(src[k].to(dst[k].dtype))
    return len(dst)


if args.init_from:
    try:
        n_loaded = load_init_weights(model, args.init_from)
        log("initial weights: %d tensors from %s" % (n_loaded, args.init_from))
        REPORT["init_from"] = {"path": args.init_from, "tensors": n_loaded}
    except Exception as e:  # noqa: BLE001
        warn("could not load the initial weights from %s (%r): training from scratch" % (args.init_from, e))
        traceback.print_exc()

# ------------------------------------------------------------------------------------------------
# 5b. Fast training model (tools/train_tiny/fast_model.py): same maths, SDPA, dense batched experts,
#     no indexer. Starts from the reference model's random init and must reproduce its fp32 logits
#     before it is used; otherwise training falls back to the reference classes.
# ------------------------------------------------------------------------------------------------
FAST = None
FAST_KEYS = None  # {hf_key: fast_key}
FAST_CFG = {"vocab": VOCAB, "hidden": HIDDEN, "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
            "rotary_dim": ROTARY_DIM, "rope_theta": ROPE_THETA, "eps": 1e-6, "index_heads": INDEX_HEADS,
            "index_dim": INDEX_DIM, "experts": EXPERTS, "topk_experts": TOPK_EXPERTS,
            "expert_inter": EXPERT_INTER, "shared_inter": SHARED_INTER, "dense_inter": DENSE_INTER,
            "alpha": TEXT_CONFIG["swiglu_alpha"], "limit": TEXT_CONFIG["swiglu_limit"],
            "routed_scale": TEXT_CONFIG["routed_scaling_factor"], "moe_layer_freq": TEXT_CONFIG["moe_layer_freq"]}


def _set_exact_fp32(on):
    torch.backends.cuda.matmul.allow_tf32 = not on
    torch.backends.cudnn.allow_tf32 = not on


def compare_fast_hf(fast, hf, seqs, label, rel_tol):
    """fp32 logits of both models on each sequence. A position is 'off' when its max |logit diff|
    exceeds rel_tol * max|logit| (an expert-selection near-tie flipped by fp32 rounding can cause a
    few; a wrong formula makes nearly all of them off). Argmax must agree wherever the position is not
    off and the reference's top-1/top-2 gap exceeds 1e-4. Returns (ok, stats)."""
    _set_exact_fp32(True)
    was_f, was_h = fast.training, hf.training
    fast.eval(); hf.eval()
    diffs, scale, flips, ties, n = [], 0.0, 0, 0, 0
    rows = []
    with torch.no_grad():
        for q in seqs:
            x = torch.tensor([q], device=DEV)
            a = fast(x).float()[0]
            b = forward(hf, x).logits.float()[0]
            rows.append((a, b))
            scale = max(scale, b.abs().max().item())
    tol = rel_tol * max(1.0, scale)
    off = 0
    for a, b in rows:
        d = (a - b).abs().max(-1).values
        diffs.append(d)
        top2 = b.topk(2, dim=-1)
        gap = top2.values[:, 0] - top2.values[:, 1]
        mism = a.argmax(-1) != b.argmax(-1)
        is_off = d > tol
        off += int(is_off.sum().item())
        ties += int((mism & (gap <= 1e-4) & ~is_off).sum().item())
        flips += int((mism & (gap > 1e-4) & ~is_off).sum().item())
        n += a.shape[0]
    fast.train(was_f); hf.train(was_h)
    allv = torch.cat(diffs)
    st = {"positions": n, "max_diff": allv.max().item(), "median_diff": allv.median().item(), "max_logit": scale,
          "tol": tol, "off_positions": off, "argmax_flips": flips, "argmax_flips_at_ties": ties}
    ok = off <= max(2, n // 500) and flips == 0
    log("fast vs reference (%s): %s -> %s" % (label, st, "OK" if ok else "MISMATCH"))
    return ok, st


def copy_fast_to_hf(fast, hf):
    hsd = hf.state_dict()
    fsd = fast.state_dict()
    with torch.no_grad():
        for hk, fk in FAST_KEYS.items():
            hsd[hk].copy_(fsd[fk].to(hsd[hk].dtype))


if os.environ.get("M3TINY_NO_FAST") != "1":
    try:
        import fast_model  # noqa: E402

        FAST = fast_model.FastM3(FAST_CFG).to(DEV)
        hsd = model.state_dict()
        FAST_KEYS = fast_model.key_map(hsd.keys(), FAST.state_dict().keys())
        left = [k for k in hsd if k not in FAST_KEYS and "rotary" not in k and "inv_freq" not in k]
        if left:
            warn("reference tensors the fast model does not have: %s" % left)
        with torch.no_grad():
            fsd = FAST.state_dict()
            for hk, fk in FAST_KEYS.items():
                fsd[fk].copy_(hsd[hk].float())
        # Random init has near-zero logits: scale the final norm so the check is not trivially small.
        norm_before = model.model.norm.weight.detach().clone()
        try:
            with torch.no_grad():
                model.model.norm.weight.add_(3.0)
                FAST.model.norm.weight.add_(3.0)
            g = torch.Generator().manual_seed(3)
            seqs = [torch.randint(0, BPE_SIZE, (n,), generator=g).tolist() for n in (37, 300, 1000)]
            seqs += [ids[i][:args.max_len] for i in keep[:3]]
            ok, st = compare_fast_hf(FAST, model, seqs, "random init", 1e-3)
        finally:
            with torch.no_grad():
                model.model.norm.weight.copy_(norm_before)
                FAST.model.norm.weight.copy_(norm_before)
        REPORT["fast_init_check"] = st
        if not ok:
            raise RuntimeError("fast model does not reproduce the reference logits at init: %s" % st)
        log("fast model: OK, used for training")
    except Exception as e:  # noqa: BLE001
        warn("fast training model unavailable (%r): training with the reference classes" % e)
        traceback.print_exc()
        FAST = None
_set_exact_fp32(False)
step_done("fast_model", used=FAST is not None)
VIS = None  # the vision tower, trained with FAST as its submodule `vision`
if args.vision and FAST is None:
    warn("--vision needs the fast training model: no vision tower trained")
elif args.vision:
    import vision_model  # noqa: E402

    VIS = vision_model.VisionTower(vision_model.VISION_CONFIG, HIDDEN, HIDDEN).to(DEV)
    if args.init_from:
        from safetensors.torch import load_file  # noqa: E402

        prev = {}
        for fn in sorted(os.listdir(args.init_from)):
            if fn.endswith(".safetensors"):
                prev.update({k: v for k, v in load_file(os.path.join(args.init_from, fn)).items()
                             if not k.startswith("language_model.")})
        try:
            log("vision tower: %d tensors from %s" % (VIS.load_checkpoint_tensors(prev), args.init_from))
        except Exception as e:  # noqa: BLE001
            warn("vision weights of %s not loaded (%r): the tower starts from scratch" % (args.init_from, e))
    FAST.vision = VIS
    IMG_U8 = IMG_U8.to(DEV)
    log("vision tower: %.2f M parameters" % (sum(p.numel() for p in VIS.parameters()) / 1e6))
PERCEIVE = None  # training-only read-out of the scene from the tower's outputs (not saved)
if VIS is not None and STREAM is not None and args.perception_weight > 0:
    PERCEIVE = vision_model.PerceptionProbe(HIDDEN, len(shapes.SHAPES), len(shapes.COLOURS), shapes.SIZE).to(DEV)
    log("perception probe: weight %g" % args.perception_weight)

# ------------------------------------------------------------------------------------------------
# 6. Training: bf16 autocast, fused AdamW, length-bucketed padded batches, wall-clock budget.
#    Expert balance: aux-loss-free, by nudging e_score_correction_bias (as M3 does).
# ------------------------------------------------------------------------------------------------
routers, bias_of = [], {}
for n, mod in model.named_modules():
    if type(mod).__name__.endswith("TopKRouter"):
        routers.append((n, mod))
bufs = dict(model.named_buffers())
for n, mod in routers:
    cand = [n + ".e_score_correction_bias", n.rsplit(".", 1)[0] + ".e_score_correction_bias"]
    found = [bufs[c] for c in cand if c in bufs]
    if found:
        bias_of[n] = found[0]
    else:
        warn("no e_score_correction_bias found for router %s: no load balancing there" % n)
router_counts = {}
HOOK_FAILED = []


def _hook(name):
    def h(mod, inp, out):
        if HOOK_FAILED or not torch.is_grad_enabled():
            return
        try:
            sel = out[2].reshape(-1).long()  # scatter_add, unlike CUDA bincount, needs no host sync
            router_counts[name] = torch.zeros(EXPERTS, device=sel.device).scatter_add_(
                0, sel, torch.ones_like(sel, dtype=torch.float))
        except Exception as e:  # noqa: BLE001
            HOOK_FAILED.append(1)
            warn("router hook failed (%r): no load balancing" % e)
    return h


for n, mod in routers:
    mod.register_forward_hook(_hook(n))
log("routers:", len(routers))

order = sorted(keep, key=lambda i: len(ids[i]))
batches, cur = [], []
for i in order:
    L = -(-len(ids[i]) // BLOCK) * BLOCK
    if cur and L * (len(cur) + 1) > args.batch_tokens:
        batches.append(cur)
        cur = []
    cur.append(i)
if cur:
    batches.append(cur)


def make_batch(idx):
    L = -(-max(len(ids[i]) for i in idx) // BLOCK) * BLOCK
    x = torch.full((len(idx), L), EOS, dtype=torch.long)
    y = torch.full((len(idx), L), -100, dtype=torch.long)
    for r, i in enumerate(idx):
        t = torch.tensor(ids[i])
        x[r, :len(t)] = t
        tgt = torch.tensor(ids[i][1:] + [EOS])
        msk = torch.tensor(lab[i][1:] + [0]).bool()
        y[r, :len(t)] = torch.where(msk, tgt, torch.full_like(tgt, -100))
    return x, y


log("batches: %d (token budget %d)" % (len(batches), args.batch_tokens))
batch_cache = {}


def run_training(use_fast, seconds):
    """Train FAST (use_fast) or the reference model for a wall-clock budget; returns (steps, epochs, tokens)."""
    net = FAST if use_fast else model
    decay, no_decay, vis_params = [], [], []
    for n, p in net.named_parameters():
        if use_fast and ".indexer." in n:
            continue  # never used in training (no gradient in the reference either): keeps its init
        if n.startswith("vision."):  # the new tower starts from scratch: a higher learning rate
            vis_params.append(p)
            continue
        (decay if p.dim() >= 2 and "embed" not in n else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}]
    if use_fast and PERCEIVE is not None:
        vis_params += list(PERCEIVE.parameters())
    if vis_params:
        groups.append({"params": vis_params, "weight_decay": 0.0, "lr_scale": args.vision_lr_scale})
    try:
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=DEV == "cuda")
    except Exception as e:  # noqa: BLE001
        warn("fused AdamW unavailable (%r)" % e)
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    if use_fast:
        balance = [(m.gate.e_score_correction_bias, m) for m in FAST.moe_blocks()]
        _set_exact_fp32(False)  # TF32 for the fp32 router matmul; bf16 autocast elsewhere
    net.train()
    fresh = use_fast and STREAM is not None
    t_train = time.time()
    step, epoch, tokens_seen = 0, 0, 0
    perm = []
    ema = None
    while True:
        el = time.time() - t_train
        if el >= seconds:
            break
        if not perm and not fresh:
            perm = list(range(len(batches)))
            random.Random(args.seed + epoch).shuffle(perm)
            epoch += 1
        if fresh:  # a new batch from the data workers; its images rendered on the device
            try:
                x, y, n_targets, flat_idx, y_sel, img_u8, img_layouts = STREAM.next()
            except Exception as e:  # noqa: BLE001
                warn("fresh data failed (%r): the rest of the training uses the fixed corpus" % e)
                fresh = False
                continue
        else:
            bi = perm.pop()
            if bi not in batch_cache:  # built once, kept on the device for the later epochs
                x, y = make_batch(batches[bi])
                rows = [k for i in batches[bi] for k in IMG_OF.get(i, [])]
                fi = (y.reshape(-1) != -100).nonzero().squeeze(1)
                batch_cache[bi] = (x.to(DEV, non_blocking=True), y.to(DEV, non_blocking=True), int(fi.numel()),
                                   fi.to(DEV, non_blocking=True), y.reshape(-1)[fi].to(DEV, non_blocking=True))
                batch_cache[bi] += (torch.tensor(rows, device=DEV) if rows and VIS is not None else None,)
            x, y, n_targets, flat_idx, y_sel, img_rows = batch_cache[bi]
            img_u8 = None if img_rows is None else IMG_U8[img_rows]
            img_layouts = None
        frac = min(1.0, el / seconds)
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr * g.get("lr_scale", 1.0)
        with torch.autocast(device_type="cuda" if DEV == "cuda" else "cpu", dtype=torch.bfloat16):
            if use_fast:
                if step == 1 and os.environ.get("M3TINY_TEST_FAST_FAIL") == "1":
                    raise RuntimeError("M3TINY_TEST_FAST_FAIL: simulated failure of the fast path")
                emb = None if img_u8 is None or VIS is None else VIS(img_u8)
                loss = FAST.loss(x, y, flat_idx, y_sel, img=None if emb is None else (IMAGE_ID, emb, None))
                lm_loss = loss  # logged: the language model's loss alone
                if PERCEIVE is not None and emb is not None and img_layouts is not None:
                    loss = loss + args.perception_weight * PERCEIVE.loss(emb, img_layouts)
            else:
                logits = forward(model, x).logits
        if not use_fast:
            loss = lm_loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                                             ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            if use_fast:
                loads = [m.last_counts for _, m in balance if m.last_counts is not None]
                for bias, m in balance:
                    if m.last_counts is not None:
                        bias.add_(args.balance_rate * torch.sign(m.last_counts.mean() - m.last_counts))
            else:
                loads = []
                for n, _ in routers:
                    c = router_counts.get(n)
                    if c is not None and n in bias_of:
                        load = c.float()
                        loads.append(load)
                        bias_of[n].add_(args.balance_rate * torch.sign(load.mean() - load))
        step += 1
        tokens_seen += n_targets
        if step % 100 == 0 or step == 1 or (not use_fast and step % 25 == 0):
            lv = lm_loss.item()
            if not math.isfinite(loss.item()):
                raise RuntimeError("loss is %r at step %d" % (loss.item(), step))
            ema = lv if ema is None else 0.9 * ema + 0.1 * lv
            imb = max((l.max() / l.mean().clamp(min=1e-9)).item() for l in loads) if loads else 0
            loss_curve.append({"step": step, "t": round(time.time() - t_train, 1), "loss": round(lv, 4), "lr": lr,
                               "fast": use_fast})
            el2 = time.time() - t_train
            tfrac = TRAINED_FRAC
            if fresh:
                tfrac = max(1e-6, STREAM.stats["trained"] / max(1, STREAM.stats["tokens"]))
            log("step %5d %s loss %.4f (ema %.4f) lr %.2e gnorm %.2f  seq %dx%d  trained tok %.1fM  "
                "(%.0fk trained tok/s, %.0fk tok/s incl. context)  max expert load/mean %.2f%s%s" % (
                    step, "fresh" if fresh else "ep %d" % epoch, lv, ema, lr, gn.item(), x.shape[0], x.shape[1],
                    tokens_seen / 1e6, tokens_seen / el2 / 1e3, tokens_seen / el2 / 1e3 / tfrac, imb,
                    "  images %d, data wait %.1f s" % (STREAM.stats["images"], STREAM.wait_s) if fresh else "",
                    "" if PERCEIVE is None or PERCEIVE.last_accuracy is None else
                    "  perception kind %.3f colour %.3f" % tuple(v.item() for v in PERCEIVE.last_accuracy)))
    log("training done (%s): %d steps, %s, %.1f s, %.1fM trained tokens" % (
        "fast model" if use_fast else "reference classes", step,
        "fresh batches" if fresh else "%d epochs (partial)" % epoch, time.time() - t_train, tokens_seen / 1e6))
    if use_fast and STREAM is not None:
        REPORT["fresh_data"] = dict(STREAM.summary(), steps=step, steps_per_s=round(step / max(1e-9, time.time() - t_train), 2))
        if PERCEIVE is not None and PERCEIVE.last_accuracy is not None:
            REPORT["fresh_data"]["perception_last_batch"] = {
                k: round(v.item(), 4) for k, v in zip(("kind", "colour"), PERCEIVE.last_accuracy)}
        log("fresh data: %s" % json.dumps(REPORT["fresh_data"]))
    return step, epoch, tokens_seen


def choose_moe_path():
    """Dense (all experts on every token) or grouped (top-k only, torch._grouped_mm): the grouped
    path is used only when its loss and gradients match the dense path's on a real batch and it is
    faster; any failure keeps the dense path."""
    info = {"used": "dense"}
    if DEV != "cuda" or not hasattr(torch, "_grouped_mm") or os.environ.get("M3TINY_NO_GROUPED") == "1":
        info["why"] = "not available"
        return info
    x, y = make_batch(batches[len(batches) // 2])
    x, y = x.to(DEV), y.to(DEV)
    fi = (y.reshape(-1) != -100).nonzero().squeeze(1)
    ysel = y.reshape(-1)[fi]
    res = {}
    for mode in ("dense", "grouped"):
        for m in FAST.moe_blocks():
            m.grouped = mode == "grouped"
        try:
            FAST.zero_grad(set_to_none=True)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = FAST.loss(x, y, fi, ysel)
            loss.backward()
            g = torch.cat([p.grad.float().reshape(-1) for p in FAST.parameters() if p.grad is not None])
            torch.cuda.synchronize()
            t = time.time()
            for _ in range(5):
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                    l2 = FAST.loss(x, y, fi, ysel)
                l2.backward()
            torch.cuda.synchronize()
            res[mode] = (float(loss.item()), g, (time.time() - t) / 5)
            info[mode] = {"loss": res[mode][0], "step_s": round(res[mode][2], 4)}
        except Exception as e:  # noqa: BLE001
            info[mode] = {"error": repr(e)[:300]}
            warn("MoE %s path failed in the check: %r" % (mode, e))
    for m in FAST.moe_blocks():
        m.grouped = False
    FAST.zero_grad(set_to_none=True)
    if "dense" in res and "grouped" in res:
        (ld, gd, td), (lg, gg, tg) = res["dense"], res["grouped"]
        cos = float(F.cosine_similarity(gd, gg, dim=0).item())
        rel = abs(ld - lg) / max(abs(ld), 1e-6)
        info.update(loss_rel_diff=rel, grad_cosine=cos)
        if math.isfinite(lg) and rel < 1e-2 and cos > 0.99 and tg < td:
            for m in FAST.moe_blocks():
                m.grouped = True
            info["used"] = "grouped"
    log("MoE path check:", json.dumps(info))
    return info


TRAINED_FRAC = max(1e-6, sum(sum(lab[i]) for i in keep) / max(1, sum(len(ids[i]) for i in keep)))
if args.fresh:
    FRESH_CHECK_THREAD.join()
    REPORT["fresh_check"] = FRESH_CHECK
    if "error" in FRESH_CHECK:
        if STREAM is not None:
            STREAM.close()
        raise SystemExit("fresh-data self-check failed (the generators touch the held-out set or the renderer "
                         "differs from shapes.py): %s" % FRESH_CHECK["error"])
    log("fresh-data self-check: OK (%s)" % json.dumps({k: v for k, v in FRESH_CHECK["result"].items()
                                                        if k in ("renderer_exact", "mix_counts",
                                                                 "distinct_generated_tool_names")}))
    if STREAM is not None and FAST is None:
        STREAM.close()
        STREAM = None
loss_curve = []
t_all = time.time()
trained_with = "reference"
if FAST is not None:
    try:
        REPORT["moe_path"] = choose_moe_path()
        step, epoch, tokens_seen = run_training(True, args.train_seconds)
        copy_fast_to_hf(FAST, model)
        trained_with = "fast"
    except Exception as e:  # noqa: BLE001
        warn("fast training failed (%r): falling back to the reference classes for the remaining time" % e)
        traceback.print_exc()
        try:  # keep the progress when the weights are sane (the init check proved the mapping)
            if all(bool(torch.isfinite(p).all()) for p in FAST.parameters()):
                copy_fast_to_hf(FAST, model)
                log("fallback continues from the fast model's weights")
        except Exception as e2:  # noqa: BLE001
            warn("could not copy the fast model's weights (%r): the reference training starts from its init" % e2)
        FAST = None
        if STREAM is not None:
            STREAM.close()
            STREAM = None
        if VIS is not None:
            warn("the vision tower trains only with the fast model: none is saved")
            VIS = None
        batch_cache.clear()
        if DEV == "cuda":
            torch.cuda.empty_cache()
if STREAM is not None:
    STREAM.close()
    STREAM = None
if FAST is None:
    step, epoch, tokens_seen = run_training(False, max(30.0, args.train_seconds - (time.time() - t_all)))
model.eval()
# Equivalence of the trained weights in the reference model (fp32): abort the save when they differ.
if trained_with == "fast":
    try:
        _eq_items = corpus.eval_set(n_arith=3, n_tool=6)
        eq_seqs = [tok.encode(corpus.render(it, add_generation_prompt=True), add_special_tokens=False).ids
                   for it in _eq_items]
        eq_seqs = [q for q in eq_seqs if len(q) <= BLOCK * TOPK_BLOCKS][:8] + [ids[i] for i in keep[-2:]]
        eq_ok, st = compare_fast_hf(FAST, model, eq_seqs, "trained", 2e-3)
        REPORT["fast_trained_check"] = st
        worst = st["max_diff"]
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        eq_ok, worst = False, float("nan")
        REPORT["fast_trained_check"] = {"error": repr(e)}
    if not eq_ok:
        msg = ("FATAL: the trained fast model and the reference model with the copied weights disagree "
               "(max |logit diff| %.3g); not saving the checkpoint" % worst)
        warn(msg)
        print("!" * 100 + "\n" + msg + "\n" + "!" * 100, flush=True)
        torch.save({k: v.detach().cpu() for k, v in FAST.state_dict().items()},
                   os.path.join(args.out_fixtures, "DIAGNOSTIC_fast_state_dict.pt"))
        step_done("train", steps=step, epochs=epoch, trained_tokens=tokens_seen, trained_with=trained_with)
        REPORT["loss_curve"] = loss_curve
        save_report()
        sys.exit(3)
    FAST_EVAL = FAST if VIS is not None else None  # image evaluation runs on it (weights re-copied below)
    del FAST
    FAST = None
batch_cache.clear()
REPORT["loss_curve"] = loss_curve
step_done("train", steps=step, epochs=epoch, trained_tokens=tokens_seen, trained_with=trained_with)
save_report()

# ------------------------------------------------------------------------------------------------
# 7. Checkpoint-exact weights: bf16 everywhere except the router weight and bias (fp32). The
#    in-memory model keeps fp32 storage of bf16-representable values, so every later step
#    (evaluation, goldens) sees exactly what the checkpoint holds.
# ------------------------------------------------------------------------------------------------
model.eval()
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
try:
    torch.set_float32_matmul_precision("highest")
except Exception:  # noqa: BLE001
    pass
router_names = {n + ".weight" for n, _ in routers}
with torch.no_grad():
    for n, p in model.named_parameters():
        if n not in router_names:
            p.copy_(p.to(torch.bfloat16).float())
sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
if VIS is not None:  # the checkpoint-exact weights into the model the image evaluation runs on
    with torch.no_grad():
        _fsd = FAST_EVAL.state_dict()
        for _hk, _fk in FAST_KEYS.items():
            _fsd[_fk].copy_(model.state_dict()[_hk].to(_fsd[_fk].dtype))
        for p in VIS.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    FAST_EVAL.eval()
log("state dict: %d tensors" % len(sd))
for k in sorted(sd):
    if ".layers.1." in k or ".layers." not in k:
        log("  %-72s %s %s" % (k, tuple(sd[k].shape), sd[k].dtype))

# ------------------------------------------------------------------------------------------------
# 8. Save in the real checkpoint layout with the original tensor names (m3-architecture.md 4.2).
# ------------------------------------------------------------------------------------------------
FP32_NAMES = set()


def original_tensors(state):
    out = {}
    used = set()

    def put(name, t, keep_fp32=False):
        t = t.contiguous()
        out[name] = t.float() if keep_fp32 else t.to(torch.bfloat16)
        if keep_fp32:
            FP32_NAMES.add(name)

    def src(k):
        used.add(k)
        return state[k]

    put("language_model.model.embed_tokens.weight", src("model.embed_tokens.weight"))
    put("language_model.model.norm.weight", src("model.norm.weight"))
    put("language_model.lm_head.weight", src("lm_head.weight"))
    for i in range(LAYERS):
        h, o = "model.layers.%d." % i, "language_model.model.layers.%d." % i
        for nm in ["input_layernorm", "post_attention_layernorm"]:
            put(o + nm + ".weight", src(h + nm + ".weight"))
        for nm in ["q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"]:
            put(o + "self_attn.%s.weight" % nm, src(h + "self_attn.%s.weight" % nm))
        for nm in ["q_proj", "k_proj", "q_norm", "k_norm"]:
            put(o + "self_attn.index_%s.weight" % nm, src(h + "self_attn.indexer.%s.weight" % nm))
        if TEXT_CONFIG["moe_layer_freq"][i] == 0:
            gu = src(h + "mlp.gate_up_proj.weight")
            assert gu.shape == (2 * DENSE_INTER, HIDDEN), gu.shape
            put(o + "mlp.gate_proj.weight", gu[:DENSE_INTER])
            put(o + "mlp.up_proj.weight", gu[DENSE_INTER:])
            put(o + "mlp.down_proj.weight", src(h + "mlp.down_proj.weight"))
            continue
        m = o + "block_sparse_moe."
        put(m + "gate.weight", src(h + "mlp.gate.weight"), keep_fp32=True)
        bk = [k for k in (h + "mlp.gate.e_score_correction_bias", h + "mlp.e_score_correction_bias") if k in state]
        put(m + "e_score_correction_bias", src(bk[0]), keep_fp32=True)
        gu = src(h + "mlp.experts.gate_up_proj")
        dn = src(h + "mlp.experts.down_proj")
        assert gu.shape == (EXPERTS, 2 * EXPERT_INTER, HIDDEN), gu.shape
        assert dn.shape == (EXPERTS, HIDDEN, EXPERT_INTER), dn.shape
        for e in range(EXPERTS):
            put(m + "experts.%d.w1.weight" % e, gu[e, :EXPERT_INTER])
            put(m + "experts.%d.w3.weight" % e, gu[e, EXPERT_INTER:])
            put(m + "experts.%d.w2.weight" % e, dn[e])
        sgu = src(h + "mlp.shared_experts.gate_up_proj.weight")
        assert sgu.shape == (2 * SHARED_INTER, HIDDEN), sgu.shape
        put(m + "shared_experts.gate_proj.weight", sgu[:SHARED_INTER])
        put(m + "shared_experts.up_proj.weight", sgu[SHARED_INTER:])
        put(m + "shared_experts.down_proj.weight", src(h + "mlp.shared_experts.down_proj.weight"))
    left = [k for k in state if k not in used]
    if left:
        warn("state-dict entries not written: %s" % left)
    return out


tensors = original_tensors(sd)
if VIS is not None:
    tensors.update(VIS.checkpoint_tensors())
total_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
names = list(tensors)
half, acc, shard_of = total_bytes / 2, 0, {}
for k in names:
    shard_of[k] = 1 if acc < half else 2
    acc += tensors[k].numel() * tensors[k].element_size()
weight_map = {}
for s in (1, 2):
    fn = "model-%05d-of-00002.safetensors" % s
    part = {k: tensors[k] for k in names if shard_of[k] == s}
    save_file(part, os.path.join(args.out_model, fn), metadata={"format": "pt"})
    for k in part:
        weight_map[k] = fn
with open(os.path.join(args.out_model, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total_bytes}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
    f.write("\n")
log("weights: %d tensors, %.1f MB, fp32 tensors: %d" % (len(tensors), total_bytes / 1e6, len(FP32_NAMES)))

text_cfg_out = dict(TEXT_CONFIG)
text_cfg_out.update(EXTRA_ROPE)
config_json = {
    "architectures": ["MiniMaxM3SparseForConditionalGeneration"],
    "model_type": "minimax_m3_vl",
    "text_config": text_cfg_out,
    "vision_config": VIS.vc if VIS is not None else VISION_CONFIG,
    "image_token_index": SID["]<]image[>["],
    "video_token_index": SID["]<]video[>["],
    "projector_hidden_size": HIDDEN,
    "projector_hidden_act": "gelu",
    "multimodal_projector_bias": True,
    "patch_merge_bias": True,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": transformers.__version__,
}
with open(os.path.join(args.out_model, "config.json"), "w") as f:
    json.dump(config_json, f, indent=2)
    f.write("\n")
if VIS is not None:
    with open(os.path.join(args.out_model, "preprocessor_config.json"), "w") as f:
        json.dump(vision_model.PREPROCESSOR_CONFIG, f, indent=2)
        f.write("\n")
with open(os.path.join(args.out_model, "generation_config.json"), "w") as f:
    json.dump({"bos_token_id": BOS, "eos_token_id": EOS, "do_sample": True, "temperature": 1.0,
               "top_p": 0.95, "top_k": 40, "transformers_version": transformers.__version__}, f, indent=2)
    f.write("\n")
with open(os.path.join(args.out_model, "tokenizer_config.json"), "w") as f:
    json.dump({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "]~!b[", "eos_token": "[e~[", "pad_token": "]!p~[", "unk_token": "]!d~[",
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POS,
        "added_tokens_decoder": {str(SID[s]): {"content": s, "special": s not in NON_SKIPPED, "normalized": False,
                                               "lstrip": False, "rstrip": False, "single_word": False}
                                 for s in SPECIALS},
    }, f, indent=2, ensure_ascii=False)
    f.write("\n")
with open(corpus.TEMPLATE_PATH, encoding="utf-8") as f_in, \
        open(os.path.join(args.out_model, "chat_template.jinja"), "w", encoding="utf-8") as f_out:
    f_out.write(f_in.read())
step_done("save", bytes=total_bytes, files=sorted(os.listdir(args.out_model)))
save_report()


# ------------------------------------------------------------------------------------------------
# 9. Reload through the transformers VL class (original names -> HF layout) and compare logits;
#    also record what save_pretrained writes (names, normalised config).
# ------------------------------------------------------------------------------------------------
def probe_ids():
    s = corpus.sample_tool(random.Random(7), "heldout", name="send_email", with_result=True)
    return tok.encode(corpus.render(s), add_special_tokens=False).ids[:400]


ref_model = model  # what goldens and eval use
reloaded = None
probe = torch.tensor([probe_ids()], device=DEV)
with torch.no_grad():
    ref_logits = forward(model, probe).logits.float()
if VLClass is not None:
    try:
        try:
            vl, info = VLClass.from_pretrained(args.out_model, dtype=torch.float32, attn_implementation="eager",
                                               output_loading_info=True)
        except TypeError:
            vl, info = VLClass.from_pretrained(args.out_model, torch_dtype=torch.float32,
                                               attn_implementation="eager", output_loading_info=True)
        force_eager(vl, "reloaded model")
        vl = vl.to(DEV).eval()
        for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
            v = sorted(map(str, info.get(k, []) or []))
            lm_v = [x for x in v if "vision" not in x and "projector" not in x and "patch_merge" not in x]
            log("reload %s: %d (language-model ones: %d) %s" % (k, len(v), len(lm_v), lm_v[:20]))
            REPORT.setdefault("reload", {})[k] = v[:200]
        with torch.no_grad():
            vl_logits = forward(vl, probe).logits.float()
        diff = (vl_logits - ref_logits).abs().max().item()
        agree = (vl_logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item()
        log("reload vs trained model: max |logit diff| %.3g, argmax agreement %.4f" % (diff, agree))
        REPORT["reload"]["max_logit_diff"] = diff
        REPORT["reload"]["argmax_agreement"] = agree
        if diff < 1e-3:
            reloaded = vl
        else:
            warn("the checkpoint reloaded through %s does not reproduce the trained model" % VLClass.__name__)
        try:
            import tempfile
            from safetensors import safe_open

            tmp = tempfile.mkdtemp()
            vl.save_pretrained(tmp)
            hf_names = {}
            for fn in os.listdir(tmp):
                if fn.endswith(".safetensors"):
                    with safe_open(os.path.join(tmp, fn), "pt") as sf:
                        for k in sf.keys():
                            hf_names[k] = list(sf.get_slice(k).get_shape())
            lm_hf = {k for k in hf_names if k.startswith("language_model.") or ".language_model." in k}
            mine = set(tensors)
            log("save_pretrained: %d tensors (%d language-model); only in ours: %s; only in HF's: %s" % (
                len(hf_names), len(lm_hf), sorted(mine - lm_hf)[:20], sorted(lm_hf - mine)[:20]))
            REPORT["save_pretrained_names_only_ours"] = sorted(mine - lm_hf)
            REPORT["save_pretrained_names_only_hf"] = sorted(lm_hf - mine)
            with open(os.path.join(tmp, "config.json")) as f:
                hf_cfg = json.load(f)
            with open(os.path.join(args.out_fixtures, "hf_save_pretrained_config.json"), "w") as f:
                json.dump(hf_cfg, f, indent=2)
                f.write("\n")
        except Exception as e:  # noqa: BLE001
            warn("save_pretrained comparison failed: %r" % e)
    except Exception as e:  # noqa: BLE001
        warn("reload through %s failed: %r" % (VLClass.__name__, e))
        traceback.print_exc()
else:
    warn("no MiniMax-M3 VL class in this transformers")

# Tokenizer through transformers: same ids and the same chat-template rendering?
try:
    from transformers import AutoTokenizer

    hft = AutoTokenizer.from_pretrained(args.out_model)
    ev_probe = corpus.eval_set(n_arith=3, n_tool=6)
    same_text = same_ids = 0
    for it in ev_probe:
        mine_t = corpus.render(it, add_generation_prompt=True)
        hf_t = hft.apply_chat_template(it["messages"], tools=it["tools"], add_generation_prompt=True,
                                       tokenize=False, **it["kwargs"])
        same_text += hf_t == mine_t
        same_ids += hft.encode(mine_t, add_special_tokens=False) == tok.encode(mine_t, add_special_tokens=False).ids
    log("AutoTokenizer: %s; apply_chat_template identical %d/%d, ids identical %d/%d" % (
        type(hft).__name__, same_text, len(ev_probe), same_ids, len(ev_probe)))
    REPORT["hf_tokenizer"] = {"class": type(hft).__name__, "template_same": same_text, "ids_same": same_ids,
                              "n": len(ev_probe)}
    if same_text != len(ev_probe) or same_ids != len(ev_probe):
        warn("transformers' tokenizer or template rendering differs from corpus.py")
except Exception as e:  # noqa: BLE001
    warn("AutoTokenizer check failed: %r" % e)
step_done("reload", reloaded=reloaded is not None)
save_report()


# ------------------------------------------------------------------------------------------------
# 10. Held-out evaluation: greedy, fp32, checkpoint-exact weights, full recompute each step (no KV
#     cache: the simplest path, same as training).
# ------------------------------------------------------------------------------------------------
def base_and_head(m):
    if hasattr(m, "lm_head") and hasattr(m, "model") and hasattr(m.model, "embed_tokens"):
        return m.model, m.lm_head
    if hasattr(m, "lm_head") and hasattr(m, "model") and hasattr(m.model, "language_model"):
        return m.model.language_model, m.lm_head
    return None, None


def greedy_nocache(m, prompts, max_new, deadline=None, batch=64, want_margins=False):
    """Greedy continuation of each prompt (list of ids) until EOS or max_new tokens."""
    base, head = base_and_head(m)
    dev = next(m.parameters()).device
    outs = [None] * len(prompts)
    margins = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    for s in range(0, len(order), batch):
        if deadline is not None and time.time() > deadline:
            break
        idx = order[s:s + batch]
        seqs = [list(prompts[i]) for i in idx]
        gen = [[] for _ in idx]
        mg = [[] for _ in idx]
        done = [False] * len(idx)
        timed_out = False
        for _ in range(max_new):
            if deadline is not None and time.time() > deadline:
                timed_out = True
                break
            L = max(len(q) for q in seqs)
            x = torch.full((len(idx), L), EOS, dtype=torch.long)
            for r, q in enumerate(seqs):
                x[r, :len(q)] = torch.tensor(q)
            x = x.to(dev)
            lens = torch.tensor([len(q) for q in seqs], device=dev)
            with torch.no_grad():
                hs = forward(base, x).last_hidden_state
                logits = head(hs[torch.arange(len(idx), device=dev), lens - 1]).float()
            top2 = logits.topk(2, dim=-1)
            nxt = top2.indices[:, 0].tolist()
            mgn = (top2.values[:, 0] - top2.values[:, 1]).tolist()
            for r in range(len(idx)):
                if done[r]:
                    continue
                gen[r].append(nxt[r])
                mg[r].append(mgn[r])
                seqs[r].append(nxt[r])
                if nxt[r] == EOS:
                    done[r] = True
            if all(done):
                break
        if timed_out:
            break
        for r, i in enumerate(idx):
            outs[i] = gen[r]
            margins[i] = mg[r]
    return (outs, margins) if want_margins else outs


EVAL_TASKS = ("arith", "arith_nothink", "tool")
results = {t: {"n": 0, "correct": 0, "accuracy": 0.0, "adaptive": "-", "enabled": "-", "disabled": "-"}
           for t in EVAL_TASKS}
try:
    eval_items = corpus.eval_set()
    if args.eval_limit:
        seen_tasks = Counter()
        eval_items = [it for it in eval_items if seen_tasks.update([it["task"]]) or seen_tasks[it["task"]] <= args.eval_limit]
    eval_prompts = [tok.encode(corpus.render(it, add_generation_prompt=True), add_special_tokens=False).ids
                    for it in eval_items]
    log("eval: %d held-out items, prompt length max %d" % (len(eval_items), max(map(len, eval_prompts))))
    committed = os.path.join(HERE, "eval_set.jsonl")
    if os.path.exists(committed):
        with open(committed, encoding="utf-8") as f:
            same = [json.loads(l) for l in f if l.strip()] == json.loads(json.dumps(eval_items))
        if not same and not args.eval_limit:
            warn("tools/train_tiny/eval_set.jsonl differs from corpus.eval_set(): regenerate it")
    with open(os.path.join(args.out_fixtures, "eval_prompt_ids.json"), "w") as f:
        json.dump({it["id"]: p for it, p in zip(eval_items, eval_prompts)}, f, separators=(",", ":"))
        f.write("\n")
    t_eval = time.time()
    deadline = t_eval + args.eval_seconds
    per_item = []
    for task, max_new, share in (("arith", 220, 0.45), ("arith_nothink", 40, 0.55), ("tool", 160, 1.0)):
        sel = [i for i, it in enumerate(eval_items) if it["task"] == task]
        outs = greedy_nocache(ref_model, [eval_prompts[i] for i in sel], args.eval_max_new or max_new,
                              deadline=t_eval + args.eval_seconds * share,
                              batch=args.eval_batch)
        for i, o in zip(sel, outs):
            if o is None:
                continue
            text = tok.decode(o, skip_special_tokens=False)
            ok, detail = corpus.score(eval_items[i], text)
            per_item.append({"id": eval_items[i]["id"], "task": task, "mode": eval_items[i]["mode"], "ok": ok,
                             "detail": detail, "completion": text})
    for task in EVAL_TASKS:
        rows = [r for r in per_item if r["task"] == task]
        res = {"n": len(rows), "correct": sum(r["ok"] for r in rows)}
        for mode in ("adaptive", "enabled", "disabled"):
            rm = [r for r in rows if r["mode"] == mode]
            res[mode] = "%d/%d" % (sum(r["ok"] for r in rm), len(rm))
        res["accuracy"] = round(res["correct"] / max(1, res["n"]), 4)
        results[task] = res
        log("EVAL %-13s accuracy %.1f%% (%d/%d)  adaptive %s  enabled %s  disabled %s" % (
            task, 100 * res["accuracy"], res["correct"], res["n"], res["adaptive"], res["enabled"], res["disabled"]))
    for r in [r for r in per_item if not r["ok"]][:12]:
        log("  FAIL %s [%s] %s | %r" % (r["id"], r["mode"], r["detail"], r["completion"][-300:]))
    for r in per_item[:2] + [r for r in per_item if r["task"] == "tool"][:2]:
        log("  sample %s [%s] ok=%s | %r" % (r["id"], r["mode"], r["ok"], r["completion"]))
    REPORT["eval"] = results
    log("eval took %.1f s" % (time.time() - t_eval))
    with open(os.path.join(args.out_fixtures, "eval_results.json"), "w") as f:
        json.dump({"summary": results, "items": per_item}, f, indent=1, ensure_ascii=False)
        f.write("\n")
except Exception as e:  # noqa: BLE001
    warn("evaluation failed: %r" % e)
    traceback.print_exc()
step_done("eval", **{k: v["accuracy"] for k, v in results.items()})
save_report()


# ------------------------------------------------------------------------------------------------
# 10b. The vision-and-tools round: held-out tool schemas (eval_tools_heldout.jsonl, the reference
#      model) and held-out images (eval_vision.jsonl, PNG data URLs decoded with PIL and
#      pre-processed as the server does; the fast model with the checkpoint-exact weights).
# ------------------------------------------------------------------------------------------------
if args.vision:
    import round_eval  # noqa: E402

    results.update(round_eval.run(args, tok, ref_model, greedy_nocache, FAST_EVAL if VIS is not None else None, VIS,
                                  IMAGE_ID, EOS, log, warn))
    REPORT["eval"] = results
    step_done("eval_round", **{k: results[k]["accuracy"] for k in round_eval.ROUND_TASKS if k in results})
    save_report()


# ------------------------------------------------------------------------------------------------
# 11. Goldens: transformers generate (greedy, KV cache), CPU, fp32, on the reloaded checkpoint when
#     it reproduced the trained model; the full-recompute greedy path and its top-1/top-2 margins
#     are recorded alongside.
# ------------------------------------------------------------------------------------------------
def golden_cases():
    rng = random.Random(2024)
    cases = []

    def add(name, sample, note=""):
        it = corpus.strip_last_assistant(sample)
        cases.append({"name": name, "messages": it["messages"], "tools": it["tools"], "kwargs": it["kwargs"],
                      "note": note})

    add("arith_add_adaptive", {"messages": [{"role": "user", "content": "What is 47 + 35?"}], "tools": None,
                               "kwargs": {}})
    add("arith_mul_enabled", {"messages": [{"role": "user", "content": "What is 83 * 7?"}], "tools": None,
                              "kwargs": {"thinking_mode": "enabled"}})
    add("arith_sub_disabled", {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                                            {"role": "user", "content": "What is 12 - 58?"}], "tools": None,
                               "kwargs": {"thinking_mode": "disabled", "reasoning_effort": "low"}})
    s = corpus.sample_tool(rng, "heldout", mode="adaptive", name="get_weather", with_result=False, history=0)
    add("tool_weather_adaptive", s)
    s = corpus.sample_tool(rng, "heldout", mode="enabled", name="send_email", with_result=False, history=0)
    add("tool_email_array_enabled", s)
    s = corpus.sample_tool(rng, "heldout", mode="disabled", name="create_event", with_result=False, history=0)
    add("tool_event_nested_disabled", s)
    s = corpus.sample_tool(rng, "heldout", mode="adaptive", name="convert_currency", with_result=True, history=1)
    add("tool_result_answer_multiturn", s)
    add("chitchat_hello", {"messages": [{"role": "user", "content": "Hello!"}], "tools": None, "kwargs": {}})
    # Past the exact window (> 32 blocks of 32 tokens): the indexer's block selection matters.
    msgs = []
    r2 = random.Random(99)
    while True:
        op, a, b = corpus.arith_operands(r2, "train")
        msgs += [{"role": "user", "content": corpus.arith_question(op, a, b)},
                 corpus.arith_turn(r2, op, a, b, "disabled")]
        probe_t = corpus.render({"messages": msgs + [{"role": "user", "content": "What is 64 + 29?"}],
                                 "tools": [corpus.TOOLS[t] for t in corpus.TOOL_NAMES], "kwargs": {}}, True)
        if len(tok.encode(probe_t, add_special_tokens=False).ids) > BLOCK * TOPK_BLOCKS + 3 * BLOCK:
            break
    add("sparse_regime_long_history",
        {"messages": msgs + [{"role": "user", "content": "What is 64 + 29?"}, {"role": "assistant", "content": ""}],
         "tools": [corpus.TOOLS[t] for t in corpus.TOOL_NAMES], "kwargs": {}},
        note="prompt longer than sparse_topk_blocks * sparse_block_size: the indexer's top-k block selection "
             "is active; transformers reduces index heads with max before top-k")
    return cases


try:
    import copy

    gold_model = reloaded if reloaded is not None else copy.deepcopy(ref_model)
    gold_src = ("%s.from_pretrained(models/m3-tiny)" % VLClass.__name__) if reloaded is not None else \
        "%s with the checkpoint's weights (in memory)" % CausalLM.__name__
    gold_model = gold_model.to("cpu").float().eval()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    goldens = []
    for c in golden_cases()[:args.golden_limit or None]:
        prompt_text = corpus.render(c, add_generation_prompt=True)
        pids = tok.encode(prompt_text, add_special_tokens=False).ids
        x = torch.tensor([pids])
        with torch.no_grad():
            out = gold_model.generate(input_ids=x, attention_mask=torch.ones_like(x),
                                      max_new_tokens=args.golden_new_tokens, do_sample=False,
                                      eos_token_id=EOS, pad_token_id=EOS)
        gen_ids = out[0, len(pids):].tolist()
        nc, mg = greedy_nocache(ref_model, [pids], args.golden_new_tokens, batch=1, want_margins=True)
        with torch.no_grad():
            last = forward(gold_model, x).logits[0, -1].float()
        top = last.topk(5)
        g = {
            "name": c["name"], "note": c["note"],
            "regime": "sparse" if len(pids) > BLOCK * TOPK_BLOCKS else "exact-dense",
            "messages": c["messages"], "tools": c["tools"], "chat_template_kwargs": c["kwargs"],
            "prompt_text": prompt_text, "prompt_ids": pids,
            "output_ids": gen_ids, "output_text": tok.decode(gen_ids, skip_special_tokens=False),
            "stopped_at_eos": bool(gen_ids and gen_ids[-1] == EOS),
            "nocache_output_ids": nc[0], "nocache_agrees": nc[0] == gen_ids,
            "min_top1_top2_margin": round(min(mg[0]), 5) if mg[0] else None,
            "prompt_last_logits_top5": [[int(i), round(float(v), 5)] for v, i in zip(top.values, top.indices)],
        }
        goldens.append(g)
        log("golden %-30s %-11s prompt %4d out %2d eos %s nocache-agrees %s min-margin %s: %r" % (
            g["name"], g["regime"], len(pids), len(gen_ids), g["stopped_at_eos"], g["nocache_agrees"],
            g["min_top1_top2_margin"], g["output_text"][:160]))
    with open(os.path.join(args.out_fixtures, "golden.json"), "w") as f:
        json.dump({
            "model": "models/m3-tiny",
            "reference": "transformers %s, %s, generate(do_sample=False), CPU float32, eager attention" % (
                transformers.__version__, gold_src),
            "max_new_tokens": args.golden_new_tokens, "eos_token_id": EOS,
            "notes": "Greedy decoding; output_ids include the final EOS when generation stopped on it. "
                     "min_top1_top2_margin is the smallest logit gap between the best and second-best token "
                     "over the generated steps (full-recompute path): small gaps are where an engine with a "
                     "different summation order may legitimately flip. Cases with regime 'sparse' exceed the "
                     "exact-dense window and depend on the indexer's block selection.",
            "cases": goldens,
        }, f, indent=1, ensure_ascii=False)
        f.write("\n")
    step_done("golden", n=len(goldens), source=gold_src)
except Exception as e:  # noqa: BLE001
    warn("golden generation failed: %r" % e)
    traceback.print_exc()

# ------------------------------------------------------------------------------------------------
# 12. Model card with the measured numbers.
# ------------------------------------------------------------------------------------------------
files = sorted(os.listdir(args.out_model))
sizes = {f: os.path.getsize(os.path.join(args.out_model, f)) for f in files}
card = """# m3-tiny

A small model in the MiniMax-M3 architecture and checkpoint format, trained on synthetic data so
that m3serve works out of the box and its tests run on real model output. Not a useful assistant.
How it was made and how to regenerate it: `tools/train_tiny/README.md`.

- Architecture: {layers} layers, hidden {hidden}, {heads} query heads / {kv} KV heads of {hd}, MiniMax sparse
  attention in every layer (block {block}, top-{topk} blocks, {ih} index heads of {idim}; prompts up to
  {win} tokens are exact dense attention), dense MLP ({dense}) in layer 0, MoE in layers 1-{last}
  ({experts} experts, top-{ek}, intermediate {inter}, sigmoid router with e_score_correction_bias, one
  shared expert of {shared}), SwiGLU-OAI, Gemma RMSNorm, per-head QK norm, partial RoPE ({rot} of {hd}).
- Vocabulary {vocab}: byte-level BPE ({bpe}) + 64 MiniMax-M3 special tokens at {bpe}..{vlast}.
- {params:.2f} M parameters{vis_line}, {mb:.1f} MB of weights (bf16; router weight and bias fp32).
- Trained {steps} steps / {secs:.0f} s on one {gpu}{cont} ({how}; transformers {tv}, torch {tt}).

## Held-out evaluation (greedy, values never seen in training)

| task | accuracy | adaptive | enabled | disabled |
|---|---|---|---|---|
| arithmetic (thinking: adaptive, the default, or enabled) | {a_acc} | {a_ad} | {a_en} | - |
| arithmetic without thinking (thinking disabled) | {n_acc} | - | - | {n_di} |
| tool call (parses, right tool, right arguments) | {t_acc} | {t_ad} | {t_en} | {t_di} |

{round_lines}The evaluation set is `tools/train_tiny/eval_set.jsonl`; per-item results are in
`tests/fixtures/m3_tiny/eval_results.json`.
""".format(layers=LAYERS, hidden=HIDDEN, heads=HEADS, kv=KV_HEADS, hd=HEAD_DIM, block=BLOCK, topk=TOPK_BLOCKS,
           ih=INDEX_HEADS, idim=INDEX_DIM, win=BLOCK * TOPK_BLOCKS, dense=DENSE_INTER, last=LAYERS - 1,
           experts=EXPERTS, ek=TOPK_EXPERTS, inter=EXPERT_INTER, shared=SHARED_INTER, rot=ROTARY_DIM,
           vocab=VOCAB, bpe=BPE_SIZE, vlast=VOCAB - 1, params=n_params / 1e6, mb=total_bytes / 1e6, steps=step,
           vis_line=("" if VIS is None else " (plus a vision tower, projector and merge MLP of %.2f M)" % (
               sum(p.numel() for p in VIS.parameters()) / 1e6)),
           gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU",
           cont=(", continuing from `%s`" % args.init_from) if args.init_from else "",
           secs=args.train_seconds, how=("fast pure-PyTorch training model, weights verified against the "
                                "transformers classes" if trained_with == "fast" else "transformers classes"), tv=transformers.__version__, tt=torch.__version__,
           a_acc="%.1f%% (%d/%d)" % (100 * results["arith"]["accuracy"], results["arith"]["correct"], results["arith"]["n"]),
           a_ad=results["arith"]["adaptive"], a_en=results["arith"]["enabled"],
           n_acc="%.1f%% (%d/%d)" % (100 * results["arith_nothink"]["accuracy"], results["arith_nothink"]["correct"],
                                     results["arith_nothink"]["n"]), n_di=results["arith_nothink"]["disabled"],
           t_acc="%.1f%% (%d/%d)" % (100 * results["tool"]["accuracy"], results["tool"]["correct"], results["tool"]["n"]),
           t_ad=results["tool"]["adaptive"], t_en=results["tool"]["enabled"], t_di=results["tool"]["disabled"],
           round_lines="".join(
               "\n%s: %.1f%% (%d/%d), adaptive %s, enabled %s, disabled %s.\n" % (
                   label, 100 * results[k]["accuracy"], results[k]["correct"], results[k]["n"],
                   results[k]["adaptive"], results[k]["enabled"], results[k]["disabled"])
               for k, label in (("gtool", "Tool calls on held-out tool schemas (`eval_tools_heldout.jsonl`)"),
                                ("ntool", "Tool calls asked as a new user would (`eval_tools_natural.jsonl`)"),
                                ("vision", "Questions on held-out images (`eval_vision.jsonl`)"))
               if k in results) + ("\n" if any(k in results for k in ("gtool", "vision")) else ""))
with open(os.path.join(args.out_model, "README.md"), "w") as f:
    f.write(card)
files = sorted(os.listdir(args.out_model))
sizes = {f: os.path.getsize(os.path.join(args.out_model, f)) for f in files}
log("model folder: %s, total %.1f MB" % (sizes, sum(sizes.values()) / 1e6))
if sum(sizes.values()) > 40e6:
    warn("model folder exceeds 40 MB")
REPORT["model_files"] = sizes
save_report()
for t, v in results.items():
    log("SUMMARY %-13s %.1f%% (%d/%d)" % (t, 100 * v["accuracy"], v["correct"], v["n"]))
log("DONE. warnings: %d" % len(REPORT["warnings"]))
for w in REPORT["warnings"]:
    log("  -", w)
