"""Fresh tool schemas for the vision-and-tools round: a new schema for every training
conversation, from an open vocabulary that shares nothing with the held-out tool schemas.

Made-up tools are `<verb>_<noun>` (sometimes `<verb>_<noun>_<noun>` or a made-up word) with 1-4
parameters named `<word>` or `<prefix>_<word>`; the words come from the lists below, from
syllable words made up on the spot and from the tokenizer's letter pieces (corpus.COPY_PIECES),
so names are copied from the schema rather than recalled. Types, enums, required lists,
descriptions and the user's wording vary as in gen_tools.py (which still writes the held-out set),
with more request and argument phrasings. Renamed variants of the six fixed tools get names,
parameter names and descriptions from synonym lists, made-up words and pieces. A share of the
conversations offers no fitting tool (distractors that share the verb or the noun included): the
assistant answers without a call. About 40% of the conversations (KIND_WEIGHTS) are everyday tools
as users write them, asked for in other words than the tool's (natural_tools.py: kinds "natural",
a call, and "natural_none", a decline), outside the domains of eval_tools_natural.jsonl.

Held out (never generated; fresh_data.py --check asserts it on every schema it draws):
* every word of gen_tools' held-out pools (VERBS, NOUNS, PARAM_WORDS, PARAM_PREFIX), as any
  `_`-separated part of a tool or parameter name (the six fixed tools keep their own names);
* every held-out rename of gen_tools.RENAME_SPLIT, as a whole tool or parameter name (a fixed
  tool's own parameter name stays allowed in that tool);
* every tool name of eval_tools_heldout.jsonl and eval_tools_natural.jsonl other than the six
  fixed tools, every (name, parameter set) signature there, their descriptions, and every
  held-out description (gen_tools' held-out templates and renamed descriptions; no description
  within 2 word edits of one);
* for the natural kinds also the domains of eval_tools_natural.jsonl (natural_tools.py's
  FORBIDDEN_NAME_PARTS and FORBIDDEN_REQUEST, checked by natural_tools.sample_problems).
"""

import copy
import json
import os
import random
import re
import sys

import corpus
import gen_tools
from fresh_vision import word_edits

HERE = os.path.dirname(os.path.abspath(__file__))
FIXED = set(corpus.TOOL_NAMES)


def _words(s):
    return [w for w in re.split(r"[\s|]+", s) if w]


# ------------------------------------------------------------------------------------------------
# What is held out.
# ------------------------------------------------------------------------------------------------
HELD_PARTS = set(gen_tools.VERBS[1]) | set(gen_tools.NOUNS[1]) | set(gen_tools.PARAM_WORDS[1]) | set(gen_tools.PARAM_PREFIX[1])
HELD_RENAME_NAMES = {n for names, _, _ in gen_tools.RENAME_SPLIT.values() for n in names[1]}
HELD_RENAME_ARGS = {a for _, args, _ in gen_tools.RENAME_SPLIT.values() for v in args.values() for a in v[1]}
HELD_DESCRIPTIONS = {d for _, _, descs in gen_tools.RENAME_SPLIT.values() for d in descs[1]}
HELD_DESC_TEMPLATES = list(gen_tools.DESCRIPTIONS[1])
FIXED_PARAMS = {t: {p for p in corpus.TOOLS[t]["function"]["parameters"]["properties"]} for t in FIXED}


def _param_paths(params, prefix=""):
    out = []
    for p, spec in (params or {}).get("properties", {}).items():
        out.append(prefix + p)
        if spec.get("type") == "object":
            out += _param_paths(spec, prefix + p + ".")
    return out


def signature(schema):
    f = schema["function"]
    return f["name"], frozenset(_param_paths(f.get("parameters")))


FIXED_SIGNATURES = {signature(corpus.TOOLS[t]) for t in FIXED}


# The generated held-out set and the hand-written requests a new user would make.
EVAL_TOOL_FILES = ("eval_tools_heldout.jsonl", "eval_tools_natural.jsonl")


def _eval_tools():
    names, sigs, descs = set(), set(), set()
    for fn in EVAL_TOOL_FILES:
        with open(os.path.join(HERE, fn), encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.strip()]
        for item in lines:
            for t in item.get("tools") or []:
                if t == corpus.TOOLS.get(t["function"]["name"]):
                    continue  # one of the six fixed tools as it is
                if t["function"]["name"] not in FIXED:
                    names.add(t["function"]["name"])
                if signature(t) not in FIXED_SIGNATURES:
                    sigs.add(signature(t))
                descs.add(t["function"].get("description", ""))
    return names, sigs, descs


EVAL_NAMES, EVAL_SIGNATURES, EVAL_DESCRIPTIONS = _eval_tools()
FORBIDDEN_NAMES = EVAL_NAMES | HELD_RENAME_NAMES


