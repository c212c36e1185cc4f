#!/usr/bin/env python3
"""Vision golden fixture for m3serve, computed with transformers' `minimax_m3_vl` (GPU machine).

Writes tests/fixtures/vision_golden/ (format: tests/fixtures/vision_golden/README.md, written by
this script too):
  a. processor: a deterministic image set (PIL-generated, saved as PNG/JPEG files in the fixture
     so the C++ side decodes the same bytes): PIL's decoded RGB (EXIF orientation applied), and
     the MiniMaxM3VLImageProcessor's pixel_values and image_grid_thw (checksums only for the
     large images);
  b. a small random MiniMax-M3-VL model (original checkpoint names, bf16, exact) and a prompt
     with three images: each image's vision-tower output, projector output, and the logits of
     every position (image features scattered into the placeholders, each image encoded alone),
     plus, report-only, HF's own forward with all images in one tower call;
  c. the real vision shapes (the config's defaults: 32 layers, hidden 1280, projector to 6144)
     with weights generated from a counter hash that C++ can reproduce exactly, one image:
     summary statistics and a few rows of the tower and projector outputs.

Conventions as make_golden.py: float32 reference, eager attention, TF32 off, weights exactly
representable in the stored dtype. The vision RoPE is the model's three-axis one: where the
installed transformers has another (5.17.0's 2-axis (t, h) form), it is patched before any tower
is built (ensure_three_axis_vision_rope; manifest.json's summary.vision_rope says which). Usage:
  python3 tools/reference/vision_golden.py --out DIR [--device cuda|cpu] [--smoke]
"""

import argparse
import json
import math
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

T0 = time.time()
sys.path.insert(0, str(Path(__file__).resolve().parent))


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


try:
    import numpy as np
    import torch
    from PIL import Image
except Exception as e:  # pragma: no cover - environment problem
    print("FATAL: cannot import numpy/torch/PIL:", repr(e), flush=True)
    sys.exit(2)

import make_golden as mg  # noqa: E402  (text model specs, checkpoint writer, HF class lookup)

# ----------------------------------------------------------------------------------------------
# (a) the image set: (name, mode, width, height, format, max_pixels or None for the default)
# ----------------------------------------------------------------------------------------------

IMAGES = [
    ("rgb_56x56", "RGB", 56, 56, "png", None),          # already a multiple of 28: no resize
    ("rgb_odd_47x33", "RGB", 47, 33, "png", None),      # upscaled to min_pixels (56 x 84)
    ("thin_600x8", "RGB", 600, 8, "png", None),         # side < 14: rounds up to one factor
    ("tall_20x300", "RGB", 20, 300, "png", None),       # aspect 15
    ("rgba_61x45", "RGBA", 61, 45, "png", None),        # alpha dropped by convert("RGB")
    ("gray_90x70", "L", 90, 70, "png", None),
    ("palette_50x80", "P", 50, 80, "png", None),
    ("jpeg_123x77", "RGB", 123, 77, "jpeg", None),
    ("down_400x300", "RGB", 400, 300, "png", 12544),    # max_pixels 112^2: the downscale branch
    ("big_700x500", "RGB", 700, 500, "jpeg", 50176),    # max_pixels 224^2
    # Appended (the seeds above depend on the index): the sizes and formats of the vision issue.
    ("one_1x1", "RGB", 1, 1, "png", None),              # upscaled 56x to min_pixels
    ("strip_27x500", "RGB", 27, 500, "png", None),      # aspect 18.5, portrait
    ("square_224x224", "RGB", 224, 224, "webp_lossless", None),
    ("photo_1000x700", "RGB", 1000, 700, "webp", None),  # lossy WebP
    ("huge_4000x3000", "RGB", 4000, 3000, "jpeg", None),  # the default max_pixels: 5x downscale
    ("exif6_90x60", "RGB", 90, 60, "jpeg_exif6", None),   # stored 90x60, shown rotated: 60x90
    ("exif3_64x40", "RGB", 64, 40, "jpeg_exif3", None),   # stored upside down
]
SMOKE_IMAGES = ["rgb_56x56", "rgb_odd_47x33", "thin_600x8", "jpeg_123x77", "square_224x224",
                "exif6_90x60"]
