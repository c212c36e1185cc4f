#include "app/memory_plan.h"

#include "kv/kv_budget.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace m3::app {

namespace {

double mxfp8(double n, double k) { return n * k * (1.0 + 1.0 / 32.0); }
double nvfp4(double n, double k) { return n * k * (0.5 + 1.0 / 16.0) + 4.0; }
double bf16(double n, double k) { return 2.0 * n * k; }

// Heads of `heads` on one of `ranks` devices (replicated below one per rank).
double heads_per_rank(int64_t heads, int ranks) {
  return std::max(1.0, static_cast<double>(heads) / ranks);
}

int64_t pages_for(int64_t context_length, int32_t page_size) {
  // A request of C tokens holds C - 1 positions in the cache when its last token is sampled.
  return std::max<int64_t>(1, (context_length - 1 + page_size - 1) / page_size);
}

std::string fraction_text(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", f);
  return buf;
}

}  // namespace

int64_t weight_bytes_per_device(const MiniMaxM3Config& c, WeightStorage storage, int ranks,
                                int ep, int dp) {
  ranks = std::max(1, ranks);
  ep = std::clamp(ep, 1, ranks);
  dp = std::clamp(dp, 1, ranks);
  const int attn_ranks = std::max(1, ranks / dp);  // a rank's attention group
  const bool f32 = storage == WeightStorage::kFloat32;
  auto dense = [&](double n, double k) { return f32 ? 4.0 * n * k : mxfp8(n, k); };
  auto expert = [&](double n, double k) { return f32 ? 4.0 * n * k : nvfp4(n, k); };
  auto plain = [&](double n, double k) { return f32 ? 4.0 * n * k : bf16(n, k); };
  const double h = static_cast<double>(c.hidden_size), d = static_cast<double>(c.head_dim);
  const double q_heads = heads_per_rank(c.num_attention_heads, attn_ranks);
  const double kv_heads = heads_per_rank(c.num_key_value_heads, attn_ranks);
  const double ix_heads = heads_per_rank(c.index_n_heads, attn_ranks);
  double total = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    total += dense(q_heads * d, h) + 2 * dense(kv_heads * d, h) + dense(h, q_heads * d);
    total += plain(1, 2 * h) + plain(1, 2 * d);  // input/post norms, q/k norms
    if (c.is_sparse_layer(i)) {
      total += dense(ix_heads * c.index_head_dim, h) + dense(c.index_head_dim, h);
      total += plain(1, 2.0 * c.index_head_dim);
    }
    if (!c.is_moe_layer(i)) {
      total += 3 * dense(static_cast<double>(c.dense_intermediate_size) / ranks, h);
      continue;
    }
    // The router [E, h] and its bias in float32 in both storages (the GPU keeps the checkpoint's
    // float32 router: bf16 can flip near-tied expert choices).
    total += 4.0 * static_cast<double>(c.num_local_experts) * h + 4.0 * c.num_local_experts;
    // E/ep experts, each split by its intermediate dimension over the ranks/ep ranks sharing them.
    const double experts_held = static_cast<double>(c.num_local_experts) / ep;
    const double inter_held = static_cast<double>(c.intermediate_size) / (ranks / ep);
    total += experts_held * (2 * expert(inter_held, h) + expert(h, inter_held));
    const double shared = static_cast<double>(c.shared_intermediate_size * c.n_shared_experts);
    if (shared > 0) total += 3 * dense(shared / ranks, h);
  }
  // The GPU path splits the vocabulary rows of both (as SGLang); the float32 path keeps the
  // embedding whole on every rank and splits the LM head's rows (tensor_parallel.h). Rank 0 with
  // a DSpark draft holds the whole head (and on the GPU the whole embedding), not counted here.
  const double vocab = static_cast<double>(c.vocab_size);
  if (f32) {
    total += plain(vocab, h) + (c.tie_word_embeddings ? 0 : plain(vocab / ranks, h)) + plain(1, h);
  } else {
    total += plain(vocab / ranks, h) * (c.tie_word_embeddings ? 1 : 2) + plain(1, h);
  }
  return static_cast<int64_t>(std::ceil(total));
}