def _norm(text):
    return re.sub(r"[^a-z0-9{} ]+", " ", text.lower()).split()


def desc_too_close(text):
    n = _norm(text)
    held = [_norm(h) for h in HELD_DESC_TEMPLATES] + [_norm(h) for h in HELD_DESCRIPTIONS]
    return any(word_edits(n, h) < 3 for h in held)


def name_ok(name):
    return name not in FORBIDDEN_NAMES and not (set(name.split("_")) & HELD_PARTS)


def param_ok(p, base=None):
    if base is not None and p in FIXED_PARAMS.get(base, ()):  # the fixed tool's own name
        return True
    return p not in HELD_RENAME_ARGS and not (set(p.split("_")) & HELD_PARTS)


def violations(schema, base=None):
    """Why a generated schema touches the held-out set ([] when it does not). base: the fixed
    tool it renames (its own names are allowed), None for a made-up tool."""
    if base is not None and schema == corpus.TOOLS[base]:
        return []
    f = schema["function"]
    bad = []
    name = f["name"]
    if name in FORBIDDEN_NAMES:
        bad.append("name %s is held out" % name)
    if set(name.split("_")) & HELD_PARTS and not (base is not None and name == base):
        bad.append("name %s has a held-out word %s" % (name, set(name.split("_")) & HELD_PARTS))
    for p in _param_paths(f.get("parameters")):
        for part in p.split("."):
            if not param_ok(part, base):
                bad.append("parameter %s of %s is held out" % (p, name))
    if signature(schema) in EVAL_SIGNATURES:
        bad.append("signature of %s is an evaluation schema's" % name)
    d = f.get("description", "")
    if d and (d in HELD_DESCRIPTIONS or d in EVAL_DESCRIPTIONS or desc_too_close(d)):
        bad.append("description %r is held out" % d)
    return bad


# ------------------------------------------------------------------------------------------------
# The open vocabulary (filtered against the held-out words at import).
# ------------------------------------------------------------------------------------------------
VERB_WORDS = _words("""get find check list create book cancel delete fetch track compute order set start
search add remove rename share rate pause verify estimate open close archive publish download scan
read write show hide move copy paste print save load sync merge split sort filter rank match join
leave lock unlock enable disable mute block approve reject submit sign assign invite notify remind
measure weigh price quote plan draft edit review_later clean wash feed water walk charge refill
restock ship deliver return refund pay bill invoice_later sell buy lease rent borrow lend grant
revoke reset restore backup mount unmount install deploy build test label tag mark flag pin unpin
star like follow watch log record register enroll subscribe unsubscribe compare summarize render
resize crop rotate tune boost dim brighten heat cool arm disarm ping trace inspect audit repair
replace clear empty fill pack unpack collect gather swap rotate_keys encrypt decrypt hash compress
extract import export attach detach park unpark reserve_later confirm decline accept greet""")
NOUN_WORDS = _words("""flight hotel order package stock_price recipe movie balance reminder alarm invoice
restaurant file podcast note contact task route parking bus meeting report photo album device light
thermostat door coupon lesson workout meal pet plant book game team score station ride bill budget
garden lamp fan heater oven fridge printer camera speaker window blind gate garage pool shed
bike scooter boat truck van taxi ferry tram subway cabin tent room desk locker shelf folder
document spreadsheet slide chart graph table record entry ledger receipt payment transfer loan
deposit card wallet gift_card voucher discount offer deal cart basket wishlist product item
shipment parcel letter message chat thread channel_post comment post story poll survey quiz
exam grade course class homework project sprint ticket_later issue bug feature release build_job
server cluster node database backup_job cache queue topic stream video clip image icon logo
badge profile avatar friend group event party wedding trip journey tour visit appointment
doctor dentist clinic pharmacy prescription vaccine symptom recipe_box grocery pantry dish
snack drink coffee tea juice bakery farm harvest crop seed tree flower lawn hedge fence roof
wall floor tile paint brush canvas sculpture museum gallery concert festival match_day race
league player coach referee stadium ticket_office seat_map menu reservation table_booking
shift schedule_slot calendar agenda timer stopwatch countdown habit goal streak diary journal
password key token license subscription plan_tier membership vote election petition donation
charity volunteer shelter adoption kennel aquarium habitat map_pin address_book contact_card""")
PARAM_PARTS = _words("""code name date time limit price city country language size level title label query
number email address owner room seat rating priority status category tag format duration speed
channel genre artist brand month hour page height distance temperature currency region zone note
id key value text message reason comment description summary width depth length area radius
angle latitude longitude altitude street postcode zip state province district building floor_no
unit_no door_code pin_code account_id user_id order_id item_id product_id sku quantity_left
stock budget cost fee tax tip discount percent ratio score rank position step index offset
start_date end_date due_date deadline interval frequency repeat timeout delay retries attempts
version release branch commit path folder filename extension size_mb bytes url link domain host
port protocol method header token secret scope role group team member guest host_name nickname
first_name last_name full_name age gender birthday phone_no mobile fax website company department
position_title salary currency_code locale timezone_name lang country_code flag_emoji theme font
style color_hex shade icon emoji mood topic subject body content caption alt_text keyword_list
filter sort_by order_by direction threshold minimum maximum target source destination origin
pickup dropoff via stops seats passengers adults children infants pets bags luggage cabin_class
meal_plan diet allergy cuisine dish course recipe_id servings calories protein carbs portion""")
PREFIXES = _words("""max start end target source new old preferred home work main extra first last
default backup primary secondary current next previous initial final total base local remote
public private custom daily weekly monthly yearly""")
ENUM_WORDS = gen_tools.ENUM_VALUES + _words("""basic standard premium pro lite plus tiny huge light dark
north south east west early late morning evening night weekday weekend open closed pending done
active paused archived urgent normal optional manual automatic json csv text html pdf png jpeg
asc desc none some all single double triple hourly instant scheduled""")
EXTRA_REQUESTS = [
    "{Verb} a {noun} with {args}.", "I'd like to {verb} a {noun}: {args}.", "Please {verb} a {noun}; {args}.",
    "Would you {verb} the {noun} with {args}?", "Time to {verb} a {noun}, {args}.",
    "Let's {verb} a {noun} with {args}.", "{Verb} this {noun}: {args}.", "Use {args} to {verb} a {noun}.",
    "I want to {verb} a {noun}. Use {args}.", "{Verb} my {noun} with {args}, please.",
    "Can you {verb} a {noun}? {Args}.", "Kindly {verb} the {noun} with {args}.",
    "Quick one: {verb} a {noun} with {args}.", "{Verb} a new {noun} with {args}.",
    "We need to {verb} the {noun}: {args}.", "Hey, {verb} a {noun} for me with {args}.",
]
REQUESTS = list(gen_tools.REQUESTS[0]) + EXTRA_REQUESTS
EXTRA_DESCRIPTIONS = [
    "This tool will {verb} a {noun}.", "{Verb} a {noun} with the given fields.", "Can {verb} a {noun}.",
    "Used to {verb} {noun} entries.", "{Verb} a {noun} on request.", "Function to {verb} a {noun}.",
    "{Verb} a {noun} and return the result.", "Helps {verb} a {noun}.", "{Verb} the given {noun}.",
    "A tool to {verb} a {noun}.", "{Verb} a single {noun}.", "Handles requests to {verb} a {noun}.",
    "{Verb} {noun}.", "Service that will {verb} a {noun} by its fields.",
]
DESCRIPTIONS = [d for d in list(gen_tools.DESCRIPTIONS[0]) + EXTRA_DESCRIPTIONS if not desc_too_close(d)]
PARAM_DESCRIPTIONS = ["The {p}.", "{P} of the {noun}.", "The {p} to use.", "Which {p}.", "{P}.", "The {p} value."]


