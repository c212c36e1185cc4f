"""Generated tools for m3-tiny: tool schemas whose names, descriptions, parameter names, types
(string, integer, number, boolean, enum, array, object) and required lists vary, so the model
learns to read a schema and copy names and values from the prompt instead of memorising six tools.

Two kinds of schema:
* made-up tools from word pools: `<verb>_<noun>` with parameters named from a pool of parameter
  words (`flight_code`, `max_price`, ...); the user names each argument by its words ("... with
  flight code ZX481 and max price 120");
* renamed variants of the six fixed tools (`get_weather` with `location` instead of `city`,
  `weather_now` instead of `get_weather`, reworded descriptions), asked with the fixed tools'
  own prompts.

Train / held-out: the verbs, nouns, parameter words, description templates and the renames are
split by hash (corpus.split_pool); a held-out schema uses at least one held-out word (made-up
tools) or a held-out rename, so the evaluation sees whole schemas and names never trained on.
"""

import copy
import json
import random

import corpus

VERBS = corpus.split_pool("""get|find|lookup|check|list|create|book|cancel|update|delete|send|fetch|track|
compute|translate|order|reserve|set|start|stop|search|add|remove|rename|share|rate|play|pause|
schedule|verify|estimate|convert|count|open|close|archive|publish|download|upload|scan""".replace("\n", "").split("|"))
NOUNS = corpus.split_pool("""flight|hotel|order|package|stock_price|recipe|movie|song|balance|reminder|alarm|
invoice|ticket|car|restaurant|word|file|playlist|podcast|note|contact|task|route|parking|train|
bus|meeting|report|photo|album|device|light|thermostat|door|account|coupon|review|lesson|
workout|meal|pet|plant|book|game|team|score|station|ride|bill|budget""".replace("\n", "").split("|"))
PARAM_WORDS = corpus.split_pool("""code|name|date|time|count|limit|price|amount|city|country|language|
color|size|level|mode|title|label|query|number|email|phone|address|owner|user|room|seat|rating|
priority|status|category|tag|format|duration|speed|volume|channel|genre|artist|brand|model|
year|month|day|hour|page|weight|height|distance|temperature|currency|region|zone|note""".replace("\n", "").split("|"))
PARAM_PREFIX = corpus.split_pool("max|min|start|end|target|source|new|old|preferred|home|work|main|extra|first|last".split("|"))
DESCRIPTIONS = corpus.split_pool([
    "{Verb} a {noun}.", "{Verb} the {noun} for the user.", "Use this to {verb} a {noun}.",
    "{Verb} one {noun} by its details.", "Tool that can {verb} a {noun}.",
    "{Verb} {noun} records.", "Lets the assistant {verb} a {noun}.", "{Verb} a {noun} in the system.",
    "Call this to {verb} the {noun}.", "{Verb} any {noun}.",
])
ENUM_VALUES = ["low", "medium", "high", "small", "large", "fast", "slow", "daily", "weekly", "monthly",
               "red", "green", "blue", "public", "private", "draft", "final", "economy", "business", "first"]
REQUESTS = corpus.split_pool([
    "Please {verb} the {noun} with {args}.", "{Verb} a {noun}: {args}.", "Can you {verb} the {noun} for {args}?",
    "I need you to {verb} a {noun} with {args}.", "{Verb} the {noun}, {args}.",
    "Could you {verb} my {noun} using {args}?", "Help me {verb} a {noun} with {args}.",
    "Go ahead and {verb} the {noun}: {args}.",
])

