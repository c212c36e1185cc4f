"""Synthetic MiniMax-M3-format conversations for the bundled tiny model (m3-tiny).

Pure Python (standard library + jinja2), so it runs on a developer machine as well as on the GPU
machine. Everything is deterministic from a seed. Values are split into a training pool and a
held-out pool (cities, time zones, names, subjects, arithmetic operand pairs, ...): the training
corpus only draws from the training pools, the evaluation set only from the held-out pools.

Tasks:
  * arithmetic: "What is A + B?", "What is A - B?" (A, B in 0..99), "What is A * B?" (A in 0..99,
    B in 0..12); the reasoning works digit by digit; the answer ends with the number.
  * tool use with six tools offered in varying subsets and orders; the assistant writes a
    ]<]minimax[>[<tool_call> block, then answers from the tool result.
  * chit-chat; thinking modes enabled / disabled / adaptive; reasoning_effort; multi-turn history.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE_PATH = os.path.join(HERE, "chat_template.jinja")
NS = "]<]minimax[>["

# ----------------------------------------------------------------------------------------------
# Special tokens. The real checkpoint has them at 200000 + offset; here they sit at
# BPE_SIZE + offset, with the same offsets where m3-architecture.md 7.1 knows them. The other
# slots of the 64 are filled with reserved tokens so the id layout mirrors the real one.
# ----------------------------------------------------------------------------------------------
SPECIAL_OFFSETS = {
    0: "]!p~[",  # pad
    19: "]~b]",  # role-turn start
    20: "[e~[",  # end of turn, EOS
    21: "]!d~[",  # unk
    25: "]<]image[>[",
    26: "]<]video[>[",
    27: "]<]start of video[>[",
    28: "]<]end of video[>[",
    29: "]<]start of image[>[",
    30: "]<]end of image[>[",
    31: "]<]vision pad[>[",
    34: "]~!b[",  # BOS
    58: "]<]noise[>[",  # DSpark noise slot
    59: "<mm:think>",
    60: "</mm:think>",
    61: NS,  # tool-call namespace marker (real id unknown)
}
NUM_SPECIAL_SLOTS = 64


def special_tokens_in_order():
    """All 64 special-token strings, index = offset from the first special id."""
    out = []
    for i in range(NUM_SPECIAL_SLOTS):
        out.append(SPECIAL_OFFSETS.get(i, "]<]reserved_%d[>[" % i))
    return out


# ----------------------------------------------------------------------------------------------
# Template rendering with the same Jinja settings Hugging Face uses for chat templates.
# ----------------------------------------------------------------------------------------------
_TEMPLATE = None


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def get_template():
    global _TEMPLATE
    if _TEMPLATE is None:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        with open(TEMPLATE_PATH, encoding="utf-8") as f:
            _TEMPLATE = env.from_string(f.read())
    return _TEMPLATE


def render(sample, add_generation_prompt=False):
    kwargs = dict(sample.get("kwargs") or {})
    return get_template().render(messages=sample["messages"], tools=sample.get("tools"),
                                 add_generation_prompt=add_generation_prompt, **kwargs)


def trainable_spans(text):
    """Character spans [start, end) of the assistant turns after the last user turn.

    Each span starts right after ']~b]ai\\n' and ends after the closing '[e~['. Only these turns
    carry their reasoning in the rendering, so only they are trained on; earlier assistant turns
    are context.
    """
    last_user = text.rfind("]~b]user\n")
    spans = []
    pos = text.find("]~b]ai\n", max(last_user, 0))
    while pos >= 0:
        start = pos + len("]~b]ai\n")
        end = text.find("[e~[", start)
        if end < 0:
            break
        spans.append((start, end + len("[e~[")))
        pos = text.find("]~b]ai\n", end)
    return spans


# ----------------------------------------------------------------------------------------------
# Value pools and the train / held-out split.
# ----------------------------------------------------------------------------------------------
def _h(s):
    return int(hashlib.sha256(s.encode("utf-8")).hexdigest()[:8], 16)


def split_pool(values, heldout_every=5):
    """Deterministic split: every value whose hash is 0 mod heldout_every is held out."""
    train, held = [], []
    for v in values:
        (held if _h("pool:" + v) % heldout_every == 0 else train).append(v)
    return train, held


CITIES = """Paris|London|Berlin|Madrid|Rome|Lisbon|Vienna|Prague|Warsaw|Budapest|Dublin|Oslo|
Stockholm|Helsinki|Copenhagen|Amsterdam|Brussels|Zurich|Geneva|Munich|Hamburg|Frankfurt|Milan|
Naples|Barcelona|Valencia|Seville|Porto|Athens|Istanbul|Ankara|Cairo|Lagos|Nairobi|Accra|Dakar|
Casablanca|Tunis|Johannesburg|Cape Town|Durban|Addis Ababa|Kampala|Kigali|Dubai|Abu Dhabi|Doha|
Riyadh|Tehran|Baghdad|Karachi|Lahore|Delhi|Mumbai|Bangalore|Chennai|Kolkata|Hyderabad|Dhaka|
Kathmandu|Colombo|Bangkok|Hanoi|Ho Chi Minh City|Kuala Lumpur|Singapore|Jakarta|Manila|Taipei|
Hong Kong|Shanghai|Beijing|Shenzhen|Guangzhou|Chengdu|Seoul|Busan|Tokyo|Osaka|Kyoto|Sapporo|
Sydney|Melbourne|Brisbane|Perth|Auckland|Wellington|Honolulu|Anchorage|Vancouver|Toronto|
Montreal|Ottawa|Calgary|Seattle|Portland|San Francisco|Los Angeles|San Diego|Las Vegas|Phoenix|
Denver|Dallas|Houston|Austin|Chicago|Detroit|Boston|New York|Philadelphia|Washington|Atlanta|
Miami|New Orleans|Nashville|Minneapolis|Mexico City|Guadalajara|Havana|Bogota|Lima|Quito|
Santiago|Buenos Aires|Montevideo|Asuncion|La Paz|Caracas|Rio de Janeiro|São Paulo|Brasília|
Salvador|Reykjavik|Tallinn|Riga|Vilnius|Kyiv|Bucharest|Sofia|Belgrade|Zagreb|Ljubljana|
Sarajevo|Tirana|Skopje|Valletta|Nicosia|Tbilisi|Yerevan|Baku|Almaty|Tashkent|Ulaanbaatar|
Marseille|Lyon|Nice|Bordeaux|Toulouse|Edinburgh|Glasgow|Manchester|Liverpool|Cardiff|Belfast|
Kraków|Gdańsk|Göteborg|Malmö|Bergen|Aarhus|Antwerp|Rotterdam|Utrecht|Cologne|Stuttgart|Leipzig|
Dresden|Bologna|Florence|Venice|Turin|Palermo|Bilbao|Málaga|Zaragoza|Córdoba|Mendoza|Medellín|
Cusco|Recife|Fortaleza|Curitiba|Osaka Bay|Nagoya|Fukuoka|Kobe|Incheon|Daegu|Xiamen|Nanjing|
Wuhan|Hangzhou|Suzhou|Pune|Jaipur|Goa|Cebu|Da Nang|Phuket|Chiang Mai|Penang|Bali|Darwin|
Hobart|Adelaide|Canberra|Christchurch|Queenstown|Suva|Nouméa|Windhoek|Lusaka|Harare|Maputo|
Luanda|Kinshasa|Abuja|Zanzibar|Mombasa|Marrakesh|Fez|Tangier|Alexandria|Luxor|Amman|Beirut|
Jerusalem|Muscat|Kuwait City|Manama""".replace("\n", "").split("|")

TIMEZONES = """Europe/London|Europe/Paris|Europe/Berlin|Europe/Madrid|Europe/Rome|Europe/Lisbon|
Europe/Vienna|Europe/Prague|Europe/Warsaw|Europe/Budapest|Europe/Dublin|Europe/Oslo|
Europe/Stockholm|Europe/Helsinki|Europe/Copenhagen|Europe/Amsterdam|Europe/Brussels|
Europe/Zurich|Europe/Athens|Europe/Istanbul|Europe/Kyiv|Europe/Bucharest|Europe/Sofia|
Europe/Belgrade|Europe/Moscow|Europe/Riga|Europe/Vilnius|Europe/Tallinn|Africa/Cairo|
Africa/Lagos|Africa/Nairobi|Africa/Johannesburg|Africa/Casablanca|Africa/Accra|Africa/Dakar|
Africa/Tunis|Africa/Kampala|Asia/Dubai|Asia/Qatar|Asia/Riyadh|Asia/Tehran|Asia/Karachi|
Asia/Kolkata|Asia/Dhaka|Asia/Kathmandu|Asia/Colombo|Asia/Bangkok|Asia/Jakarta|Asia/Singapore|
Asia/Kuala_Lumpur|Asia/Manila|Asia/Taipei|Asia/Hong_Kong|Asia/Shanghai|Asia/Seoul|Asia/Tokyo|
Asia/Tashkent|Asia/Almaty|Asia/Baku|Asia/Tbilisi|Asia/Yerevan|Asia/Ulaanbaatar|Asia/Ho_Chi_Minh|
Australia/Sydney|Australia/Melbourne|Australia/Perth|Australia/Brisbane|Australia/Adelaide|
Australia/Darwin|Australia/Hobart|Pacific/Auckland|Pacific/Honolulu|Pacific/Fiji|
America/Anchorage|America/Vancouver|America/Los_Angeles|America/Denver|America/Phoenix|
America/Chicago|America/New_York|America/Toronto|America/Halifax|America/Mexico_City|
America/Bogota|America/Lima|America/Santiago|America/Buenos_Aires|America/Sao_Paulo|
America/Caracas|America/Havana|America/Montevideo|Atlantic/Reykjavik|Atlantic/Azores|UTC|
Indian/Maldives|Indian/Mauritius""".replace("\n", "").split("|")

QUERY_A = """best|cheap|easy|quick|healthy|vegan|classic|modern|simple|advanced|free|open source|
beginner|history of|latest|local|used|electric|small|portable|quiet|fast|budget|family|
outdoor|winter|summer|home|travel|weekend""".replace("\n", "").split("|")
QUERY_B = """pizza recipes|hiking trails|laptops|python tutorials|bike repair|coffee makers|
chess openings|garden tools|rust books|yoga routines|camera lenses|jazz albums|board games|
guitar lessons|sourdough bread|running shoes|tent reviews|museum tickets|train routes|
language apps|desk chairs|phone plans|solar panels|kids books|soup ideas|ski resorts|
wine regions|piano pieces|bird watching|sci-fi novels|car rentals|city parks|dog breeds|
tea shops|data science courses|knitting patterns|meditation tips|photo editors|headphones|
weather apps""".replace("\n", "").split("|")

CURRENCIES = "USD|EUR|GBP|JPY|CNY|CHF|CAD|AUD|NZD|SEK|NOK|DKK|PLN|CZK|HUF|INR|KRW|SGD|HKD|BRL|MXN|ZAR|TRY|AED".split("|")

NAMES = """alice|bob|carol|dave|erin|frank|grace|heidi|ivan|judy|mallory|niaj|olivia|peggy|rupert|
sybil|trent|victor|walter|yara|zoe|liam|emma|noah|ava|mia|lucas|ella|leo|nora|omar|lina|kai|
maya|theo|iris|hugo|anna|felix|sara|jonas|lea|ben|clara|tim|eva|paul|rosa|max|ines|david|
julia|samir|aisha|kenji|yuki|chen|wei|priya|arjun|fatima|diego|sofia|mateo|lucia""".replace("\n", "").split("|")
DOMAINS = "example.com|example.org|mail.test|corp.test|uni.test|home.test".split("|")

SUBJECTS = """Lunch plans|Project update|Meeting notes|Weekend trip|Invoice|Team dinner|Quarterly report|
Budget review|Holiday schedule|New office|Welcome aboard|Server outage|Design review|
Birthday party|Book club|Release notes|Travel booking|Conference talk|Hiring update|Code review|
Football tickets|Garden party|Study group|Rent payment|Car pool|Movie night|Offsite agenda|
Lab results|Thank you|Question about the draft|Reading list|Vacation request|Training session|
Demo day|Launch checklist|Bug triage|Family visit|Concert tonight|Piano recital|Hackathon""".replace("\n", "").split("|")

BODIES = """See you at noon|The draft is ready for review|Please send me the slides|I will be ten minutes late|
The meeting moved to Friday|Thanks for your help|Can we talk tomorrow|The tickets are booked|
Dinner is at seven|Please check the numbers|I fixed the bug|The report is attached|
Let us meet in the lobby|Happy birthday|The server is back up|Bring your laptop|
The room is booked until five|I agree with the plan|Please review my changes|Call me when you land|
The package arrived|We need two more chairs|The demo went well|Do not forget the cake|
The train leaves at nine|Lunch is on me|I sent the invoice|Welcome to the team|
Please confirm by Monday|The trip is confirmed|Let us start at ten|The keys are at the desk|
I will bring snacks|The talk is at three|Please update the wiki|Good luck today""".replace("\n", "").split("|")

TITLES = """Team sync|Product demo|Design review|Budget meeting|Lunch with Sam|Yoga class|Board meeting|
Sprint planning|Dentist visit|Coffee chat|Book club|Piano lesson|Town hall|Code review|
Hiring panel|Customer call|Project kickoff|Retro|Release party|Training day|Interview|
Strategy offsite|Hackathon|Study session|Parent meeting|Doctor visit|Game night|Workshop|
Press briefing|Investor update|All hands|Security review|Onboarding|Marketing sync|Film night|
Running club|Chess club|Guitar practice|Cooking class|Volunteer day""".replace("\n", "").split("|")

CONDITIONS = "sunny|cloudy|rainy|windy|snowy|foggy|clear|stormy|partly cloudy|humid".split("|")

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a concise assistant. Keep answers short.",
    "You are a friendly assistant for a travel company.",
    "You help users with math and everyday tasks.",
    "You are an assistant that can use tools when they help.",
    "Answer politely and precisely.",
]

EFFORTS = ["low", "medium", "high", "xhigh", "max"]

POOLS = {}
for _name, _vals in [("city", CITIES), ("tz", TIMEZONES), ("qa", QUERY_A), ("qb", QUERY_B),
                     ("name", NAMES), ("subject", SUBJECTS), ("body", BODIES), ("title", TITLES)]:
    _vals = [v.strip() for v in _vals if v.strip()]
    POOLS[_name] = split_pool(sorted(set(_vals)))


def _synthetic_values(name, real, n, seed=77):
    """Made-up values of the same shape as a pool's, for training only: with ~200 real cities a
    small model memorises them instead of learning to copy the value from the prompt (the held-out
    values then get replaced by memorised ones). Deterministic; never equal to a real value."""
    rng = random.Random("%s:%d" % (name, seed))
    cons, vows = "bcdfghjklmnprstvwz", "aeiou"

    def word(lo, hi):
        return "".join(rng.choice(cons) + rng.choice(vows) + (rng.choice(cons) if rng.random() < 0.3 else "")
                       for _ in range(rng.randint(lo, hi)))

    words = sorted({w for v in real for w in v.split()})
    taken, out = set(real), []
    while len(out) < n:
        if name == "city":
            v = " ".join(word(2, 3).capitalize() for _ in range(1 if rng.random() < 0.8 else 2))
        elif name == "tz":
            v = "%s/%s" % (rng.choice(real).split("/")[0] if "/" in rng.choice(real) else "Europe",
                           "_".join(word(2, 3).capitalize() for _ in range(1 if rng.random() < 0.8 else 2)))
        elif name == "name":
            v = word(2, 3)
        else:  # subject, body, title: new combinations of the pool's words
            k = rng.randint(2, 3) if name != "body" else rng.randint(3, 6)
            v = " ".join(rng.choice(words) for _ in range(k))
            v = v[0].upper() + v[1:]
        if v not in taken and "/" not in v.split("/", 1)[-1]:
            taken.add(v)
            out.append(v)
    return out


SYNTH = {}
for _name in ("city", "tz", "name", "subject", "body", "title"):
    _tr, _he = POOLS[_name]
    SYNTH[_name] = _synthetic_values(_name, _tr + _he, 2 * len(_tr))


def pool(name, split):
    train, held = POOLS[name]
    if split == "train":
        return train + SYNTH.get(name, [])
    return held if split == "heldout" else train


REGIONS = sorted({t.split("/")[0] for t in TIMEZONES if "/" in t})
POOL_WORDS = sorted({w for k in ("subject", "body", "title", "qa", "qb") for v in POOLS[k][0] for w in v.split()})
FRESH_SHARE = 0.6  # share of training values made up on the spot
# Letter pieces of the tokenizer's vocabulary (set_copy_pieces, when the tokenizer exists before the
# corpus): made-up values built from them make every token a copy target. Without them, tokens that
# occur only in held-out values ("eva", "lobby", "é") were never copied in training and the model
# replaced them by familiar ones.
COPY_PIECES = []
# Letters outside ASCII are two byte-level tokens each unless the tokenizer merged them; held-out
# values with them (Málaga -> "MÓlaga") were copied wrongly because training copied few of them.
# Made-up words get one at random (any of these, not just the held-out values' letters).
ACCENTED = "áàâãäåéèêëíìîïóòôõöúùûüýÿñçćčńśšźżžłøæœßğışăřůőű"
ACCENT_SHARE = 0.15


def set_copy_pieces(pieces):
    COPY_PIECES[:] = sorted({p for p in pieces if len(p) >= 2 and p.isalpha()})


def fresh_value(rng, name):
    """A value never seen before (made up per sample, unbounded): with a fixed value list a small
    model memorises the values instead of learning to copy them from the prompt, and then replaces
    a held-out value by a memorised one (what the first m3-tiny did)."""
    cons, vows = "bcdfghjklmnprstvwz", "aeiouy"

    def word(lo, hi):
        if COPY_PIECES and rng.random() < 0.5:
            w = "".join(rng.choice(COPY_PIECES) for _ in range(rng.randint(1, max(1, hi - 1)))).lower()
        else:
            w = "".join(rng.choice(cons) + rng.choice(vows) + (rng.choice(cons) if rng.random() < 0.35 else "")
                        for _ in range(rng.randint(lo, hi)))
        if rng.random() < ACCENT_SHARE:
            i = rng.randrange(len(w))
            w = w[:i] + rng.choice(ACCENTED) + w[i + 1:]
        return w

    def mixed_word(lo, hi):
        return rng.choice(POOL_WORDS) if rng.random() < 0.3 else word(lo, hi)

    if name == "city":
        n = 1 if rng.random() < 0.7 else rng.choice([2, 2, 3])
        return " ".join(word(1, 4).capitalize() for _ in range(n))
    if name == "tz":
        n = 1 if rng.random() < 0.75 else 2
        return "%s/%s" % (rng.choice(REGIONS), "_".join(word(1, 4).capitalize() for _ in range(n)))
    if name == "name":
        # Half of them one tokenizer piece: held-out names that are one token ("eva", "dave") were
        # copied as a similar familiar token ("evo", "dapon"), an output row seldom trained.
        if COPY_PIECES and rng.random() < 0.5:
            return rng.choice(COPY_PIECES).lower()
        return word(1, 3)
    if name == "body":
        v = " ".join(mixed_word(1, 3) for _ in range(rng.randint(3, 7)))
    else:  # subject, title
        v = " ".join(mixed_word(1, 3) for _ in range(rng.randint(1, 4)))
    return v[0].upper() + v[1:]


def pool_value(rng, name, split):
    """One value of a pool for `split`; training draws made-up values FRESH_SHARE of the time.
    The held-out split consumes the random stream exactly as before (the eval set is fixed)."""
    if split == "train" and rng.random() < FRESH_SHARE:
        held = POOLS[name][1]
        while True:
            v = fresh_value(rng, name)
            if v not in held:
                return v
    return rng.choice(pool(name, split))


def arith_heldout(op, a, b):
    return _h("arith:%s:%d:%d" % (op, a, b)) % 10 == 0


def value_heldout(kind, value):
    return _h("%s:%s" % (kind, value)) % 5 == 0


# ----------------------------------------------------------------------------------------------
# Tools (OpenAI format). Descriptions are short to keep prompts well inside the model's
# exact-attention window.
# ----------------------------------------------------------------------------------------------
TOOLS = {
    "get_weather": {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
            },
        },
    },
    "get_time": {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Get the current time in a time zone.",
            "parameters": {
                "type": "object",
                "properties": {"timezone": {"type": "string"}},
                "required": ["timezone"],
            },
        },
    },
    "search_web": {
        "type": "function",
        "function": {
            "name": "search_web",
            "description": "Search the web. Use 5 results unless asked otherwise.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "max_results": {"type": "integer"}},
                "required": ["query", "max_results"],
            },
        },
    },
    "convert_currency": {
        "type": "function",
        "function": {
            "name": "convert_currency",
            "description": "Convert an amount of money.",
            "parameters": {
                "type": "object",
                "properties": {
                    "amount": {"type": "number"},
                    "from_currency": {"type": "string"},
                    "to_currency": {"type": "string"},
                },
                "required": ["amount", "from_currency", "to_currency"],
            },
        },
    },
    "send_email": {
        "type": "function",
        "function": {
            "name": "send_email",
            "description": "Send an email.",
            "parameters": {
                "type": "object",
                "properties": {
                    "to": {"type": "array", "items": {"type": "string"}},
                    "subject": {"type": "string"},
                    "body": {"type": "string"},
                },
                "required": ["to", "subject", "body"],
            },
        },
    },
    "create_event": {
        "type": "function",
        "function": {
            "name": "create_event",
            "description": "Create a calendar event.",
            "parameters": {
                "type": "object",
                "properties": {
                    "title": {"type": "string"},
                    "start": {"type": "string"},
                    "location": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}, "room": {"type": "string"}},
                        "required": ["city", "room"],
                    },
                },
                "required": ["title", "start", "location"],
            },
        },
    },
}
TOOL_NAMES = list(TOOLS)


def tool_list(rng, must=None, k=None):
    """A random subset (in random order) of the tool pool that contains `must` (a list)."""
    must = list(must or [])
    others = [t for t in TOOL_NAMES if t not in must]
    if k is None:
        k = rng.choice([1, 2, 2, 3, 3, 3, 4, 4, 5, 6])
    k = max(k, len(must))
    chosen = must + rng.sample(others, min(len(others), k - len(must)))
    rng.shuffle(chosen)
    return [TOOLS[t] for t in chosen]


# ----------------------------------------------------------------------------------------------
# Arithmetic with digit-by-digit reasoning.
# ----------------------------------------------------------------------------------------------
def _digits(n, width):
    s = str(n).rjust(width, "0")
    return [int(c) for c in reversed(s)]


PLACES = ["Ones", "Tens", "Hundreds", "Thousands", "Ten thousands"]


def add_steps(a, b):
    """Digit-by-digit addition of two non-negative integers, as sentences. Every step is one fact
    of two operands (a digit sum, then "+ 1" for a carry): a small model learns such a table
    reliably, while three-operand sums were its most frequent error."""
    width = max(len(str(a)), len(str(b)))
    da, db = _digits(a, width), _digits(b, width)
    carry, out = 0, []
    for i in range(width):
        s1 = da[i] + db[i]
        s = s1 + carry
        expr = "%d + %d = %d" % (da[i], db[i], s1)
        if carry:
            expr += ", plus the carry: %d + 1 = %d" % (s1, s)
        if s >= 10:
            out.append("%s: %s, write %d, carry 1." % (PLACES[i], expr, s - 10))
            carry = 1
        else:
            out.append("%s: %s, write %d." % (PLACES[i], expr, s))
            carry = 0
    if carry:
        out.append("%s: write the carry 1." % PLACES[width])
    return " ".join(out)


def sub_steps(a, b):
    """Digit-by-digit subtraction a - b with a >= b >= 0, two operands per step."""
    width = len(str(a))
    da, db = _digits(a, width), _digits(b, width)
    borrow, out = 0, []
    for i in range(width):
        top = da[i] - borrow
        pre = "%d - 1 = %d for the borrow. " % (da[i], top) if borrow else ""
        if top < db[i]:
            out.append("%s: %s%d is less than %d, borrow 1: %d - %d = %d, write %d." % (
                PLACES[i], pre, top, db[i], top + 10, db[i], top + 10 - db[i], top + 10 - db[i]))
            borrow = 1
        else:
            out.append("%s: %s%d - %d = %d, write %d." % (PLACES[i], pre, top, db[i], top - db[i],
                                                         top - db[i]))
            borrow = 0
    return " ".join(out)


def arith_reasoning(op, a, b):
    if op == "+":
        r = a + b
        return "Add %d and %d digit by digit. %s The result is %d." % (a, b, add_steps(a, b), r)
    if op == "-":
        if a >= b:
            return "Subtract %d from %d digit by digit. %s The result is %d." % (
                b, a, sub_steps(a, b), a - b)
        return ("%d is less than %d, so compute %d - %d and make it negative. %s "
                "The result is %d." % (a, b, b, a, sub_steps(b, a), a - b))
    # multiplication, b in 0..12
    r = a * b
    if a == 0 or b == 0:
        return "Anything times 0 is 0. The result is 0."
    if a < 10:
        return "%d * %d = %d. The result is %d." % (a, b, r, r)
    tens, ones = a // 10, a % 10
    t = "Split %d into %d + %d. %d * %d = %d, so %d * %d = %d." % (
        a, tens * 10, ones, tens, b, tens * b, tens * 10, b, tens * 10 * b)
    if ones == 0:
        return t + " The result is %d." % r
    t += " %d * %d = %d." % (ones, b, ones * b)
    t += " Add %d and %d digit by digit. %s The result is %d." % (
        tens * 10 * b, ones * b, add_steps(tens * 10 * b, ones * b), r)
    return t


def arith_value(op, a, b):
    return a + b if op == "+" else a - b if op == "-" else a * b


def arith_operands(rng, split, op=None):
    while True:
        o = op or rng.choice(["+", "-", "*"])
        a = rng.randint(0, 99)
        b = rng.randint(0, 12) if o == "*" else rng.randint(0, 99)
        if split == "train" and o == "-" and rng.random() < 0.2:  # close operands: which is larger?
            b = min(99, max(0, a + rng.randint(-9, 9)))
            if rng.random() < 0.25:  # a - a: the model answered "-0" ("a is less than a")
                b = a
        if arith_heldout(o, a, b) == (split == "heldout"):
            return o, a, b


ARITH_ANSWERS = ["{a} {op} {b} = {r}.", "The answer is {r}.", "{a} {op} {b} is {r}."]


def arith_turn(rng, op, a, b, mode):
    r = arith_value(op, a, b)
    content = rng.choice(ARITH_ANSWERS).format(a=a, op=op, b=b, r=r)
    msg = {"role": "assistant", "content": content}
    if mode != "disabled":
        msg["reasoning_content"] = arith_reasoning(op, a, b)
    return msg


def arith_question(op, a, b):
    return "What is %d %s %d?" % (a, op, b)


# ----------------------------------------------------------------------------------------------
# Tool tasks.
# ----------------------------------------------------------------------------------------------
def _amount(rng, split):
    while True:
        if rng.random() < 0.5:
            v = rng.randint(1, 5000)
        else:
            v = round(rng.randint(100, 500000) / 100.0, 2)
            if v == int(v):
                continue
        if value_heldout("amount", repr(v)) == (split == "heldout"):
            return v


def _email(rng, split):
    return "%s@%s" % (pool_value(rng, "name", split), rng.choice(DOMAINS))


def _join_names(items):
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def _start(rng, split):
    while True:
        s = "2026-%02d-%02d %02d:%s" % (rng.randint(1, 12), rng.randint(1, 28), rng.randint(7, 20),
                                         rng.choice(["00", "15", "30", "45"]))
        if value_heldout("start", s) == (split == "heldout"):
            return s


def _room(rng):
    return rng.choice(["%d%s" % (rng.randint(1, 9), rng.choice("ABCDEF")),
                       "R%d" % rng.randint(10, 99), "%s%d" % (rng.choice("ABCDEFGH"), rng.randint(100, 450))])


def _query(rng, split):
    if split == "train" and rng.random() < 0.4:  # made-up queries: copying, not recall
        while True:
            q = " ".join(fresh_value(rng, "subject").lower().split()[:3] + [rng.choice(QUERY_B)])
            if not value_heldout("query", q):
                return q
    while True:
        q = "%s %s" % (rng.choice(QUERY_A), rng.choice(QUERY_B))
        if value_heldout("query", q) == (split == "heldout"):
            return q


def make_tool_task(rng, split, name):
    """(user prompt, arguments, thinking sentence, tool result, final answer)."""
    if name == "get_weather":
        city = pool_value(rng, "city", split)
        unit = "fahrenheit" if rng.random() < 0.35 else "celsius"
        if unit == "fahrenheit":
            prompt = rng.choice(["What's the weather in {c} in fahrenheit?",
                                 "What's the weather in {c}? Use fahrenheit.",
                                 "Tell me the weather in {c} in fahrenheit."]).format(c=city)
        else:
            prompt = rng.choice(["What's the weather in {c}?", "What's the weather in {c}?",
                                 "How is the weather in {c} today?",
                                 "What's the weather in {c} in celsius?"]).format(c=city)
        args = {"city": city, "unit": unit}
        think = "The user wants the weather in %s in %s. I will call get_weather." % (city, unit)
        temp = rng.randint(-10, 35) if unit == "celsius" else rng.randint(14, 95)
        cond = rng.choice(CONDITIONS)
        result = {"city": city, "temperature": temp, "unit": unit, "condition": cond}
        answer = "It is %d degrees %s and %s in %s." % (temp, unit, cond, city)
    elif name == "get_time":
        tz = pool_value(rng, "tz", split)
        prompt = rng.choice(["What time is it in {t}?", "What time is it in {t}?",
                             "Tell me the current time in {t}."]).format(t=tz)
        args = {"timezone": tz}
        think = "The user wants the time in %s. I will call get_time." % tz
        hhmm = "%02d:%02d" % (rng.randint(0, 23), rng.randint(0, 59))
        result = {"timezone": tz, "time": hhmm}
        answer = "It is %s in %s." % (hhmm, tz)
    elif name == "search_web":
        q = _query(rng, split)
        if rng.random() < 0.4:
            n = rng.randint(1, 10)
            prompt = rng.choice(["Search the web for {q} and give me {n} results.",
                                 "Search the web for {q}, top {n} results."]).format(q=q, n=n)
        else:
            n = 5
            prompt = rng.choice(["Search the web for {q}.", "Search the web for {q}.",
                                 "Can you search the web for {q}?"]).format(q=q)
        args = {"query": q, "max_results": n}
        think = "The user wants a web search for %s with %d results. I will call search_web." % (q, n)
        hits = [{"title": "%s guide %d" % (q.capitalize(), i + 1), "url": "https://example.com/%d" % (i + 1)}
                for i in range(min(n, 2))]
        result = {"results": hits}
        answer = "I found: " + "; ".join("%s (%s)" % (h["title"], h["url"]) for h in hits) + "."
    elif name == "convert_currency":
        amt = _amount(rng, split)
        fr, to = rng.sample(CURRENCIES, 2)
        prompt = rng.choice(["Convert {a} {f} to {t}.", "Convert {a} {f} to {t}.",
                             "How much is {a} {f} in {t}?"]).format(a=amt, f=fr, t=to)
        args = {"amount": amt, "from_currency": fr, "to_currency": to}
        think = "The user wants to convert %s %s to %s. I will call convert_currency." % (amt, fr, to)
        res = round(amt * rng.uniform(0.2, 5.0), 2)
        result = {"amount": amt, "from": fr, "to": to, "result": res}
        answer = "%s %s is %s %s." % (amt, fr, res, to)
    elif name == "send_email":
        k = rng.choice([1, 2, 2, 2, 3])
        to = []
        while len(to) < k:
            e = _email(rng, split)
            if e not in to:
                to.append(e)
        subj = pool_value(rng, "subject", split)
        body = pool_value(rng, "body", split)
        prompt = rng.choice(["Send an email to {to} with subject {s} saying {b}.",
                             "Send an email to {to} with subject {s} saying {b}.",
                             "Email {to} with subject {s} saying {b}."]).format(
                                 to=_join_names(to), s=subj, b=body)
        args = {"to": to, "subject": subj, "body": body}
        think = "The user wants to send an email to %s. I will call send_email." % _join_names(to)
        result = {"status": "sent", "id": "msg_%d" % rng.randint(100, 999)}
        answer = "Done: the email %s was sent to %s." % (subj, _join_names(to))
    elif name == "create_event":
        title = pool_value(rng, "title", split)
        start = _start(rng, split)
        city = pool_value(rng, "city", split)
        room = _room(rng)
        prompt = rng.choice(["Create an event {t} at {s} in {c}, room {r}.",
                             "Create an event {t} at {s} in {c}, room {r}.",
                             "Schedule an event {t} at {s} in {c}, room {r}."]).format(
                                 t=title, s=start, c=city, r=room)
        args = {"title": title, "start": start, "location": {"city": city, "room": room}}
        think = "The user wants an event %s at %s in %s, room %s. I will call create_event." % (
            title, start, city, room)
        result = {"status": "created", "event_id": "evt_%d" % rng.randint(100, 999)}
        answer = "The event %s is set for %s in %s, room %s." % (title, start, city, room)
    else:
        raise ValueError(name)
    return prompt, args, think, json.dumps(result, ensure_ascii=False), answer


def tool_call(name, args, idx):
    return {"id": "call_%d" % idx, "type": "function", "function": {"name": name, "arguments": args}}


# ----------------------------------------------------------------------------------------------
# Chit-chat.
# ----------------------------------------------------------------------------------------------
CHITCHAT = [
    (["Hello!", "Hi!", "Hey there!", "Good morning!", "Hello, how are you?"],
     "The user greets me. I will greet them back.",
     ["Hello! How can I help you today?", "Hi! What can I do for you?"]),
    (["Who are you?", "What are you?", "What is your name?"],
     "The user asks who I am.",
     ["I am m3-tiny, a small test model in the MiniMax-M3 format."]),
    (["What can you do?", "How can you help me?"],
     "The user asks what I can do.",
     ["I can do simple arithmetic, call tools such as weather, time, web search, currency, email "
      "and calendar, and chat a little."]),
    (["Thank you!", "Thanks a lot.", "Thanks!", "Great, thanks."],
     "The user thanks me.",
     ["You're welcome!", "Glad I could help."]),
    (["Tell me a joke.", "Do you know a joke?"],
     "The user wants a joke. I will tell a short one.",
     ["Why did the math book look sad? It had too many problems.",
      "I told my computer a joke about UDP. I am not sure it got it."]),
    (["Goodbye!", "Bye!", "See you later."],
     "The user says goodbye.",
     ["Goodbye! Have a nice day.", "See you!"]),
    (["How are you?", "How is it going?"],
     "The user asks how I am.",
     ["I am fine, thank you. How can I help?"]),
    (["What is the capital of France?"], "A simple fact.", ["The capital of France is Paris."]),
    (["What color is the sky?"], "A simple fact.", ["On a clear day the sky is blue."]),
    (["Can you help me?", "I need help."], "The user asks for help.",
     ["Of course. What do you need?"]),
]


def chitchat_turn(rng, mode):
    users, think, answers = rng.choice(CHITCHAT)
    msg = {"role": "assistant", "content": rng.choice(answers)}
    if mode == "enabled":
        msg["reasoning_content"] = think
    return rng.choice(users), msg


# ----------------------------------------------------------------------------------------------
# Whole conversations.
# ----------------------------------------------------------------------------------------------
def _mode(rng):
    r = rng.random()
    return "adaptive" if r < 0.5 else "enabled" if r < 0.8 else "disabled"


def _kwargs(rng, mode, force_mode=False):
    kw = {}
    if force_mode or mode != "adaptive" or rng.random() < 0.5:
        kw["thinking_mode"] = mode  # adaptive is also the default when not given
    if rng.random() < 0.25:
        kw["reasoning_effort"] = rng.choice(EFFORTS)
    return kw


def _history(rng, split, n):
    """n earlier exchanges (rendered without reasoning, since they precede the last user turn)."""
    msgs = []
    for _ in range(n):
        if rng.random() < 0.5:
            op, a, b = arith_operands(rng, "train")
            msgs.append({"role": "user", "content": arith_question(op, a, b)})
            msgs.append(arith_turn(rng, op, a, b, "enabled"))
        else:
            u, m = chitchat_turn(rng, "enabled")
            msgs.append({"role": "user", "content": u})
            msgs.append(m)
    return msgs


def _prefix(rng):
    r = rng.random()
    if r < 0.55:
        return []
    return [{"role": "system" if r < 0.85 else "developer", "content": rng.choice(SYSTEM_PROMPTS)}]


def sample_arith(rng, split, mode=None, op=None, history=None):
    mode = mode or _mode(rng)
    op, a, b = arith_operands(rng, split, op)
    msgs = _prefix(rng)
    msgs += _history(rng, split, history if history is not None else rng.choice([0, 0, 0, 1, 2]))
    msgs.append({"role": "user", "content": arith_question(op, a, b)})
    tools = tool_list(rng, k=rng.randint(1, 3)) if rng.random() < 0.15 else None
    msgs.append(arith_turn(rng, op, a, b, mode))
    return {"task": "arith", "messages": msgs, "tools": tools, "kwargs": _kwargs(rng, mode),
            "expect": {"op": op, "a": a, "b": b, "value": arith_value(op, a, b)}}


def sample_tool(rng, split, mode=None, name=None, with_result=None, history=None):
    mode = mode or _mode(rng)
    name = name or rng.choices(TOOL_NAMES, weights=[TRAIN_TOOL_WEIGHT[t] for t in TOOL_NAMES])[0]
    prompt, args, think, result, answer = make_tool_task(rng, split, name)
    msgs = _prefix(rng)
    msgs += _history(rng, split, history if history is not None else rng.choice([0, 0, 0, 0, 1]))
    msgs.append({"role": "user", "content": prompt})
    call = {"role": "assistant", "content": "", "tool_calls": [tool_call(name, args, 0)]}
    if mode != "disabled":
        call["reasoning_content"] = think
    msgs.append(call)
    with_result = rng.random() < 0.7 if with_result is None else with_result
    if with_result:
        msgs.append({"role": "tool", "tool_call_id": "call_0", "content": result})
        final = {"role": "assistant", "content": answer}
        if mode == "enabled":
            final["reasoning_content"] = "The tool answered. I will report the result."
        msgs.append(final)
    return {"task": "tool", "messages": msgs, "tools": tool_list(rng, must=[name]),
            "kwargs": _kwargs(rng, mode), "expect": {"name": name, "arguments": args}}


def sample_two_tools(rng, split, mode=None):
    """Two calls in one <tool_call> block (weather + time)."""
    mode = mode or _mode(rng)
    p1, a1, t1, r1, ans1 = make_tool_task(rng, split, "get_weather")
    p2, a2, t2, r2, ans2 = make_tool_task(rng, split, "get_time")
    prompt = "What's the weather in %s and what time is it in %s?" % (a1["city"], a2["timezone"])
    a1 = {"city": a1["city"], "unit": "celsius"}
    msgs = _prefix(rng) + [{"role": "user", "content": prompt}]
    call = {"role": "assistant", "content": "",
            "tool_calls": [tool_call("get_weather", a1, 0), tool_call("get_time", a2, 1)]}
    if mode != "disabled":
        call["reasoning_content"] = ("The user wants the weather in %s and the time in %s. I will "
                                     "call get_weather and get_time." % (a1["city"], a2["timezone"]))
    msgs.append(call)
    r1d = json.loads(r1)
    r1d["unit"] = "celsius"
    r1d["temperature"] = rng.randint(-10, 35)
    msgs.append({"role": "tool", "tool_call_id": "call_0", "content": json.dumps(r1d, ensure_ascii=False)})
    msgs.append({"role": "tool", "tool_call_id": "call_1", "content": r2})
    ans1 = "It is %d degrees celsius and %s in %s." % (r1d["temperature"], r1d["condition"], a1["city"])
    msgs.append({"role": "assistant", "content": ans1 + " " + ans2})
    return {"task": "tool2", "messages": msgs, "tools": tool_list(rng, must=["get_weather", "get_time"]),
            "kwargs": _kwargs(rng, mode), "expect": None}


def sample_no_tool(rng, split, mode=None):
    """A tool task whose tool is not offered: the assistant says so and calls nothing."""
    mode = mode or _mode(rng)
    name = rng.choice(TOOL_NAMES)
    prompt = make_tool_task(rng, split, name)[0]
    tools = [TOOLS[t] for t in TOOL_NAMES if t != name]
    tools = rng.sample(tools, rng.randint(1, 3)) if rng.random() < 0.7 else None
    msgs = _prefix(rng) + [{"role": "user", "content": prompt}]
    msg = {"role": "assistant", "content": "Sorry, I have no tool for that here, so I cannot do it."}
    if mode == "enabled":
        msg["reasoning_content"] = "The user needs %s, but that tool is not offered." % name
    msgs.append(msg)
    return {"task": "no_tool", "messages": msgs, "tools": tools, "kwargs": _kwargs(rng, mode),
            "expect": None}


def sample_chitchat(rng, split, mode=None):
    mode = mode or _mode(rng)
    msgs = _prefix(rng) + _history(rng, split, rng.choice([0, 0, 1]))
    u, m = chitchat_turn(rng, mode)
    msgs += [{"role": "user", "content": u}, m]
    tools = tool_list(rng, k=rng.randint(1, 3)) if rng.random() < 0.2 else None
    return {"task": "chitchat", "messages": msgs, "tools": tools, "kwargs": _kwargs(rng, mode),
            "expect": None}


# More of the tools whose arguments are long copies (the first models failed those most).
TRAIN_TOOL_WEIGHT = {"get_weather": 1.0, "get_time": 1.0, "search_web": 0.6, "convert_currency": 0.6,
                     "send_email": 1.6, "create_event": 1.6}


def training_sample(rng):
    r = rng.random()
    if r < 0.30:
        return sample_arith(rng, "train")
    if r < 0.82:
        return sample_tool(rng, "train")
    if r < 0.86:
        return sample_two_tools(rng, "train")
    if r < 0.89:
        return sample_no_tool(rng, "train")
    return sample_chitchat(rng, "train")


def training_corpus(n, seed):
    rng = random.Random(seed)
    return [training_sample(rng) for _ in range(n)]


def strip_last_assistant(sample):
    """The prompt part of a sample: messages up to the trained assistant turn (excluded)."""
    msgs = list(sample["messages"])
    while msgs and msgs[-1]["role"] == "assistant":
        msgs.pop()
    out = dict(sample)
    out["messages"] = msgs
    return out


def eval_set(seed=1234, n_arith=300, n_tool=300, n_nothink=60):
    """Held-out prompts (generation prompt only) with the expected answers.

    arith: equal shares of +, -, *; thinking mode adaptive (the default: the model thinks) 60%,
    enabled 40%. arith_nothink: the same questions with thinking disabled (the answer without any
    reasoning), reported separately. tool: equal shares of the six tools; adaptive 50%, enabled
    30%, disabled 20%; single user turn.
    """
    rng = random.Random(seed)
    items = []
    for i in range(n_arith + n_nothink):
        op = ["+", "-", "*"][i % 3]
        mode = ["adaptive"] * 6 + ["enabled"] * 4
        mode = mode[i % 10] if i < n_arith else "disabled"
        s = sample_arith(rng, "heldout", mode=mode, op=op, history=0)
        s = strip_last_assistant(s)
        s["kwargs"] = {"thinking_mode": mode} if mode != "adaptive" else {}
        s["mode"] = mode
        if mode == "disabled":
            s["task"] = "arith_nothink"
        items.append(s)
    for i in range(n_tool):
        name = TOOL_NAMES[i % len(TOOL_NAMES)]
        mode = ["adaptive", "adaptive", "adaptive", "adaptive", "adaptive", "enabled", "enabled",
                "enabled", "disabled", "disabled"][(i // 6) % 10]
        s = sample_tool(rng, "heldout", mode=mode, name=name, with_result=False, history=0)
        s = strip_last_assistant(s)
        s["kwargs"] = {"thinking_mode": mode} if mode != "adaptive" else {}
        s["mode"] = mode
        items.append(s)
    for i, s in enumerate(items):
        s["id"] = "%s-%03d" % (s["task"], i)
    return items


# ----------------------------------------------------------------------------------------------
# Output parsing and scoring (mirrored by eval.mjs).
# ----------------------------------------------------------------------------------------------
def split_reasoning(text, mode):
    """(reasoning, content) of a completion that followed the generation prompt of `mode`."""
    text = text.replace("[e~[", "")
    if mode == "enabled":
        if "</mm:think>" in text:
            r, c = text.split("</mm:think>", 1)
            return r, c
        return text, ""
    if mode == "disabled":
        return "", text[len("</mm:think>"):] if text.startswith("</mm:think>") else text
    if text.startswith("</mm:think>"):
        return "", text[len("</mm:think>"):]
    if text.startswith("<mm:think>") and "</mm:think>" in text:
        r, c = text[len("<mm:think>"):].split("</mm:think>", 1)
        return r, c
    return "", text


_TAG = re.compile(re.escape(NS) + r"<(/?)([^<>]+?)>")


def _build(node, schema):
    """node: ('text', str) or ('elem', [(tag, node), ...])."""
    typ = (schema or {}).get("type")
    kind, val = node
    if kind == "text":
        if typ == "integer":
            return int(val)
        if typ == "number":
            f = float(val)
            return int(f) if re.fullmatch(r"-?\d+", val.strip()) else f
        if typ == "boolean":
            return val.strip() == "true"
        if typ in ("array", "object"):
            return json.loads(val) if val.strip() else ([] if typ == "array" else {})
        return val
    if typ == "array" or (typ is None and all(t == "item" for t, _ in val)):
        return [_build(n, (schema or {}).get("items")) for t, n in val]
    props = (schema or {}).get("properties", {})
    return {t: _build(n, props.get(t)) for t, n in val}


def _parse_children(text, pos, closing):
    """Parse text/elements starting at pos until the tag `</closing>`; returns (node, pos)."""
    children, buf_start = [], pos
    while True:
        m = _TAG.search(text, pos)
        if m is None:
            raise ValueError("unterminated <%s>" % closing)
        if m.group(1) == "/":
            if m.group(2) != closing:
                raise ValueError("mismatched </%s>, expected </%s>" % (m.group(2), closing))
            if children:
                if text[buf_start:m.start()].strip():
                    raise ValueError("mixed text and elements in <%s>" % closing)
                return ("elem", children), m.end()
            return ("text", text[buf_start:m.start()]), m.end()
        if text[buf_start:m.start()].strip():
            raise ValueError("text before element <%s>" % m.group(2))
        tag = m.group(2)
        child, pos = _parse_children(text, m.end(), tag)
        children.append((tag, child))
        buf_start = pos


def parse_tool_calls(content, tools):
    """Parse ]<]minimax[>[<tool_call> blocks; returns (text_before, [(name, arguments)])."""
    start_tok = NS + "<tool_call>"
    i = content.find(start_tok)
    if i < 0:
        return content, []
    before = content[:i]
    end = content.find(NS + "</tool_call>", i)
    if end < 0:
        raise ValueError("no closing </tool_call>")
    block = content[i + len(start_tok):end]
    schemas = {}
    for t in tools or []:
        f = t.get("function", t)
        schemas[f["name"]] = f.get("parameters")
    calls = []
    for m in re.finditer(re.escape(NS) + r'<invoke name="([^"]+)">', block):
        name = m.group(1)
        node, _ = _parse_children(block, m.end(), "invoke")
        if node[0] == "text":
            if node[1].strip():
                raise ValueError("invoke body is text")
            args = {}
        else:
            args = _build(node, schemas.get(name) or {"type": "object"})
        calls.append((name, args))
    if not calls:
        raise ValueError("tool_call block without invoke")
    return before, calls


def last_number(text):
    nums = re.findall(r"-?\d+(?:\.\d+)?", text)
    return nums[-1] if nums else None


def score(item, completion):
    """Returns (ok, detail) for one eval item and the raw completion text."""
    mode = item.get("mode", "adaptive")
    reasoning, content = split_reasoning(completion, mode)
    if item["task"] in ("arith", "arith_nothink"):
        n = last_number(content)
        ok = n is not None and n == str(item["expect"]["value"])
        return ok, {"got": n, "want": item["expect"]["value"]}
    try:
        _, calls = parse_tool_calls(content, item["tools"])
    except Exception as e:  # malformed output counts as a failure
        return False, {"error": str(e)}
    if not calls:
        return False, {"error": "no tool call"}
    name, args = calls[0]
    ok = name == item["expect"]["name"] and args == item["expect"]["arguments"]
    return ok, {"got": [name, args], "want": [item["expect"]["name"], item["expect"]["arguments"]]}


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1 and sys.argv[1] == "eval-set":
        out = sys.argv[2]
        with open(out, "w", encoding="utf-8") as f:
            for it in eval_set():
                f.write(json.dumps(it, ensure_ascii=False) + "\n")
        print("wrote", out)
    else:
        rng = random.Random(0)
        for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
            s = training_sample(rng)
            print(render(s))
            print("-----")