def _clean(words):
    out = []
    for w in dict.fromkeys(words):
        w = w.replace("_later", "")
        if w in FORBIDDEN_NAMES or w in HELD_RENAME_ARGS or (set(w.split("_")) & HELD_PARTS):
            continue
        out.append(w)
    return out


VERB_WORDS, NOUN_WORDS = _clean(VERB_WORDS), _clean(NOUN_WORDS)
PARAM_PARTS, PREFIXES = _clean(PARAM_PARTS), _clean(PREFIXES)

_CONS, _VOWS = "bcdfghjklmnprstvwz", "aeiou"


def made_up_word(rng, lo=2, hi=3):
    """An ASCII identifier word: syllables, or tokenizer letter pieces when known."""
    while True:
        if corpus.COPY_PIECES and rng.random() < 0.5:
            w = "".join(rng.choice(corpus.COPY_PIECES) for _ in range(rng.randint(1, 2))).lower()
        else:
            w = "".join(rng.choice(_CONS) + rng.choice(_VOWS) + (rng.choice(_CONS) if rng.random() < 0.3 else "")
                        for _ in range(rng.randint(lo, hi)))
        if w.isascii() and w.isalpha() and 2 <= len(w) <= 14 and w not in HELD_PARTS and w not in FORBIDDEN_NAMES \
                and w not in HELD_RENAME_ARGS:
            return w


def _verb(rng):
    return rng.choice(VERB_WORDS) if rng.random() < 0.75 else made_up_word(rng)


def _noun(rng):
    r = rng.random()
    if r < 0.7:
        return rng.choice(NOUN_WORDS)
    if r < 0.85:
        return made_up_word(rng)
    return "%s_%s" % (rng.choice(NOUN_WORDS).split("_")[0], rng.choice(NOUN_WORDS).split("_")[-1])


