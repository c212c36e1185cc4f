"""The checkpoint format of m3-tiny's vision tower, in pure Python: the config blocks train.py
writes (config.json's vision_config, preprocessor_config.json), smart_resize, and the tensor names
and shapes m3serve's loader reads (src/model/minimax_m3/vision_tower.cpp, vision_weight_names and
load_vision_weights). vision_model.py (PyTorch) checks its checkpoint against tensor_shapes();
make_vision_check_model.py writes a randomly initialised model of this format for the C++ check.
"""

import math

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# m3-tiny's tower: 4 layers of hidden 128 (4 heads of 32: 3 x 10 rotary dims + 2 unrotated).
VISION_CONFIG = {
    "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_channels": 3, "image_size": 112, "patch_size": 14, "temporal_patch_size": 2,
    "spatial_merge_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-05,
}
PREPROCESSOR_CONFIG = {
    "image_processor_type": "Qwen2VLImageProcessor", "do_resize": True, "resample": 3,
    "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
    "image_mean": list(CLIP_MEAN), "image_std": list(CLIP_STD),
    "min_pixels": 3136, "max_pixels": 12544, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
}


def smart_resize(height, width, factor=28, min_pixels=3136, max_pixels=12544):
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def tensor_shapes(vc, projector_hidden, text_hidden):
    """{checkpoint tensor name: shape} of the tower, projector and merge MLP (no name prefix)."""
    H, F_, P, T = vc["hidden_size"], vc["intermediate_size"], projector_hidden, text_hidden
    vm = "vision_tower.vision_model."
    out = {vm + "embeddings.patch_embedding.weight": [H, vc["num_channels"], vc["temporal_patch_size"],
                                                      vc["patch_size"], vc["patch_size"]],
           vm + "pre_layrnorm.weight": [H], vm + "pre_layrnorm.bias": [H]}
    for i in range(vc["num_hidden_layers"]):
        base = vm + "encoder.layers.%d." % i
        for leaf, shape in (("layer_norm1", [H]), ("layer_norm2", [H])):
            out[base + leaf + ".weight"], out[base + leaf + ".bias"] = shape, shape
        for leaf, o, n in (("self_attn.q_proj", H, H), ("self_attn.k_proj", H, H), ("self_attn.v_proj", H, H),
                           ("self_attn.out_proj", H, H), ("mlp.fc1", F_, H), ("mlp.fc2", H, F_)):
            out[base + leaf + ".weight"], out[base + leaf + ".bias"] = [o, n], [o]
    m = vc["spatial_merge_size"] ** 2
    for leaf, o, n in (("multi_modal_projector.linear_1", P, H), ("multi_modal_projector.linear_2", P, P),
                       ("patch_merge_mlp.linear_1", T, m * P), ("patch_merge_mlp.linear_2", T, T)):
        out[leaf + ".weight"], out[leaf + ".bias"] = [o, n], [o]
    return out