# Renamed variants of the fixed tools: {tool: ([tool names], {argument: [names]}, [descriptions])}.
RENAMES = {
    "get_weather": (["get_weather", "weather_now", "current_weather", "fetch_weather", "weather_lookup",
                     "check_weather", "get_forecast"],
                    {"city": ["city", "location", "place", "town", "city_name", "where"],
                     "unit": ["unit", "units", "temperature_unit", "scale"]},
                    ["Get the current weather in a city.", "Current weather for a place.",
                     "Look up the weather somewhere.", "Returns today's weather conditions for a location.",
                     "Weather report for a town."]),
    "get_time": (["get_time", "current_time", "time_in_zone", "clock_lookup", "world_clock", "what_time"],
                 {"timezone": ["timezone", "tz", "zone", "time_zone", "iana_zone"]},
                 ["Get the current time in a time zone.", "Current local time for a zone.",
                  "Tells the time in an IANA time zone.", "Look up the clock in a region."]),
    "search_web": (["search_web", "web_search", "internet_search", "find_online", "search_internet"],
                   {"query": ["query", "q", "search_terms", "text", "keywords"],
                    "max_results": ["max_results", "limit", "num_results", "count", "top_k"]},
                   ["Search the web.", "Run a web search and return links.", "Find pages on the internet.",
                    "Look things up online."]),
    "convert_currency": (["convert_currency", "currency_convert", "exchange_money", "fx_convert",
                          "money_exchange"],
                         {"amount": ["amount", "value", "sum", "quantity"],
                          "from": ["from", "source_currency", "from_currency", "base"],
                          "to": ["to", "target_currency", "to_currency", "quote"]},
                         ["Convert an amount between currencies.", "Exchange money from one currency to another.",
                          "Currency conversion at today's rate."]),
}
RENAME_SPLIT = {t: (corpus.split_pool(names, 4), {a: corpus.split_pool(v, 4) for a, v in args.items()},
                    corpus.split_pool(descs, 4)) for t, (names, args, descs) in RENAMES.items()}


def _pick(rng, pools, split):
    train, held = pools
    if split == "train" or not held:
        return rng.choice(train)
    return rng.choice(held)


def _words(name):
    return name.replace("_", " ")


def _value(rng, typ, split, enum=None):
    """A value of a JSON type and the words the user says for it."""
    if enum:
        v = rng.choice(enum)
        return v, v
    if typ == "integer":
        v = rng.randint(1, 999)
        return v, str(v)
    if typ == "number":
        v = rng.randint(1, 9999) / 10.0
        return v, repr(v)
    if typ == "boolean":
        v = rng.random() < 0.5
        return v, "true" if v else "false"
    if typ == "array":
        v = [corpus.fresh_value(rng, "name") for _ in range(rng.randint(1, 3))]
        return v, corpus._join_names(v)
    # string: a made-up word, a code, or a two-word value
    r = rng.random()
    if r < 0.4:
        v = corpus.fresh_value(rng, "name")
    elif r < 0.7:
        v = "%s%d" % ("".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(2)), rng.randint(10, 9999))
    else:
        v = "%s %s" % (corpus.fresh_value(rng, "name"), corpus.fresh_value(rng, "name"))
    return v, v


def _param_name(rng, split, used):
    for _ in range(20):
        w = _pick(rng, PARAM_WORDS, split if rng.random() < 0.7 else "train")
        if rng.random() < 0.4:
            w = _pick(rng, PARAM_PREFIX, split if rng.random() < 0.5 else "train") + "_" + w
        if w not in used:
            return w
    return "field_%d" % len(used)