def _param(rng, used, prefix=None):
    """A fresh parameter name not in `used`; `prefix`: the tool's shared prefix, taken 85% of the time."""
    for _ in range(50):
        w = rng.choice(PARAM_PARTS) if rng.random() < 0.7 else made_up_word(rng, 1, 3)
        if prefix is not None and rng.random() < 0.85:
            w = prefix + "_" + w.split("_")[-1]
        elif rng.random() < 0.4:
            w = (rng.choice(PREFIXES) if rng.random() < 0.8 else made_up_word(rng, 1, 2)) + "_" + w
        if w not in used and param_ok(w):
            return w
    return "field_%d" % len(used)


def _sp(w):
    return w.replace("_", " ")


def _join(said, sep_last=" and "):
    return said[0] if len(said) == 1 else ", ".join(said[:-1]) + sep_last + said[-1]


ARG_FORMS = ["{p} {v}"] * 6 + ["{p} {v}", "{p} is {v}", "{p}: {v}", "{p} set to {v}", "the {p} {v}", "{p} = {v}"]


BARE_REQUESTS = ["{Verb} {args}.", "Can you {verb} {args}?", "Please {verb} {args}.", "I want to {verb} {args}.",
                 "{Verb} {args} for me.", "Could you {verb} {args}, please?"]


def made_up_tool(rng, verb=None, noun=None):
    """(schema, prompt, arguments, verb, noun) of a fresh made-up tool."""
    want_verb, want_noun = verb, noun
    for _ in range(200):
        verb = want_verb or _verb(rng)
        noun = want_noun or _noun(rng)
        name = "%s_%s" % (verb, noun)
        if name_ok(name) and name not in FIXED:
            break
    else:
        raise RuntimeError("no free tool name for %s / %s" % (want_verb, want_noun))
    for _ in range(20):
        schema, prompt, args = _made_up_body(rng, name, verb, noun)
        if not violations(schema):
            return schema, prompt, args, verb, noun
    raise RuntimeError("no made-up tool outside the held-out set for %s" % name)


def _made_up_body(rng, name, verb, noun):
    desc_t = rng.choice(DESCRIPTIONS)
    desc = desc_t.format(Verb=verb.capitalize(), verb=verb, noun=_sp(noun))
    props, used, said, args, required = {}, set(), [], {}, []
    bare = None  # the words of the last argument said, when a bare value can stand for it
    form = rng.choice(ARG_FORMS)
    # A fifth of the tools name their parameters with one shared prefix (max_year, max_time), a
    # quarter of those with a made-up one: the call must tell them apart by what follows the
    # prefix, and a prefix never seen in training must not make the model write one name twice.
    shared = None
    if rng.random() < 0.2:
        shared = rng.choice(PREFIXES) if rng.random() < 0.75 else made_up_word(rng, 1, 1)
    for i in range(rng.choice([1, 1, 2, 2, 3, 3, 4])):
        p = _param(rng, used, shared)
        used.add(p)
        typ = rng.choices(["string", "integer", "number", "boolean", "enum", "array", "object"],
                          weights=[5, 2, 1, 1, 2, 1, 1])[0]
        if typ == "enum":
            enum = rng.sample(ENUM_WORDS, rng.randint(2, 5))
            props[p] = {"type": "string", "enum": enum}
            v = rng.choice(enum)
            words = v
        elif typ == "array":
            props[p] = {"type": "array", "items": {"type": "string"}}
            v, words = gen_tools._value(rng, "array", "train")
        elif typ == "object":
            s1 = _param(rng, set())
            s2 = _param(rng, {s1})
            t2 = rng.choice(["string", "integer"])
            props[p] = {"type": "object", "properties": {s1: {"type": "string"}, s2: {"type": t2}}}
            v1, w1 = gen_tools._value(rng, "string", "train")
            v2, w2 = gen_tools._value(rng, t2, "train")
            v = {s1: v1, s2: v2}
            words = "%s %s and %s %s" % (_sp(s1), w1, _sp(s2), w2)
        else:
            props[p] = {"type": typ}
            v, words = gen_tools._value(rng, typ, "train")
        if rng.random() < 0.3:
            props[p]["description"] = rng.choice(PARAM_DESCRIPTIONS).format(p=_sp(p), P=_sp(p).capitalize(),
                                                                            noun=_sp(noun))
        is_required = i == 0 or rng.random() < 0.6
        if is_required:
            required.append(p)
        if is_required or rng.random() < 0.5:
            args[p] = v
            said.append(form.format(p=_sp(p), v=words) if typ != "object" else "%s with %s" % (_sp(p), words))
            bare = words if typ in ("string", "integer", "number", "enum") else None
    if rng.random() < 0.25:  # the user names the arguments in another order
        rng.shuffle(said)
    if any(props[p]["type"] in ("array", "object") for p in args):
        arg_text = "; ".join(said)
    else:
        arg_text = _join(said)
    req = rng.choice(REQUESTS)
    if len(args) == 1 and bare is not None and rng.random() < 0.3:
        # One argument: users name the value alone ("Define serendipity.", "Play Miles Davis."),
        # and the schema says which parameter it fills.
        req, arg_text = rng.choice(BARE_REQUESTS), bare
    prompt = vary_wording(rng, req.format(Verb=verb.capitalize(), verb=verb, noun=_sp(noun), args=arg_text,
                                          Args=arg_text[0].upper() + arg_text[1:]))
    schema = {"type": "function", "function": {"name": name, "description": desc,
                                               "parameters": {"type": "object", "properties": props,
                                                              "required": required}}}
    if rng.random() < 0.05:
        del schema["function"]["description"]
    return schema, prompt, args


