"""m3-tiny's vision tower and projector in PyTorch, the same maths as m3serve's C++ path so the
trained weights run there unchanged. Conventions mirrored (src/model/minimax_m3/vision_tower.*,
src/loader/vision_config.cpp, src/server/media/image_preprocess.*, src/app/vision_stack.cpp,
m3-architecture.md 6):

* config.json keys: vision_config.{hidden_size, num_attention_heads, num_hidden_layers,
  intermediate_size, patch_size, temporal_patch_size, spatial_merge_size, num_channels,
  layer_norm_eps, rope_theta, hidden_act "gelu"}; top-level projector_hidden_size,
  projector_hidden_act "gelu"; text_config.hidden_size is where the merge MLP ends;
  preprocessor_config.json: min_pixels, max_pixels, image_mean, image_std, patch_size,
  temporal_patch_size, merge_size (must equal the tower's).
* tensor names (no prefix): vision_tower.vision_model.embeddings.patch_embedding.weight
  [H, 3, T, P, P] (a Conv3d weight, used as a linear over the (c, t, y, x)-ordered patch, no bias),
  vision_tower.vision_model.pre_layrnorm.{weight,bias},
  vision_tower.vision_model.encoder.layers.N.{layer_norm1,layer_norm2,self_attn.q_proj,
  self_attn.k_proj,self_attn.v_proj,self_attn.out_proj,mlp.fc1,mlp.fc2}.{weight,bias},
  multi_modal_projector.linear_{1,2}.{weight,bias} (H -> P -> P),
  patch_merge_mlp.linear_{1,2}.{weight,bias} (4P -> text hidden -> text hidden).
* forward: patch linear, pre-LayerNorm, pre-LN layers (x += out_proj(attn(LN1 x)); x += fc2(gelu(
  fc1(LN2 x)))), bidirectional attention over the image's patches with scale 1/sqrt(head_dim),
  exact (erf) GELU everywhere, no post-LayerNorm; project every patch, then concatenate the 4
  consecutive patches of each merge window and run the merge MLP: one output per window.
* 3-D RoPE on q and k: axis = (head_dim // 3) // 2 * 2 dims per axis (t, h, w), inv_freq_j =
  theta^(-2j / axis), angles [t f ; h f ; w f] applied half-split (rotate_half) over the first
  3 * axis dims of each head; t = 0 for an image; (h, w) the patch's row and column, derived from
  the merge-window-order index.
* pre-processing: smart_resize to multiples of patch * merge (28) within [min_pixels,
  max_pixels] (Python round, half to even), PIL bicubic resize when the size changes, x / 255 in
  double then float32, (x - mean) / std in float32, the frame repeated to temporal_patch_size,
  patches of (c, t, y, x) values in merge-window order (h/m, w/m, m, m).
* prompt: one ]<]image[>[ per image from the chat template, expanded to ]<]start of image[>[ +
  N x ]<]image[>[ + ]<]end of image[>[ with N = patches / 4; the tower's outputs replace the
  embeddings of the ]<]image[>[ positions in order.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from vision_format import CLIP_MEAN, CLIP_STD, PREPROCESSOR_CONFIG, VISION_CONFIG, smart_resize, tensor_shapes  # noqa: F401


def load_rgb(png_bytes, pre=PREPROCESSOR_CONFIG):
    """PNG/JPEG bytes -> uint8 tensor [H, W, 3] after smart_resize and PIL's bicubic resize."""
    import io

    import numpy as np
    from PIL import Image

    im = Image.open(io.BytesIO(png_bytes)).convert("RGB")
    h, w = smart_resize(im.height, im.width, pre["patch_size"] * pre["merge_size"], pre["min_pixels"],
                        pre["max_pixels"])
    if (im.height, im.width) != (h, w):
        im = im.resize((w, h), Image.BICUBIC)
    return torch.from_numpy(np.asarray(im, dtype=np.uint8).copy())