int64_t kv_bytes_per_page_per_device(const MiniMaxM3Config& c, int ranks, double kv_element_bytes,
                                     double index_element_bytes, int dp_groups) {
  ranks = std::max(1, ranks) / std::max(1, dp_groups);  // the ranks one group's heads split over
  KvLayout layout;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    ++(c.is_sparse_layer(i) ? layout.num_sparse_layers : layout.num_dense_layers);
  layout.num_kv_heads = static_cast<int32_t>(heads_per_rank(c.num_key_value_heads, std::max(1, ranks)));
  layout.head_dim = static_cast<int32_t>(c.head_dim);
  layout.index_head_dim = static_cast<int32_t>(c.index_head_dim);
  layout.kv_dtype_bytes = kv_element_bytes;
  layout.index_dtype_bytes = index_element_bytes;
  return kv_bytes_per_page(layout, static_cast<int32_t>(c.index_block_size));
}

int64_t kv_bytes_per_page_for_dtype(const MiniMaxM3Config& c, int ranks, KvCacheDtype dtype,
                                    int dp_groups) {
  const int64_t page = c.index_block_size;
  return kv_bytes_per_page_per_device(c, ranks, kv_bytes_per_element(dtype, page, c.head_dim),
                                      kv_bytes_per_element(dtype, page, c.index_head_dim),
                                      dp_groups);
}

int64_t activation_bytes_per_device(const MiniMaxM3Config& c, WeightStorage storage, int ranks,
                                    int64_t step_tokens, int64_t logit_rows) {
  ranks = std::max(1, ranks);
  const double h = static_cast<double>(c.hidden_size), d = static_cast<double>(c.head_dim);
  const double q = heads_per_rank(c.num_attention_heads, ranks) * d;
  const double kv = heads_per_rank(c.num_key_value_heads, ranks) * d;
  const double ix = heads_per_rank(c.index_n_heads, ranks) * c.index_head_dim;
  const double mlp = static_cast<double>(std::max(c.dense_intermediate_size,
                                                  c.shared_intermediate_size)) / ranks;
  const double k = static_cast<double>(c.num_experts_per_tok);
  // Per token: the residual (f32), the normed row (bf16), q|k|v|index q|index k (f32), q, the
  // attention output and index q (bf16), router logits and top-k, gate|up (f32) and its SwiGLU
  // (bf16), the shared expert's output (f32), and per routed expert its activation and output.
  const double per_token = 4 * h + 2 * h + 4 * (q + 2 * kv + ix + c.index_head_dim) +
                           2 * (2 * q + ix) + 4.0 * c.num_local_experts + 8 * k +
                           4 * 2 * mlp + 2 * mlp + 4 * h +
                           k * (2.0 * c.intermediate_size / ranks + 4 * h);
  const double scale = storage == WeightStorage::kFloat32 ? 2.0 : 1.0;  // f32 where bf16 above
  const double logits = 2.0 * 4 * static_cast<double>(logit_rows) * c.vocab_size / ranks;
  double fixed = 256.0 * (1 << 20);  // CPU: the thread pool's scratch and the sampler
  if (storage == WeightStorage::kCheckpointFormats) {
    // CUDA context and cuBLASLt workspace (~1 GiB), the prefill attention scratch (512 MiB) and
    // the largest weight dequantised to bf16 for a prefill GEMM (the dense gate|up).
    fixed = (1024.0 + 512.0) * (1 << 20) + 2.0 * 2.0 * c.dense_intermediate_size / ranks * h;
  }
  return static_cast<int64_t>(
      std::ceil(scale * per_token * static_cast<double>(std::max<int64_t>(1, step_tokens)) +
                logits + fixed));
}