# Renamed fixed tools: {tool: (name parts, {parameter: [names]}, [descriptions])}.
RENAME_VOCAB = {
    "get_weather": (
        (_words("get fetch show find read query report see give pull load obtain"),
         _words("weather forecast conditions meteo sky climate weather_report weather_info outlook"),
         _words("now today info report data live here api current for_city by_city")),
        {"city": _words("city location place town city_name where locality area site spot destination loc "
                        "municipality place_name location_name target_city city_or_town settlement"),
         "unit": _words("unit temp_unit scale temperature_unit degrees unit_system measure temperature_scale "
                        "deg_unit system_of_units")},
        ["Weather for a place.", "Returns the weather in a city.", "Current conditions for a location.",
         "Get the weather somewhere.", "Weather by city.", "Tells the weather in a town.",
         "Shows temperature and sky for a city.", "Current weather for a place.", "Look up the weather somewhere.",
         "Returns today's weather conditions for a location.", "Weather report for a town.",
         "Fetch the weather of a given city.", "Reports how the weather is in a place."]),
    "get_time": (
        (_words("get fetch show read find query tell give obtain"),
         _words("time clock local_time hour datetime time_of_day wall_clock"),
         _words("now in_zone info here api current for_zone by_zone")),
        {"timezone": _words("tz zone time_zone iana_zone tz_name zone_name tz_id iana_tz olson_zone tzid "
                            "area_zone region_zone")},
        ["Get the current time in a time zone.", "Tells the time in an IANA time zone.",
         "Look up the clock in a region.", "Local time for a zone.", "Returns the time of day in a zone.",
         "What the clock shows in a time zone.", "Time of day for an IANA zone name."]),
    "search_web": (
        (_words("search find query browse look_up scan"),
         _words("web internet online net pages sites the_web www"),
         _words("now api pages results engine")),
        {"query": _words("query q search_terms text terms search_query phrase topic search_text question input "
                         "words term search_string"),
         "max_results": _words("max_results top_k n results how_many max_hits num_hits page_size k n_results "
                               "max_items hits top_n result_size")},
        ["Search the web.", "Find pages on the internet.", "Look things up on the internet.",
         "Web search; returns links.", "Search engine lookup.", "Finds web pages for a query.",
         "Searches online and returns the top links. Use 5 results unless asked otherwise."]),
    "convert_currency": (
        (_words("exchange change swap calc get compute"),
         _words("currency money fx forex cash rate"),
         _words("rate calc now api tool")),
        {"amount": _words("value sum total money amt figure how_much cash amount_value"),
         "from_currency": _words("from_currency source from_ccy base_currency currency_from src_currency "
                                 "sell_currency origin_currency"),
         "to_currency": _words("dest_currency currency_to buy_currency quote_currency ccy_to into_currency "
                               "out_currency")},
        ["Convert an amount between currencies.", "Currency conversion.", "Change money into another currency.",
         "Exchange an amount of money at the current rate.", "Converts money from one currency into another.",
         "FX conversion of an amount."]),
    "send_email": (
        (_words("email write compose dispatch post mail deliver"),
         _words("email mail message letter e_mail"),
         _words("now out to_user api")),
        {"to": _words("recipients to_addresses emails addressees recipient_list mail_to destinations"),
         "subject": _words("subject topic subject_line heading title_line summary"),
         "body": _words("body text message content mail_body email_text")},
        ["Send an email.", "Email someone.", "Deliver an email message.", "Writes and sends an email.",
         "Mail a message to people."]),
    "create_event": (
        (_words("add new make plan put create insert"),
         _words("event meeting appointment calendar_event calendar_entry"),
         _words("now entry item")),
        {"title": _words("title name event_title summary label event_name caption"),
         "start": _words("start start_time begins when starts_at begin datetime start_at"),
         "location": _words("location place venue where site spot")},
        ["Create a calendar event.", "Add an event to the calendar.", "Puts an appointment in the calendar.",
         "Schedules a calendar entry.", "New calendar event."]),
}
NESTED_RENAMES = {"city": _words("city town city_name"), "room": _words("room room_name hall room_id")}


