"""Fresh image questions for the vision-and-tools round: a new scene for every training
conversation, rendered on the training device by a vectorised renderer, and a large set of
training question phrasings kept apart from the evaluation's.

Scenes. A training scene is shapes.layout_from() of a data worker's random stream (the same
layout rules as the evaluation's shapes.layout(seed): 1-4 shapes in distinct quadrants, distinct
colours and kinds, radius 11-19, centred inside the quadrant) with a background drawn by
torch.randint on the device: base grey uniform in 90..160, one byte per 2 x 2 cell taken mod 48,
pixel = base + cell - 24 (shapes.pixels' noise). No training scene has a seed: the layouts of the
evaluation images (eval_vision.jsonl, seeds 0..119) are rejected when drawn, and the background
never comes from shapes.py's seeded stream. render() draws the shapes with shapes._inside's
rules in integer arithmetic; given shapes.noise_params(seed) it reproduces shapes.pixels(seed)
byte for byte (fresh_data.py --check proves it on the evaluation seeds).

Phrasings. TRAIN_PHRASINGS[kind] are expanded from the templates below; a template is dropped
when its normalised form (lower case, "color" -> "colour", no punctuation) is within
MIN_EDIT_WORDS - 1 word edits of a held-out phrasing (shapes.PHRASINGS[kind][1], the ones
eval_vision.jsonl uses), so the evaluation's phrasings and their near copies are never trained.
"""

import itertools
import re

import shapes

COLOUR_NAMES = list(shapes.COLOURS)  # index order of the layout tensors
KIND_INDEX = {k: i for i, k in enumerate(shapes.SHAPES)}  # circle 0, square 1, triangle 2, diamond 3
QUAD_INDEX = {q: i for i, q in enumerate(shapes.QUADRANTS)}
MAX_OBJECTS = 4
MIN_EDIT_WORDS = 3
EVAL_SEEDS = range(120)  # multimodal_corpus.vision_eval_set(): image i has seed i

_IMG = "[the image|the picture|this image|this picture|the photo|the scene|this scene|the drawing]"
_C = "[colour|color]"
_OBJ = "[object|thing|figure|item|one|shape]"
_OBJS = "[shapes|objects|things|figures|items]"
TEMPLATES = {
    "colour": [
        "What %s is the {shape}?" % _C,
        "What %s is the {shape} in %s?" % (_C, _IMG),
        "Which %s is the {shape}?" % _C,
        "Which %s does the {shape} have?" % _C,
        "What %s does the {shape} have?" % _C,
        "What is the %s of the {shape}?" % _C,
        "What is the %s of the {shape} in %s?" % (_C, _IMG),
        "What's the %s of the {shape}?" % _C,
        "Name the %s of the {shape}." % _C,
        "Say which %s the {shape} is." % _C,
        "Tell me which %s the {shape} has." % _C,
        "Tell me what %s the {shape} is." % _C,
        "Give me the %s of the {shape}." % _C,
        "I want to know the %s of the {shape}." % _C,
        "Look at the {shape}. What %s is it?" % _C,
        "The {shape}: what %s is it?" % _C,
        "The {shape} is which %s?" % _C,
        "The {shape} has which %s?" % _C,
        "In %s, what %s is the {shape}?" % (_IMG, _C),
        "There is a {shape} in %s. What %s is it?" % (_IMG, _C),
        "How is the {shape} [coloured|colored]?",
        "Identify the %s of the {shape}." % _C,
        "Which %s was used for the {shape}?" % _C,
        "Is the {shape} red, green, blue, yellow, purple or orange?",
        "What %s is the {shape} painted?" % _C,
        "Find the {shape} and tell me its %s." % _C,
        "{shape} %s?" % _C,
    ],
    "shape": [
        "What shape is the {colour} %s?" % _OBJ,
        "Which shape is {colour}?",
        "What is the {colour} shape?",
        "What kind of shape is the {colour} one?",
        "Which shape is [coloured|colored] {colour}?",
        "What is the shape of the {colour} [object|thing|figure|item]?",
        "Tell me the shape of the {colour} [object|thing|figure|item].",
        "Identify the {colour} shape.",
        "The {colour} %s is what shape?" % _OBJ,
        "The {colour} [object|figure|one]: what shape is it?",
        "Look at the {colour} [object|figure|one]. What shape is it?",
        "What form does the {colour} [object|figure] have?",
        "In %s, which shape is {colour}?" % _IMG,
        "Which of the shapes is {colour}?",
        "Say what shape the {colour} [object|figure|one] is.",
        "I want to know which shape is {colour}.",
        "Is the {colour} [object|one] a circle, a square, a triangle or a diamond?",
        "What is drawn in {colour}?",
        "Find the {colour} [object|one] and tell me its shape.",
        "{colour} shape?",
    ],
    "count": [
        "How many %s are in %s?" % (_OBJS, _IMG),
        "How many %s do you see?" % _OBJS,
        "How many %s are there?" % _OBJS,
        "How many %s does %s contain?" % (_OBJS, _IMG),
        "How many %s can you see in %s?" % (_OBJS, _IMG),
        "Count the %s in %s." % (_OBJS, _IMG),
        "Count the %s." % _OBJS,
        "What is the count of %s in %s?" % (_OBJS, _IMG),
        "Tell me how many %s there are." % _OBJS,
        "Give me the number of %s." % _OBJS,
        "How many %s are drawn?" % _OBJS,
        "Number of %s in %s?" % (_OBJS, _IMG),
        "How many %s does it show?" % _OBJS,
        "Can you count the %s?" % _OBJS,
        "I want to know how many %s there are." % _OBJS,
        "Say how many %s you see." % _OBJS,
        "How many coloured %s are on the background?" % _OBJS,
        "Is there one shape, or two, three or four?",
    ],
    "position": [
        "Where is the {colour} {shape}?",
        "In which corner is the {colour} {shape}?",
        "Where in %s is the {colour} {shape}?" % _IMG,
        "Which corner is the {colour} {shape} in?",
        "In what part of %s is the {colour} {shape}?" % _IMG,
        "Where can I find the {colour} {shape}?",
        "Where does the {colour} {shape} sit?",
        "What is the position of the {colour} {shape}?",
        "Give the position of the {colour} {shape}.",
        "Say where the {colour} {shape} is located.",
        "Locate the {colour} {shape}.",
        "The {colour} {shape} is in which corner?",
        "In which quadrant is the {colour} {shape}?",
        "Where is the {colour} {shape} located in %s?" % _IMG,
        "Is the {colour} {shape} at the top left, top right, bottom left or bottom right?",
        "Find the {colour} {shape} and tell me its corner.",
        "{colour} {shape}: which corner?",
    ],
}