def patches(u8, patch=14, merge=2, temporal=2):
    """uint8 [B, H, W, 3] (one size) -> float32 [B, n, 3 * temporal * patch^2] in merge-window order."""
    B, H, W, _ = u8.shape
    x = (u8.double() / 255.0).float()
    mean = torch.tensor(CLIP_MEAN, dtype=torch.float32, device=u8.device)
    std = torch.tensor(CLIP_STD, dtype=torch.float32, device=u8.device)
    x = ((x - mean) / std).permute(0, 3, 1, 2)  # [B, 3, H, W]
    gh, gw = H // patch, W // patch
    x = x.reshape(B, 3, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.permute(0, 2, 5, 3, 6, 1, 4, 7)  # [B, bh, bw, mh, mw, c, py, px]
    x = x.unsqueeze(6).expand(*x.shape[:6], temporal, patch, patch)  # [.., c, t, py, px]
    return x.reshape(B, gh * gw, 3 * temporal * patch * patch).contiguous(), (gh, gw)


def _ln(mod, x):
    """LayerNorm in float32 whatever autocast does (the residual stream stays float32)."""
    return F.layer_norm(x.float(), mod.normalized_shape, mod.weight.float(), mod.bias.float(), mod.eps)


class _Attn(nn.Module):
    def __init__(self, H):
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(H, H), nn.Linear(H, H)
        self.v_proj, self.out_proj = nn.Linear(H, H), nn.Linear(H, H)


class _MLP(nn.Module):
    def __init__(self, H, F_):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(H, F_), nn.Linear(F_, H)


class _Layer(nn.Module):
    def __init__(self, H, F_, eps):
        super().__init__()
        self.layer_norm1, self.layer_norm2 = nn.LayerNorm(H, eps=eps), nn.LayerNorm(H, eps=eps)
        self.self_attn, self.mlp = _Attn(H), _MLP(H, F_)


class _Two(nn.Module):
    def __init__(self, a, b, c):
        super().__init__()
        self.linear_1, self.linear_2 = nn.Linear(a, b), nn.Linear(b, c)


class VisionTower(nn.Module):
    """State-dict names are the checkpoint's (see the module docstring), except that the patch
    embedding is stored as a linear [H, 3 * T * P * P] (checkpoint_tensors reshapes it)."""

    def __init__(self, vc, projector_hidden, text_hidden):
        super().__init__()
        self.vc = dict(vc)
        H, F_, eps = vc["hidden_size"], vc["intermediate_size"], vc["layer_norm_eps"]
        self.heads = vc["num_attention_heads"]
        self.merge = vc["spatial_merge_size"]
        self.patch_values = vc["num_channels"] * vc["temporal_patch_size"] * vc["patch_size"] ** 2
        self.vision_tower = nn.Module()
        vm = self.vision_tower.vision_model = nn.Module()
        vm.embeddings = nn.Module()
        vm.embeddings.patch_embedding = nn.Linear(self.patch_values, H, bias=False)
        vm.pre_layrnorm = nn.LayerNorm(H, eps=eps)
        vm.encoder = nn.Module()
        vm.encoder.layers = nn.ModuleList([_Layer(H, F_, eps) for _ in range(vc["num_hidden_layers"])])
        self.multi_modal_projector = _Two(H, projector_hidden, projector_hidden)
        self.patch_merge_mlp = _Two(self.merge * self.merge * projector_hidden, text_hidden, text_hidden)
        D = H // self.heads
        self.axis = (D // 3) // 2 * 2
        assert self.axis >= 2, "head_dim too small for 3-D RoPE"
        j = torch.arange(self.axis // 2, dtype=torch.float64)
        self.register_buffer("inv_freq", (1.0 / vc.get("rope_theta", 10000.0) ** (2 * j / self.axis)).float(),
                             persistent=False)

    def _rope_tables(self, gh, gw, device):
        n, M = gh * gw, self.merge
        p = torch.arange(n, device=device)
        window, within = p // (M * M), p % (M * M)
        ph = (window // (gw // M)) * M + within // M
        pw = (window % (gw // M)) * M + within % M
        pos = torch.stack([torch.zeros_like(p), ph, pw], 1).float()  # [n, 3] (t, h, w)
        ang = (pos[:, :, None] * self.inv_freq.float()[None, None, :]).reshape(n, -1)  # [n, 3 * axis/2]
        return ang.cos(), ang.sin()

    @staticmethod
    def _rope(x, cos, sin):  # x [B, heads, n, D]; rotate_half over the first 2 * half dims
        half = cos.shape[-1]
        a, b, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        return torch.cat([a * cos - b * sin, b * cos + a * sin, rest], -1)

    def forward(self, u8):
        """uint8 images [B, H, W, 3] (one size, already resized) -> [B * windows, text_hidden]."""
        px, (gh, gw) = patches(u8, self.vc["patch_size"], self.merge, self.vc["temporal_patch_size"])
        vm = self.vision_tower.vision_model
        B, n, _ = px.shape
        x = _ln(vm.pre_layrnorm, vm.embeddings.patch_embedding(px.to(vm.embeddings.patch_embedding.weight.dtype)))
        cos, sin = self._rope_tables(gh, gw, u8.device)
        D = x.shape[-1] // self.heads
        for l in vm.encoder.layers:
            h = _ln(l.layer_norm1, x)
            q, k, v = [proj(h).view(B, n, self.heads, D).transpose(1, 2) for proj in
                       (l.self_attn.q_proj, l.self_attn.k_proj, l.self_attn.v_proj)]
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            if q.dtype != v.dtype:
                q, k = q.to(v.dtype), k.to(v.dtype)
            if hasattr(F, "scaled_dot_product_attention"):
                o = F.scaled_dot_product_attention(q, k, v)  # no mask: bidirectional; scale 1/sqrt(D)
            else:  # torch < 2.0 (local checks only)
                o = ((q @ k.transpose(-1, -2)) / D ** 0.5).softmax(-1) @ v
            x = x + l.self_attn.out_proj(o.transpose(1, 2).reshape(B, n, -1))
            x = x + l.mlp.fc2(F.gelu(l.mlp.fc1(_ln(l.layer_norm2, x))))
        y = self.multi_modal_projector.linear_2(F.gelu(self.multi_modal_projector.linear_1(x)))  # [B, n, P]
        y = y.reshape(B * n // (self.merge ** 2), -1)  # 4 consecutive patches = one merge window
        return self.patch_merge_mlp.linear_2(F.gelu(self.patch_merge_mlp.linear_1(y)))

    def checkpoint_tensors(self):
        """{checkpoint name: bf16 tensor} in the layout the C++ loader reads."""
        out = {}
        vc = self.vc
        for k, v in self.state_dict().items():
            if k == "vision_tower.vision_model.embeddings.patch_embedding.weight":
                v = v.reshape(v.shape[0], vc["num_channels"], vc["temporal_patch_size"], vc["patch_size"],
                              vc["patch_size"])
            out[k] = v.detach().to(torch.bfloat16).contiguous().cpu()
        want = tensor_shapes(vc, self.multi_modal_projector.linear_1.out_features,
                             self.patch_merge_mlp.linear_2.out_features)
        got = {k: list(v.shape) for k, v in out.items()}
        bad = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        assert not bad, "vision tensors differ from vision_format.tensor_shapes: %s" % bad
        return out

    def load_checkpoint_tensors(self, tensors):
        """The inverse of checkpoint_tensors (continuing from an earlier round); returns how many."""
        sd = self.state_dict()
        n = 0
        with torch.no_grad():
            for k, v in sd.items():
                if k in tensors:
                    v.copy_(tensors[k].reshape(v.shape).to(v.dtype))
                    n += 1
        return n



class PerceptionProbe(nn.Module):
    """A training-only linear read-out of the tower's merged outputs: for each quadrant of a scene,
    which kind of shape sits there (none or one of shapes.SHAPES) and which colour (none or one of
    shapes.COLOURS), from the mean of the quadrant's merge windows. Its cross entropy, added to the
    language model's loss, puts the scene into the image tokens in a linearly readable form from the
    first steps on, where the language model's own gradient reaches the tower weakly and late. The
    probe is not part of the checkpoint.

    layouts are fresh_vision.encode_layout rows: int [n, objects, 6] (valid, kind, colour, cx, cy, r)
    on an image of `size` pixels whose quadrants split at size / 2."""

    def __init__(self, text_hidden, kinds, colours, size):
        super().__init__()
        self.kinds, self.colours, self.size = kinds, colours, size
        self.head = nn.Linear(text_hidden, (1 + kinds) + (1 + colours))
        self.last_accuracy = None  # (kind, colour) accuracy per quadrant slot of the last batch

    def targets(self, layouts):
        """(kind [n, 4], colour [n, 4]): 0 where the quadrant is empty, else 1 + the index."""
        lay = layouts.long()
        n = lay.shape[0]
        kind = torch.zeros(n, 4, dtype=torch.long, device=lay.device)
        colour = torch.zeros_like(kind)
        half = self.size // 2
        quad = (lay[..., 4] >= half).long() * 2 + (lay[..., 3] >= half).long()  # QUADRANTS order
        valid = lay[..., 0] > 0
        rows = torch.arange(n, device=lay.device).unsqueeze(1).expand_as(quad)
        kind[rows[valid], quad[valid]] = lay[..., 1][valid] + 1
        colour[rows[valid], quad[valid]] = lay[..., 2][valid] + 1
        return kind, colour

    def quadrant_means(self, emb, n_images):
        """[n * windows, H] tower outputs (windows row-major over a square grid) -> [n, 4, H]."""
        w = emb.shape[0] // n_images
        side = int(round(w ** 0.5))
        assert side * side == w and side % 2 == 0, "a square window grid of even side (got %d windows)" % w
        x = emb.float().view(n_images, 2, side // 2, 2, side // 2, -1)  # (qy, wy, qx, wx)
        return x.mean(dim=(2, 4)).reshape(n_images, 4, -1)

    def loss(self, emb, layouts):
        n = layouts.shape[0]
        logits = self.head(self.quadrant_means(emb, n))  # [n, 4, classes]
        kind, colour = self.targets(layouts)
        lk, lc = logits[..., :1 + self.kinds], logits[..., 1 + self.kinds:]
        loss = F.cross_entropy(lk.reshape(-1, lk.shape[-1]), kind.reshape(-1)) + \
            F.cross_entropy(lc.reshape(-1, lc.shape[-1]), colour.reshape(-1))
        with torch.no_grad():
            self.last_accuracy = ((lk.argmax(-1) == kind).float().mean(), (lc.argmax(-1) == colour).float().mean())
        return loss


@torch.no_grad()
def greedy(fast, vis, prompts, images, image_id, eos, max_new, batch=64):
    """Greedy decoding without a KV cache on the fast text model with image embeddings.
    prompts: token lists; images: per prompt a uint8 [n_img, H, W, 3] tensor (or None)."""
    dev = next(fast.parameters()).device
    outs = []
    for s in range(0, len(prompts), batch):
        ps = [list(p) for p in prompts[s:s + batch]]
        ims = [im for im in images[s:s + batch] if im is not None and len(im)]
        emb = vis(torch.cat(ims).to(dev)).float() if ims else None
        gen = [[] for _ in ps]
        done = [False] * len(ps)
        for _ in range(max_new):
            L = max(len(p) for p in ps)
            x = torch.full((len(ps), L), eos, dtype=torch.long, device=dev)
            for r, p in enumerate(ps):
                x[r, :len(p)] = torch.tensor(p, device=dev)
            # generated tokens are never image tokens in a sane model; count them out anyway
            x_img = x.clone()
            for r, p in enumerate(ps):
                x_img[r, len(prompts[s + r]):] = eos
            logits = fast.forward(x, img=(image_id, emb, x_img) if emb is not None else None)
            lens = torch.tensor([len(p) for p in ps], device=dev)
            nxt = logits[torch.arange(len(ps), device=dev), lens - 1].argmax(-1).tolist()
            for r in range(len(ps)):
                if done[r]:
                    continue
                gen[r].append(nxt[r])
                ps[r].append(nxt[r])
                done[r] = nxt[r] == eos
            if all(done):
                break
        outs += gen
    return outs