def _rename_name(rng, base):
    (verbs, nouns, sufs), _, _ = RENAME_VOCAB[base]
    for _ in range(100):
        r = rng.random()
        if r < 0.1:
            name = base
        elif r < 0.2:
            name = made_up_word(rng) + "_" + rng.choice(nouns)
        elif r < 0.3:
            name = made_up_word(rng)
        else:
            v, n, s = rng.choice(verbs), rng.choice(nouns), rng.choice(sufs)
            name = rng.choice(["%s_%s" % (v, n), "%s_%s" % (n, s), "%s_%s_%s" % (v, n, s), "%s_%s" % (n, v), n])
        if name == base or (name_ok(name) and name not in FIXED):
            return name
    return base


def _rename_param(rng, base, p, pool):
    for _ in range(50):
        r = rng.random()
        if r < 0.25:
            q = p
        elif r < 0.33:
            q = made_up_word(rng, 2, 3)
        else:
            q = rng.choice(pool)
        if param_ok(q, base):
            return q
    return p


def _said(value, prompt):
    """Whether the user's words carry the argument's value (else it was a default)."""
    if isinstance(value, dict):
        return any(_said(v, prompt) for v in value.values())
    if isinstance(value, list):
        return any(_said(v, prompt) for v in value)
    return str(value).lower() in prompt.lower()


def _vary_parameters(rng, params, args, prompt):
    """A user's own version of a known tool rarely has its exact parameter set: drop parameters whose
    value the request does not say (the call then leaves them out: a weather tool with only
    `location`), and sometimes add an optional parameter nobody asked for (left out of the call)."""
    props, required = params["properties"], params.setdefault("required", [])
    for p in [p for p in list(args) if not _said(args[p], prompt)]:
        if len(props) > 1 and rng.random() < 0.5:
            del props[p], args[p]
            if p in required:
                required.remove(p)
    if rng.random() < 0.25:
        extra = _param(rng, set(props))
        props[extra] = {"type": rng.choice(["string", "string", "integer", "boolean"])}
        if rng.random() < 0.3:
            props[extra]["description"] = rng.choice(PARAM_DESCRIPTIONS).format(
                p=_sp(extra), P=_sp(extra).capitalize(), noun="request")


# Surface variation of a request (the values untouched): the fixed tools' prompts and the request
# templates are few, and a user writes "What is", "please" or no question mark.
_WORDING = [("What's ", "What is "), ("What's ", "whats "), ("Tell me ", "Can you tell me "),
            ("Tell me ", "Please tell me "), ("How is ", "How's "), ("Convert ", "Please convert "),
            ("Search the web for ", "Look up "), ("Send an email ", "Write an email "),
            ("What's the weather in ", "Is it raining in "), ("What's the weather in ", "Weather in "),
            ("What's the weather in ", "What is the weather like in "),
            ("What time is it in ", "What's the local time in "), ("What time is it in ", "Current time in "),
            ("Search the web for ", "Find "), ("Convert ", "Change "), ("How much is ", "What is ")]


def vary_wording(rng, prompt):
    if rng.random() < 0.5:
        return prompt
    for a, b in rng.sample(_WORDING, len(_WORDING)):
        if prompt.startswith(a):
            prompt = b + prompt[len(a):]
            break
    r = rng.random()
    if r < 0.2 and prompt[-1:] in "?.":
        prompt = prompt[:-1]
    elif r < 0.35:
        prompt = prompt[:-1] + " please" + prompt[-1:] if prompt[-1:] in "?." else prompt + " please"
    elif r < 0.5:
        prompt = rng.choice(["Hi! ", "Hey, ", "Quick one: ", "Thanks in advance. "]) + prompt
    return prompt


def renamed_tool(rng, base=None):
    """(schema, prompt, arguments, base) of a renamed variant of a fixed tool, asked with the
    fixed tool's own prompts (corpus.make_tool_task)."""
    base = base or rng.choices(sorted(RENAME_VOCAB), weights=[3 if b in gen_tools.RENAMES else 1
                                                             for b in sorted(RENAME_VOCAB)])[0]
    _, argnames, descs = RENAME_VOCAB[base]
    for _ in range(50):
        schema = copy.deepcopy(corpus.TOOLS[base])
        prompt, args, _, _, _ = corpus.make_tool_task(rng, "train", base)
        fn = schema["function"]
        fn["name"] = _rename_name(rng, base)
        if rng.random() < 0.8:
            d = rng.choice(descs)
            if d not in HELD_DESCRIPTIONS and not desc_too_close(d):
                fn["description"] = d
        props = fn["parameters"]["properties"]
        mapping = {a: _rename_param(rng, base, a, argnames[a]) for a in props if a in argnames}
        if len(set(mapping.values())) < len(mapping):
            continue
        if base == "create_event" and rng.random() < 0.5:
            loc = props["location"]
            sub = {k: rng.choice(NESTED_RENAMES[k]) for k in loc["properties"]}
            if len(set(sub.values())) == len(sub):
                loc["properties"] = {sub[k]: v for k, v in loc["properties"].items()}
                loc["required"] = [sub[k] for k in loc.get("required", [])]
                args["location"] = {sub[k]: v for k, v in args["location"].items()}
        fn["parameters"]["properties"] = {mapping.get(k, k): v for k, v in props.items()}
        fn["parameters"]["required"] = [mapping.get(k, k) for k in fn["parameters"].get("required", [])]
        args = {mapping.get(k, k): v for k, v in args.items()}
        _vary_parameters(rng, fn["parameters"], args, prompt)
        if schema != corpus.TOOLS[base] and not violations(schema, base):
            return schema, vary_wording(rng, prompt), args, base
    raise RuntimeError("no renamed %s found" % base)


