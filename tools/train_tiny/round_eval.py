"""Evaluation of the vision-and-tools round inside train.py (it runs on the GPU machine with the
trained models): held-out tool schemas (eval_tools_heldout.jsonl) through the reference model,
held-out images (eval_vision.jsonl: PNG data URLs decoded with PIL and pre-processed as the server
does) through the fast model with the checkpoint-exact weights and the vision tower. Writes
eval_results_vision_tools.json into the fixtures folder; returns {"gtool": ..., "vision": ...}."""

import base64
import json
import os
import time
import traceback

import torch

import corpus
import gen_tools
import multimodal_corpus
import shapes


ROUND_TASKS = ("gtool", "gtool_none", "ntool", "ntool_none", "vision")
# Hand-written requests as a new user would make them (common tools, natural wording), scored the
# same way; fresh_tools.py keeps their names, signatures and descriptions out of training.
EVAL_NATURAL_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "eval_tools_natural.jsonl")


def _summary(rows):
    res = {"n": len(rows), "correct": sum(r["ok"] for r in rows)}
    for mode in ("adaptive", "enabled", "disabled"):
        rm = [r for r in rows if r["mode"] == mode]
        res[mode] = "%d/%d" % (sum(r["ok"] for r in rm), len(rm))
    res["accuracy"] = round(res["correct"] / max(1, res["n"]), 4)
    return res


def run(args, tok, ref_model, greedy_nocache, fast_eval, vis, image_id, eos, log, warn):
    import vision_model

    results = {}
    round_rows = []
    try:
        t_ev = time.time()
        gt_items = (multimodal_corpus.read_jsonl(multimodal_corpus.EVAL_TOOLS_PATH)[:args.eval_limit or None] +
                    multimodal_corpus.read_jsonl(EVAL_NATURAL_PATH)[:args.eval_limit or None])
        gt_prompts = [tok.encode(corpus.render(it, add_generation_prompt=True), add_special_tokens=False).ids
                      for it in gt_items]
        # Its own time limit: greedy_nocache takes the prompts shortest first, so a cut-off leaves out the
        # longest schemas, the hardest ones, and the figure would be biased upwards.
        outs = greedy_nocache(ref_model, gt_prompts, args.eval_max_new or 160,
                              deadline=t_ev + args.round_eval_seconds, batch=args.eval_batch)
        missing = sum(o is None for o in outs)
        if missing:
            warn("held-out tool schemas: %d of %d items not evaluated within --round-eval-seconds %.0f (the "
                 "longest prompts); the accuracy covers the rest only" % (missing, len(outs), args.round_eval_seconds))
        for it, o in zip(gt_items, outs):
            if o is not None:
                text = tok.decode(o, skip_special_tokens=False)
                ok, detail = gen_tools.score(it, text)
                round_rows.append({"id": it["id"], "task": it["task"], "mode": it["mode"], "ok": ok, "detail": detail,
                                   "completion": text})
        for t in ("gtool", "gtool_none", "ntool", "ntool_none"):
            results[t] = _summary([r for r in round_rows if r["task"] == t])
    except Exception as e:  # noqa: BLE001
        warn("held-out tool-schema evaluation failed: %r" % e)
        traceback.print_exc()
    if vis is not None:
        try:
            v_items = multimodal_corpus.read_jsonl(multimodal_corpus.EVAL_VISION_PATH)[:args.eval_limit or None]
            v_prompts, v_images = [], []
            for it in v_items:
                ims = [vision_model.load_rgb(base64.b64decode(p["image_url"]["url"].split(",", 1)[1]))
                       for m in it["messages"] if isinstance(m["content"], list)
                       for p in m["content"] if p.get("type") == "image_url"]
                n_tok = ims[0].shape[0] // 14 * (ims[0].shape[1] // 14) // 4
                text = multimodal_corpus.expand_image_tokens(corpus.render(it, add_generation_prompt=True), n_tok)
                v_prompts.append(tok.encode(text, add_special_tokens=False).ids)
                v_images.append(torch.stack(ims))
            outs = vision_model.greedy(fast_eval, vis, v_prompts, v_images, image_id, eos, args.eval_max_new or 100,
                                       batch=args.eval_batch)
            for it, o in zip(v_items, outs):
                text = tok.decode(o, skip_special_tokens=False)
                ok, detail = multimodal_corpus.score_vision(it, text)
                round_rows.append({"id": it["id"], "task": "vision", "mode": it["mode"], "ok": ok, "detail": detail,
                                   "kind": it["expect"]["kind"], "completion": text})
            vrows = [r for r in round_rows if r["task"] == "vision"]
            results["vision"] = _summary(vrows)
            results["vision"]["by_kind"] = {k: "%d/%d" % (sum(r["ok"] for r in vrows if r["kind"] == k),
                                                          sum(1 for r in vrows if r["kind"] == k)) for k in shapes.KINDS}
        except Exception as e:  # noqa: BLE001
            warn("held-out image evaluation failed: %r" % e)
            traceback.print_exc()
    for t in ROUND_TASKS:
        if t in results:
            log("EVAL %-13s accuracy %.1f%% (%d/%d)  adaptive %s  enabled %s  disabled %s %s" % (
                t, 100 * results[t]["accuracy"], results[t]["correct"], results[t]["n"], results[t]["adaptive"],
                results[t]["enabled"], results[t]["disabled"], results[t].get("by_kind", "")))
    for t in ROUND_TASKS:  # a few failures of every task (all of them are in the results file)
        for r in [r for r in round_rows if r["task"] == t and not r["ok"]][:5]:
            log("  FAIL %s [%s] %s | %r" % (r["id"], r["mode"], r["detail"], r["completion"][-300:]))
    with open(os.path.join(args.out_fixtures, "eval_results_vision_tools.json"), "w") as f:
        json.dump({"summary": {k: results[k] for k in ROUND_TASKS if k in results}, "items": round_rows},
                  f, indent=1, ensure_ascii=False)
        f.write("\n")
    return {k: results[k] for k in ROUND_TASKS if k in results}
