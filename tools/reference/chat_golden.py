#!/usr/bin/env python3
"""Golden chat-template renderings from transformers' apply_chat_template (the reference).

Inputs:
  --models DIR    one folder per model: DIR/<name>/tokenizer_config.json and optionally
                  DIR/<name>/chat_template.jinja (which wins, as in transformers). Made by
                  tools/reference/chat_golden_inputs.sh.
  --requests DIR  chat request bodies (*.json): messages, tools, documents, chat_template_kwargs,
                  add_generation_prompt (default true), continue_final_message (default false).
Output (--out FILE): JSON lines, one per (model, request), sorted:
  {"model": ..., "request": "<file name>", "ok": true, "prompt": "..."}
  {"model": ..., "request": ..., "ok": false, "error": "<exception type>: <message>"}
preceded by a header line {"header": {...versions, clock...}}.

Rendering is transformers' own code: PreTrainedTokenizerBase.apply_chat_template(tokenize=False)
on an object that carries only what it reads (chat_template, special_tokens_map), so the whole
tokenizer (tokenizer.json) is not needed. The request is first preprocessed as vLLM does
(assistant tool-call arguments given as a JSON string are parsed into an object).
strftime_now is frozen at --now (Unix seconds) in time zone UTC so goldens are reproducible.

--engine jinja2 renders without transformers, with a jinja2 environment set up like
transformers' (for local development only; CI goldens must come from --engine transformers).
"""

import argparse
import copy
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path

SPECIAL_TOKENS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                  "mask_token"]
# Names apply_chat_template binds itself; a template kwarg of that name is refused (also by
# m3serve), because in Python it would either be a TypeError or change the call.
RESERVED_KWARGS = {"conversation", "messages", "tools", "documents", "chat_template",
                   "add_generation_prompt", "continue_final_message", "tokenize", "padding",
                   "truncation", "max_length", "return_tensors", "return_dict",
                   "return_assistant_tokens_mask", "tokenizer_kwargs"}