def _distractor(rng, target_name, verb=None, noun=None, target_base=None):
    """Another tool: a made-up one (sharing the verb or the noun when asked), a fixed or a renamed
    one (never the fixed tool the target renames, nor another variant of it)."""
    r = rng.random()
    if r < 0.55 or verb or noun:
        for _ in range(20):
            t = made_up_tool(rng, verb=verb, noun=noun)[0]
            if t["function"]["name"] != target_name:
                return t, None
        return None, None
    bases = [b for b in corpus.TOOL_NAMES if b != target_base]
    if r < 0.8:
        b = rng.choice(bases)
        return corpus.TOOLS[b], b
    t, _, _, b = renamed_tool(rng, rng.choice(bases))
    return t, b


def _offer(rng, target, target_base, verb=None, noun=None, k=None):
    """The target (or None) among distractors in random order; returns (tools, [(schema, base)])."""
    k = rng.choice([0, 1, 1, 2, 2, 3]) if k is None else k
    tools, meta, names = [], [], {target["function"]["name"]} if target else set()
    for i in range(k):
        r = rng.random() if verb is not None else 1.0  # near misses: the same verb or the same noun
        t, b = _distractor(rng, target["function"]["name"] if target else "",
                           verb=verb if r < 0.2 else None, noun=noun if 0.2 <= r < 0.4 else None,
                           target_base=target_base)
        if t is not None and t["function"]["name"] not in names:
            names.add(t["function"]["name"])
            tools.append(t)
            meta.append((t, b))
    if target is not None:
        tools.append(target)
        meta.append((target, target_base))
    order = list(range(len(tools)))
    rng.shuffle(order)
    return [tools[i] for i in order], [meta[i] for i in order]


def append_call(rng, msgs, prompt, name, args, think, mode):
    """The user's request and the assistant's call of `name` (with its reasoning unless thinking
    is off); 30% of the time also the tool's result and the answer after it."""
    msgs.append({"role": "user", "content": prompt})
    call = {"role": "assistant", "content": "", "tool_calls": [corpus.tool_call(name, args, 0)]}
    if mode != "disabled":
        call["reasoning_content"] = think
    msgs.append(call)
    if rng.random() < 0.3:
        gen_tools.append_tool_result(rng, msgs, name, mode)


# Kinds of conversation and their weights: about 40% of them are natural_tools' everyday tools
# (natural: 5.4 / 17.1 = 31.6% calls, natural_none: 8.2% declines).
KIND_WEIGHTS = {"made_up": 6, "renamed": 3, "none": 1.3, "natural": 5.4, "natural_none": 1.4}


def kind_weights(spec):
    """KIND_WEIGHTS with the weights of `spec` ("made_up=7.5,natural=4"; "" keeps them all).
    Raises ValueError naming an unknown kind or a weight that is not a number >= 0."""
    weights = dict(KIND_WEIGHTS)
    for item in filter(None, (x.strip() for x in spec.split(","))):
        kind, _, value = (x.strip() for x in item.partition("="))
        if kind not in weights:
            raise ValueError("unknown kind %r (kinds: %s)" % (kind, ", ".join(weights)))
        try:
            weights[kind] = float(value)
        except ValueError:
            raise ValueError("%s=%r is not a number" % (kind, value)) from None
        if not weights[kind] >= 0:
            raise ValueError("%s=%s must be >= 0" % (kind, value))
    return weights