def made_up_tool(rng, split):
    """(schema, user prompt, arguments, verb, noun) of a generated tool."""
    verb, noun = _pick(rng, VERBS, split), _pick(rng, NOUNS, split)
    if split == "heldout" and rng.random() < 0.5:  # at least one held-out word: sometimes only one
        if rng.random() < 0.5:
            verb = _pick(rng, VERBS, "train")
        else:
            noun = _pick(rng, NOUNS, "train")
    name = "%s_%s" % (verb, noun)
    desc = _pick(rng, DESCRIPTIONS, split).format(Verb=verb.capitalize(), verb=verb, noun=_words(noun))
    props, used, said, args, required = {}, set(), [], {}, []
    for i in range(rng.choice([1, 1, 2, 2, 3, 3, 4])):
        p = _param_name(rng, split, used)
        used.add(p)
        typ = rng.choices(["string", "integer", "number", "boolean", "enum", "array", "object"],
                          weights=[5, 2, 1, 1, 2, 1, 1])[0]
        if typ == "enum":
            enum = rng.sample(ENUM_VALUES, rng.randint(2, 4))
            props[p] = {"type": "string", "enum": enum}
            v, words = _value(rng, "string", split, enum)
        elif typ == "array":
            props[p] = {"type": "array", "items": {"type": "string"}}
            v, words = _value(rng, "array", split)
        elif typ == "object":
            s1, s2 = _param_name(rng, split, set()), None
            s2 = _param_name(rng, split, {s1})
            t2 = rng.choice(["string", "integer"])
            props[p] = {"type": "object", "properties": {s1: {"type": "string"}, s2: {"type": t2}}}
            v1, w1 = _value(rng, "string", split)
            v2, w2 = _value(rng, t2, split)
            v = {s1: v1, s2: v2}
            words = "%s %s and %s %s" % (_words(s1), w1, _words(s2), w2)
        else:
            props[p] = {"type": typ}
            v, words = _value(rng, typ, split)
        if rng.random() < 0.3:
            props[p]["description"] = "The %s." % _words(p)
        is_required = i == 0 or rng.random() < 0.6
        if is_required:
            required.append(p)
        if is_required or rng.random() < 0.5:  # optional arguments are asked for half the time
            args[p] = v
            said.append("%s %s" % (_words(p), words) if typ != "object" else "%s with %s" % (_words(p), words))
    if any(props[p]["type"] in ("array", "object") for p in args):  # their values hold "," and "and"
        arg_text = "; ".join(said)
    else:
        arg_text = said[0] if len(said) == 1 else ", ".join(said[:-1]) + " and " + said[-1]
    prompt = _pick(rng, REQUESTS, split).format(Verb=verb.capitalize(), verb=verb, noun=_words(noun), args=arg_text)
    schema = {"type": "function", "function": {
        "name": name, "description": desc,
        "parameters": {"type": "object", "properties": props, "required": required}}}
    return schema, prompt, args, verb, noun


def renamed_tool(rng, split, base=None):
    """(schema, user prompt, arguments) of a renamed variant of a fixed tool."""
    base = base or rng.choice(sorted(RENAMES))
    names, argnames, descs = RENAME_SPLIT[base]
    schema = copy.deepcopy(corpus.TOOLS[base])
    prompt, args, _, _, _ = corpus.make_tool_task(rng, split, base)
    held = split == "heldout"
    # a held-out schema renames the tool or at least one argument with a held-out name
    force = rng.choice(["name"] + sorted(argnames)) if held else None
    fn = schema["function"]
    fn["name"] = _pick(rng, names, "heldout" if force == "name" else "train")
    fn["description"] = _pick(rng, descs, split)
    props = fn["parameters"]["properties"]
    mapping = {a: _pick(rng, argnames[a], "heldout" if force == a else "train") for a in argnames}
    fn["parameters"]["properties"] = {mapping.get(k, k): v for k, v in props.items()}
    fn["parameters"]["required"] = [mapping.get(k, k) for k in fn["parameters"].get("required", [])]
    args = {mapping.get(k, k): v for k, v in args.items()}
    return schema, prompt, args, base


def call_plan(args):
    """The reasoning's account of a call's arguments, each name with its value in the call's
    order ("min_year = medium, min_time = 5"), or "no arguments". Naming the values as well as the
    names keeps the call from repeating one parameter in place of the next."""
    if not args:
        return "no arguments"
    return ", ".join("%s = %s" % (k, v if isinstance(v, str) else json.dumps(v, ensure_ascii=False))
                     for k, v in args.items())


def call_plan_problems(s):
    """[] when the reasoning before the call of sample `s` (if it has one) ends with
    call_plan(expected arguments); else why not."""
    call = next((m for m in s["messages"] if m.get("tool_calls")), None)
    think = call.get("reasoning_content") if call else None
    if think is None or think.endswith(" with %s." % call_plan(s["expect"]["arguments"])):
        return []
    return ["reasoning %r does not name the call's arguments and values" % think]


def _offered(rng, target, base=None):
    """The target schema among 0..3 other tools (fixed or generated), in random order. Never beside
    the fixed tool `base` that the target renames: the two would do the same thing, and either
    call would be right (fresh_tools' distractors follow the same rule). The base is dropped after
    the shuffle, so the random stream, and every other item drawn from it, stays the same."""
    others = [corpus.TOOLS[t] for t in rng.sample(corpus.TOOL_NAMES, rng.randint(0, 2))]
    if rng.random() < 0.5:
        others.append(made_up_tool(rng, "train")[0])
    others = [o for o in others if o["function"]["name"] != target["function"]["name"]]
    tools = others + [target]
    rng.shuffle(tools)
    return [t for t in tools if base is None or t is target or t["function"]["name"] != base]


