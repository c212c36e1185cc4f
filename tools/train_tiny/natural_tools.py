"""Everyday tools as users write them, and requests as people make them: fresh_tools' "natural"
kinds (a call, and a request that no offered tool serves).

The made-up tools of fresh_tools.py are asked for with their own verb and noun ("Fetch a lamp
with ..."); real requests use synonyms and paraphrases ("Get me a cab to the airport" for
request_ride), leave unsaid optional parameters out and give values in natural forms ("for 4
people" is guests 4). This module is a lexicon of everyday tool DOMAINS: per action several real
tool names (find_hotels, hotel_search, ...), parameter-name synonyms per slot (city / location /
destination), descriptions, request templates that mostly avoid the tool's words, phrases that add
an optional slot, value pools (places, names, dates, codes, numbers) and the JSON type of every
slot (a slot said as "4 people" is the integer 4; "no meat" sets a boolean). Conversations:

* natural (call): the target tool among 0-3 distractors from other domains, sometimes with
  another action of the same domain (book vs cancel); the call has exactly the slots the request
  says; a share of the requests come with small talk ("Hi! ... Thanks!");
* natural_none (decline): the request's domain is served by no offered tool (tools of other
  domains, near misses that share a name word, or a same-domain action that cannot do it, e.g.
  cancel_hotel_booking for "Find me a hotel"); the answer is fresh_tools' decline.

Held out, besides everything fresh_tools.violations() rejects (checked on every schema drawn, as
for the other kinds): the domains of eval_tools_natural.jsonl (weather, product / shop search,
messaging, stock prices, exchange rates and currency, translation, local time and time zones,
timers and alarms, unit conversion, music, word definitions, restaurant tables, flight status,
calculators) and the six fixed tools' domains (weather, time, web search, currency, email,
calendar events). FORBIDDEN_NAME_PARTS may be in no tool name, parameter name, description or
enum value and FORBIDDEN_REQUEST in no request (sample_problems() checks a conversation; every
generated one passes it or is drawn again; fresh_data.py --check and `python3 natural_tools.py
--check N` run it).

    python3 natural_tools.py [N]          N rendered conversations
    python3 natural_tools.py --check N    N conversations of each kind through every check
"""

import json
import random
import re
import sys

import corpus
import fresh_tools
import gen_tools

KINDS = ("natural", "natural_none")
DECLINE = "Sorry, I have no tool for that here, so I cannot do it."

# ------------------------------------------------------------------------------------------------
# What is held out, beyond fresh_tools.violations().
# ------------------------------------------------------------------------------------------------
# Substrings of tool names, parameter names, descriptions and enum values.
FORBIDDEN_NAME_PARTS = [
    "weather", "forecast", "stock", "ticker", "exchange", "currenc", "translat", "timer", "alarm",
    "countdown", "music", "song", "play_", "playlist", "define", "definition", "dictionary", "restaurant",
    "table", "flight", "calculat", "time_zone", "timezone", "local_time", "clock", "convert", "units",
    "product", "shop", "message", "text_", "chat", "email", "mail", "calendar", "web_search", "search_web",
    "celsius", "fahrenheit",
]
# Whole parameter names of the natural evaluation's tools that belong to its domains.
FORBIDDEN_PARAMS = {"text", "recipient", "ticker", "target_language", "from_unit", "to_unit", "flight_number",
                    "expression", "restaurant", "artist", "word", "minutes", "base", "target", "unit"}
# Requests (word starts, case-insensitive).
FORBIDDEN_REQUEST = re.compile(
    r"\b(weather|forecast|stocks?\b|ticker|exchange|currenc|translat|timers?\b|alarm|countdown|music|songs?\b|"
    r"playlist|play\b|plays\b|playing\b|defin(e|es|ed|ing|ition|itions)\b|dictionar|restaurant|tables?\b|"
    r"flight|calculat|time ?zones?\b|local time|convert|units?\b|products?\b|shops?\b|shopping|messag|texts?\b|"
    r"texting|chats?\b|chatting|clocks?\b|o'clock|on time\b|what time is it|celsius|fahrenheit|e-?mails?\b|"
    r"calendar|search the web)", re.I)


def _plain(s):
    return s.lower().replace(" ", "_")


def forbidden_in_name(s):
    s = _plain(s)
    return [w for w in FORBIDDEN_NAME_PARTS if w in s]


def _part_held(part):
    """A name part that is a held-out word or its plural (tickets, trains)."""
    return part in fresh_tools.HELD_PARTS or (part.endswith("s") and part[:-1] in fresh_tools.HELD_PARTS)


def name_usable(name):
    return (fresh_tools.name_ok(name) and name not in fresh_tools.FIXED and not forbidden_in_name(name)
            and not any(_part_held(p) for p in name.split("_")))


def param_usable(p):
    return (fresh_tools.param_ok(p) and p not in FORBIDDEN_PARAMS and not forbidden_in_name(p)
            and not any(_part_held(x) for x in p.split("_")))


# ------------------------------------------------------------------------------------------------
# Value pools.
# ------------------------------------------------------------------------------------------------
def _w(s):
    return [x.strip() for x in s.split("|") if x.strip()]


DATES = _w("""today|tomorrow|tonight|this weekend|next Monday|next Tuesday|next Wednesday|next Thursday|
next Friday|next Saturday|next Sunday|Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday|
this Friday|this Saturday|the day after tomorrow|next week""")
MONTHS = _w("January|February|March|April|May|June|July|August|September|October|November|December")
TIMES = _w("7 am|7:30 am|8 am|8:15|9 am|9:30|10 am|11:45|noon|1 pm|2:30 pm|3 pm|4 pm|5:15 pm|6 pm|6:30 pm|"
           "7 pm|8 pm|9:45 pm|10 pm|midnight|18:00|19:30|20:15|07:45")
STREETS = _w("Oak|Maple|Elm|Pine|Cedar|Park|Lake|Hill|River|Church|Mill|Station|King|Queen|Bridge|Market|"
             "Garden|Harbor|Victoria|Union|Chestnut|Willow|Spring|Forest|Meadow")
STREET_KINDS = _w("Street|Road|Avenue|Lane|Drive|Way|Boulevard|Place")
LANDMARKS = _w("the airport|the train station|the central station|the bus terminal|the stadium|the city centre|"
               "the office|the hospital|the university|the harbour|the old town|the convention centre|"
               "the zoo|the beach|the mall|the museum|the main square|home|my hotel|the ferry port")