int64_t draft_weight_bytes(const DraftMemoryShape& d) {
  const int64_t per_layer = 2 * d.hidden + 2 * d.head_dim                 // the four norms
                            + 2 * d.heads * d.head_dim * d.hidden           // q_proj, o_proj
                            + 2 * d.kv_heads * d.head_dim * d.hidden        // k_proj, v_proj
                            + 3 * d.intermediate * d.hidden;                // gate, up, down
  int64_t n = d.hidden * d.num_target_layers * d.hidden  // fc
              + 2 * d.hidden                             // hidden_norm, final_norm
              + 2 * d.vocab * d.markov_rank              // markov_w1, markov_w2
              + d.layers * per_layer;
  if (d.confidence_head) n += d.hidden + (d.confidence_with_markov ? d.markov_rank : 0) + 1;
  return n * static_cast<int64_t>(sizeof(float));
}

int64_t draft_context_bytes_per_sequence(const DraftMemoryShape& d) {
  const int64_t S = d.context_page_size;
  const int64_t pages = (d.sliding_window + S - 1) / S + 3;
  return d.layers * 2 * pages * S * d.kv_heads * d.head_dim * static_cast<int64_t>(sizeof(float));
}

int64_t draft_feature_bytes_per_kv_page(const DraftMemoryShape& d, int32_t page_size) {
  return d.num_target_layers * d.hidden * page_size * static_cast<int64_t>(sizeof(float));
}

int64_t vision_tower_gpu_bytes(const VisionConfig& v) {
  const int64_t h = v.hidden_size, i = v.intermediate_size, pj = v.projector_hidden_size;
  const int64_t ht = v.text_hidden_size, merge = v.spatial_merge_size * v.spatial_merge_size;
  const int64_t matrices = h * v.patch_values() +
                           v.num_hidden_layers * (4 * h * h + 2 * h * i) +
                           pj * h + ht * pj + pj * ht * merge + ht * pj;
  const int64_t vectors = 2 * h + v.num_hidden_layers * (4 * h + 4 * h + i + h) + 2 * pj + 2 * ht;
  return 2 * matrices + 4 * vectors;
}