def sample(rng, split, mode=None, kind=None, with_result=None):
    """A conversation with generated tools; task 'gtool' (a call is expected) or 'gtool_none'
    (no offered tool fits: a plain answer)."""
    mode = mode or corpus._mode(rng)
    kind = kind or rng.choices(["made_up", "renamed", "none"], weights=[6, 3, 1])[0]
    msgs = corpus._prefix(rng)
    if kind == "none":
        target, prompt, _, verb, noun = made_up_tool(rng, split)
        other, _, _, _, _ = made_up_tool(rng, split)
        tools = [other] if other["function"]["name"] != target["function"]["name"] else []
        tools += [corpus.TOOLS[t] for t in rng.sample(corpus.TOOL_NAMES, rng.randint(0, 2))]
        rng.shuffle(tools)
        msgs.append({"role": "user", "content": prompt})
        msg = {"role": "assistant", "content": "Sorry, I have no tool for that here, so I cannot do it."}
        if mode != "disabled":
            msg["reasoning_content"] = "The user wants to %s a %s, but no offered tool does that." % (verb, _words(noun))
        msgs.append(msg)
        return {"task": "gtool_none", "messages": msgs, "tools": tools or None,
                "kwargs": corpus._kwargs(rng, mode), "expect": {"name": None, "arguments": None}}
    base = None
    if kind == "made_up":
        schema, prompt, args, verb, noun = made_up_tool(rng, split)
    else:
        schema, prompt, args, base = renamed_tool(rng, split)
    name = schema["function"]["name"]
    msgs.append({"role": "user", "content": prompt})
    call = {"role": "assistant", "content": "", "tool_calls": [corpus.tool_call(name, args, 0)]}
    if mode != "disabled":
        call["reasoning_content"] = "The offered tool %s fits the request. I will call it with %s." % (
            name, call_plan(args))
    msgs.append(call)
    if with_result if with_result is not None else rng.random() < 0.3:
        append_tool_result(rng, msgs, name, mode)
    return {"task": "gtool", "messages": msgs, "tools": _offered(rng, schema, base),
            "kwargs": corpus._kwargs(rng, mode), "expect": {"name": name, "arguments": args}}


def eval_set(seed=4321, n=240):
    """Held-out schemas: made-up tools (60%), renamed fixed tools (30%), no fitting tool (10%);
    thinking adaptive 50%, enabled 30%, disabled 20%; single user turn."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        kind = ["made_up"] * 6 + ["renamed"] * 3 + ["none"]
        kind = kind[i % 10]
        mode = ["adaptive"] * 5 + ["enabled"] * 3 + ["disabled"] * 2
        mode = mode[(i // 10) % 10]
        s = corpus.strip_last_assistant(sample(rng, "heldout", mode=mode, kind=kind, with_result=False))
        s["kwargs"] = {"thinking_mode": mode} if mode != "adaptive" else {}
        s["mode"] = mode
        s["id"] = "%s-%03d" % (s["task"], i)
        items.append(s)
    return items


def score(item, completion):
    """(ok, detail): the right tool with exactly the right arguments, or no call when none fits."""
    if item["expect"]["name"] is not None:
        return corpus.score(dict(item, task="tool"), completion)
    _, content = corpus.split_reasoning(completion, item.get("mode", "adaptive"))
    try:
        _, calls = corpus.parse_tool_calls(content, item["tools"])
    except Exception as e:  # noqa: BLE001
        return False, {"error": str(e)}
    return (not calls and bool(content.strip())), {"got": [c[0] for c in calls], "want": "no call"}


def append_tool_result(rng, msgs, name, mode):
    """The tool's answer to call_0 (a made-up value) and the assistant's report of it."""
    word = corpus.fresh_value(rng, "name")
    msgs.append({"role": "tool", "tool_call_id": "call_0",
                 "content": json.dumps({"status": "ok", "result": word}, ensure_ascii=False)})
    final = {"role": "assistant", "content": "Done: %s returned %s." % (name, word)}
    if mode == "enabled":
        final["reasoning_content"] = "The tool answered. I will report the result."
    msgs.append(final)