POOLS = {
    "ingredient": _w("eggs|spinach|feta|chicken|rice|tomatoes|garlic|onions|potatoes|mushrooms|tofu|lentils|"
                     "chickpeas|salmon|pasta|zucchini|carrots|broccoli|cheddar|yogurt|lemons|basil|bacon|"
                     "beef mince|coconut milk|sweet potatoes|bell peppers|oats|bananas|apples|flour|butter"),
    "dish": _w("lasagna|pancakes|banana bread|chicken curry|pad thai|tomato soup|risotto|chili|falafel|"
               "carrot cake|fried rice|guacamole|shakshuka|beef stew|apple pie|ramen|paella|tacos|hummus|"
               "lemon tart|minestrone|dumplings|quiche|brownies|gazpacho|mac and cheese|fish pie"),
    "diet": _w("vegan|vegetarian|gluten-free|keto|dairy-free|low-carb|paleo"),
    "news_topic": _w("technology|politics|science|health|sports|business|climate|space|education|elections|"
                     "the economy|local news|world news|football|tennis|art|startups|energy|travel"),
    "region": _w("Europe|Asia|Africa|South America|North America|Australia|the UK|Canada|Germany|Japan|"
                 "India|Brazil|Kenya|Spain|Mexico|France|Italy|Norway|Chile"),
    "team": _w("Arsenal|the Lakers|Real Madrid|Bayern|the Yankees|Celtic|Ajax|Boca Juniors|the Warriors|"
               "Juventus|Benfica|the Red Sox|the Packers|Galatasaray|Porto|the Bulls|Chelsea|Napoli|Lyon|"
               "the Maple Leafs|Flamengo|the All Blacks|Barcelona|Liverpool|Inter"),
    "league": _w("the Premier League|La Liga|the Bundesliga|Serie A|the NBA|the NFL|the NHL|Ligue 1|the MLS|"
                 "the Eredivisie|the Champions League|the IPL|the Six Nations"),
    "movie": ["The %s %s" % (a, b) for a in _w("Silent|Last|Hidden|Broken|Golden|Lost|Endless|Crimson|Quiet|"
                                                 "Northern|Distant|Iron|Paper|Midnight|Secret")
              for b in _w("Harbor|Garden|Voyage|Empire|Signal|Winter|Orchard|Frontier|Letter|Mountain|Tide")],
    "book": ["The %s of %s" % (a, b) for a in _w("Art|History|Secret|Garden|House|Daughter|Memory|Island|Map")
             for b in _w("Small Things|the Sea|Lost Time|Tomorrow|the River|Glass|Stars|Silence|Salt")],
    "author": _w("Jane Austen|Toni Morrison|Haruki Murakami|Chimamanda Adichie|George Orwell|Ursula Le Guin|"
                 "Gabriel Garcia Marquez|Agatha Christie|Terry Pratchett|Mary Shelley|Italo Calvino|"
                 "Zadie Smith|Kazuo Ishiguro|Isabel Allende|Octavia Butler|Leo Tolstoy"),
    "podcast": _w("The Daily Brief|Science Friday|Hidden Histories|The Moth|Planet Money|Radiolab|"
                  "Deep Space Notes|The Kitchen Hour|Startup Stories|Mind Matters|Crime Files|"
                  "Garden Talk|The Long Run|History Extra|Tech Weekly"),
    "podcast_topic": _w("true crime|history|space|cooking|running|startups|psychology|gardening|philosophy|"
                        "parenting|investing|climate|comedy|film|architecture"),
    "room": _w("living room|kitchen|bedroom|bathroom|office|hallway|garage|dining room|kids' room|porch|"
               "basement|attic|guest room|study|garden"),
    "medication": _w("ibuprofen|amoxicillin|metformin|lisinopril|atorvastatin|levothyroxine|omeprazole|"
                     "salbutamol|cetirizine|sertraline|insulin|vitamin D"),
    "specialty": _w("dentist|dermatologist|GP|eye doctor|physiotherapist|pediatrician|cardiologist|"
                    "family doctor|ENT specialist|orthopedist|nurse"),
    "gym_class": _w("yoga|spin|pilates|boxing|zumba|HIIT|body pump|aqua aerobics|crossfit|barre|kickboxing|"
                    "stretching|core"),
    "pet": _w("Rex|Luna|Milo|Bella|Oscar|Coco|Max|Daisy|Simba|Nala|Pepper|Biscuit|Ziggy|Mochi"),
    "pet_food": _w("dry food|wet food|kibble|tuna|chicken|treats|salmon|carrots|seeds|pellets"),
    "plant": _w("fern|basil|monstera|orchid|cactus|tomato plant|peace lily|snake plant|rosemary|bonsai|"
                "aloe vera|fiddle leaf fig|pothos|lavender|succulents"),
    "lottery": _w("Powerball|Mega Millions|EuroMillions|Lotto|EuroJackpot|SuperEnalotto|Oz Lotto|Lotto Max"),
    "sign": _w("Aries|Taurus|Gemini|Cancer|Leo|Virgo|Libra|Scorpio|Sagittarius|Capricorn|Aquarius|Pisces"),
    "quote_topic": _w("courage|friendship|success|patience|love|work|change|hope|learning|kindness|failure|"
                      "leadership|creativity|happiness"),
    "quote_author": _w("Maya Angelou|Albert Einstein|Marcus Aurelius|Seneca|Oscar Wilde|Mark Twain|"
                       "Confucius|Eleanor Roosevelt|Nelson Mandela|Rumi|Marie Curie"),
    "trivia_cat": _w("history|geography|science|sports|animals|film|literature|space|food|art|mythology"),
    "tv_channel": _w("BBC One|CNN|HBO|ESPN|Channel 4|ITV|Discovery|National Geographic|Arte|RAI 1|ZDF|"
                     "Comedy Central|Cartoon Network|PBS|Sky Sports"),
    "performer": _w("Coldplay|Adele|Taylor Swift|Arctic Monkeys|Beyoncé|Radiohead|Dua Lipa|Ed Sheeran|"
                    "Billie Eilish|the Rolling Stones|Björk|Kendrick Lamar|Stromae|Rosalía|Metallica"),
    "event_kind": _w("comedy shows|food festivals|art exhibitions|markets|theatre|workshops|family events|"
                     "street fairs|book readings|open-air cinema|dance shows|sports events"),
    "job_title": _w("nurse|data analyst|web developer|electrician|teacher|accountant|graphic designer|"
                    "project manager|barista|truck driver|software engineer|chef|pharmacist|lab technician|"
                    "customer support agent|UX designer|plumber|marketing manager"),
    "food": _w("an avocado|a banana|100 g of oats|a boiled egg|a slice of pizza|a cup of rice|an apple|"
               "greek yogurt|almonds|a croissant|peanut butter|salmon|brown bread|a bagel|chickpeas|tofu"),
    "activity": _w("running|cycling|swimming|walking|rowing|hiking|yoga|weight training|tennis|climbing|"
                   "skating|dancing"),
    "todo": _w("buy milk|call the plumber|pay the rent|book a dentist visit|water the garden|renew my passport|"
               "pick up the dry cleaning|finish the report|clean the garage|return the library books|"
               "fix the bike|buy a birthday present|sort the recycling|back up my laptop|wash the car"),
    "grocery": _w("milk|bread|eggs|apples|coffee|rice|butter|cheese|bananas|tomatoes|olive oil|yogurt|"
                  "toilet paper|dish soap|oat milk|orange juice|pasta|cereal|onions|chicken breasts"),
    "company": _w("Acme Ltd|Northwind|Globex|Initech|Blue Harbor Design|Greenleaf Studio|Kestrel Labs|"
                  "Orbit Media|Riverside Bakery|Summit Partners|Pixel Forge|Tidewater Co"),
    "expense_cat": _w("groceries|rent|transport|dining out|fuel|utilities|travel|entertainment|health|"
                      "office supplies|gifts|subscriptions|insurance"),
    "expense_note": _w("lunch with Sara|taxi to the office|new headphones|gym membership|coffee beans|"
                       "train to Leeds|printer ink|birthday gift|parking at the mall|bike repair"),
    "bouquet": _w("red roses|tulips|sunflowers|lilies|a mixed bouquet|white orchids|peonies|daisies|"
                  "a spring bouquet|carnations"),
    "beach": _w("Brighton|Bondi Beach|Malibu|Cascais|Biarritz|Scheveningen|Sylt|Whitby|St Ives|Cape Cod|"
                "Nazaré|Zandvoort|Ocean Beach|Saint-Malo"),
    "note": _w("ideas for the garden party|the wifi password is on the fridge|gift ideas for mum|"
               "questions for the landlord|books to read this summer|the car needs new tyres|"
               "pack sunscreen and hats|call Anna back about the flat"),
    "note_title": _w("Garden party|Gift ideas|Landlord|Reading list|Packing|Trip plan|Weekend|Recipes|Work"),
    "reason": _w("wrong size|arrived damaged|changed my mind|not as described|too late|duplicate order"),
    "travel_by": ["walking", "driving", "cycling", "transit"],
    "line": _w("line 4|the 42|the N7|the red line|the M2|line 11|the 73|the S1|the blue line"),
    "door": _w("front door|back door|garage door|side door|patio door"),
    "contact_label": _w("mobile|work|home"),
}


def _date(rng):
    if rng.random() < 0.7:
        return rng.choice(DATES)
    return "%s %d" % (rng.choice(MONTHS), rng.randint(1, 28)) if rng.random() < 0.6 else \
        "%d %s" % (rng.randint(1, 28), rng.choice(MONTHS))


def _cap(s):
    return s[:1].upper() + s[1:]


def _city(rng):
    return rng.choice(corpus.pool("city", "train")) if rng.random() < 0.6 else corpus.fresh_value(rng, "city")


def _person(rng):
    if rng.random() < 0.6:
        return _cap(rng.choice(corpus.pool("name", "train")))
    return _cap(corpus.fresh_value(rng, "name"))


def _address(rng):
    street = rng.choice(STREETS) if rng.random() < 0.7 else _cap(fresh_tools.made_up_word(rng, 2, 3))
    return "%d %s %s" % (rng.randint(1, 250), street, rng.choice(STREET_KINDS))


def _code(rng, shape):
    """A code from a shape: A a capital letter, 9 a digit, anything else kept."""
    return "".join(rng.choice("ABCDEFGHJKLMNPRSTUVWXYZ") if c == "A" else str(rng.randint(0, 9)) if c == "9" else c
                   for c in shape)


CODE_SHAPES = {
    "tracking": ["1Z999AA9999999999", "AA999999999AA", "9999 9999 9999", "AA99999999", "999999999999"],
    "booking": ["AA9AA9", "AAA999", "99999999", "BK-99999", "H9999A"],
    "order": ["A-99999", "999-9999999", "#99999", "AA99999", "9999999"],
    "invoice": ["INV-9999", "INV-999999", "9999/99", "A-999"],
    "prescription": ["RX99999", "RX-999-999", "9999999", "AA9999"],
    "plate": ["AA99 AAA", "AAA 999", "A 999 AA", "AA-999-AA", "999 AAA"],
    "ride": ["R-9999", "RD99999", "AA9A9"],
    "appointment": ["APT-9999", "A9999", "99999"],
    "bike": ["9999", "B-999", "AA999"],
    "charger": ["CH-999", "9999", "A99"],
    "ref": ["AA9999", "99999", "REF-9999"],
}


def _title_case_made_up(rng, n):
    return " ".join(_cap(fresh_tools.made_up_word(rng, 1, 3)) for _ in range(n))


