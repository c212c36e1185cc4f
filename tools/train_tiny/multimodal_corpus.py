"""The vision-and-tools round of m3-tiny: the training mix (the text corpus of corpus.py, generated
tools of gen_tools.py, image questions of shapes.py) and the two held-out evaluation sets, in pure
Python (jinja2 for rendering only).

  python3 multimodal_corpus.py eval-sets         writes eval_tools_heldout.jsonl, eval_vision.jsonl
  python3 multimodal_corpus.py show [N]          prints N rendered training conversations

Image samples carry their image as {"type": "image", "seed": S} in the user content (the template
writes one ]<]image[>[ for it, as for an image_url part) and the seeds in sample["images"];
expand_image_tokens() turns each placeholder into ]<]start of image[>[ + N x ]<]image[>[ +
]<]end of image[>[, as the server does (docs/vision.md), N = 16 for the 112 x 112 images.
"""

import json
import os
import random
import sys

import corpus
import gen_tools
import shapes

HERE = os.path.dirname(os.path.abspath(__file__))
EVAL_TOOLS_PATH = os.path.join(HERE, "eval_tools_heldout.jsonl")
EVAL_VISION_PATH = os.path.join(HERE, "eval_vision.jsonl")
IMAGE = "]<]image[>["
IMAGE_START, IMAGE_END = "]<]start of image[>[", "]<]end of image[>["
PATCH, MERGE = 14, 2
TOKENS_PER_IMAGE = (shapes.SIZE // PATCH) ** 2 // (MERGE * MERGE)

# Shares of the training mix (the rest is corpus.training_sample's text mix).
SHARE_IMAGE, SHARE_GTOOL = 0.25, 0.20
QUESTIONS_PER_IMAGE = 2  # consecutive image conversations share an image (different questions)


def image_sample(rng, seed, split="train", mode=None, kind=None):
    mode = mode or corpus._mode(rng)
    kind, q, want, answer = shapes.question(rng, seed, split, kind)
    msgs = corpus._prefix(rng) if split == "train" else []
    msgs.append({"role": "user", "content": shapes.user_content(q, {"type": "image", "seed": seed})})
    msg = {"role": "assistant", "content": answer}
    if mode != "disabled":
        msg["reasoning_content"] = shapes.describe(shapes.layout(seed))
    msgs.append(msg)
    return {"task": "vision", "messages": msgs, "tools": None, "images": [seed],
            "kwargs": corpus._kwargs(rng, mode), "expect": {"kind": kind, "answer": want}}


def training_corpus(n, seed):
    """n conversations; the k-th image conversation asks about the image of seed
    shapes.TRAIN_SEED_BASE + k // QUESTIONS_PER_IMAGE (never an eval image)."""
    rng = random.Random(seed)
    out, n_img = [], 0
    for _ in range(n):
        r = rng.random()
        if r < SHARE_IMAGE:
            out.append(image_sample(rng, shapes.TRAIN_SEED_BASE + seed * 10_000_000 + n_img // QUESTIONS_PER_IMAGE))
            n_img += 1
        elif r < SHARE_IMAGE + SHARE_GTOOL:
            out.append(gen_tools.sample(rng, "train"))
        else:
            out.append(corpus.training_sample(rng))
    return out


def expand_image_tokens(text, tokens_per_image=TOKENS_PER_IMAGE):
    return text.replace(IMAGE, IMAGE_START + IMAGE * tokens_per_image + IMAGE_END)


def vision_eval_set(seed=777, n=120):
    """Held-out images (seeds 0..n-1) with held-out phrasings; kinds cycle colour, shape, count,
    position; thinking adaptive 50%, enabled 30%, disabled 20%. Content parts are image_url data
    URLs (PNG), as a client sends them."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        mode = (["adaptive"] * 5 + ["enabled"] * 3 + ["disabled"] * 2)[(i // 4) % 10]
        s = corpus.strip_last_assistant(image_sample(rng, i, "heldout", mode=mode,
                                                     kind=shapes.KINDS[i % len(shapes.KINDS)]))
        s["messages"][-1]["content"][0] = {"type": "image_url", "image_url": {"url": shapes.data_url(i)}}
        s["kwargs"] = {"thinking_mode": mode} if mode != "adaptive" else {}
        s["mode"] = mode
        s["id"] = "vision-%03d" % i
        items.append(s)
    return items


def score_vision(item, completion):
    _, content = corpus.split_reasoning(completion, item.get("mode", "adaptive"))
    ok = shapes.score(item["expect"]["kind"], item["expect"]["answer"], content)
    return ok, {"got": content.strip()[-120:], "want": item["expect"]["answer"]}


def write_jsonl(path, items):
    with open(path, "w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "eval-sets":
        write_jsonl(EVAL_TOOLS_PATH, gen_tools.eval_set())
        write_jsonl(EVAL_VISION_PATH, vision_eval_set())
        print("wrote", EVAL_TOOLS_PATH, EVAL_VISION_PATH)
    else:
        rng_n = int(sys.argv[2]) if len(sys.argv) > 2 else 3
        for s in training_corpus(rng_n, 0):
            print(expand_image_tokens(corpus.render(s)))
            print("-----")