def expand(template):
    """All strings of a template with [a|b|...] alternatives."""
    parts = re.split(r"(\[[^\]]*\])", template)
    opts = [p[1:-1].split("|") if p.startswith("[") else [p] for p in parts]
    return ["".join(c) for c in itertools.product(*opts)]


def normalise(text):
    t = text.lower().replace("color", "colour")
    return re.sub(r"[^a-z0-9{} ]+", " ", t).split()


def word_edits(a, b):
    """Levenshtein distance between two word lists."""
    prev = list(range(len(b) + 1))
    for i, wa in enumerate(a, 1):
        cur = [i]
        for j, wb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (wa != wb)))
        prev = cur
    return prev[-1]


def heldout(kind):
    return list(shapes.PHRASINGS[kind][1])


def too_close(text, held_texts):
    n = normalise(text)
    return any(word_edits(n, normalise(h)) < MIN_EDIT_WORDS for h in held_texts)


def _build():
    train, dropped = {}, {}
    for kind, temps in TEMPLATES.items():
        cand = list(dict.fromkeys(shapes.PHRASINGS[kind][0] + [s for t in temps for s in expand(t)]))
        held = heldout(kind)
        train[kind] = [c for c in cand if not too_close(c, held)]
        dropped[kind] = [c for c in cand if too_close(c, held)]
    return train, dropped


TRAIN_PHRASINGS, DROPPED_PHRASINGS = _build()
EVAL_LAYOUTS = None  # frozenset of layout tuples of the evaluation images (filled on first use)


def eval_layouts():
    global EVAL_LAYOUTS
    if EVAL_LAYOUTS is None:
        EVAL_LAYOUTS = frozenset(tuple(shapes.layout(s)) for s in EVAL_SEEDS)
    return EVAL_LAYOUTS


def fresh_layout(rng):
    """A training scene: shapes.layout_from(rng), never one of the evaluation images' layouts."""
    ev = eval_layouts()
    while True:
        objs = shapes.layout_from(rng)
        if tuple(objs) not in ev:
            return objs


def encode_layout(objs):
    """[MAX_OBJECTS][6] ints (valid, kind, colour, cx, cy, r) for the renderer; zero rows pad."""
    rows = [[1, KIND_INDEX[k], COLOUR_NAMES.index(c), cx, cy, r] for _, c, k, cx, cy, r in objs]
    return rows + [[0] * 6 for _ in range(MAX_OBJECTS - len(rows))]


def _style(rng, text):
    """Light surface noise on a training phrasing: lower-case start, missing final punctuation."""
    if rng.random() < 0.12:
        text = text[0].lower() + text[1:]
    if rng.random() < 0.08 and text[-1] in "?.":
        text = text[:-1]
    return text


