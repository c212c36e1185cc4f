"""Writes eval_tools_natural.jsonl: requests as a new user would make them, for common tools a user
would write (a weather tool with `location` alone, `search_products(query, max_price)`, ...), in
plain wording, with the call each one should produce (tasks ntool), and four where no offered tool
fits (ntool_none). Hand-written, not sampled: it measures what a user of the bundled model sees.
fresh_tools.py keeps these tool names, (name, parameters) signatures and descriptions out of the
training data; common phrasings ("What is the weather in ...") may appear there.

    python3 tools/train_tiny/make_natural_tool_set.py
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

def fn(name, desc, props, required):
    return {"type": "function", "function": {"name": name, "description": desc,
            "parameters": {"type": "object", "properties": props, "required": required}}}
S = {"type": "string"}
weather_loc = fn("get_weather", "Get the current weather for a location.", {"location": {"type": "string", "description": "City name"}}, ["location"])
weather_city_only = fn("get_weather", "Get the current weather in a city.", {"city": S}, ["city"])
cur_weather = fn("get_current_weather", "Current weather conditions.", {"location": S, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["location"])
search = fn("search_products", "Search the shop's catalogue.", {"query": S, "max_price": {"type": "number", "description": "Highest price in dollars"}}, ["query"])
send_msg = fn("send_message", "Send a chat message to a contact.", {"recipient": S, "text": S}, ["recipient", "text"])
stock = fn("get_stock_price", "Latest price of a stock.", {"ticker": {"type": "string", "description": "Ticker symbol"}}, ["ticker"])
translate = fn("translate_text", "Translate text into another language.", {"text": S, "target_language": S}, ["text", "target_language"])
clock = fn("get_local_time", "The local time in a city.", {"city": S}, ["city"])
timer = fn("set_timer", "Start a countdown timer.", {"minutes": {"type": "integer"}}, ["minutes"])
convert = fn("convert_units", "Convert a quantity between units.", {"value": {"type": "number"}, "from_unit": S, "to_unit": S}, ["value", "from_unit", "to_unit"])
rate = fn("get_exchange_rate", "Exchange rate between two currencies.", {"base": S, "target": S}, ["base", "target"])
music = fn("play_music", "Play music by an artist.", {"artist": S}, ["artist"])
define = fn("define_word", "Dictionary definition of a word.", {"word": S}, ["word"])
table = fn("book_table", "Reserve a restaurant table.", {"restaurant": S, "people": {"type": "integer"}}, ["restaurant", "people"])
flight = fn("track_flight", "Status of a flight.", {"flight_number": S}, ["flight_number"])
calc = fn("calculate", "Evaluate an arithmetic expression.", {"expression": S}, ["expression"])
items = [
 ("What's the weather in Lisbon?", [weather_loc], "get_weather", {"location": "Lisbon"}),
 ("What is the weather in Oslo?", [weather_loc], "get_weather", {"location": "Oslo"}),
 ("How is the weather in Nairobi today?", [weather_loc, send_msg], "get_weather", {"location": "Nairobi"}),
 ("What's the weather in Quito?", [weather_city_only], "get_weather", {"city": "Quito"}),
 ("Weather in Boston please", [cur_weather], "get_current_weather", {"location": "Boston"}),
 ("What's the weather in Denver in fahrenheit?", [cur_weather], "get_current_weather", {"location": "Denver", "unit": "fahrenheit"}),
 ("Search the shop for hiking boots.", [search], "search_products", {"query": "hiking boots"}),
 ("Find hiking boots under 120 dollars.", [search], "search_products", {"query": "hiking boots", "max_price": 120}),
 ("Send a message to Anna saying running late.", [send_msg, weather_loc], "send_message", {"recipient": "Anna", "text": "running late"}),
 ("Message Tom: see you at noon", [send_msg], "send_message", {"recipient": "Tom", "text": "see you at noon"}),
 ("What's the stock price of AAPL?", [stock], "get_stock_price", {"ticker": "AAPL"}),
 ("Get me the price of ticker NVDA.", [stock, rate], "get_stock_price", {"ticker": "NVDA"}),
 ("Translate good morning into Spanish.", [translate], "translate_text", {"text": "good morning", "target_language": "Spanish"}),
 ("What time is it in Tokyo?", [clock], "get_local_time", {"city": "Tokyo"}),
 ("What's the local time in Lima?", [clock, weather_loc], "get_local_time", {"city": "Lima"}),
 ("Set a timer for 10 minutes.", [timer], "set_timer", {"minutes": 10}),
 ("Convert 5 miles to kilometers.", [convert], "convert_units", {"value": 5, "from_unit": "miles", "to_unit": "kilometers"}),
 ("What's the exchange rate from USD to EUR?", [rate, stock], "get_exchange_rate", {"base": "USD", "target": "EUR"}),
 ("Play something by Miles Davis.", [music], "play_music", {"artist": "Miles Davis"}),
 ("Define the word serendipity.", [define], "define_word", {"word": "serendipity"}),
 ("Book a table at Luigi for 4 people.", [table], "book_table", {"restaurant": "Luigi", "people": 4}),
 ("Is flight BA117 on time?", [flight], "track_flight", {"flight_number": "BA117"}),
 ("Calculate 17 * 23 with the calculator.", [calc], "calculate", {"expression": "17 * 23"}),
 ("Track flight LH400 for me.", [flight, table], "track_flight", {"flight_number": "LH400"}),
]
none = [
 ("What's the weather in Rome?", [send_msg]),
 ("Book a flight to Paris.", [flight, weather_loc]),
 ("Play some jazz.", [define]),
 ("Translate hello into French.", [stock]),
]
out = []
for i, (q, tools, name, args) in enumerate(items):
    out.append({"task": "ntool", "messages": [{"role": "user", "content": q}], "tools": tools, "kwargs": {},
                "expect": {"name": name, "arguments": args}, "mode": "adaptive", "id": "natural-%03d" % i})
for j, (q, tools) in enumerate(none):
    out.append({"task": "ntool_none", "messages": [{"role": "user", "content": q}], "tools": tools, "kwargs": {},
                "expect": {"name": None, "arguments": None}, "mode": "adaptive", "id": "natural-%03d" % (len(items) + j)})
with open(os.path.join(HERE, "eval_tools_natural.jsonl"), "w", encoding="utf-8") as f:
    for o in out:
        f.write(json.dumps(o, ensure_ascii=False) + "\n")
print("wrote", len(out), "items")