def frozen_datetime_class(now_unix):
    class FrozenDatetime(_dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return _dt.datetime.fromtimestamp(now_unix, tz)
    return FrozenDatetime


def load_model(folder: Path):
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.exists() else {}
    jinja_path = folder / "chat_template.jinja"
    if jinja_path.exists():
        template = jinja_path.read_text(encoding="utf-8")
    else:
        template = cfg.get("chat_template")
        if isinstance(template, list):  # transformers turns the list into a dict
            template = {t["name"]: t["template"] for t in template}
    if template is None:
        raise SystemExit(f"{folder}: no chat template (chat_template.jinja or tokenizer_config)")
    # special_tokens_map: the attributes set to a non-empty value, as strings.
    special = {}
    for name in SPECIAL_TOKENS:
        v = cfg.get(name)
        if isinstance(v, dict):
            v = v.get("content")
        if v:
            special[name] = str(v)
    return template, special


def vllm_preprocess(messages):
    """vLLM chat_utils._postprocess_messages: tool-call arguments as dicts."""
    for message in messages:
        if (message.get("role") == "assistant" and "tool_calls" in message
                and isinstance(message["tool_calls"], list)):
            for item in message["tool_calls"]:
                if content := item["function"].get("arguments"):
                    if not isinstance(content, (dict, list)):
                        item["function"]["arguments"] = json.loads(content)
                else:
                    item["function"]["arguments"] = {}


class TransformersRenderer:
    def __init__(self, now_unix):
        import transformers
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.utils import chat_template_utils
        chat_template_utils.datetime = frozen_datetime_class(now_unix)

        class MinimalTokenizer:
            apply_chat_template = PreTrainedTokenizerBase.apply_chat_template
            get_chat_template = PreTrainedTokenizerBase.get_chat_template

            def __init__(self, chat_template, special_tokens_map):
                self.chat_template = chat_template
                self.special_tokens_map = special_tokens_map

        self.tokenizer_class = MinimalTokenizer
        self.render_jinja_template = chat_template_utils.render_jinja_template
        self.get_chat_template = PreTrainedTokenizerBase.get_chat_template
        # Prefer apply_chat_template itself; if this transformers version needs more of the
        # tokenizer than the minimal object has, fall back to the function it calls.
        self.path = "apply_chat_template"
        try:
            out = self._apply("{{ bos_token }}{{ messages[0]['content'] }}", {"bos_token": "<s>"},
                              [{"role": "user", "content": "x"}], None, None, False, False, {})
            assert out == "<s>x", out
        except (AttributeError, TypeError, AssertionError) as e:
            print(f"note: apply_chat_template on a minimal tokenizer failed ({e!r}); "
                  "using render_jinja_template", file=sys.stderr)
            self.path = "render_jinja_template"
        self.version = f"{transformers.__version__} ({self.path})"

    def _apply(self, template, special, messages, tools, documents, add_generation_prompt,
               continue_final_message, kwargs):
        tok = self.tokenizer_class(template, special)
        return tok.apply_chat_template(
            messages, tools=tools, documents=documents, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, tokenize=False, return_dict=False,
            **kwargs)

    def _render(self, template, special, messages, tools, documents, add_generation_prompt,
                continue_final_message, kwargs):
        # What apply_chat_template does around render_jinja_template (transformers 5.x).
        tok = self.tokenizer_class(template, special)
        chat_template = self.get_chat_template(tok, None, tools)
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt are not compatible.")
        rendered, _ = self.render_jinja_template(
            conversations=[messages], tools=tools, documents=documents, chat_template=chat_template,
            return_assistant_tokens_mask=False, continue_final_message=continue_final_message,
            add_generation_prompt=add_generation_prompt, **{**special, **kwargs})
        return rendered[0]

    def render(self, *args):
        if self.path == "apply_chat_template":
            return self._apply(*args)
        return self._render(*args)


class Jinja2Renderer:
    """Development fallback mirroring transformers' environment and render_jinja_template."""

    def __init__(self, now_unix):
        import jinja2
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        self.version = "jinja2-" + jinja2.__version__
        now_cls = frozen_datetime_class(now_unix)

        class Generation(Extension):
            tags = {"generation"}

            def parse(self, parser):
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
                return jinja2.nodes.CallBlock(self.call_method("_gen"), [], [], body).set_lineno(lineno)

            def _gen(self, caller):
                return caller()

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        def strftime_now(format):
            return now_cls.now().strftime(format)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[Generation, loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        self.env = env

    def render(self, template, special, messages, tools, documents, add_generation_prompt,
               continue_final_message, kwargs):
        if isinstance(template, dict):
            if tools is not None and "tool_use" in template:
                template = template["tool_use"]
            elif "default" in template:
                template = template["default"]
            else:
                raise ValueError("This model has multiple chat templates with no default specified!")
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt are not compatible.")
        compiled = self.env.from_string(template)
        tag = "CONTINUE_FINAL_MESSAGE_TAG "
        chat = messages
        if continue_final_message:
            chat = copy.deepcopy(chat)
            final_message = chat[-1].get("content")
            if final_message is None:
                raise ValueError('continue_final_message is set but the final message has no "content" to continue!')
            if "content" not in template:
                raise ValueError('continue_final_message is set to "content" but this is not an accepted field in the chat_template')
            if isinstance(final_message, (list, tuple)):
                for block in reversed(final_message):
                    if "text" in block:
                        final_message = block["text"]
                        block["text"] = block["text"] + tag
                        break
                else:
                    raise ValueError("continue_final_message is set but we could not find any text to continue in the final message!")
            else:
                chat[-1]["content"] = chat[-1]["content"] + tag
        rendered = compiled.render(messages=chat, tools=tools, documents=documents,
                                   add_generation_prompt=add_generation_prompt,
                                   **{**special, **kwargs})
        if continue_final_message:
            if final_message.strip() not in rendered or tag.strip() not in rendered:
                raise ValueError("continue_final_message is set but the final message does not appear in the chat")
            loc = rendered.rindex(tag.strip())
            if rendered[loc:loc + len(tag)] == tag:
                rendered = rendered[:loc]
            else:
                rendered = rendered[:loc].rstrip()
        return rendered


def render_request(renderer, template, special, request):
    request = copy.deepcopy(request)
    messages = request["messages"]
    vllm_preprocess(messages)
    kwargs = request.get("chat_template_kwargs") or {}
    bad = sorted(set(kwargs) & RESERVED_KWARGS)
    if bad:
        raise ValueError(f"chat_template_kwargs may not set {bad}")
    add_gen = request.get("add_generation_prompt")
    add_gen = True if add_gen is None else add_gen
    cont = request.get("continue_final_message") or False
    return renderer.render(template, special, messages, request.get("tools"),
                           request.get("documents"), add_gen, cont, kwargs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", required=True, type=Path)
    ap.add_argument("--requests", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--engine", choices=["transformers", "jinja2"], default="transformers")
    ap.add_argument("--now", type=int, default=1767323045,  # 2026-01-02 03:04:05 UTC
                    help="Unix time strftime_now sees (time zone UTC)")
    args = ap.parse_args()

    os.environ["TZ"] = "UTC"
    time.tzset()
    renderer = (TransformersRenderer if args.engine == "transformers" else Jinja2Renderer)(args.now)

    models = sorted(p for p in args.models.iterdir() if p.is_dir())
    requests = sorted(args.requests.glob("*.json"))
    if not models or not requests:
        raise SystemExit("no models or no requests found")
    records = []
    for model in models:
        template, special = load_model(model)
        for req_path in requests:
            request = json.loads(req_path.read_text(encoding="utf-8"))
            rec = {"model": model.name, "request": req_path.name}
            try:
                rec["prompt"] = render_request(renderer, template, special, request)
                rec["ok"] = True
            except Exception as e:  # noqa: BLE001 - every failure is a recorded outcome
                rec["ok"] = False
                rec["error"] = f"{type(e).__name__}: {e}"
            records.append(rec)
    header = {"header": {"engine": args.engine, "version": renderer.version, "now_unix": args.now,
                         "tz": "UTC", "python": sys.version.split()[0],
                         "models": [m.name for m in models], "requests": len(requests)}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as f:
        f.write(json.dumps(header, ensure_ascii=False) + "\n")
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    ok = sum(r["ok"] for r in records)
    print(f"{len(records)} renderings ({ok} ok, {len(records) - ok} errors) -> {args.out}")


if __name__ == "__main__":
    main()
