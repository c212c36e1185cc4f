"""A pure-Python encoder for m3-tiny's tokenizer.json (byte-level BPE, the split regex, the 64
added tokens), for machines without the `tokenizers` package (checks and CPU runs of the fresh-data
pipeline). It implements only what that file uses: added tokens split out first (longest match),
the `Split` pre-tokenizer (isolated), ByteLevel without its own regex, BPE merges by rank, no
normalizer. `python3 bpe_lite.py check` compares it with the committed prompt ids of the eval set.

Needs the `regex` module (Debian: python3-regex) for the \\p{..} classes.
"""

import json
import os
import sys


def _byte_chars():
    """The byte -> printable character table of byte-level BPE: printable Latin-1 bytes map to
    themselves, the others to 256, 257, ... in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class Encoding:
    def __init__(self, ids, tokens=None):
        self.ids = ids
        self.tokens = tokens or []


class LiteTokenizer:
    def __init__(self, spec):
        import regex

        self.spec = spec
        m = spec["model"]
        assert m["type"] == "BPE", m["type"]
        self.vocab = m["vocab"]
        self.inv = {v: k for k, v in self.vocab.items()}
        merges = [tuple(x) if isinstance(x, list) else tuple(x.split(" ")) for x in m["merges"]]
        self.rank = {p: i for i, p in enumerate(merges)}
        pre = spec["pre_tokenizer"]
        pres = pre["pretokenizers"] if pre["type"] == "Sequence" else [pre]
        split = [p for p in pres if p["type"] == "Split"]
        self.split_re = regex.compile(split[0]["pattern"]["Regex"]) if split else None
        self.added = {t["content"]: t["id"] for t in spec["added_tokens"]}
        for t, i in self.added.items():
            self.inv[i] = t
        self.added_re = regex.compile("|".join(regex.escape(s) for s in sorted(self.added, key=len, reverse=True)))
        self.bytes = _byte_chars()
        self.unbytes = {c: b for b, c in self.bytes.items()}
        self.cache = {}

    @classmethod
    def from_file(cls, path):
        with open(path, encoding="utf-8") as f:
            return cls(json.load(f))

    @classmethod
    def from_str(cls, s):
        return cls(json.loads(s))

    def to_str(self):
        return json.dumps(self.spec, ensure_ascii=False)

    def save(self, path):
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_str())

    def get_vocab_size(self):
        return len(self.inv)

    def token_to_id(self, s):
        return self.added.get(s, self.vocab.get(s))

    def _bpe(self, piece):
        got = self.cache.get(piece)
        if got is not None:
            return got
        word = [self.bytes[b] for b in piece.encode("utf-8")]
        while len(word) > 1:
            best, at = None, -1
            for i in range(len(word) - 1):
                r = self.rank.get((word[i], word[i + 1]))
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            a, b = word[at], word[at + 1]
            out, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and word[i] == a and word[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            word = out
        ids = [self.vocab[w] for w in word]
        if len(self.cache) < 200_000:
            self.cache[piece] = ids
        return ids

    def _plain(self, text, out):
        pieces = self.split_re.findall(text) if self.split_re is not None else [text]
        for p in pieces:
            if p:
                out.extend(self._bpe(p))

    def encode(self, text, add_special_tokens=False):
        out, pos = [], 0
        for m in self.added_re.finditer(text):
            if m.start() > pos:
                self._plain(text[pos:m.start()], out)
            out.append(self.added[m.group(0)])
            pos = m.end()
        if pos < len(text):
            self._plain(text[pos:], out)
        return Encoding(out, [self.inv[i] for i in out])

    def encode_batch(self, texts, add_special_tokens=False):
        return [self.encode(t) for t in texts]

    def decode(self, ids, skip_special_tokens=False):
        parts, buf = [], []
        for i in ids:
            t = self.inv[i]
            if i in self.added.values():
                if buf:
                    parts.append(bytes(self.unbytes[c] for c in "".join(buf)).decode("utf-8", "replace"))
                    buf = []
                parts.append(t)
            else:
                buf.append(t)
        if buf:
            parts.append(bytes(self.unbytes[c] for c in "".join(buf)).decode("utf-8", "replace"))
        return "".join(parts)


def load(path_or_json):
    """The real `tokenizers` Tokenizer when installed, else LiteTokenizer (same ids)."""
    is_json = path_or_json.lstrip().startswith("{")
    try:
        from tokenizers import Tokenizer

        return Tokenizer.from_str(path_or_json) if is_json else Tokenizer.from_file(path_or_json)
    except ImportError:
        return LiteTokenizer.from_str(path_or_json) if is_json else LiteTokenizer.from_file(path_or_json)


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import corpus

    root = os.path.abspath(os.path.join(here, "..", ".."))
    tok = LiteTokenizer.from_file(os.path.join(root, "models/m3-tiny/tokenizer.json"))
    with open(os.path.join(root, "tests/fixtures/m3_tiny/eval_prompt_ids.json")) as f:
        want = json.load(f)
    with open(os.path.join(here, "eval_set.jsonl"), encoding="utf-8") as f:
        items = [json.loads(line) for line in f if line.strip()]
    bad = 0
    for it in items:
        text = corpus.render(it, add_generation_prompt=True)
        ids = tok.encode(text).ids
        if ids != want[it["id"]]:
            bad += 1
        elif tok.decode(ids) != text:
            bad += 1
    print("bpe_lite: %d/%d eval prompts encode to the committed ids (and decode back)" % (len(items) - bad, len(items)))
    sys.exit(1 if bad else 0)
