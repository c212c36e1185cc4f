#!/usr/bin/env python3
"""Expected outputs of the Jinja engine unit cases (tests/fixtures/chat/jinja_cases.json).

Each case {name, template, vars?} is rendered in transformers' chat-template environment
(transformers.utils.chat_template_utils._compile_jinja_template when transformers is installed,
else an equivalent jinja2 ImmutableSandboxedEnvironment: trim_blocks, lstrip_blocks, loopcontrols,
tojson override, raise_exception, strftime_now), with strftime_now frozen at --now in UTC.
Writes JSON lines {"name", "ok", "out"} or {"name", "ok": false, "error"} after a header line.
Usage: jinja_cases.py --cases tests/fixtures/chat/jinja_cases.json --out FILE [--engine ...]
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chat_golden import Jinja2Renderer, frozen_datetime_class  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--engine", choices=["transformers", "jinja2"], default="transformers")
    ap.add_argument("--now", type=int, default=1767323045)
    args = ap.parse_args()
    os.environ["TZ"] = "UTC"
    time.tzset()
    if args.engine == "transformers":
        import transformers
        from transformers.utils import chat_template_utils
        chat_template_utils.datetime = frozen_datetime_class(args.now)
        compile_template = chat_template_utils._compile_jinja_template
        version = "transformers-" + transformers.__version__
    else:
        r = Jinja2Renderer(args.now)
        compile_template = r.env.from_string
        version = r.version
    cases = json.loads(args.cases.read_text(encoding="utf-8"))
    with args.out.open("w", encoding="utf-8") as f:
        f.write(json.dumps({"header": {"engine": args.engine, "version": version,
                                       "now_unix": args.now, "tz": "UTC"}}) + "\n")
        for case in cases:
            rec = {"name": case["name"]}
            try:
                rec["out"] = compile_template(case["template"]).render(**case.get("vars", {}))
                rec["ok"] = True
            except Exception as e:  # noqa: BLE001 - failures are expected outcomes
                rec["ok"] = False
                rec["error"] = f"{type(e).__name__}: {e}"
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"{len(cases)} cases -> {args.out}")


if __name__ == "__main__":
    main()
