#!/usr/bin/env bash
# Writes a model directory for `--load-format dummy` at MiniMax-M3.1-Flash's text shapes (the
# values of MiniMaxM3Config's defaults, docs/memory.md) with LAYERS decoder layers (3 dense, the
# rest MoE), and the bundled model's tokenizer and template, its BPE vocabulary filled up to the
# 200,064 ids with made-up ASCII pieces: the random tokens dummy weights generate then all decode
# to text, so streamed chunks (and the ITL a benchmark measures between them) come one per token.
#   tools/device/flash-config.sh DIR [LAYERS=60]
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:?usage: flash-config.sh DIR [LAYERS]}
LAYERS=${2:-60}
mkdir -p "$DIR"
cp models/m3-tiny/{tokenizer_config.json,chat_template.jinja,generation_config.json} "$DIR/"
python3 - "$DIR/tokenizer.json" <<'PY'
import json, sys
t = json.load(open("models/m3-tiny/tokenizer.json"))
vocab = t["model"]["vocab"]
taken = set(vocab) | {a["content"] for a in t["added_tokens"]}
used = set(vocab.values()) | {a["id"] for a in t["added_tokens"]}
for i in range(200064):
    if i in used:
        continue
    piece, n = "zq", i
    while True:  # base-26 letters: bytes the byte-level decoder maps to themselves
        piece += chr(ord("a") + n % 26)
        n //= 26
        if n == 0:
            break
    assert piece not in taken, piece
    vocab[piece] = i
json.dump(t, open(sys.argv[1], "w"), ensure_ascii=False)
PY
python3 - "$DIR/config.json" "$LAYERS" <<'PY'
import json, sys
c = json.load(open("models/m3-tiny/config.json"))
t = c["text_config"]
L = int(sys.argv[2])
dense = min(3, L)
t.update(vocab_size=200064, hidden_size=6144, intermediate_size=3072, dense_intermediate_size=12288,
         shared_intermediate_size=3072, num_hidden_layers=L, num_attention_heads=64,
         num_key_value_heads=4, head_dim=128, max_position_embeddings=524288, rope_theta=5e6,
         rotary_dim=64, partial_rotary_factor=0.5, num_local_experts=128, num_experts_per_tok=4,
         n_shared_experts=1, routed_scaling_factor=2.0, moe_layer_freq=[0] * dense + [1] * (L - dense))
t["sparse_attention_config"].update(sparse_num_index_heads=4, sparse_index_dim=128,
         sparse_block_size=128, sparse_topk_blocks=16, sparse_local_block=1, sparse_init_block=1,
         sparse_attention_freq=[1] * L, sparse_disable_index_value=[1] * L)
json.dump(c, open(sys.argv[1], "w"), indent=2)
PY
