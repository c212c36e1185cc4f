#!/usr/bin/env python3
"""Write tests/fixtures/m3_tiny/template_cases.json: chat_template.jinja rendered with Hugging
Face's Jinja settings (corpus.render) for a spread of conversations, so a Jinja engine can be
checked against it. Usage: python3 tools/train_tiny/make_template_cases.py [OUT]"""
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import corpus  # noqa: E402


def cases():
    rng = random.Random(11)
    out = []
    for _ in range(60):
        s = corpus.training_sample(rng)
        out.append({"messages": s["messages"], "tools": s["tools"], "kwargs": s["kwargs"],
                    "add_generation_prompt": False})
        p = corpus.strip_last_assistant(s)
        out.append({"messages": p["messages"], "tools": p["tools"], "kwargs": p["kwargs"],
                    "add_generation_prompt": True})
    out.append({"messages": [{"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image"}]}],
                "tools": None, "kwargs": {"thinking_mode": "enabled", "reasoning_effort": "low"},
                "add_generation_prompt": True})
    out.append({"messages": [{"role": "user", "content": "x"},
                             {"role": "assistant", "content": "ok", "tool_calls": [
                                 {"type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
                             {"role": "tool", "content": "r"}],
                "tools": [corpus.TOOLS["get_time"]], "kwargs": {}, "add_generation_prompt": True})
    out.append({"messages": [{"role": "user", "content": "x"},
                             {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
                                 "name": "f", "arguments": {"b": True, "c": False, "n": None, "f": 2.5, "i": 3,
                                                            "l": [1, {"k": "v"}], "o": {"p": [True]}}}}]}],
                "tools": None, "kwargs": {"thinking_mode": "bogus"}, "add_generation_prompt": False})
    for c in out:
        c["expected"] = corpus.render({"messages": c["messages"], "tools": c["tools"], "kwargs": c["kwargs"]},
                                      add_generation_prompt=c["add_generation_prompt"])
    return out


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "../../tests/fixtures/m3_tiny/template_cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"template": "models/m3-tiny/chat_template.jinja (= tools/train_tiny/chat_template.jinja)",
                   "renderer": "jinja2 ImmutableSandboxedEnvironment(trim_blocks, lstrip_blocks, loopcontrols), "
                               "tojson = json.dumps(ensure_ascii=False): Hugging Face's settings",
                   "variables": "messages, tools, add_generation_prompt, plus kwargs (thinking_mode, reasoning_effort)",
                   "cases": cases()}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print("wrote", path)