FLOAT_VALUES = {"rgb_56x56", "rgb_odd_47x33", "jpeg_123x77"}  # float32 pixel_values stored too
MODEL_IMAGES = ["rgb_odd_47x33", "thin_600x8", "rgba_61x45"]  # the prompt's images, in order
SMOKE_MODEL_IMAGES = ["rgb_odd_47x33", "thin_600x8"]
REAL_SHAPE_IMAGE = "jpeg_123x77"
# Decoded bytes and levels above this size are checked through a checksum (poly_hash) only.
STORE_LIMIT = 400_000


def poly_hash(buf):
    """sum_i (b_i + 1) * P^i mod 2^64, P = the FNV-64 prime: a position-sensitive checksum that
    the C++ test recomputes in a few lines (vision_golden_test.cpp)."""
    a = np.frombuffer(bytes(buf), dtype=np.uint8).astype(np.uint64)
    if a.size == 0:
        return "0000000000000000"
    p = np.full(a.size, 0x100000001B3, dtype=np.uint64)
    p[0] = 1
    with np.errstate(over="ignore"):
        powers = np.cumprod(p, dtype=np.uint64)
        return f"{int(((a + np.uint64(1)) * powers).sum(dtype=np.uint64)):016x}"


def make_image(name, mode, w, h, seed):
    """Smooth gradients + rings + seeded noise: edges and texture for the bicubic taps."""
    g = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = np.sqrt((x - w * 0.4) ** 2 + (y - h * 0.6) ** 2)
    base = np.stack([
        127 + 120 * np.sin(x / max(w, 1) * 6.3 + 0.5),
        127 + 120 * np.cos(y / max(h, 1) * 5.1),
        127 + 120 * np.sin(r / (3.0 if w * h < 4_000_000 else 60.0)),
    ], axis=-1)
    # Noise gives the bicubic taps texture; the large images get little or none, so their files
    # stay small (the camera-sized one is smooth: its resize is a 5x average anyway).
    n = w * h
    if n < 4_000_000:
        base += g.normal(0, 18 if n <= 250_000 else 2, base.shape)
    rgb = np.clip(np.rint(base), 0, 255).astype(np.uint8)
    img = Image.fromarray(rgb, "RGB")
    if mode == "RGBA":
        alpha = np.clip(np.rint(255 * (x / max(w - 1, 1))), 0, 255).astype(np.uint8)
        img = Image.fromarray(np.dstack([rgb, alpha]), "RGBA")
    elif mode == "L":
        img = img.convert("L")
    elif mode == "P":
        img = img.quantize(colors=16, method=Image.Quantize.MEDIANCUT)
    return img


def write_images(out, names):
    """Writes the named images; returns {name: file}. A format this PIL cannot write is logged
    and left out (the C++ test lists what the fixture lacks)."""
    from PIL import features
    idir = out / "images"
    idir.mkdir(parents=True, exist_ok=True)
    files = {}
    for i, (name, mode, w, h, fmt, _) in enumerate(IMAGES):
        if name not in names:
            continue
        img = make_image(name, mode, w, h, 1000 + i)
        if fmt.startswith("webp") and not features.check("webp"):
            log(f"{name}: this PIL has no WebP support; left out")
            continue
        if fmt == "jpeg":
            fn = f"{name}.jpg"
            img.save(idir / fn, "JPEG", quality=90 if w * h <= 250_000 else 80 if w * h < 4_000_000 else 70)
        elif fmt.startswith("jpeg_exif"):
            fn = f"{name}.jpg"
            exif = Image.Exif()
            exif[0x0112] = int(fmt[len("jpeg_exif"):])  # Orientation
            img.save(idir / fn, "JPEG", quality=90, exif=exif.tobytes())
        elif fmt == "webp_lossless":
            fn = f"{name}.webp"
            img.save(idir / fn, "WEBP", lossless=True)
        elif fmt == "webp":
            fn = f"{name}.webp"
            img.save(idir / fn, "WEBP", quality=80)
        else:
            fn = f"{name}.png"
            img.save(idir / fn, "PNG")
        files[name] = fn
    return files


# ----------------------------------------------------------------------------------------------
# The processor
# ----------------------------------------------------------------------------------------------

def find(mod, *names):
    for n in names:
        c = getattr(mod, n, None)
        if c is not None:
            return c
    avail = sorted(n for n in dir(mod) if not n.startswith("_"))
    raise RuntimeError(f"none of {names} in {mod.__name__}; it has: {avail}")


