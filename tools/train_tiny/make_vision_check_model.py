#!/usr/bin/env python3
"""Writes a copy of models/m3-tiny with a randomly initialised vision tower in exactly the format
train.py --vision saves (vision_format.py: config.json's vision_config and projector_hidden_size,
preprocessor_config.json, bf16 tensors with the checkpoint names, listed in the shard index), in
pure Python (the safetensors file is written by hand). Serving it proves that m3serve's C++ path
loads the trained format before any GPU time is spent:

  python3 tools/train_tiny/make_vision_check_model.py /tmp/m3tiny-vision-check
  build/bin/m3serve serve --model-path /tmp/m3tiny-vision-check ...   (then send an image)
"""

import json
import os
import random
import shutil
import struct
import sys

import vision_format

HERE = os.path.dirname(os.path.abspath(__file__))
SHARD = "model-vision.safetensors"


def bf16_bytes(values):
    """float values -> little-endian bf16 (round to nearest even on the float32 bits)."""
    out = bytearray()
    for v in values:
        bits = struct.unpack("<I", struct.pack("<f", v))[0]
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        out += struct.pack("<H", bits & 0xFFFF)
    return bytes(out)


def write_safetensors(path, tensors):
    """tensors: {name: (shape, bf16 bytes)}."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (shape, data) in tensors.items():
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, data in tensors.values():
            f.write(data)


def main(out_dir, src=os.path.join(HERE, "..", "..", "models", "m3-tiny")):
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    shutil.copytree(src, out_dir)
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    text_hidden = cfg["text_config"]["hidden_size"]
    cfg["vision_config"] = dict(vision_format.VISION_CONFIG)
    cfg["projector_hidden_size"] = text_hidden  # what train.py writes
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out_dir, "preprocessor_config.json"), "w") as f:
        json.dump(vision_format.PREPROCESSOR_CONFIG, f, indent=2)
    rng = random.Random(0)
    tensors = {}
    for name, shape in vision_format.tensor_shapes(cfg["vision_config"], text_hidden, text_hidden).items():
        n = 1
        for d in shape:
            n *= d
        if "norm" in name and name.endswith(".weight"):
            vals = [1.0] * n
        elif name.endswith(".bias"):
            vals = [0.0] * n
        else:
            vals = [rng.gauss(0.0, 0.05) for _ in range(n)]
        tensors[name] = (shape, bf16_bytes(vals))
    write_safetensors(os.path.join(out_dir, SHARD), tensors)
    index_path = os.path.join(out_dir, "model.safetensors.index.json")
    with open(index_path) as f:
        index = json.load(f)
    for name, (_, data) in tensors.items():
        index["weight_map"][name] = SHARD
        index["metadata"]["total_size"] += len(data)
    index["weight_map"] = dict(sorted(index["weight_map"].items()))
    with open(index_path, "w") as f:
        json.dump(index, f, indent=2)
    print("wrote %s: %d vision tensors, %.2f MB" % (out_dir, len(tensors),
                                                    sum(len(d) for _, d in tensors.values()) / 1e6))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_vision_check_model.py OUT_DIR")
    main(sys.argv[1])
