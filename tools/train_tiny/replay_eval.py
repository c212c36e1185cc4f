#!/usr/bin/env python3
"""Replays the held-out evaluation set's prompts against a running m3serve (one request at a time)
and prints what the server's /metrics saw: generated tokens per second of wall time and, with a
DSpark draft, the mean accepted length (tokens committed per verify step) and the draft acceptance
rate. No scoring (eval.mjs scores); standard library only, for machines without Node or curl.
  python3 tools/train_tiny/replay_eval.py --url http://127.0.0.1:8000 [--temperature 0.7] [--limit N]
"""
import argparse
import json
import pathlib
import re
import time
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent


def metrics(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    out = {}
    for name in ("generation_tokens_total", "spec_accept_length_sum", "spec_accept_length_count",
                 "spec_draft_tokens_total", "spec_accepted_tokens_total"):
        m = re.search(r"^m3serve:%s(?:\{[^}]*\})? ([0-9.e+]+)" % name, text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="m3-tiny")
    ap.add_argument("--set", default=str(HERE / "eval_set.jsonl"))
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--limit", type=int, default=0, help="first N items of each task (0: all)")
    ap.add_argument("--max-tokens", type=int, default=256)
    a = ap.parse_args()
    items, per_task = [], {}
    for line in open(a.set):
        it = json.loads(line)
        per_task[it["task"]] = per_task.get(it["task"], 0) + 1
        if a.limit == 0 or per_task[it["task"]] <= a.limit:
            items.append(it)
    before, t0 = metrics(a.url), time.time()
    for it in items:
        body = {"model": a.model, "messages": it["messages"], "temperature": a.temperature,
                "max_tokens": a.max_tokens}
        if it.get("tools"):
            body["tools"] = it["tools"]
        mode = (it.get("kwargs") or {}).get("thinking_mode")
        if mode:  # as eval.mjs sends it
            body["thinking"] = {"type": mode}
            body["chat_template_kwargs"] = {"thinking_mode": mode}
        req = urllib.request.Request(a.url + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=300).read()
    dt, after = time.time() - t0, metrics(a.url)
    d = {k: after[k] - before[k] for k in after}
    steps = d["spec_accept_length_count"]
    print(json.dumps({
        "items": len(items), "temperature": a.temperature, "seconds": round(dt, 2),
        "generated_tokens": int(d["generation_tokens_total"]),
        "tokens_per_s": round(d["generation_tokens_total"] / dt, 1),
        "verify_steps": int(steps),
        "mean_accept_length": round(d["spec_accept_length_sum"] / steps, 3) if steps else None,
        "acceptance_rate": round(d["spec_accepted_tokens_total"] / d["spec_draft_tokens_total"], 3)
        if d["spec_draft_tokens_total"] else None}))


if __name__ == "__main__":
    main()