def question(rng, objs, kind=None):
    """(kind, question, expected answer key, answer sentence) with a training phrasing (the answer
    sentences are shapes.question's)."""
    kind = kind or rng.choice(shapes.KINDS)
    phr = _style(rng, rng.choice(TRAIN_PHRASINGS[kind]))
    q, colour, shape, _, _, _ = rng.choice(objs)
    if kind == "colour":
        return kind, phr.format(shape=shape), colour, "The %s is %s." % (shape, colour)
    if kind == "shape":
        text = phr.format(colour=colour)
        return kind, text[0].upper() + text[1:] if phr[0] == "{" else text, shape, \
            "The %s object is a %s." % (colour, shape)
    if kind == "position":
        text = phr.format(colour=colour, shape=shape)
        return (kind, text[0].upper() + text[1:] if phr[0] == "{" else text, q,
                "The %s %s is at the %s." % (colour, shape, q))
    n = len(objs)
    return kind, phr, str(n), "There %s %d shape%s." % ("is" if n == 1 else "are", n, "" if n == 1 else "s")


def sample(rng, corpus, mode=None):
    """One training conversation about a fresh scene; sample["layouts"] holds its encoded layout
    (the image is rendered on the training device from it)."""
    mode = mode or corpus._mode(rng)
    objs = fresh_layout(rng)
    kind, q, want, answer = question(rng, objs)
    msgs = corpus._prefix(rng)
    msgs.append({"role": "user", "content": shapes.user_content(q, {"type": "image"})})
    msg = {"role": "assistant", "content": answer}
    if mode != "disabled":
        msg["reasoning_content"] = shapes.describe(objs)
    msgs.append(msg)
    return {"task": "vision", "messages": msgs, "tools": None, "layouts": [encode_layout(objs)],
            "kwargs": corpus._kwargs(rng, mode), "expect": {"kind": kind, "answer": want, "question": q},
            "objs": objs}


# ------------------------------------------------------------------------------------------------
# The vectorised renderer (torch; CPU or GPU).
# ------------------------------------------------------------------------------------------------
_PALETTE = {}


def palette(torch, device):
    """[colours, 3] int64 on the device, made once per device (no host copy in the training step)."""
    key = str(device)
    if key not in _PALETTE:
        _PALETTE[key] = torch.tensor([shapes.COLOURS[c] for c in COLOUR_NAMES], dtype=torch.int64, device=device)
    return _PALETTE[key]


def random_noise(torch, n, generator, device):
    """(base [n], cells [n, S/2, S/2]) as shapes.pixels draws them: base uniform in 90..160,
    cells uniform bytes mod 48."""
    lo, hi = shapes.NOISE_BASE
    g = shapes.SIZE // shapes.NOISE_CELL
    base = torch.randint(lo, hi + 1, (n,), generator=generator, device=device)
    cells = torch.randint(0, 256, (n, g, g), generator=generator, device=device) % shapes.NOISE_LEVELS
    return base, cells


def render(torch, layouts, base, cells):
    """uint8 [n, S, S, 3] images. layouts: int [n, MAX_OBJECTS, 6] (encode_layout rows); base
    [n]; cells [n, S/2, S/2] in 0..47. Shape tests are shapes._inside's in integers (square:
    |d| <= 0.85 r as 20 |d| <= 17 r, exact for integer d and r; triangle: 2 |dx| <= dy + r)."""
    dev = layouts.device
    n, S = layouts.shape[0], shapes.SIZE
    lay = layouts.to(torch.int64)
    v = base.to(torch.int64).view(n, 1, 1) + cells.to(torch.int64) - shapes.NOISE_LEVELS // 2
    v = v.repeat_interleave(shapes.NOISE_CELL, 1).repeat_interleave(shapes.NOISE_CELL, 2)  # [n, S, S]
    img = v.unsqueeze(-1).expand(n, S, S, 3)
    ys = torch.arange(S, device=dev).view(1, S, 1)
    xs = torch.arange(S, device=dev).view(1, 1, S)
    pal = palette(torch, dev)
    for k in range(lay.shape[1]):
        valid, kind, col, cx, cy, r = [t.view(n, 1, 1) for t in lay[:, k].unbind(-1)]
        dx, dy = xs - cx, ys - cy
        adx, ady = dx.abs(), dy.abs()
        circle = dx * dx + dy * dy <= r * r
        square = (20 * adx <= 17 * r) & (20 * ady <= 17 * r)
        triangle = (dy >= -r) & (dy <= r) & (2 * adx <= dy + r)
        diamond = adx + ady <= r
        inside = torch.where(kind == 0, circle, torch.where(kind == 1, square, torch.where(kind == 2, triangle, diamond)))
        inside = inside & (valid > 0)
        rgb = pal[lay[:, k, 2].clamp(0, len(COLOUR_NAMES) - 1)].view(n, 1, 1, 3)
        img = torch.where(inside.unsqueeze(-1), rgb, img)
    return img.to(torch.uint8)


def render_fresh(torch, layouts, generator):
    base, cells = random_noise(torch, layouts.shape[0], generator, layouts.device)
    return render(torch, layouts, base, cells)