def sample(rng, mode=None, kind=None):
    """A conversation with fresh tools: 'gtool' (a call) or 'gtool_none' (nothing fits: a plain
    answer). sample["schemas"] lists (schema, base) of every offered tool for the checks; a
    natural one also has sample["natural"] (natural_tools.sample_problems checks it)."""
    mode = mode or corpus._mode(rng)
    kind = kind or rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
    if kind in ("natural", "natural_none"):
        import natural_tools  # here, not at the top: natural_tools imports this module

        return natural_tools.sample(rng, mode, kind)
    msgs = corpus._prefix(rng)
    if kind == "none":
        _, prompt, _, verb, noun = made_up_tool(rng)
        tools, meta = [], []
        for _ in range(rng.choice([1, 1, 2, 3])):
            r = rng.random()  # near misses: the same verb or the same noun, never both
            t, b = _distractor(rng, "%s_%s" % (verb, noun), verb=verb if r < 0.25 else None,
                               noun=noun if 0.25 <= r < 0.5 else None)
            if t is not None and t["function"]["name"] not in {x["function"]["name"] for x in tools} \
                    and t["function"]["name"] != "%s_%s" % (verb, noun):
                tools.append(t)
                meta.append((t, b))
        msgs.append({"role": "user", "content": prompt})
        msg = {"role": "assistant", "content": "Sorry, I have no tool for that here, so I cannot do it."}
        if mode != "disabled":
            msg["reasoning_content"] = "The user wants to %s a %s, but no offered tool does that." % (verb, _sp(noun))
        msgs.append(msg)
        return {"task": "gtool_none", "messages": msgs, "tools": tools or None, "kwargs": corpus._kwargs(rng, mode),
                "expect": {"name": None, "arguments": None}, "schemas": meta}
    if kind == "made_up":
        schema, prompt, args, verb, noun = made_up_tool(rng)
        base = None
        think = "The user wants to %s a %s. The offered tool %s does that. I will call it with %s." % (
            verb, _sp(noun), schema["function"]["name"], gen_tools.call_plan(args))
    else:
        schema, prompt, args, base = renamed_tool(rng)
        verb = noun = None
        think = "The offered tool %s fits the request. I will call it with %s." % (
            schema["function"]["name"], gen_tools.call_plan(args))
    name = schema["function"]["name"]
    append_call(rng, msgs, prompt, name, args, think, mode)
    tools, meta = _offer(rng, schema, base, verb, noun)
    return {"task": "gtool", "messages": msgs, "tools": tools, "kwargs": corpus._kwargs(rng, mode),
            "expect": {"name": name, "arguments": args}, "schemas": meta}


def sample_problems(s):
    """What is wrong with a conversation ([] when nothing): its call's reasoning does not end with
    the arguments and their values (gen_tools.call_plan_problems), or its offered tools touch the
    held-out set: each must be one of its checked schemas (`s["schemas"]`, outside the held-out
    pools) or a fixed tool as it is, and none may have an evaluation tool's name or (name,
    parameters) signature."""
    problems = gen_tools.call_plan_problems(s)
    for t, base in s.get("schemas") or []:
        problems += violations(t, base)
    for t in s.get("tools") or []:
        n = t["function"]["name"]
        if not (t == corpus.TOOLS.get(n) or any(t is x for x, _ in s.get("schemas") or [])):
            problems.append("unchecked tool %s" % n)
        if n in EVAL_NAMES:
            problems.append("evaluation tool name %s" % n)
        if t != corpus.TOOLS.get(n) and signature(t) in EVAL_SIGNATURES:
            problems.append("evaluation signature %s" % n)
    return problems


def check(n):
    """n conversations of each made-up and renamed kind through sample_problems; the made-up tools
    of two or more parameters share a prefix often enough to learn from. Raises AssertionError."""
    rng, failures, multi, shared = random.Random("fresh-tools-check"), [], 0, 0
    for kind in ("made_up", "renamed", "none"):
        for i in range(n):
            s = sample(rng, kind=kind)
            failures += ["%s %d: %s" % (kind, i, v) for v in sample_problems(s)]
            if kind == "made_up":
                target = next(t for t in s["tools"] if t["function"]["name"] == s["expect"]["name"])
                props = list(target["function"]["parameters"]["properties"])
                heads = [q.split("_")[0] for q in props if "_" in q]
                multi += len(props) >= 2
                shared += len(heads) != len(set(heads))
    assert kind_weights(" made_up=8, natural=0")["made_up"] == 8.0
    for bad in ("made=1", "natural=x", "none=-1", "renamed=nan"):
        try:
            kind_weights(bad)
            failures.append("kind_weights(%r) accepted" % bad)
        except ValueError:
            pass
    assert not failures, "\n".join(failures[:20])
    assert 0.12 <= shared / max(1, multi) <= 0.4, "shared prefixes in %d of %d tools" % (shared, multi)
    return {"per_kind": n, "made_up_multi_param": multi, "shared_prefix": shared}


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--check":
        print(json.dumps(check(int(sys.argv[2]) if len(sys.argv) > 2 else 3000)))
        print("fresh_tools --check: OK")
    else:
        rng = random.Random(0)
        for _ in range(4):
            print(corpus.render(sample(rng)))
            print("-----")