def processor_facts(ip):
    facts = {"class": type(ip).__name__}
    try:
        facts["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception as e:  # pragma: no cover - depends on the torch version
        facts["torch_cpu_capability"] = f"<{type(e).__name__}>"
    for k in ("backend", "patch_size", "temporal_patch_size", "merge_size", "min_pixels",
              "max_pixels", "image_mean", "image_std", "rescale_factor", "resample", "size",
              "do_convert_rgb", "do_resize", "do_rescale", "do_normalize"):
        try:
            v = getattr(ip, k)
            facts[k] = v if isinstance(v, (int, float, str, bool, list, type(None))) else str(v)
        except Exception as e:
            facts[k] = f"<{type(e).__name__}>"
    return facts


def size_limits(ip):
    """(min_pixels, max_pixels) of the image processor: transformers 5.17 keeps them in
    `size` (shortest_edge / longest_edge, counted in pixels), older releases as attributes."""
    s = ip.size
    def get(k):
        return s.get(k) if isinstance(s, dict) else getattr(s, k, None)
    mx = getattr(ip, "max_pixels", None) or get("max_pixels") or get("longest_edge")
    mn = getattr(ip, "min_pixels", None) or get("min_pixels") or get("shortest_edge")
    return int(mn), int(mx)


def levels_of(pv, mean, std, T, P):
    """pixel_values [N, 3*T*P*P] -> uint8 levels, and the float32 values those levels give under
    the processor's fused rescale+normalise ((x - 255*mean) / (255*std), float32)."""
    m = torch.tensor(mean, dtype=torch.float32) * 255.0
    s = torch.tensor(std, dtype=torch.float32) * 255.0
    ch = torch.arange(pv.shape[1]) // (T * P * P)
    lv = torch.round(pv * s[ch] + m[ch])
    lv_c = lv.clamp(0, 255)
    recon = (lv_c - m[ch]) / s[ch]
    return lv_c.to(torch.uint8), recon, float((lv - lv_c).abs().max())


def run_processor(hf_mod, out, names, files, log_rows):
    IP = find(hf_mod, "MiniMaxM3VLImageProcessor", "MiniMaxM3VLImageProcessorFast")
    ip = IP()
    facts = processor_facts(ip)
    log("image processor:", json.dumps(facts, default=str))
    T, P, M = ip.temporal_patch_size, ip.patch_size, ip.merge_size
    mean, std = list(ip.image_mean), list(ip.image_std)
    import importlib
    ipmod = importlib.import_module(type(ip).__module__)
    smart_resize = getattr(ipmod, "smart_resize")
    bufs = {"decoded": bytearray(), "levels": bytearray(), "values": bytearray()}
    entries, per_image = [], {}

    def store(key, data):
        """Appends data to bufs[key] and returns its offset, or -1 when it is too large to keep."""
        if len(data) > STORE_LIMIT:
            return -1
        off = len(bufs[key])
        bufs[key] += data
        return off

    for (name, mode, w0, h0, fmt, max_px) in IMAGES:
        if name not in names or name not in files:
            continue
        # As transformers' load_image (and vLLM's and SGLang's loaders): EXIF orientation applied.
        from PIL import ImageOps
        with Image.open(out / "images" / files[name]) as im:
            im.load()
            src = ImageOps.exif_transpose(im)
        w, h = src.size
        rgb = src.convert("RGB")
        dec = np.asarray(rgb, dtype=np.uint8)
        # What the processor itself converts to (transformers' convert_to_rgb composites alpha
        # onto white; PIL's convert("RGB") drops it): recorded, the C++ test compares with HF.
        try:
            from transformers.image_transforms import convert_to_rgb
            hf_rgb = np.asarray(convert_to_rgb(src), dtype=np.uint8)
            hf_same = bool(np.array_equal(hf_rgb, dec))
        except Exception as e:
            log("cannot compare transformers' convert_to_rgb:", repr(e))
            hf_same = None
        min_px, default_max = size_limits(ip)
        kw = {} if max_px is None else {"size": {"shortest_edge": min_px, "longest_edge": max_px}}
        res = ip(images=[src], return_tensors="pt", **kw)
        pv = res["pixel_values"].float().cpu()
        grid = [int(v) for v in res["image_grid_thw"][0].tolist()]
        rh, rw = smart_resize(h, w, factor=P * M, min_pixels=min_px,
                              max_pixels=max_px or default_max)
        assert grid == [1, rh // P, rw // P], (name, grid, rh, rw)
        lv, recon, clamp_dev = levels_of(pv, mean, std, T, P)
        exact = bool(torch.equal(recon, pv))
        dev = float((recon - pv).abs().max())
        dec_b, lv_b = dec.tobytes(), lv.numpy().tobytes()
        e = {"name": name, "file": files[name], "mode": mode, "width": w, "height": h,
             "stored_width": w0, "stored_height": h0,
             "max_pixels": max_px, "hf_rgb_equals_pil_convert": hf_same, "resized": [rh, rw], "grid_thw": grid,
             "num_patches": int(pv.shape[0]), "patch_values": int(pv.shape[1]),
             "decoded_offset": store("decoded", dec_b), "decoded_hash": poly_hash(dec_b),
             "levels_offset": store("levels", lv_b), "levels_hash": poly_hash(lv_b),
             "values_offset": len(bufs["values"]) // 4 if name in FLOAT_VALUES else -1,
             "levels_reproduce_values_bitwise": exact, "levels_reproduce_values_max_dev": dev,
             "levels_clamp_dev": clamp_dev}
        if name in FLOAT_VALUES:
            bufs["values"] += pv.numpy().astype("<f4").tobytes()
        entries.append(e)
        per_image[name] = (pv, grid)
        log_rows.append(f"{name:16} {w}x{h} -> {rh}x{rw} grid {grid} exact_levels {exact} "
                        f"stored {'yes' if e['levels_offset'] >= 0 else 'hash only'}")
    left_out = [i[0] for i in IMAGES if i[0] in names and i[0] not in files]
    for k, fn in (("decoded", "decoded.u8"), ("levels", "pixel_levels.u8"),
                  ("values", "pixel_values.f32")):
        (out / fn).write_bytes(bytes(bufs[k]))
    proc = {"processor": facts, "patch_size": P, "temporal_patch_size": T, "merge_size": M,
            "image_mean": mean, "image_std": std, "images": entries, "left_out": left_out}
    mg.write_json(out / "processor.json", proc)
    return per_image, facts


# ----------------------------------------------------------------------------------------------
# The vision tower's 3-D RoPE
# ----------------------------------------------------------------------------------------------

class ThreeAxisVisionRotary(torch.nn.Module):
    """The MiniMax-M3 vision RoPE as the released checkpoint was trained with it (transformers
    <= 5.16, SGLang, vLLM, llama.cpp; m3serve's vision_tower.cpp): per axis (t, h, w) axis_dim =
    2 * ((head_dim // 3) // 2) dims (26 of 80), inv_freq_j = theta^(-2j / axis_dim); the angles
    [t f ; h f ; w f] duplicated, so the first 3 * axis_dim head dims rotate (rotate_half) and the
    rest pass through. No buffers (HF's own test: rotary.state_dict() == {})."""

    def __init__(self, config):
        super().__init__()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.axis_dim = 2 * ((head_dim // 3) // 2)
        rp = getattr(config, "rope_parameters", None) or {}
        self.theta = float(rp.get("rope_theta", getattr(config, "rope_theta", 10000.0)))

    def forward(self, x, position_ids):
        with torch.autocast(device_type=x.device.type if x.device.type != "mps" else "cpu", enabled=False):
            inv = 1.0 / (self.theta ** (torch.arange(0, self.axis_dim, 2, dtype=torch.float32,
                                                     device=x.device) / self.axis_dim))
            ang = position_ids.to(device=x.device, dtype=torch.float32)[..., None] * inv  # [N, 3, F]
            ang = ang.flatten(1)
            ang = torch.cat([ang, ang], dim=-1)
        return ang.cos().to(x.dtype), ang.sin().to(x.dtype)


def ensure_three_axis_vision_rope(hf, summary):
    """transformers 5.17.0's MiniMaxM3VLVisionRotaryEmbedding is the Qwen2.5-VL 2-axis one (20
    frequencies of theta^(-2j/40) per axis, all 80 dims rotated) applied to the first two columns
    of the (t, h, w) position ids, so the width is dropped (a regression of transformers PR
    #48105; the fixture made with it matched a numpy model of exactly that to 2e-6). Probe the
    installed class on a 2x4x4 grid and, when it is not the three-axis ladder, replace it in the
    modeling module (before any model is built) with ThreeAxisVisionRotary. The manifest says
    which; the C++ golden test requires 'three-axis'."""
    modeling = sys.modules.get(hf.model_cls.__module__)
    installed = getattr(modeling, "MiniMaxM3VLVisionRotaryEmbedding", None)
    VC = find(hf.mod, "MiniMaxM3VLVisionConfig")
    cfg = VC(hidden_size=160, num_attention_heads=2, spatial_merge_size=2,
             rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
    t, h, w, m = 2, 4, 4, 2
    tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
    blk = lambda a: a.reshape(t, h // m, m, w // m, m).permute(0, 1, 3, 2, 4).reshape(-1)
    pos = torch.stack([blk(tt), blk(hh), blk(ww)], dim=-1)  # merge-window order, as the tower
    want_cos, want_sin = ThreeAxisVisionRotary(cfg)(torch.empty(pos.shape[0], 160), pos)
    verdict = "three-axis (installed)"
    try:
        cos, sin = installed(cfg)(torch.empty(pos.shape[0], 160), pos)
        same = cos.shape == want_cos.shape and torch.allclose(cos.float(), want_cos, atol=1e-6) \
            and torch.allclose(sin.float(), want_sin, atol=1e-6)
        detail = f"cos shape {tuple(cos.shape)}"
    except Exception as e:  # pragma: no cover - depends on the installed version
        same, detail = False, repr(e)
    if not same:
        modeling.MiniMaxM3VLVisionRotaryEmbedding = ThreeAxisVisionRotary
        verdict = (f"three-axis (patched: transformers {hf.version}'s MiniMaxM3VLVisionRotaryEmbedding "
                   f"is not the three-axis ladder, {detail})")
    log("vision rope:", verdict)
    summary["vision_rope"] = verdict


# ----------------------------------------------------------------------------------------------
# (b) the small model
# ----------------------------------------------------------------------------------------------

VISION_SMALL = dict(hidden_size=160, intermediate_size=192, num_hidden_layers=2,
                    num_attention_heads=2, num_channels=3, image_size=224, patch_size=14,
                    temporal_patch_size=2, spatial_merge_size=2, hidden_act="gelu",
                    layer_norm_eps=1e-5, projector_hidden_size=64)
TEXT_SMALL = dict(mg.BASE_SPARSE_MOE, name="vision_model", seed=4242, layers=2,
                  attn=["sparse", "sparse"], mlp=["dense", "moe"], topk_blocks=2, prompt_lens=[])
IMG_START, IMG_END = 508, 509  # any ids: only image_token_index (vocab - 2 = 510) is special


def vision_weights(s, vc, seed):
    """Larger than make_golden's 0.02 init, so attention and RoPE visibly shape the output."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape, kind in mg.vision_weight_shapes(s, vc):
        n = torch.randn(shape, generator=gen, dtype=torch.float32)
        fan_in = int(np.prod(shape[1:])) if len(shape) >= 2 else 1
        if kind == "ln_w":
            w = 1.0 + 0.1 * n
        elif len(shape) == 1:
            w = 0.1 * n
        else:
            w = n * (1.5 / math.sqrt(fan_in))
        out[name] = w.to(torch.bfloat16).float()
    return out


def model_golden(hf, device, out, per_image, model_images, summary):
    s, vc = TEXT_SMALL, VISION_SMALL
    mg.validate_spec(s)
    tmp = Path(tempfile.mkdtemp(prefix="vision_golden_"))
    text, _ = mg.make_weights(s, vc)
    vis = vision_weights(s, vc, s["seed"] + 1)
    ckpt, _, _ = mg.build_checkpoint(s, text, vis)
    mdir = out / "model"
    mdir.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file
    save_file(ckpt, str(mdir / "model.safetensors"), metadata={"format": "pt"})
    mg.write_json(mdir / "config.json", mg.hf_form_config(hf, s, vc, tmp))
    mg.write_json(mdir / "generation_config.json", mg.generation_config())
    model, info = hf.load(str(mdir), device)
    info = {k: sorted(map(str, v)) for k, v in dict(info).items() if isinstance(v, (list, set, tuple))}
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise RuntimeError(f"from_pretrained did not map every tensor: {bad}")
    summary["save_pretrained"] = mg.compare_save_pretrained(model, ckpt, verbose=False)
    inner = getattr(model, "model", model)
    tower, proj = inner.vision_tower, inner.multi_modal_projector

    gen = torch.Generator().manual_seed(s["seed"] + 7)
    rand = lambda n: torch.randint(3, IMG_START, (n,), generator=gen).tolist()
    img_id = s["vocab"] - 2
    ids, towers, projs, grids, pvs = [mg.BOS_ID] + rand(5), [], [], [], []
    for k, name in enumerate(model_images):
        pv, grid = per_image[name]
        g = torch.tensor([grid], dtype=torch.long, device=device)
        with torch.inference_mode():
            hidden = tower(pv.to(device), g).last_hidden_state.reshape(-1, vc["hidden_size"])
            feats = proj(hidden)
            via_api = model.get_image_features(pv.to(device), g)
            pooled = getattr(via_api, "pooler_output", via_api)
            # One tensor for all images in some transformers versions, a tuple per image in others.
            api = pooled if torch.is_tensor(pooled) else torch.cat(list(pooled), 0)
            api = api.reshape(-1, feats.shape[-1])
        d_api = float((api - feats).abs().max())
        if d_api > 0:
            log(f"get_image_features differs from tower+projector by {d_api:.3g} for {name}")
        summary.setdefault("get_image_features_max_diff", 0.0)
        summary["get_image_features_max_diff"] = max(summary["get_image_features_max_diff"], d_api)
        towers.append(hidden.float().cpu())
        projs.append(feats.float().cpu())
        grids.append(grid)
        pvs.append(pv)
        ids += [IMG_START] + [img_id] * feats.shape[0] + [IMG_END] + rand(4 + 3 * k)
    ids_t = torch.tensor([ids], device=device)
    with torch.inference_mode():
        emb = model.get_input_embeddings()(ids_t).clone()
        mask = ids_t[0] == img_id
        emb[0, mask] = torch.cat(projs, 0).to(device, emb.dtype)
        logits = model(inputs_embeds=emb, use_cache=False).logits[0].float().cpu()
        joint = model(input_ids=ids_t, pixel_values=torch.cat(pvs, 0).to(device),
                      image_grid_thw=torch.tensor(grids, device=device), use_cache=False)
        joint = joint.logits[0].float().cpu()
    d_joint = float((joint - logits).abs().max())
    log(f"logits: per-image tower vs HF's one tower call over all images: max |diff| {d_joint:.3g}")
    marg = mg.margins(logits)
    (out / "tower.f32").write_bytes(torch.cat(towers, 0).numpy().astype("<f4").tobytes())
    (out / "projector.f32").write_bytes(torch.cat(projs, 0).numpy().astype("<f4").tobytes())
    (out / "logits.f32").write_bytes(logits.numpy().astype("<f4").tobytes())
    exp = {"ids": ids, "images": model_images, "grid_thw": grids,
           "image_token_id": img_id, "image_start_id": IMG_START, "image_end_id": IMG_END,
           "tower_rows": [int(t.shape[0]) for t in towers], "tower_hidden": vc["hidden_size"],
           "projector_rows": [int(p.shape[0]) for p in projs], "text_hidden": s["hidden"],
           "vocab": s["vocab"], "argmax": logits.argmax(-1).tolist(),
           "argmax_margin": [round(float(v), 6) for v in marg],
           "max_abs": {"tower": float(torch.cat(towers).abs().max()),
                       "projector": float(torch.cat(projs).abs().max()),
                       "logits": float(logits.abs().max())},
           "joint_tower_call_logits_max_diff": d_joint,
           "get_image_features_max_diff": summary["get_image_features_max_diff"],
           "notes": ["each image goes through the vision tower alone (attention within one image, "
                     "as vLLM and m3serve do); HF's forward(pixel_values=...) runs one tower call "
                     "over all images with no mask, so its images attend to each other: "
                     "joint_tower_call_logits_max_diff reports that difference"]}
    mg.write_json(out / "model_expected.json", exp)
    summary["model"] = {"tokens": len(ids), "min_margin": float(marg.min()), "joint_diff": d_joint}


# ----------------------------------------------------------------------------------------------
# (c) real shapes, hash-generated weights
# ----------------------------------------------------------------------------------------------

M32 = 0xFFFFFFFF


def mul32(x, m):
    """(x * m) mod 2^32 for int64 tensors x < 2^32, without int64 overflow."""
    lo = (x * (m & 0xFFFF)) & M32
    hi = ((x * (m >> 16)) & 0xFFFF) << 16
    return (lo + hi) & M32


def hash_u32(idx, tensor_no, seed):
    x = (idx * 0x9E3779B1 + (tensor_no + 1) * 0x85EBCA77 + seed) & M32
    x = x ^ (x >> 16)
    x = mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def hash_weight(shape, tensor_no, kind, seed, device):
    """Exactly representable float32 values from a counter hash (docs: README.md of the fixture):
    u = hash >> 8 (24 bits); linear weights (u - 2^23) * 2^(-23 - e) with 2^-e the power of two
    nearest sqrt(3 / fan_in); biases (u - 2^23) * 2^-27; LayerNorm weights 1 + ((hash >> 20) -
    2048) * 2^-14."""
    n = int(np.prod(shape))
    idx = torch.arange(n, dtype=torch.int64, device=device)
    h = hash_u32(idx, tensor_no, seed)
    if kind == "ln_w":
        v = 1.0 + ((h >> 20) - 2048).to(torch.float32) * 2.0 ** -14
    elif len(shape) == 1:
        v = ((h >> 8) - (1 << 23)).to(torch.float32) * 2.0 ** -27
    else:
        fan_in = int(np.prod(shape[1:]))
        e = round(-math.log2(math.sqrt(3.0 / fan_in)))
        v = ((h >> 8) - (1 << 23)).to(torch.float32) * 2.0 ** (-23 - e)
    return v.reshape(shape)


def module_state_dict(module, ours):
    """Our checkpoint names -> the module's parameter names. from_pretrained renames checkpoint
    keys (patch_embedding -> proj, no encoder. level, ...); loading a module directly skips that,
    so the same renames are applied here, and what is left is paired by shape when that is unique."""
    want = {k: tuple(v.shape) for k, v in module.state_dict().items() if "inv_freq" not in k}

    def norm(k):
        k = k.replace("encoder.layers.", "layers.").replace("patch_embedding", "proj")
        return k.replace("pre_layrnorm", "pre_layernorm")

    out, left = {}, {}
    for k, v in ours.items():
        for cand in (k, norm(k), norm(k).replace("pre_layernorm", "pre_layrnorm")):
            if cand in want and cand not in out and want[cand] == tuple(v.shape):
                out[cand] = v
                break
        else:
            left[k] = v
    free = {k: s for k, s in want.items() if k not in out}
    for k, v in list(left.items()):
        same = [m for m, s in free.items() if s == tuple(v.shape) and m.split(".")[-1] == k.split(".")[-1]]
        if len(same) == 1:
            log(f"real-shape weights: {k} -> {same[0]} (by shape)")
            out[same[0]] = v
            free.pop(same[0])
            left.pop(k)
    if left or free:
        raise RuntimeError(f"real-shape weights did not map: ours {sorted(left)} module {sorted(free)}")
    return out


def real_shape_golden(hf, device, out, per_image, smoke, summary):
    mod = sys.modules.get(hf.model_cls.__module__)
    VC = find(hf.mod, "MiniMaxM3VLVisionConfig")
    VM = find(mod, "MiniMaxM3VLVisionModel")
    PJ = find(mod, "MiniMaxM3VLMultiModalProjector")
    full = hf.config_cls()
    vcfg = full.vision_config if not smoke else VC(num_hidden_layers=2)
    if smoke:
        full.vision_config = vcfg
    vd = {k: getattr(vcfg, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                         "num_attention_heads", "patch_size", "temporal_patch_size",
                                         "spatial_merge_size", "num_channels", "layer_norm_eps")}
    vd["projector_hidden_size"] = full.projector_hidden_size
    text_hidden = full.text_config.hidden_size
    log("real-shape vision config:", vd, "text hidden", text_hidden)
    names = mg.vision_weight_shapes({"hidden": text_hidden}, vd)
    seed = 20260101
    sd = {}
    for no, (name, shape, kind) in enumerate(names):
        sd[name] = hash_weight(shape, no, kind, seed, device)
    tower = VM(vcfg).to(device).float().eval()
    projector = PJ(full).to(device).float().eval()
    V = "vision_tower.vision_model."
    tsd = module_state_dict(tower, {k[len(V):]: v for k, v in sd.items() if k.startswith(V)})
    miss = tower.load_state_dict(tsd, strict=False)
    pmap = {"multi_modal_projector.linear_1": "linear_1", "multi_modal_projector.linear_2": "linear_2",
            "patch_merge_mlp.linear_1": "merge_linear_1", "patch_merge_mlp.linear_2": "merge_linear_2"}
    psd = {}
    for k, v in sd.items():
        for a, b in pmap.items():
            if k.startswith(a + "."):
                psd[b + k[len(a):]] = v
    pmiss = projector.load_state_dict(psd, strict=False)
    bad = [k for k in list(miss.missing_keys) + list(miss.unexpected_keys)
           + list(pmiss.missing_keys) + list(pmiss.unexpected_keys) if "inv_freq" not in k]
    if bad:
        raise RuntimeError(f"real-shape weights did not map: {bad[:10]}")
    pv, grid = per_image[REAL_SHAPE_IMAGE]
    with torch.inference_mode():
        hidden = tower(pv.to(device), torch.tensor([grid], device=device)).last_hidden_state
        hidden = hidden.reshape(-1, vd["hidden_size"])
        feats = projector(hidden)
    h, f = hidden.float().cpu(), feats.float().cpu()

    def stats(t):
        return {"shape": list(t.shape), "mean": float(t.mean()), "std": float(t.std()),
                "max_abs": float(t.abs().max()), "sum_abs": float(t.abs().sum(dtype=torch.float64)),
                "row0_first16": [float(v) for v in t[0, :16]],
                "row_last_first16": [float(v) for v in t[-1, :16]],
                "col0": [float(v) for v in t[:, 0]]}

    res = {"image": REAL_SHAPE_IMAGE, "grid_thw": grid, "vision_config": vd,
           "text_hidden_size": text_hidden, "weight_seed": seed,
           "weight_order": [n for n, _, _ in names], "smoke": smoke,
           "generator": "see hash_weight() in tools/reference/vision_golden.py",
           "tower": stats(h), "projector": stats(f), "projector_row0": [float(v) for v in f[0]]}
    mg.write_json(out / "real_shape.json", res)
    summary["real_shape"] = {"layers": vd["num_hidden_layers"], "tokens": int(f.shape[0]),
                             "tower_max_abs": res["tower"]["max_abs"],
                             "projector_max_abs": res["projector"]["max_abs"]}


# ----------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/vision_golden")
    ap.add_argument("--device", default=None)
    ap.add_argument("--smoke", action="store_true", help="fewer images, 2-layer real-shape tower")
    ap.add_argument("--processor-only", action="store_true",
                    help="only the image set and the processor's files (no model, no manifest)")
    args = ap.parse_args()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    except Exception as e:
        log("precision settings failed:", repr(e))
    torch.set_grad_enabled(False)
    log("python", sys.version.split()[0], platform.platform(), "torch", torch.__version__,
        "device", device)
    import PIL
    log("PIL", PIL.__version__, "numpy", np.__version__)
    try:
        import torchvision
        log("torchvision", torchvision.__version__)
    except Exception as e:
        log("torchvision not importable:", repr(e))
    hf = mg.HF()
    log("transformers", hf.version)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = SMOKE_IMAGES if args.smoke else [i[0] for i in IMAGES]
    model_images = SMOKE_MODEL_IMAGES if args.smoke else MODEL_IMAGES
    summary, rows, ok = {"smoke": args.smoke}, [], True
    steps = [("processor", None)]
    if not args.processor_only:
        steps += [("model", None), ("real_shape", None)]
    per_image = {}
    ensure_three_axis_vision_rope(hf, summary)  # before any vision tower is built
    for step, _ in steps:
        t = time.time()
        try:
            if step == "processor":
                files = write_images(out, names)
                per_image, facts = run_processor(hf.mod, out, names, files, rows)
                summary["processor"] = facts
            elif step == "model":
                model_golden(hf, device, out, per_image, model_images, summary)
            else:
                real_shape_golden(hf, device, out, per_image, args.smoke, summary)
            log(f"step {step} ok in {time.time() - t:.1f}s")
        except Exception as e:
            ok = False
            traceback.print_exc()
            log(f"step {step} FAILED: {e!r}")
            if step == "processor":
                break
    if args.processor_only:
        for r in rows:
            log(r)
        log(f"processor golden {'OK' if ok else 'FAILED'}; wall {time.time() - T0:.1f}s")
        return 0 if ok else 1
    manifest = {"reference": f"transformers {hf.version}, torch {torch.__version__}, float32, "
                             f"TF32 off, device {device}", "ok": ok, "summary": summary}
    mg.write_json(out / "manifest.json", manifest)
    log("=" * 80)
    for r in rows:
        log(r)
    log("summary:", json.dumps({k: v for k, v in summary.items() if k != "processor"}, default=str))
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log(f"vision golden {'OK' if ok else 'FAILED'}: {total} bytes in {out}; wall {time.time() - T0:.1f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
