"""Synthetic images for m3-tiny's vision round: coloured shapes on noise, with questions about
colour, shape, count and position, in pure Python (no numpy, no PIL) so the evaluation set is
generated and checked on machines without an imaging stack.

An image is SIZE x SIZE RGB (112: a multiple of 28, so the processor's smart_resize keeps the size
and the PIL bicubic resize is the identity; 8 x 8 patches of 14 = 16 image tokens). The picture is
cut into four quadrants; 1 to 4 shapes sit in distinct quadrants, each with its own colour and its
own shape kind, so every question has exactly one answer. The background is grey noise drawn on a
2 x 2-pixel grid (it compresses better in the committed PNGs and is still noise to the model).

Train / held-out: the training images come from seeds >= 1_000_000 (the caller's sample index plus
that offset), the evaluation images from seeds below it, and the question phrasings are split:
PHRASINGS[kind][0] are trained, PHRASINGS[kind][1] appear only in the evaluation.
"""

import base64
import random
import re
import struct
import zlib

SIZE = 112
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 170, 40),
    "blue": (30, 60, 225),
    "yellow": (235, 220, 30),
    "purple": (150, 40, 200),
    "orange": (250, 140, 20),
}
SHAPES = ["circle", "square", "triangle", "diamond"]
QUADRANTS = ["top left", "top right", "bottom left", "bottom right"]
TRAIN_SEED_BASE = 1_000_000

PHRASINGS = {
    "colour": (["What colour is the {shape}?", "What color is the {shape}?",
                "Which colour does the {shape} have?", "What is the colour of the {shape} in the image?"],
               ["Tell me the color of the {shape}.", "The {shape} in this picture: which color is it?"]),
    "shape": (["What shape is the {colour} object?", "Which shape is {colour}?",
               "What is the {colour} shape?"],
              ["Name the shape that is {colour}.", "The {colour} thing in the picture is which shape?"]),
    "count": (["How many shapes are in the image?", "How many shapes do you see?",
               "Count the shapes in the image."],
              ["How many objects are in this picture?", "What is the number of shapes here?"]),
    "position": (["Where is the {colour} {shape}?", "In which corner is the {colour} {shape}?",
                  "Where in the image is the {colour} {shape}?"],
                 ["Which corner holds the {colour} {shape}?", "Tell me where the {colour} {shape} is."]),
}
KINDS = list(PHRASINGS)


def layout(seed):
    """The scene for a seed: [(quadrant, colour, shape, cx, cy, r)], in quadrant order."""
    return layout_from(random.Random("shapes:%d" % seed))


def layout_from(rng):
    """The scene drawn from a random.Random (layout(seed) is layout_from of the seed's stream; the
    fresh training scenes of fresh_vision.py draw from a worker's stream)."""
    n = rng.randint(1, 4)
    quads = sorted(rng.sample(range(4), n))
    colours = rng.sample(sorted(COLOURS), n)
    kinds = rng.sample(SHAPES, n)
    objs = []
    half = SIZE // 2
    for q, c, k in zip(quads, colours, kinds):
        r = rng.randint(11, 19)
        x0, y0 = (q % 2) * half, (q // 2) * half
        cx = x0 + rng.randint(r + 2, half - r - 2)
        cy = y0 + rng.randint(r + 2, half - r - 2)
        objs.append((QUADRANTS[q], c, k, cx, cy, r))
    return objs


def _inside(kind, dx, dy, r):
    if kind == "circle":
        return dx * dx + dy * dy <= r * r
    if kind == "square":
        return abs(dx) <= r * 0.85 and abs(dy) <= r * 0.85
    if kind == "diamond":
        return abs(dx) + abs(dy) <= r
    # triangle pointing up: apex at (0, -r), base at y = +r
    if dy < -r or dy > r:
        return False
    return abs(dx) <= (dy + r) / 2.0


NOISE_CELL, NOISE_LEVELS, NOISE_BASE = 2, 48, (90, 160)


def noise_params(seed):
    """(base grey, cell bytes) of a seed's background, the values pixels(seed) draws: pixel
    (y, x) is base + cells[(y // 2) * (SIZE // 2) + x // 2] % 48 - 24 before the shapes."""
    rng = random.Random("noise:%d" % seed)
    base = rng.randint(*NOISE_BASE)
    return base, rng.randbytes((SIZE // NOISE_CELL) * (SIZE // NOISE_CELL))


def pixels(seed):
    """RGB bytes (row-major, SIZE * SIZE * 3) of the image for a seed."""
    rng = random.Random("noise:%d" % seed)
    base = rng.randint(90, 160)
    cells = rng.randbytes((SIZE // 2) * (SIZE // 2))
    img = bytearray(SIZE * SIZE * 3)
    for y in range(SIZE):
        row = (y // 2) * (SIZE // 2)
        for x in range(SIZE):
            v = base + (cells[row + x // 2] % 48) - 24
            i = (y * SIZE + x) * 3
            img[i] = img[i + 1] = img[i + 2] = v
    for _, colour, kind, cx, cy, r in layout(seed):
        rgb = bytes(COLOURS[colour])
        for y in range(max(0, cy - r), min(SIZE, cy + r + 1)):
            for x in range(max(0, cx - r), min(SIZE, cx + r + 1)):
                if _inside(kind, x - cx, y - cy, r):
                    i = (y * SIZE + x) * 3
                    img[i:i + 3] = rgb
    return bytes(img)


def png(rgb, width=SIZE, height=SIZE):
    """An 8-bit RGB PNG (filter 0 on every row), written with zlib only."""
    raw = b"".join(b"\x00" + rgb[y * width * 3:(y + 1) * width * 3] for y in range(height))

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def data_url(seed):
    return "data:image/png;base64," + base64.b64encode(png(pixels(seed))).decode("ascii")


def describe(objs):
    parts = ["%s %s %s at the %s" % ("an" if c[0] in "aeiou" else "a", c, k, q) for q, c, k, _, _, _ in objs]
    if len(parts) == 1:
        return "The image shows " + parts[0] + "."
    return "The image shows " + ", ".join(parts[:-1]) + " and " + parts[-1] + "."


def question(rng, seed, split, kind=None):
    """(kind, question text, expected answer key, answer sentence) for the image of `seed`."""
    objs = layout(seed)
    kind = kind or rng.choice(KINDS)
    phr = rng.choice(PHRASINGS[kind][0 if split == "train" else 1])
    q, colour, shape, _, _, _ = rng.choice(objs)
    if kind == "colour":
        return kind, phr.format(shape=shape), colour, "The %s is %s." % (shape, colour)
    if kind == "shape":
        return kind, phr.format(colour=colour), shape, "The %s object is a %s." % (colour, shape)
    if kind == "position":
        return (kind, phr.format(colour=colour, shape=shape), q,
                "The %s %s is at the %s." % (colour, shape, q))
    n = len(objs)
    return kind, phr, str(n), "There %s %d shape%s." % ("is" if n == 1 else "are", n, "" if n == 1 else "s")


def user_content(q, image_ref):
    """The user turn: the image first, then the question (the order the server receives too)."""
    return [dict(image_ref), {"type": "text", "text": q}]


def score(kind, want, content):
    """ok when the answer names the expected value and no competing one (mirrored by eval.mjs)."""
    text = content.lower().replace("color", "colour")
    if kind == "count":
        nums = re.findall(r"\d+", text)
        return bool(nums) and nums[-1] == want
    pool = {"colour": list(COLOURS), "shape": SHAPES, "position": QUADRANTS}[kind]
    found = [p for p in pool if re.search(r"\b%s\b" % re.escape(p), text)]
    return found == [want]
