#!/usr/bin/env python3
"""Checks that the PyTorch model train.py trains (fast_model.py + vision_model.py) computes what
m3serve's C++ path computes for the same checkpoint and image: for items of eval_vision.jsonl it
compares the top-5 log-probabilities of the first generated tokens (greedy, float32) from a running
`m3serve serve` (the image sent as a PNG data URL: the server decodes, resizes, normalises, cuts
patches, runs the tower and injects the features) with the PyTorch models fed the PNG decoded by
PIL. Needs torch, numpy, PIL and jinja2 (any CPU build of torch) and the m3serve binary:

  python3 tools/train_tiny/make_vision_check_model.py /tmp/m3tiny-vision-check     (or a trained model)
  build/bin/m3serve serve --model-path /tmp/m3tiny-vision-check --port 18431 &
  python3 tools/train_tiny/check_vision_server.py --model-path /tmp/m3tiny-vision-check \\
      --url http://127.0.0.1:18431/v1 --bin build/bin/m3serve

Exits non-zero when a greedy token differs or a top-5 log-probability differs by more than --tol
(default 2e-3: both sides are float32 with different summation orders over 6 + 4 layers).
"""

import argparse
import base64
import json
import os
import subprocess
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import corpus  # noqa: E402
import fast_model  # noqa: E402
import multimodal_corpus  # noqa: E402
import vision_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "..", "build", "bin", "m3serve"))
    ap.add_argument("--items", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--tol", type=float, default=2e-3)
    a = ap.parse_args()
    cfg, tc, fc, ckpt = fast_model.load_model_dir(a.model_path)
    fast = fast_model.FastM3(fc)
    fast.load_state_dict(fast_model.state_from_checkpoint(ckpt, tc))
    vis = vision_model.VisionTower(cfg["vision_config"], cfg["projector_hidden_size"], tc["hidden_size"])
    n = vis.load_checkpoint_tensors(ckpt)
    assert n == len(vis.state_dict()), "vision tensors missing from the checkpoint"
    fast.eval()
    vis.eval()
    items = multimodal_corpus.read_jsonl(multimodal_corpus.EVAL_VISION_PATH)[:a.items]
    image_id = cfg["image_token_index"]
    worst, bad = 0.0, 0
    for it in items:
        url = it["messages"][-1]["content"][0]["image_url"]["url"]
        img = vision_model.load_rgb(base64.b64decode(url.split(",", 1)[1]))
        n_tok = img.shape[0] // 14 * (img.shape[1] // 14) // 4
        text = multimodal_corpus.expand_image_tokens(corpus.render(it, add_generation_prompt=True), n_tok)
        ids = json.loads(subprocess.run([a.bin, "tokenize", "--model-path", a.model_path], input=json.dumps(text) + "\n",
                                        capture_output=True, text=True, check=True).stdout.splitlines()[0])
        body = {"model": a.model_path, "messages": it["messages"], "temperature": 0, "max_tokens": a.tokens,
                "logprobs": True, "top_logprobs": 5, "skip_special_tokens": False}
        if it["kwargs"].get("thinking_mode"):
            body["chat_template_kwargs"] = {"thinking_mode": it["kwargs"]["thinking_mode"]}
        req = urllib.request.Request(a.url.rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        resp = json.load(urllib.request.urlopen(req, timeout=300))
        if resp["usage"]["prompt_tokens"] != len(ids):
            print("%s: prompt tokens: server %d, here %d" % (it["id"], resp["usage"]["prompt_tokens"], len(ids)))
            bad += 1
            continue
        server = resp["choices"][0]["logprobs"]["content"]
        with torch.no_grad():
            emb = vis(img[None])
            seq = list(ids)
            for step, tok_info in enumerate(server):
                x = torch.tensor([seq])
                logits = fast(x, img=(image_id, emb, None))[0, -1].double()
                lp = torch.log_softmax(logits, -1)
                top = lp.topk(5)
                mine = {int(i): float(v) for v, i in zip(top.values, top.indices)}
                theirs = tok_info["top_logprobs"]
                # compare by value rank (the server names tokens by text, not id)
                diffs = [abs(sv["logprob"] - mv) for sv, mv in zip(theirs, sorted(mine.values(), reverse=True))]
                worst = max(worst, max(diffs))
                greedy = int(top.indices[0])
                print("%s step %d: max |dlogprob| %.2e  top1 here %d (%.4f) server %r (%.4f)" % (
                    it["id"], step, max(diffs), greedy, float(top.values[0]), tok_info["token"], tok_info["logprob"]))
                if max(diffs) > a.tol:
                    bad += 1
                seq.append(greedy)
    print("worst |dlogprob| %.3g over %d items; %d problems" % (worst, len(items), bad))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