Result<MemoryPlan> plan_memory(const MemoryPlanInput& in) {
  if (in.page_size <= 0 || in.kv_bytes_per_page <= 0) {
    return invalid_argument("[memory plan] the model reports no KV layout (page of " +
                            std::to_string(in.page_size) + " tokens, " +
                            std::to_string(in.kv_bytes_per_page) + " bytes)");
  }
  if (in.context_length > in.max_context_length) {
    return invalid_argument("--context-length " + std::to_string(in.context_length) +
                            " exceeds the model's max_position_embeddings " +
                            std::to_string(in.max_context_length));
  }
  MemoryPlan p;
  const int64_t page_bytes = in.kv_bytes_per_page;
  const double fraction =
      in.mem_fraction_static > 0 ? in.mem_fraction_static : in.default_mem_fraction;
  const int32_t wanted_context =
      in.context_length > 0 ? in.context_length : in.max_context_length;
  const std::string fraction_flag = in.mem_fraction_static > 0
                                        ? "--mem-fraction-static " + fraction_text(fraction)
                                        : "the default memory fraction " + fraction_text(fraction);
  int64_t pool = 0;
  if (in.kv_cache_bytes > 0) {
    pool = in.kv_cache_bytes;
    p.sized_by = "--kv-cache-bytes " + std::to_string(in.kv_cache_bytes);
  } else if (fraction > 0) {
    if (in.device_memory_bytes <= 0) {
      return invalid_argument("[memory plan] the " + in.device_name +
                              " memory size is unknown; give --kv-cache-bytes");
    }
    // Working memory uses the rest (1 - F) first; what does not fit there is reserved inside F.
    const int64_t static_bytes =
        static_cast<int64_t>(fraction * static_cast<double>(in.device_memory_bytes));
    p.reserve_bytes = std::max<int64_t>(
        0, in.activation_bytes - (in.device_memory_bytes - static_bytes));
    GpuKvBudget budget;
    budget.device_total_bytes = in.device_memory_bytes;
    budget.weight_bytes = in.weight_bytes;
    budget.reserve_bytes = p.reserve_bytes;
    budget.mem_fraction_static = fraction;
    auto pages = kv_pages_for_mem_fraction(budget, page_bytes);
    if (!pages.is_ok()) {
      return invalid_argument(fraction_flag + " on " + std::to_string(in.ranks) + " " +
                              in.device_name + " device" + (in.ranks == 1 ? "" : "s") + ": " +
                              pages.status().message());
    }
    pool = int64_t{*pages} * page_bytes;
    p.sized_by = fraction_flag + " of " + format_bytes(in.device_memory_bytes) + " per device";
    if (in.cap_to_running_requests > 0) {
      const int64_t useful = int64_t{in.cap_to_running_requests} *
                             pages_for(wanted_context, in.page_size) * page_bytes;
      if (pool > useful) {
        pool = useful;
        p.sized_by += ", capped at what " + std::to_string(in.cap_to_running_requests) +
                      " running requests of " + std::to_string(wanted_context) +
                      " tokens can hold";
      }
    }
    if (in.free_bytes_limit > 0 && pool > in.free_bytes_limit) {
      p.warnings.push_back(fraction_flag + " asks for a KV pool of " + format_bytes(pool) +
                           ", but only " + format_bytes(in.free_bytes_limit) +
                           " is free for it after the profile step (with headroom); the pool "
                           "has that");
      pool = in.free_bytes_limit;
      p.sized_by += ", capped at the memory free after the profile step";
    }
  } else if (in.default_kv_cache_bytes > 0) {
    pool = in.default_kv_cache_bytes;
    p.sized_by = "the default pool of " + format_bytes(pool);
    if (in.context_length > 0) {  // an explicit context length gets at least one request's room
      const int64_t one = pages_for(in.context_length, in.page_size) * page_bytes;
      if (one > pool) {
        pool = one;
        p.sized_by = "one request of --context-length " + std::to_string(in.context_length);
      }
    }
  } else {
    pool = pages_for(wanted_context, in.page_size) * page_bytes;
    p.sized_by = "one request of " + std::to_string(wanted_context) + " tokens";
  }
  p.pages = pool / page_bytes;
  p.kv_cache_bytes = p.pages * page_bytes;
  p.max_tokens = p.pages * in.page_size;
  const int64_t needed = pages_for(wanted_context, in.page_size);
  auto too_small = [&](int64_t context) {
    const int64_t need = pages_for(context, in.page_size);
    return invalid_argument(
        p.sized_by + " holds " + std::to_string(p.pages) + " KV pages of " +
        std::to_string(in.page_size) + " tokens (" + std::to_string(page_bytes) +
        " bytes each); one request of the context length " + std::to_string(context) +
        " needs " + std::to_string(need) + " pages = " + std::to_string(need * page_bytes) +
        " bytes. Raise --kv-cache-bytes or --mem-fraction-static, lower --context-length, or "
        "use more devices");
  };
  if (p.pages < 1) return too_small(wanted_context);
  if (needed <= p.pages) {
    p.context_length = wanted_context;
  } else if (in.context_length > 0) {
    return too_small(in.context_length);
  } else {
    p.context_length = static_cast<int32_t>(std::min<int64_t>(p.max_tokens, INT32_MAX));
    p.warnings.push_back("the model's maximum context of " + std::to_string(wanted_context) +
                         " tokens does not fit the KV pool of " + std::to_string(p.max_tokens) +
                         " tokens; serving a context length of " +
                         std::to_string(p.context_length) +
                         " (raise --mem-fraction-static or use more devices for more)");
  }
  return p;
}

Result<int64_t> available_host_memory(const std::string& meminfo_text) {
  std::string text = meminfo_text;
  if (text.empty()) {
    std::ifstream f("/proc/meminfo");
    if (!f) return not_found("[memory plan] cannot read /proc/meminfo");
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    long long kb = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kb) == 1) return int64_t{kb} * 1024;
  }
  return not_found("[memory plan] /proc/meminfo has no MemAvailable line");
}

std::string format_bytes(int64_t bytes) {
  char buf[48];
  const double b = static_cast<double>(bytes);
  if (b >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.1f GB", b / 1e9);
  } else if (b >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(bytes));
  }
  return buf;
}

}  // namespace m3::app