def draw(rng, pool):
    """(JSON value, the words the user says)."""
    if pool == "city":
        v = _city(rng)
    elif pool == "person":
        v = _person(rng)
    elif pool == "date":
        v = _date(rng)
    elif pool == "time":
        v = rng.choice(TIMES)
    elif pool == "when":
        v = "%s at %s" % (rng.choice(DATES[:20]), rng.choice(TIMES))
    elif pool == "address":
        v = _address(rng)
    elif pool == "place":
        v = rng.choice(LANDMARKS) if rng.random() < 0.6 else _address(rng)
    elif pool.startswith("code-"):
        v = _code(rng, rng.choice(CODE_SHAPES[pool[5:]]))
    elif pool.startswith("int") or pool.startswith("money"):
        lo, hi = (int(x) for x in pool.lstrip("intmoney").split("-"))
        if pool.startswith("money") and rng.random() < 0.3:
            v = round(rng.uniform(lo, hi) * 4) / 4
            v = int(v) if v == int(v) else v
        elif pool.startswith("money") and hi >= 100:
            v = rng.randint(max(1, lo // 10), hi // 10) * 10
        else:
            v = rng.randint(lo, hi)
        return v, str(v)
    elif pool in ("movie", "book", "podcast", "team", "company", "pet") and rng.random() < 0.3:
        v = _title_case_made_up(rng, 1 if pool in ("pet", "team") else rng.randint(2, 3))
        if pool == "company":
            v += " " + rng.choice(["Ltd", "Inc", "GmbH", "Studio", "Co"])
    else:
        v = rng.choice(POOLS[pool])
    return v, v


def _join(xs):
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " and " + xs[-1]


# ------------------------------------------------------------------------------------------------
# The lexicon.
# ------------------------------------------------------------------------------------------------
class Slot:
    def __init__(self, spec):
        key, typ, pool, names, label = [x.strip() for x in spec.split(":")]
        self.required = key.endswith("*")
        self.key = key.rstrip("*")
        self.enum = typ[5:].split("/") if typ.startswith("enum=") else None
        self.type = "string" if self.enum else typ
        self.pool = pool
        self.names = [n for n in names.split() if param_usable(n)]
        self.label = label

    def schema(self, rng):
        if self.enum:
            s = {"type": "string", "enum": list(self.enum)}
        elif self.type == "array":
            s = {"type": "array", "items": {"type": "string"}}
        else:
            s = {"type": self.type}
        if self.label and rng.random() < 0.35:
            s["description"] = self.label
        return s

    def value(self, rng):
        if self.enum:
            v = rng.choice(self.enum)
            return v, v
        if self.type == "boolean":
            return True, None
        if self.type == "array":
            vals = []
            for _ in range(rng.randint(1, 4)):
                v = draw(rng, self.pool)[0]
                if v not in vals:
                    vals.append(v)
            return vals, _join(vals)
        return draw(rng, self.pool)


class Action:
    def __init__(self, domain, role, names, descs, slots, requests, needs, extras=None):
        self.domain, self.role = domain, role
        self.names = [n for n in names.split() if name_usable(n)]
        self.descs = [d for d in descs if not forbidden_in_name(d) and not fresh_tools.desc_too_close(d)]
        self.slots = [Slot(s) for s in slots.split(";") if s.strip()]
        self.by_key = {s.key: s for s in self.slots}
        self.requests, self.needs, self.extras = requests, needs, extras or {}
        req = {s.key for s in self.slots if s.required}
        for t in requests:
            keys = set(re.findall(r"{(\w+)}", t))
            assert req <= keys <= set(self.by_key), (self.names, t)
        assert any(set(re.findall(r"{(\w+)}", t)) == req for t in requests), (self.names, "no required-only request")
        for t in needs:
            assert set(re.findall(r"{(\w+)}", t)) <= req, (self.names, t)
        for k, phrases in self.extras.items():
            assert k in self.by_key and not self.by_key[k].required, (self.names, k)
            for p in phrases:
                assert set(re.findall(r"{(\w+)}", p)) <= {k}, (self.names, p)
        for s in self.slots:
            assert s.names, (self.names, s.key)
            assert s.type != "boolean" or s.key in self.extras, (self.names, s.key)
        assert self.names and self.descs, (domain, names)


class Domain:
    def __init__(self, key, family, actions):
        self.key, self.family = key, family
        self.actions = [Action(key, *a) for a in actions]


def A(role, names, descs, slots, requests, needs, extras=None):
    return (role, names, descs, slots, requests, needs, extras)


DOMAINS = [
    Domain("hotel", "lodging", [
        A("find", "find_hotels search_hotels hotel_search find_hotel hotel_finder hotels_available search_stays",
          ["Find hotels in a city.", "Search for hotel rooms by city and dates.", "Lists hotels with free rooms.",
           "Hotel search with optional dates, guests and budget."],
          "city*:string:city:city location destination city_name where:City to stay in;"
          "check_in:string:date:check_in arrival_date checkin_date start_date:Arrival date;"
          "nights:integer:int2-14:nights num_nights stay_length:Number of nights;"
          "guests:integer:int2-8:guests people num_guests adults:How many guests;"
          "max_price:number:money60-400:max_price budget price_cap max_nightly_rate:Highest price per night",
          ["Find me a hotel in {city}.", "I need somewhere to stay in {city}.", "Any hotels in {city}?",
           "Where can I stay in {city} {check_in}?", "Look for a room in {city} for {guests} people.",
           "Hotels in {city} under {max_price} dollars a night?", "We need a place to sleep in {city}.",
           "Got any rooms in {city} for {nights} nights?"],
          ["a hotel in {city}", "a place to stay in {city}", "a room in {city}"],
          {"check_in": ["from {check_in}", "arriving {check_in}", "starting {check_in}"],
           "nights": ["for {nights} nights"], "guests": ["for {guests} guests", "for {guests} people"],
           "max_price": ["under {max_price} dollars a night", "for at most {max_price} a night"]}),
        A("make", "book_hotel book_hotel_room hotel_booking book_room book_stay",
          ["Book a room at a hotel.", "Makes a hotel booking.", "Books a stay at the given hotel."],
          "hotel*:string:company:hotel hotel_name property:Hotel name;"
          "check_in*:string:date:check_in arrival_date checkin_date:Arrival date;"
          "nights:integer:int2-14:nights num_nights:Number of nights;"
          "guests:integer:int2-8:guests people num_guests:How many guests",
          ["Book me a room at {hotel} from {check_in}.", "Get us a room at {hotel} arriving {check_in}.",
           "I'd like to stay at {hotel} from {check_in} for {nights} nights.",
           "Please book {hotel}, arriving {check_in}, {guests} guests."],
          ["a room at {hotel} from {check_in}", "to book {hotel} for {check_in}"],
          {"nights": ["for {nights} nights"], "guests": ["for {guests} people", "for {guests} of us"]}),
        A("cancel", "cancel_hotel_booking cancel_booking hotel_cancel cancel_stay",
          ["Cancel a hotel booking.", "Cancels an existing hotel booking by its reference."],
          "booking_ref*:string:code-booking:booking_ref confirmation_code booking_id reference:Booking reference",
          ["Cancel my hotel booking {booking_ref}.", "I won't need the room after all, booking {booking_ref}.",
           "Please call off hotel reservation {booking_ref}."],
          ["to cancel hotel booking {booking_ref}", "the room booking {booking_ref} cancelled"]),
    ]),
    Domain("ride", "route", [
        A("make", "request_ride book_taxi order_cab call_taxi get_ride hail_ride book_ride",
          ["Request a taxi ride.", "Orders a cab to a destination.", "Books a ride with a driver.",
           "Hail a ride from a pickup point to a destination."],
          "destination*:string:place:destination dropoff drop_off to_address where_to end_location:Where to go;"
          "pickup:string:place:pickup pickup_location from_address start_location origin:Where to be picked up;"
          "ride_type:enum=standard/xl/comfort/green:place:ride_type vehicle_class tier:Kind of ride;"
          "passengers:integer:int2-6:passengers riders seats:Number of passengers",
          ["Get me a taxi to {destination}.", "I need a cab to {destination}.", "Can you call me a ride to {destination}?",
           "Take me to {destination}.", "Book a taxi from {pickup} to {destination}.",
           "I need to get to {destination}, pick me up at {pickup}.", "Send a car to take me to {destination}."],
          ["a taxi to {destination}", "a ride to {destination}", "a cab to {destination}"],
          {"pickup": ["from {pickup}", "picking me up at {pickup}"], "ride_type": ["in a {ride_type} car", ", {ride_type} class"],
           "passengers": ["for {passengers} people", ", there are {passengers} of us"]}),
        A("find", "estimate_fare ride_fare_estimate fare_quote taxi_fare get_fare_estimate price_ride",
          ["Estimate the fare of a ride.", "Quotes the price of a taxi trip.", "How much a ride would cost."],
          "destination*:string:place:destination dropoff to_address:Where to;"
          "pickup:string:place:pickup pickup_location origin:Start of the ride",
          ["How much would a taxi to {destination} cost?", "What's the fare to {destination}?",
           "Roughly what does a cab from {pickup} to {destination} cost?", "Price of a ride to {destination}?"],
          ["the fare of a ride to {destination}", "to know what a taxi to {destination} costs"],
          {"pickup": ["from {pickup}"]}),
        A("cancel", "cancel_ride cancel_taxi ride_cancel cancel_cab",
          ["Cancel a booked ride.", "Cancels a taxi by its ride id."],
          "ride_id*:string:code-ride:ride_id booking_id trip_id:Ride id",
          ["Cancel my taxi {ride_id}.", "I don't need ride {ride_id} anymore, cancel it.", "Call off cab {ride_id}."],
          ["to cancel ride {ride_id}", "the taxi {ride_id} cancelled"]),
    ]),
    Domain("reminder", "tasks", [
        A("make", "create_reminder add_reminder_item set_reminder new_reminder remind_me remember_task",
          ["Create a reminder.", "Sets a reminder for later.", "Reminds the user of something at a given moment."],
          "task*:string:todo:task what reminder content note:What to be reminded of;"
          "when:string:when:when remind_at due at_time:When to remind",
          ["Remind me to {task}.", "Don't let me forget to {task}.", "Remind me {when} to {task}.",
           "Please remind me to {task} {when}.", "I have to {task}, remind me."],
          ["a reminder to {task}", "to be reminded to {task}"],
          {"when": ["{when}"]}),
        A("find", "list_reminders get_reminders show_reminders reminders_due upcoming_reminders",
          ["List upcoming reminders.", "Shows the reminders that are due.", "Returns the user's reminders."],
          "date:string:date:date due_on on_date:Which date",
          ["What are my reminders?", "Show me my reminders for {date}.", "Do I have any reminders {date}?",
           "What did I ask you to remind me about?"],
          ["a list of reminders", "to see the reminders"]),
    ]),
    Domain("recipe", "cooking", [
        A("find", "find_recipes search_recipes recipe_search get_recipe recipe_finder recipes_for",
          ["Find recipes for a dish.", "Search a recipe collection.", "Looks up cooking recipes.",
           "Recipe search with an optional diet and time budget."],
          "dish*:string:dish:dish query name recipe_name meal:Dish to cook;"
          "diet:enum=vegan/vegetarian/gluten-free/keto:dish:diet dietary_need:Diet;"
          "max_prep:integer:int15-90:max_prep max_time max_cook_time ready_in:Longest preparation time in minutes",
          ["How do I make {dish}?", "Find me a recipe for {dish}.", "I want to cook {dish} tonight.",
           "Give me a good {dish} recipe.", "What's an easy way to make {dish}?", "Any ideas for making {dish}?"],
          ["a recipe for {dish}", "to know how to cook {dish}"],
          {"diet": ["that is {diet}", ", something {diet}"], "max_prep": ["in under {max_prep} minutes", "ready in {max_prep} minutes"]}),
        A("find_alt", "recipes_by_ingredient cook_with find_by_ingredients what_to_cook ingredient_recipes",
          ["Suggest recipes from the ingredients at hand.", "Recipes that use given ingredients.",
           "Finds dishes you can cook with what is in the fridge."],
          "ingredients*:array:ingredient:ingredients items have available foods:Ingredients at hand;"
          "vegetarian:boolean:-:vegetarian veggie meat_free:Only vegetarian dishes",
          ["I have {ingredients}. What can I cook?", "What can I make with {ingredients}?",
           "Dinner ideas using {ingredients}?", "My fridge has {ingredients}, any recipe ideas?"],
          ["a dish made from {ingredients}", "ideas for cooking with {ingredients}"],
          {"vegetarian": ["with no meat", ", vegetarian only", ", nothing with meat"]}),
    ]),
    Domain("news", "news", [
        A("find", "get_headlines news_headlines top_news latest_news fetch_news news_feed get_news",
          ["Latest news headlines.", "Top stories on a topic.", "Returns current headlines, optionally by topic and region."],
          "topic:string:news_topic:topic category section subject:News topic;"
          "region:string:region:region country area edition:Where the news is from",
          ["What's in the news?", "Any news about {topic}?", "Give me the latest headlines on {topic}.",
           "What's happening in {region}?", "Catch me up on {topic} news from {region}.", "What are today's top stories?"],
          ["the latest news", "the news headlines"],
          {"topic": ["about {topic}"], "region": ["from {region}", "in {region}"]}),
    ]),
    Domain("sports", "news", [
        A("find", "match_score live_score latest_result team_result game_score",
          ["Latest match result of a team.", "Live and final scores by team.", "Score of a team's last game."],
          "team*:string:team:team team_name club side:Team",
          ["Did {team} win?", "What was the score in the {team} game?", "How did {team} do last night?",
           "Score of the {team} match?", "Who won, {team} or their opponents?"],
          ["the latest score of {team}", "to know how {team} did"]),
        A("find2", "league_standings get_standings standings ranking",
          ["Current standings of a league.", "League positions and points."],
          "league*:string:league:league competition division:League",
          ["Who's top of {league}?", "Show me the standings in {league}.", "How does {league} look right now?",
           "Where is everyone in {league}?"],
          ["the standings of {league}", "the positions in {league}"]),
    ]),
    Domain("parcel", "parcel", [
        A("check", "track_parcel track_package parcel_status where_is_package delivery_status package_tracker",
          ["Track a parcel by its tracking number.", "Delivery status of a package.", "Where a shipment is now."],
          "tracking_number*:string:code-tracking:tracking_number tracking_id tracking_code parcel_id:Tracking number;"
          "carrier:enum=ups/dhl/fedex/usps/dpd:code-tracking:carrier courier:Delivery company",
          ["Where is my package {tracking_number}?", "Has parcel {tracking_number} arrived yet?",
           "When will {tracking_number} be delivered?", "Can you check on my delivery {tracking_number}?",
           "Track {tracking_number} please."],
          ["the status of parcel {tracking_number}", "to know where package {tracking_number} is"],
          {"carrier": [", it's with {carrier}", "sent by {carrier}"]}),
        A("make", "start_return return_item request_return create_return return_order",
          ["Start a return for an order.", "Opens a return request.", "Return an item you bought."],
          "order_id*:string:code-order:order_id order_number purchase_id:Order number;"
          "reason:string:reason:reason return_reason why:Why it goes back",
          ["I want to send back order {order_id}.", "Return order {order_id}, please.",
           "Order {order_id} is {reason}, I'd like to return it.", "How do I return my order {order_id}?"],
          ["to return order {order_id}", "a return for order {order_id}"],
          {"reason": ["because it's {reason}", ", reason: {reason}"]}),
    ]),
    Domain("cinema", "live_events", [
        A("find", "find_showtimes movie_showtimes showtimes cinema_listings whats_showing film_times",
          ["Showtimes of a film in nearby cinemas.", "Cinema listings for a movie.", "When and where a film is showing."],
          "movie*:string:movie:movie film title movie_title:Film;"
          "city:string:city:city location near:Where;"
          "date:string:date:date when show_date:Which date",
          ["When is {movie} showing?", "Where can I see {movie}?", "Is {movie} on anywhere in {city}?",
           "What times is {movie} on {date}?", "I want to watch {movie} at the cinema."],
          ["showtimes for {movie}", "to see {movie} at a cinema"],
          {"city": ["in {city}", "near {city}"], "date": ["{date}"]}),
        A("make", "book_cinema_seats buy_cinema_passes book_movie book_film_seats cinema_booking",
          ["Book seats for a film.", "Buys cinema seats for a showing."],
          "movie*:string:movie:movie film title:Film;"
          "seats:integer:int2-6:seats num_seats people how_many:Number of seats;"
          "showtime:string:time:showtime time starts_at:Start of the showing",
          ["Get me {seats} seats for {movie}.", "Book {movie} for {seats} of us.", "Grab seats for {movie} at {showtime}.",
           "I'd like to see {movie}, book it."],
          ["seats for {movie}", "to book {movie}"],
          {"seats": ["for {seats} people"], "showtime": ["at {showtime}", "for the {showtime} showing"]}),
    ]),
    Domain("podcast", "podcast", [
        A("find", "find_podcasts search_podcasts podcast_search discover_podcasts podcast_finder",
          ["Find podcasts on a topic.", "Podcast search.", "Suggests podcasts about a subject."],
          "topic*:string:podcast_topic:topic query subject genre:Subject",
          ["Any good podcasts about {topic}?", "Recommend me a podcast on {topic}.", "I want something to listen to about {topic}.",
           "Find shows about {topic} I can listen to."],
          ["podcasts about {topic}", "a podcast on {topic}"]),
        A("make", "subscribe_podcast follow_podcast podcast_subscribe add_podcast",
          ["Subscribe to a podcast.", "Follows a podcast so new episodes arrive."],
          "podcast*:string:podcast:podcast show name podcast_name:Podcast",
          ["Subscribe me to {podcast}.", "Follow {podcast} for me.", "I want new episodes of {podcast} automatically."],
          ["to follow {podcast}", "a subscription to {podcast}"]),
    ]),
    Domain("lights", "home", [
        A("make", "switch_lights set_lights toggle_lights lights_power light_switch control_lights",
          ["Switch lights on or off.", "Turns the lights in a room on or off.", "Smart light power control."],
          "room*:string:room:room area zone where location:Room;"
          "state*:enum=on/off:room:state power on_off:On or off",
          ["Turn the {room} lights {state}.", "Switch {state} the lights in the {room}.", "Lights {state} in the {room}, please.",
           "Can you put the {room} lights {state}?"],
          ["the {room} lights {state}", "to switch the lights in the {room} {state}"]),
        A("adjust", "dim_lights set_brightness light_level brightness dim_room",
          ["Set the brightness of the lights.", "Dims or brightens the lights in a room."],
          "room*:string:room:room area where:Room;"
          "brightness*:integer:int5-100:brightness level percent:Brightness in percent",
          ["Dim the {room} lights to {brightness} percent.", "Set the {room} to {brightness}% brightness.",
           "Make the {room} lights {brightness} percent."],
          ["the {room} lights at {brightness} percent", "to dim the {room} lights"]),
    ]),
    Domain("thermostat", "home_heat", [
        A("make", "set_thermostat set_heating thermostat_set heating_target adjust_heating",
          ["Set the thermostat.", "Sets the target temperature of the heating.", "Changes the home heating target."],
          "temperature*:integer:int15-27:temperature target_temp degrees setpoint:Target in degrees;"
          "room:string:room:room zone area:Room",
          ["Set the heating to {temperature} degrees.", "Make it {temperature} degrees in here.",
           "Turn the thermostat to {temperature}.", "I'm cold, put the heat up to {temperature}.",
           "Warm the {room} to {temperature} degrees."],
          ["the heating at {temperature} degrees", "the thermostat set to {temperature}"],
          {"room": ["in the {room}"]}),
    ]),
    Domain("bank", "money", [
        A("find", "get_balance bank_balance check_balance balance_inquiry show_balance",
          ["Current balance of a bank card or savings.", "Shows how much money is in the bank.", "Bank balance."],
          "kind:enum=checking/savings/credit:room:kind which balance_type:Which balance",
          ["How much money do I have?", "What's my bank balance?", "How much is left in my {kind}?",
           "Check my {kind} balance.", "Am I broke? What's in the bank?"],
          ["the bank balance", "to know how much money is in the bank"]),
        A("make", "transfer_funds bank_transfer move_money pay_someone wire_money",
          ["Transfer money to someone.", "Makes a bank transfer.", "Pays a person from the bank."],
          "payee*:string:person:payee beneficiary to_person pay_to:Who gets the money;"
          "sum*:number:money5-900:sum total how_much value:How much;"
          "memo:string:expense_note:memo note reference:Note on the transfer",
          ["Pay {payee} {sum} dollars.", "Transfer {sum} dollars to {payee}.",
           "Move {sum} to {payee}.", "I owe {payee} {sum}, please pay them.", "Wire {payee} {sum} dollars."],
          ["to pay {payee} {sum}", "a transfer of {sum} to {payee}"],
          {"memo": ["for {memo}", "with the note {memo}"]}),
    ]),
    Domain("notes", "tasks", [
        A("make", "create_note add_note save_note new_note jot_down write_note",
          ["Create a note.", "Saves a short note.", "Adds a note to the notebook."],
          "content*:string:note:content body note note_body:What to write down;"
          "title:string:note_title:title heading name:Title",
          ["Make a note: {content}.", "Write down that {content}.", "Jot this down: {content}.",
           "Save a note titled {title}: {content}.", "Note for later, {content}."],
          ["a note saying {content}", "to write down {content}"],
          {"title": ["under {title}", "titled {title}"]}),
        A("find", "search_notes find_notes notes_search find_in_notes",
          ["Search the notes.", "Finds notes that mention something."],
          "query*:string:note_title:query search keyword term:What to look for",
          ["Find my notes about {query}.", "What did I write about {query}?", "Pull up my notes on {query}."],
          ["notes about {query}", "to find the notes on {query}"]),
    ]),
    Domain("directions", "route", [
        A("find", "get_directions directions route_to navigate plan_route how_to_get_there",
          ["Directions between two places.", "Route from A to B by car, bike, on foot or transit.", "Turn-by-turn navigation."],
          "destination*:string:place:destination to_place end where_to goal:Where to go;"
          "origin:string:place:origin start from_place starting_point:Where from;"
          "travel_by:enum=walking/driving/cycling/transit:travel_by:travel_by transport means:How to travel",
          ["How do I get to {destination}?", "Directions to {destination}, please.", "What's the way to {destination} from {origin}?",
           "Show me how to reach {destination}.", "Which way to {destination}?"],
          ["directions to {destination}", "the way to {destination}"],
          {"origin": ["from {origin}", "starting at {origin}"], "travel_by": ["by {travel_by}", "{travel_by}"]}),
    ]),
    Domain("transit", "route", [
        A("find", "next_departures bus_times rail_departures transit_departures departures_board next_bus",
          ["Next departures from a station.", "Upcoming buses and trains at a station.", "Live departure board."],
          "station*:string:city:station from_station origin_station:Station;"
          "line:string:line:line route_no service:Line",
          ["When's the next bus from {station}?", "What leaves {station} soon?", "Next departures at {station}?",
           "When does {line} leave from {station}?", "I'm at {station}, what's coming?"],
          ["the next departures from {station}", "to know what leaves {station}"],
          {"line": ["on {line}", "for {line}"]}),
    ]),
    Domain("rental", "vehicle_rental", [
        A("find", "rent_vehicle rental_search find_rental hire_vehicle vehicle_hire rental_quote",
          ["Find a rental vehicle.", "Search rental cars and vans in a city.", "Vehicle hire."],
          "city*:string:city:city pickup_city location:Where to pick it up;"
          "start:string:date:start pickup_date from_date:First day;"
          "days:integer:int2-21:duration rental_length hire_length:How many days;"
          "size:enum=compact/suv/van/estate:room:size category vehicle_size:Size",
          ["I need a rental car in {city}.", "Hire me a car in {city} for {days} days.", "Can I rent a {size} in {city}?",
           "Find a car to rent in {city} from {start}.", "Any rental cars at {city}?"],
          ["a rental car in {city}", "to hire a car in {city}"],
          {"start": ["from {start}", "starting {start}"], "days": ["for {days} days"], "size": [", a {size} if possible"]}),
    ]),
    Domain("doctor", "health", [
        A("make", "book_appointment doctor_appointment see_doctor book_doctor clinic_booking",
          ["Book an appointment with a doctor.", "Makes a clinic appointment.", "Books a visit with a health professional."],
          "specialist*:string:specialty:specialist doctor provider practitioner:Who to see;"
          "date:string:date:date when preferred_date:Preferred date;"
          "reason:string:reason:reason complaint symptoms:What it is about",
          ["I need to see a {specialist}.", "Book me in with the {specialist} {date}.", "Can I get an appointment with a {specialist}?",
           "Make a {specialist} appointment for {date}.", "I'd like to see the {specialist}."],
          ["an appointment with a {specialist}", "to see a {specialist}"],
          {"date": ["{date}", "for {date}"]}),
        A("cancel", "cancel_appointment appointment_cancel cancel_visit cancel_doctor",
          ["Cancel a doctor's appointment.", "Cancels a clinic booking by its id."],
          "appointment_id*:string:code-appointment:appointment_id booking_id visit_id:Appointment id",
          ["Cancel my appointment {appointment_id}.", "I can't make appointment {appointment_id}, cancel it.",
           "Call off visit {appointment_id}."],
          ["to cancel appointment {appointment_id}", "the visit {appointment_id} cancelled"]),
    ]),
    Domain("gym", "gym", [
        A("make", "book_class join_class gym_booking book_fitness_class class_signup",
          ["Book a gym class.", "Signs up for a fitness class.", "Reserves a spot in a class at the gym."],
          "class_name*:string:gym_class:class_name class activity session:Class;"
          "date:string:date:date when:Date;"
          "start:string:time:start starts_at at:Start",
          ["Sign me up for {class_name}.", "Book a {class_name} class {date}.", "I want to do {class_name} at {start}.",
           "Get me a spot in {class_name}.", "Put me down for {class_name} {date} at {start}."],
          ["a spot in {class_name}", "to join a {class_name} class"],
          {"date": ["{date}"], "start": ["at {start}"]}),
        A("find", "list_classes gym_classes class_list classes_on what_classes",
          ["List gym classes.", "Which classes run at the gym on a date."],
          "date:string:date:date on_date when:Date",
          ["What classes are on {date}?", "What's running at the gym?", "Show me the gym classes for {date}."],
          ["the list of gym classes", "to see what classes run"]),
    ]),
    Domain("library", "library", [
        A("find", "search_catalog library_search find_book catalog_search book_search",
          ["Search the library catalogue.", "Finds books by title or author.", "Is a book in the library."],
          "title*:string:book:title book_title query name:Title;"
          "author:string:author:author writer by:Author",
          ["Does the library have {title}?", "Is {title} by {author} available to borrow?",
           "Look for {title} in the library.", "Can I borrow {title}?", "Is there a copy of {title} on the shelves?"],
          ["the book {title} from the library", "to borrow {title}"],
          {"author": ["by {author}"]}),
        A("make", "renew_loan renew_book extend_loan library_renew renew_borrowed",
          ["Renew a library loan.", "Extends a borrowed book's due date."],
          "title*:string:book:title book_title item:Book",
          ["Renew {title} for me.", "Can I keep {title} longer?", "Extend my loan of {title}."],
          ["to keep {title} longer", "the loan of {title} renewed"]),
    ]),
    Domain("parking", "parking", [
        A("find", "find_parking parking_near parking_search nearby_parking garage_finder",
          ["Find parking near a place.", "Nearby parking garages and free spaces.", "Parking search."],
          "near*:string:place:near location address around destination:Where;"
          "hours:integer:int2-10:hours duration stay_hours:How long",
          ["Where can I park near {near}?", "Any parking close to {near}?", "I need a spot to leave the car near {near}.",
           "Find me parking at {near} for {hours} hours."],
          ["parking near {near}", "a place to park near {near}"],
          {"hours": ["for {hours} hours"]}),
        A("make", "pay_parking parking_payment start_parking park_session pay_for_parking",
          ["Pay for parking.", "Starts a paid parking session for a plate."],
          "plate*:string:code-plate:plate license_plate registration reg:Number plate;"
          "hours:integer:int2-10:hours duration:How long;"
          "zone:string:code-charger:zone area_code lot:Parking zone",
          ["Pay parking for {plate}.", "Start parking for {plate} for {hours} hours.", "I parked, plate {plate}, pay it please.",
           "Pay {hours} hours of parking for {plate} in zone {zone}."],
          ["to pay parking for {plate}", "a parking session for {plate}"],
          {"hours": ["for {hours} hours"], "zone": ["in zone {zone}"]}),
    ]),
    Domain("pharmacy", "pharmacy", [
        A("make", "refill_prescription order_refill prescription_refill renew_prescription refill_meds",
          ["Refill a prescription.", "Orders a refill of a medication.", "Repeat prescription request."],
          "medication*:string:medication:medication medicine drug prescription:Medicine;"
          "pharmacy:string:address:pharmacy store_address pickup_at:Pharmacy to pick up at",
          ["I'm running out of {medication}, refill it.", "Refill my {medication}.", "Order more {medication} for me.",
           "I need a repeat of my {medication} prescription."],
          ["a refill of {medication}", "more {medication}"],
          {"pharmacy": ["for pickup at {pharmacy}", "at the pharmacy on {pharmacy}"]}),
        A("find", "find_pharmacy nearest_pharmacy pharmacy_near chemist_finder",
          ["Find a pharmacy nearby.", "Nearest chemists, optionally only open ones."],
          "near*:string:place:near location around address:Where;"
          "open_now:boolean:-:open_now only_open open:Only pharmacies open now",
          ["Where's the nearest pharmacy to {near}?", "Is there a chemist near {near}?", "I need a pharmacy around {near}."],
          ["a pharmacy near {near}", "the nearest chemist to {near}"],
          {"open_now": ["that's open now", "open right now"]}),
    ]),
    Domain("pet", "pet", [
        A("make", "log_feeding pet_feeding record_feeding feed_log pet_meal_log",
          ["Log a pet's meal.", "Records that a pet was fed.", "Pet feeding diary."],
          "pet*:string:pet:pet pet_name animal name:Pet;"
          "food:string:pet_food:food meal what:What it ate;"
          "grams:integer:int20-400:grams portion_g serving:Portion in grams",
          ["I just fed {pet}.", "Note that {pet} had {food}.", "{pet} ate {grams} grams of {food}, log it.", "Log {pet}'s dinner."],
          ["to log that {pet} was fed", "{pet}'s meal recorded"],
          {"food": ["some {food}", "with {food}"], "grams": [", {grams} grams"]}),
        A("find", "find_vet vet_near nearest_vet animal_clinic vet_search",
          ["Find a vet nearby.", "Animal clinics near a place."],
          "near*:string:city:near city location:Where",
          ["My dog is sick, is there a vet in {near}?", "Find an animal doctor near {near}.", "Vets around {near}?"],
          ["a vet in {near}", "an animal clinic near {near}"]),
    ]),
    Domain("plant", "plant", [
        A("make", "log_watering water_log plant_watered record_watering watering_diary",
          ["Log that a plant was watered.", "Plant watering diary.", "Records watering of a house plant."],
          "plant*:string:plant:plant plant_name which:Plant;"
          "ml:integer:int50-1000:ml water_ml:Water in millilitres",
          ["I watered the {plant}.", "The {plant} got {ml} ml of water, note it.", "Log watering for my {plant}.",
           "Just gave the {plant} a drink."],
          ["to record that the {plant} was watered", "the watering of the {plant} logged"],
          {"ml": ["with {ml} ml"]}),
        A("find", "plant_care care_guide plant_tips care_tips plant_help",
          ["Care tips for a plant.", "How to look after a plant: light, water, soil."],
          "plant*:string:plant:plant species name:Plant",
          ["How often should I water a {plant}?", "My {plant} looks sad, any tips?", "How do I look after a {plant}?",
           "Does a {plant} need much light?"],
          ["care tips for a {plant}", "to know how to look after a {plant}"]),
    ]),
    Domain("lottery", "lottery", [
        A("find", "lottery_results winning_numbers draw_results get_draw lotto_results",
          ["Winning numbers of a lottery draw.", "Latest lottery results.", "Results of a draw by game."],
          "game*:string:lottery:game lottery draw name:Which lottery;"
          "date:string:date:date draw_date:Draw date",
          ["What were the {game} numbers?", "Did anyone win {game} {date}?", "Winning numbers for {game}?",
           "Show me last night's {game} draw."],
          ["the {game} results", "the winning {game} numbers"],
          {"date": ["from {date}", "for {date}"]}),
    ]),
    Domain("horoscope", "horoscope", [
        A("find", "get_horoscope horoscope daily_horoscope star_sign_reading astrology",
          ["Horoscope for a star sign.", "Daily astrology reading.", "What the stars say for a sign."],
          "sign*:string:sign:sign zodiac star_sign zodiac_sign:Star sign;"
          "period:enum=today/tomorrow/week:room:period when range:Which period",
          ["What's my horoscope? I'm a {sign}.", "Horoscope for {sign}, please.", "What do the stars say for {sign}?",
           "Read me the {sign} horoscope for {period}."],
          ["the horoscope for {sign}", "a {sign} reading"],
          {"period": ["for {period}"]}),
    ]),
    Domain("quotes", "quotes", [
        A("find", "random_quote get_quote inspire_me quote_of_the_moment famous_quote",
          ["A famous quotation.", "Returns an inspiring quote, optionally on a topic or by an author.", "Quote finder."],
          "topic:string:quote_topic:topic theme subject about:Theme;"
          "author:string:quote_author:author by person:Who said it",
          ["Give me an inspiring quote.", "I need some motivation, a quote about {topic}?", "Something {author} said about {topic}?",
           "Share a famous line about {topic}.", "Quote me {author}."],
          ["a quote", "an inspiring quotation"],
          {"topic": ["about {topic}", "on {topic}"], "author": ["by {author}", "from {author}"]}),
    ]),
    Domain("trivia", "trivia", [
        A("find", "trivia_question get_trivia quiz_question random_trivia trivia",
          ["A trivia question.", "Random quiz question by category and difficulty."],
          "category:string:trivia_cat:category topic subject:Category;"
          "difficulty:enum=easy/medium/hard:room:difficulty level:How hard",
          ["Ask me a trivia question.", "Quiz me on {category}.", "Give me a {difficulty} question about {category}.",
           "Test my knowledge!", "Got a brain teaser about {category}?"],
          ["a trivia question", "to be quizzed"],
          {"category": ["about {category}"], "difficulty": [", make it {difficulty}", ", a {difficulty} one"]}),
    ]),
    Domain("tv", "tv", [
        A("find", "tv_guide tv_listings whats_on_tv channel_guide broadcast_listings",
          ["What's on TV.", "TV listings by channel and time.", "Programme guide."],
          "channel:string:tv_channel:channel station network:Channel;"
          "date:string:date:date when:Date",
          ["What's on TV tonight?", "What's on {channel}?", "Anything good on {channel} {date}?", "What's on the telly {date}?",
           "Show me the TV guide."],
          ["the TV listings", "to know what is on TV"],
          {"channel": ["on {channel}"], "date": ["{date}"]}),
    ]),
    Domain("concert", "live_events", [
        A("find", "find_concerts concert_search gigs_near live_shows tour_dates",
          ["Find concerts.", "Upcoming gigs by performer or city.", "Concert search."],
          "performer:string:performer:performer band act headliner:Performer;"
          "city:string:city:city location where:City",
          ["Is {performer} touring?", "Any gigs in {city}?", "When is {performer} coming to {city}?",
           "Concerts in {city}?", "Where can I see {performer} live?", "Any good gigs coming up?"],
          ["concerts", "live shows"],
          {"city": ["in {city}", "near {city}"]}),
        A("make", "buy_concert_seats book_gig concert_booking book_concert",
          ["Buy seats for a concert.", "Books places at a gig."],
          "performer*:string:performer:performer band show:Performer;"
          "seats:integer:int2-6:seats num_seats how_many:Number of seats;"
          "city:string:city:city venue_city where:City",
          ["Get me into the {performer} concert.", "Book {seats} places for {performer}.", "I want to see {performer} live, buy seats."],
          ["seats for {performer}", "to go to the {performer} concert"],
          {"seats": ["for {seats} people", "{seats} seats"], "city": ["in {city}"]}),
    ]),
    Domain("events", "live_events", [
        A("find", "find_events events_near whats_on event_search local_events things_to_do",
          ["Find events in a city.", "Local events by date and type.", "What's going on in town."],
          "city*:string:city:city location where area:City;"
          "date:string:date:date when:Date;"
          "kind:string:event_kind:kind category event_type:Type of event",
          ["What's going on in {city}?", "Anything fun to do in {city} {date}?", "Are there any {kind} in {city}?",
           "Things to do in {city}?", "I'm bored in {city}, what's on?"],
          ["events in {city}", "things to do in {city}"],
          {"date": ["{date}", "for {date}"], "kind": ["like {kind}"]}),
    ]),
    Domain("jobs", "jobs", [
        A("find", "search_jobs job_search find_jobs job_listings vacancies openings",
          ["Search job openings.", "Job listings by role and city.", "Finds vacancies."],
          "role*:string:job_title:role position title job_title:Role;"
          "city:string:city:city location where:City;"
          "remote:boolean:-:remote remote_only work_from_home:Remote jobs only",
          ["Any {role} jobs in {city}?", "I'm looking for work as a {role}.", "Find me {role} openings.",
           "Who's hiring a {role}?", "Find {role} positions in {city}."],
          ["{role} jobs", "work as a {role}"],
          {"city": ["in {city}", "around {city}"], "remote": ["that I can do from home", ", remote only"]}),
    ]),
    Domain("homes", "lodging", [
        A("find", "search_listings find_apartments home_search flat_finder rentals_search property_search",
          ["Search homes for rent or sale.", "Apartment and house listings.", "Real-estate listings by city and size."],
          "city*:string:city:city location area where:City;"
          "bedrooms:integer:int1-5:bedrooms beds rooms num_bedrooms:Bedrooms;"
          "max_rent:number:money400-3000:max_rent budget max_price rent_cap:Highest monthly rent",
          ["I'm looking for a flat in {city}.", "Any apartments for rent in {city}?", "Find a {bedrooms}-bedroom place in {city}.",
           "Houses in {city} under {max_rent} a month?", "I need to move to {city}, what's available?"],
          ["a flat in {city}", "a home in {city}"],
          {"bedrooms": ["with {bedrooms} bedrooms"], "max_rent": ["under {max_rent} a month", "up to {max_rent} per month"]}),
    ]),
    Domain("nutrition", "nutrition", [
        A("find", "nutrition_facts get_nutrition food_info calorie_info nutrients",
          ["Nutrition facts of a food.", "Calories and nutrients of a food."],
          "food*:string:food:food item query:Food",
          ["How many calories in {food}?", "Is {food} healthy?", "How much protein does {food} have?",
           "What's the nutrition of {food}?"],
          ["the nutrition facts of {food}", "the calories in {food}"]),
    ]),
    Domain("fitness", "fitness", [
        A("make", "log_workout record_workout add_exercise workout_log track_exercise",
          ["Log a workout.", "Records an exercise session.", "Adds a workout to the activity diary."],
          "activity*:string:activity:activity sport exercise type:Activity;"
          "duration:integer:int10-120:duration length_minutes time_spent:Length in minutes;"
          "distance_km:number:money1-42:distance_km km distance:Distance in km",
          ["I did {activity} for {duration} minutes.", "Log a {activity} session.", "Did {distance_km} km of {activity} today.",
           "Record my {activity}, {duration} minutes.", "Add {activity} to my workouts."],
          ["to log a {activity} workout", "a {activity} session recorded"],
          {"duration": ["for {duration} minutes"], "distance_km": ["{distance_km} km"]}),
        A("find", "get_steps step_total daily_steps activity_summary steps_walked",
          ["Steps walked on a date.", "Daily activity summary."],
          "date:string:date:date when:Date",
          ["How many steps did I do {date}?", "How much did I walk today?", "Show my activity for {date}."],
          ["the steps walked", "the activity summary"]),
    ]),
    Domain("sleep", "sleep", [
        A("find", "sleep_summary get_sleep sleep_stats sleep_report night_summary",
          ["Sleep statistics for a night.", "How long and how well the user slept."],
          "date:string:date:date night when:Night",
          ["How did I sleep?", "How long did I sleep {date}?", "Was my sleep any good {date}?", "Show my sleep stats."],
          ["the sleep summary", "to know how they slept"]),
    ]),
    Domain("todo", "tasks", [
        A("make", "add_todo add_task new_task create_todo todo_add",
          ["Add an item to the to-do list.", "Creates a task.", "Puts something on the task list."],
          "task*:string:todo:task item title what:Task;"
          "due:string:date:due due_date by when:Due date",
          ["Add '{task}' to my to-do list.", "Put '{task}' on my list.", "I need to {task} by {due}.", "New task: {task}."],
          ["{task} on the to-do list", "a task to {task}"],
          {"due": ["by {due}", "due {due}"]}),
        A("cancel", "complete_task mark_done finish_task check_off done_task",
          ["Mark a task as done.", "Ticks off an item of the to-do list."],
          "task*:string:todo:task item title:Task",
          ["I've done {task}, tick it off.", "Mark '{task}' as done.", "Cross {task} off my list."],
          ["to mark {task} as done", "to tick off {task}"]),
    ]),
    Domain("grocery", "tasks", [
        A("make", "add_grocery grocery_list_add add_to_list groceries_add list_item_add",
          ["Add an item to the grocery list.", "Puts groceries on the list.", "Grocery list."],
          "item*:string:grocery:item grocery name what:Item;"
          "how_many:integer:int2-12:how_many qty pieces number_of:How many",
          ["Put {item} on the grocery list.", "We're out of {item}.", "Add {how_many} {item} to the list.",
           "Remember we need {item}."],
          ["{item} on the grocery list", "to buy {item}"],
          {"how_many": ["({how_many} of them)", ", we need {how_many}"]}),
        A("cancel", "remove_grocery grocery_list_remove remove_from_list delete_grocery",
          ["Remove an item from the grocery list.", "Takes something off the grocery list."],
          "item*:string:grocery:item grocery name:Item",
          ["Take {item} off the grocery list.", "We don't need {item} anymore.", "Remove {item} from the list."],
          ["{item} off the grocery list", "to remove {item} from the list"]),
    ]),
    Domain("contacts", "contacts", [
        A("find", "find_contact contact_search get_contact address_book_search who_is",
          ["Look up a contact.", "Finds a person in the address book.", "Contact details by name."],
          "name*:string:person:name contact person full_name:Name",
          ["What's {name}'s number?", "Find {name} in my contacts.", "Do I have {name}'s address?", "Get me {name}'s details."],
          ["the details of {name}", "{name}'s contact details"]),
        A("make", "call_contact start_call dial ring place_call voice_call",
          ["Call someone.", "Starts a voice call.", "Dials a contact."],
          "contact*:string:person:contact callee name who:Who to call;"
          "line:enum=mobile/work/home:contact_label:line which_number label:Which number",
          ["Call {contact}.", "Ring {contact} for me.", "Get {contact} on the line.", "Can you dial {contact} at {line}?",
           "I want to talk to {contact}."],
          ["to call {contact}", "a call with {contact}"],
          {"line": ["on their {line} number", "at {line}"]}),
    ]),
    Domain("invoice", "invoice", [
        A("make", "issue_invoice bill_client invoice_client new_invoice raise_invoice",
          ["Issue an invoice to a client.", "Creates and sends a bill.", "Bills a customer."],
          "client*:string:company:client customer bill_to company:Client;"
          "total*:number:money50-9000:total sum value:Total;"
          "due_date:string:date:due_date due pay_by:Due date",
          ["Bill {client} {total} dollars.", "Invoice {client} for {total}.", "Charge {client} {total}, due {due_date}.",
           "{client} owes us {total}, raise an invoice."],
          ["to bill {client} {total}", "an invoice to {client} for {total}"],
          {"due_date": ["due {due_date}", "payable by {due_date}"]}),
        A("check", "invoice_status get_invoice check_invoice invoice_paid payment_status",
          ["Status of an invoice.", "Whether an invoice was paid."],
          "invoice_id*:string:code-invoice:invoice_id invoice_number ref number:Invoice number",
          ["Has {invoice_id} been paid?", "What's the status of invoice {invoice_id}?", "Did the client settle {invoice_id}?"],
          ["the status of invoice {invoice_id}", "to know whether {invoice_id} was paid"]),
    ]),
    Domain("expenses", "money_log", [
        A("make", "log_expense add_expense record_spending expense_add track_spending",
          ["Log an expense.", "Records money spent.", "Adds a purchase to the budget."],
          "cost*:number:money2-300:cost price spent sum total:How much;"
          "category:string:expense_cat:category kind bucket:Category;"
          "note:string:expense_note:note memo description_note what:What it was",
          ["I spent {cost} on {note}.", "Log {cost} for {category}.", "Add an expense of {cost}.",
           "Paid {cost} dollars for {note}, file it under {category}."],
          ["to log an expense of {cost}", "{cost} of spending recorded"],
          {"category": ["under {category}", "as {category}"], "note": ["for {note}"]}),
        A("find", "spending_summary expense_report get_spending budget_summary spend_total",
          ["Spending summary.", "How much was spent, by category and month."],
          "category:string:expense_cat:category kind:Category;"
          "month:string:date:month period:Month",
          ["How much have I spent this month?", "What did I spend on {category}?", "Show my spending on {category} for this month.",
           "Am I over budget?"],
          ["a summary of the spending", "to know how much was spent"],
          {"category": ["on {category}"]}),
    ]),
    Domain("bikes", "bikes", [
        A("find", "find_bikes bike_near bike_share_docks nearest_bike docks_near",
          ["Find shared bikes nearby.", "Bike-share docks with free bikes."],
          "near*:string:place:near location around address:Where;"
          "electric:boolean:-:electric e_bike ebike_only:Only e-bikes",
          ["Any bikes near {near}?", "Where can I grab a bike around {near}?", "I want to cycle from {near}, any docks?"],
          ["a shared bike near {near}", "a bike dock near {near}"],
          {"electric": [", an e-bike if possible", ", electric ones only"]}),
        A("make", "unlock_bike rent_bike start_bike bike_unlock",
          ["Unlock a shared bike.", "Starts a bike rental by bike number."],
          "bike_id*:string:code-bike:bike_id bike_number id:Bike number",
          ["Unlock bike {bike_id}.", "I'm at bike {bike_id}, let me ride it.", "Start a rental on bike {bike_id}."],
          ["to unlock bike {bike_id}", "bike {bike_id} unlocked"]),
    ]),
    Domain("charging", "charging", [
        A("find", "find_chargers charging_stations ev_chargers charger_map nearest_charger",
          ["Find EV charging stations.", "Chargers for electric vehicles near a place."],
          "near*:string:place:near location around:Where;"
          "connector:enum=ccs/type2/chademo/tesla:room:connector plug plug_type:Plug",
          ["Where can I charge my EV near {near}?", "Any chargers around {near}?", "My battery's low, find a charger near {near}.",
           "I need a {connector} charger close to {near}."],
          ["a charger near {near}", "somewhere to charge near {near}"],
          {"connector": ["with a {connector} plug"]}),
        A("make", "start_charging charge_session begin_charge charger_start",
          ["Start a charging session.", "Starts charging at a charger."],
          "charger_id*:string:code-charger:charger_id station_id point:Charger",
          ["Start charging at {charger_id}.", "I'm plugged in at {charger_id}, turn it on.", "Begin a charge on {charger_id}."],
          ["to start charging at {charger_id}", "a charge on {charger_id}"]),
    ]),
    Domain("air", "air", [
        A("find", "air_quality get_aqi aqi pollution_level air_index",
          ["Air quality index of a city.", "Pollution levels."],
          "city*:string:city:city location where:City",
          ["How's the air in {city}?", "Is it safe to run outside in {city}? How's the pollution?", "Air quality in {city}?",
           "Is the smog bad in {city}?"],
          ["the air quality in {city}", "the pollution level in {city}"]),
    ]),
    Domain("pollen", "air", [
        A("find", "pollen_levels allergy_outlook hay_fever_index pollen_report",
          ["Pollen levels for a place.", "Allergy risk from pollen."],
          "city*:string:city:city location where:City;"
          "kind:enum=grass/tree/weed:room:kind pollen_kind:Pollen",
          ["Is the pollen bad in {city}?", "My hay fever is acting up, pollen in {city}?", "How much {kind} pollen in {city}?",
           "Allergy levels in {city}?"],
          ["the pollen level in {city}", "the allergy outlook for {city}"],
          {"kind": [", {kind} pollen especially"]}),
    ]),
    Domain("tide", "sea", [
        A("find", "tide_times get_tides tides high_tide tide_chart",
          ["Tide times for a beach.", "High and low tides."],
          "beach*:string:beach:beach place spot location:Beach;"
          "date:string:date:date when:Date",
          ["When is high tide at {beach}?", "Tides at {beach} {date}?", "When's low water at {beach}?"],
          ["the tides at {beach}", "the tide times for {beach}"],
          {"date": ["{date}"]}),
    ]),
    Domain("sun", "sun", [
        A("find", "sunrise_sunset sun_times daylight golden_hour daylight_hours",
          ["Sunrise and sunset for a place.", "Daylight hours."],
          "city*:string:city:city location place:City;"
          "date:string:date:date when:Date",
          ["When does the sun set in {city}?", "When is sunrise in {city}?",
           "How long is daylight in {city} {date}?", "When's golden hour in {city}?"],
          ["sunset and sunrise in {city}", "the daylight hours of {city}"],
          {"date": ["{date}"]}),
    ]),
    Domain("flowers", "gifts", [
        A("make", "order_flowers flower_delivery deliver_flowers",
          ["Order flowers for delivery.", "Delivers a bouquet to someone."],
          "bouquet*:string:bouquet:bouquet flowers arrangement:Flowers;"
          "deliver_to*:string:person:deliver_to for_person gift_for name:Who gets them;"
          "address:string:address:address delivery_address where:Where",
          ["Get {bouquet} to {deliver_to}.", "Have {bouquet} delivered to {deliver_to}.",
           "Order {bouquet} for {deliver_to}.", "Surprise {deliver_to} with {bouquet} at {address}."],
          ["{bouquet} for {deliver_to}", "flowers delivered to {deliver_to}"],
          {"address": ["at {address}", "to {address}"]}),
    ]),
    Domain("lock", "home_security", [
        A("make", "lock_door smart_lock door_lock lock_up secure_door",
          ["Lock a door.", "Locks a smart lock."],
          "door*:string:door:door which lock_name:Door",
          ["Lock the {door}.", "Did I lock the {door}? Lock it.", "Make sure the {door} is locked."],
          ["the {door} locked", "to lock the {door}"]),
        A("make2", "unlock_door open_lock door_unlock let_in",
          ["Unlock a door.", "Opens a smart lock."],
          "door*:string:door:door which lock_name:Door",
          ["Unlock the {door}.", "Let me in through the {door}.", "Open the {door} lock."],
          ["the {door} unlocked", "to open the {door}"]),
    ]),
    Domain("vacuum", "cleaning", [
        A("make", "start_vacuum vacuum_room robot_clean clean_room start_cleaning",
          ["Start the robot vacuum.", "Cleans a room with the robot vacuum."],
          "room:string:room:room area zone where:Room",
          ["Vacuum the {room}.", "Clean the floors.", "Run the robot in the {room}.", "The {room} is dusty, clean it."],
          ["the floors cleaned", "the robot vacuum running"]),
    ]),
]

ACTIONS = [a for d in DOMAINS for a in d.actions]
# Pairs of a domain's actions where one can't do the other's job (a decline's near miss).
SAFE_PAIRS = {frozenset(p) for p in [("cancel", "find"), ("cancel", "make"), ("cancel", "check"), ("cancel", "find2"),
                                      ("cancel", "make2"), ("make", "check"), ("make2", "check"), ("find", "make2"),
                                      ("make", "make2"), ("find", "find2")]}


def _assert_lexicon():
    assert len(DOMAINS) >= 40, len(DOMAINS)
    for a in ACTIONS:
        for n in a.names:
            assert not forbidden_in_name(n), n
        for d in a.descs:
            assert not forbidden_in_name(d), d


_assert_lexicon()


# ------------------------------------------------------------------------------------------------
# Tools and requests.
# ------------------------------------------------------------------------------------------------
def build_tool(rng, action, keep=None):
    """(schema, kept slots): a tool for the action; optional slots kept at random (keep: must)."""
    keep = set(keep or ())
    for _ in range(50):
        slots = [s for s in action.slots if s.required or s.key in keep or rng.random() < 0.7]
        used, props = set(), {}
        pnames = {}
        for s in slots:
            cands = [n for n in s.names if n not in used]
            if not cands:
                break
            p = rng.choice(cands) if rng.random() < 0.85 else cands[0]
            used.add(p)
            pnames[s.key] = p
            props[p] = s.schema(rng)
        else:
            if rng.random() < 0.2:
                items = list(props.items())
                rng.shuffle(items)
                props = dict(items)
            fn = {"name": rng.choice(action.names)}
            if rng.random() < 0.92:
                fn["description"] = rng.choice(action.descs)
            fn["parameters"] = {"type": "object", "properties": props,
                                "required": [pnames[s.key] for s in slots if s.required]}
            schema = {"type": "function", "function": fn}
            if not fresh_tools.violations(schema) and not schema_problems(schema):
                return schema, {s.key: pnames[s.key] for s in slots}
    raise RuntimeError("no natural tool for %s" % action.names)


def _fill(template, said):
    return template.format(**said)


def make_request(rng, action, kept):
    """(request, {slot key: value}, need): a request that says the required slots and some of the
    kept optional ones."""
    templates = [t for t in action.requests if set(re.findall(r"{(\w+)}", t)) <= set(kept)]
    t = rng.choice(templates)
    keys = set(re.findall(r"{(\w+)}", t))
    values, said = {}, {}
    for k in keys:
        values[k], said[k] = action.by_key[k].value(rng)
    extra = []
    for k in kept:
        if k not in keys and k in action.extras and rng.random() < 0.35 and len(extra) < 2:
            v, w = action.by_key[k].value(rng)
            values[k] = v
            phrase = rng.choice(action.extras[k])
            extra.append(phrase.format(**{k: w}) if w is not None else phrase)
    req = _fill(t, said)
    if extra:
        end = req[-1] if req[-1] in ".?!" else ""
        body = req[:-1] if end else req
        req = body + "".join(e if e.startswith(",") else " " + e for e in extra) + end
    need = _fill(rng.choice(action.needs), said)
    return (_cap(req) if not t.startswith("{") else req), values, need


CHAT_PRE = ["Hi! ", "Hello there! ", "Hey, hope you're well. ", "Good morning! ", "Hi, quick favour: ",
            "Evening! ", "Hey! Long day today. ", "Hello, thanks for the help earlier. "]
CHAT_POST = [" Thanks!", " Thank you so much.", " Cheers!", " You're a star.", " Thanks a lot!"]


def _style(rng, req, values):
    r = rng.random()
    if r < 0.1 and req[-1:] in ".?!":
        return req[:-1]
    if r < 0.18 and not any(str(v)[:1].isupper() and req.startswith(str(v)) for v in values.values()):
        return req[0].lower() + req[1:]
    if r < 0.28:
        return req[:-1] + " please" + req[-1:] if req[-1:] in ".?!" else req + " please"
    return req


def _other_tools(rng, families, k, share_word_with=None):
    """k tools of actions whose family is not in families; one of them, when asked, has a name
    sharing a word with one of share_word_with's names."""
    tools, names = [], set()
    pool = [a for a in ACTIONS if _family(a) not in families]
    if share_word_with is not None:
        parts = {p for n in share_word_with.names for p in n.split("_")}
        near = [(a, n) for a in pool for n in a.names if set(n.split("_")) & parts]
        if near:
            a, n = rng.choice(near)
            schema = _named_tool(rng, a, n)
            if schema is not None:
                tools.append((schema, a))
                names.add(n)
    for _ in range(k * 4):
        if len(tools) >= k:
            break
        a = rng.choice(pool)
        schema, _ = build_tool(rng, a)
        if schema["function"]["name"] not in names:
            tools.append((schema, a))
            names.add(schema["function"]["name"])
    return tools


def _named_tool(rng, action, name):
    for _ in range(20):
        schema, _ = build_tool(rng, action)
        schema["function"]["name"] = name
        if not fresh_tools.violations(schema) and not schema_problems(schema):
            return schema
    return None


_DOMAIN = {d.key: d for d in DOMAINS}


def _family(action):
    return _DOMAIN[action.domain].family


def _domain_of(action):
    return _DOMAIN[action.domain]


def sample(rng, mode=None, kind="natural"):
    """A conversation of kind 'natural' (task gtool) or 'natural_none' (task gtool_none)."""
    for _ in range(20):
        s = _sample(rng, mode, kind)
        if not sample_problems(s):
            return s
    raise RuntimeError("no natural sample without problems: %s" % sample_problems(s))


def _sample(rng, mode, kind):
    mode = mode or corpus._mode(rng)
    msgs = corpus._prefix(rng)
    action = rng.choice(ACTIONS)
    siblings = [a for a in _domain_of(action).actions if a is not action]
    if kind == "natural_none":
        kept = [s.key for s in action.slots if s.required or rng.random() < 0.6]
        req, values, need = make_request(rng, action, kept)
        tools = []
        near = [a for a in siblings if frozenset((a.role, action.role)) in SAFE_PAIRS]
        r = rng.random()
        if near and r < 0.3:
            a = rng.choice(near)
            tools.append((build_tool(rng, a)[0], a))
        k = rng.choice([1, 1, 2, 2, 3]) - len(tools)
        tools += _other_tools(rng, {_family(action)}, k, share_word_with=action if 0.3 <= r < 0.6 else None)
        tools = tools[:3]
        rng.shuffle(tools)
        msgs.append({"role": "user", "content": _style(rng, req, values)})
        msg = {"role": "assistant", "content": DECLINE}
        if mode != "disabled":
            msg["reasoning_content"] = "The user wants %s, but no offered tool does that." % need
        msgs.append(msg)
        offered = [t for t, _ in tools]
        return {"task": "gtool_none", "messages": msgs, "tools": offered or None, "kwargs": corpus._kwargs(rng, mode),
                "expect": {"name": None, "arguments": None}, "schemas": [(t, None) for t in offered],
                "natural": {"request": req, "domain": action.domain, "call": False}}
    schema, kept = build_tool(rng, action)
    req, values, need = make_request(rng, action, list(kept))
    args = {kept[k]: v for k, v in values.items()}
    ordered = [p for p in schema["function"]["parameters"]["properties"] if p in args]
    args = {p: args[p] for p in ordered}
    name = schema["function"]["name"]
    chat = rng.random() < 0.15
    prompt = _style(rng, req, values)
    if chat:
        first = prompt if prompt[:1].isupper() or not prompt[:1].isalpha() else _cap(prompt)
        prompt = rng.choice(CHAT_PRE) + first + (rng.choice(CHAT_POST) if rng.random() < 0.6 else "")
    think = "%sThe user wants %s. The offered tool %s does that. I will call it with %s." % (
        "The user greets me. " if chat else "", need, name, gen_tools.call_plan(args))
    fresh_tools.append_call(rng, msgs, prompt, name, args, think, mode)
    tools = []
    if siblings and rng.random() < 0.3:
        a = rng.choice(siblings)
        t = build_tool(rng, a)[0]
        if t["function"]["name"] != name:
            tools.append((t, a))
    k = rng.choice([0, 1, 1, 2, 2, 3])
    for t, a in _other_tools(rng, {_family(action)}, k):
        if t["function"]["name"] not in {name} | {x["function"]["name"] for x, _ in tools}:
            tools.append((t, a))
    tools = tools[:3] + [(schema, action)]
    rng.shuffle(tools)
    offered = [t for t, _ in tools]
    return {"task": "gtool", "messages": msgs, "tools": offered, "kwargs": corpus._kwargs(rng, mode),
            "expect": {"name": name, "arguments": args}, "schemas": [(t, None) for t in offered],
            "natural": {"request": prompt, "domain": action.domain, "call": True, "small_talk": chat,
                        "same_domain_distractor": any(a is not action and a.domain == action.domain for _, a in tools)}}


# ------------------------------------------------------------------------------------------------
# Checks.
# ------------------------------------------------------------------------------------------------
def _strings_of(schema):
    f = schema["function"]
    out = [("name", f["name"]), ("description", f.get("description", ""))]

    def walk(params):
        for p, spec in (params or {}).get("properties", {}).items():
            out.append(("parameter", p))
            out.append(("parameter description", spec.get("description", "")))
            for e in spec.get("enum") or []:
                out.append(("enum", e))
            if spec.get("type") == "object":
                walk(spec)

    walk(f.get("parameters"))
    return out


def schema_problems(schema):
    """Held-out domain words in a natural tool ([] when none)."""
    bad = []
    for what, s in _strings_of(schema):
        w = forbidden_in_name(s)
        if w:
            bad.append("%s %r has %s" % (what, s, w))
        if what == "parameter" and s in FORBIDDEN_PARAMS:
            bad.append("parameter %r is an evaluation domain's" % s)
        if what != "parameter" and FORBIDDEN_REQUEST.search(s):
            bad.append("%s %r has %s" % (what, s, FORBIDDEN_REQUEST.search(s).group(0)))
    return bad


def sample_problems(s):
    """What is wrong with a natural conversation ([] when nothing): held-out words or schemas,
    a call that does not match its request."""
    bad = []
    for t, base in s.get("schemas") or []:
        bad += fresh_tools.violations(t, base)
        bad += schema_problems(t)
    for t in s.get("tools") or []:
        if t["function"]["name"] in fresh_tools.FIXED:
            bad.append("fixed tool %s offered" % t["function"]["name"])
    users = [m["content"] for m in s["messages"] if m["role"] == "user"]
    for u in users:
        m = FORBIDDEN_REQUEST.search(u)
        if m:
            bad.append("request %r has %r" % (u, m.group(0)))
    for m in s["messages"]:
        if m.get("reasoning_content") and FORBIDDEN_REQUEST.search(m["reasoning_content"]):
            bad.append("reasoning %r has a held-out word" % m["reasoning_content"])
    names = [t["function"]["name"] for t in s.get("tools") or []]
    if len(set(names)) != len(names):
        bad.append("duplicate tool names %s" % names)
    exp = s["expect"]
    if exp["name"] is None:
        return bad
    req = users[-1]
    bad += gen_tools.call_plan_problems(s)
    tool = next((t for t in s["tools"] if t["function"]["name"] == exp["name"]), None)
    if tool is None or names.count(exp["name"]) != 1:
        return bad + ["target %s not offered once" % exp["name"]]
    params = tool["function"]["parameters"]
    for p in params.get("required", []):
        if p not in exp["arguments"]:
            bad.append("required %s not in the call" % p)
    for p, v in exp["arguments"].items():
        spec = params["properties"].get(p)
        if spec is None:
            bad.append("argument %s not a parameter" % p)
            continue
        typ = spec["type"]
        ok = {"string": isinstance(v, str), "integer": isinstance(v, int) and not isinstance(v, bool),
              "number": isinstance(v, (int, float)) and not isinstance(v, bool), "boolean": v is True,
              "array": isinstance(v, list)}[typ]
        if not ok:
            bad.append("argument %s=%r is not a %s" % (p, v, typ))
        if "enum" in spec and v not in spec["enum"]:
            bad.append("argument %s=%r not in its enum" % (p, v))
        for x in (v if isinstance(v, list) else [v]):
            if typ != "boolean" and not re.search(r"(?<![\w.])%s(?![\w]|\.\d)" % re.escape(str(x)), req):
                bad.append("argument %s=%r is not in the request %r" % (p, x, req))
    return bad


def check(n=20000, log=print):
    """n conversations of each kind through sample_problems; returns counts, raises on a problem."""
    import collections

    rng = random.Random("natural-check")
    stats = collections.Counter()
    domains = collections.Counter()
    failures = []
    for kind in KINDS:
        for i in range(n):
            s = fresh_tools.sample(rng, kind=kind)
            p = sample_problems(s)
            if p:
                failures.append("%s %d: %s" % (kind, i, p))
                log("CHECK FAILED: " + failures[-1])
                if len(failures) > 20:
                    break
            stats[kind] += 1
            stats["%s offered tools %d" % (kind, len(s.get("tools") or []))] += 1
            if s["natural"].get("same_domain_distractor"):
                stats["natural with a same-domain distractor"] += 1
            if s["natural"].get("small_talk"):
                stats["natural with small talk"] += 1
            domains[s["natural"]["domain"]] += 1
    out = {"samples": dict(stats), "domains": len(DOMAINS), "actions": len(ACTIONS),
           "domains_drawn": len(domains), "failures": failures}
    if failures:
        raise AssertionError("%d natural check failures, first: %s" % (len(failures), failures[0]))
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--check":
        res = check(int(sys.argv[2]) if len(sys.argv) > 2 else 20000)
        print(json.dumps(res, indent=1))
        print("natural_tools --check: OK")
    else:
        rng = random.Random(0)
        for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
            print(corpus.render(sample(rng, kind=KINDS[i % 2])))
            print("-----")
