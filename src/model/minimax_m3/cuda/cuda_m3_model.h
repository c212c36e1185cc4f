// The MiniMax-M3 text model on the real-shape CUDA kernels: weights in their storage
// formats (MXFP8 / NVFP4 / BF16, see gpu_weights.h), a bf16 paged KV cache per layer in the
// scheduler's page layout (cuda::KvCacheView, page = sparse block = 128 tokens), bf16
// activations and a float32 residual stream. forward() has exactly minimax_m3::Model::forward's
// semantics (model.h): decode rows and prefill chunks of several sequences in one batch, input
// embeddings (image features) replacing their tokens' embeddings.
//
// Two paths per step:
//  * decode (at most max_batch rows; every sequence one token, unless
//    CudaM3Kernels::small_steps_on_decode_path lets a prefill chunk's tokens be rows too): the
//    streaming GEMVs (quant_gemv.h), indexer_decode + sparse_decode, grouped expert GEMVs. Rows are padded
//    to a batch bucket (1, 2, 4, ..., max_batch) and the block tables to a power-of-two width; padding
//    rows have block-table -1 (no KV write, no attention) and position 0. All buffers are made at
//    load, so the step allocates nothing, and with graphs on it is captured into a CUDA graph per
//    (batch bucket, table width) on its first use (that step runs eagerly) and replayed after.
//    Graph replay and the eager launches are the same kernels on the same buffers: bitwise equal.
//  * general (larger steps with a prefill chunk): linears through PrefillGemm on all tokens of the step
//    (dequantise to bf16 + cuBLASLt; routed experts grouped by expert), decode rows of the step
//    through indexer_decode + sparse_decode, each prefill chunk through launch_prefill_attention.
//    Scratch comes from a caching allocator.
//
// MSA sparse layers run the indexer + block-sparse attention; full_attention layers (MiniMax-M3's
// first three) dense causal attention (dense_decode for decode rows, the prefill kernels' dense
// mode for chunks) with no index keys cached. check_real_shape_fit (fit_check.h) lists what the
// kernels need, and load() returns its invalid_argument so the caller can fall back to the float32
// path. Not thread-safe: one caller (the engine thread) at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

struct CUstream_st;

namespace m3::cuda {
class OneShotAllReduce;
}

#include "backend/comm/communicator.h"
#include "backend/cuda/prefill/prefill_gemm.h"
#include "core/status.h"
#include "loader/model_config.h"
#include "loader/weight_source.h"
#include "model/minimax_m3/model.h"
#include "quant/kv_quant.h"

namespace m3::minimax_m3 {

struct DevWeights;  // gpu_weights.h

// Decode-path thresholds that depend on the GPU (its SM count, how many CTAs of a kernel fit
// beside another's) rather than on the model. The defaults are the H200's; docs/performance.md
// says how to measure a change (cuda_model_decode_bench, A/B in one run).
struct CudaM3Tuning {
  // Decode steps of up to this many rows spread each row of the add + RMSNorm over a cluster of
  // 8 CTAs exchanging partial sums in distributed shared memory: few rows leave most SMs idle
  // with one CTA per row. Above it (and at 0), one CTA per row.
  int64_t cluster_norm_max_rows = 16;
  // Decode steps of up to this many rows route in one fused launch (router GEMV, top-k and
  // grouping; moe/moe_route.h). Its last CTA runs every row's top-k and the grouping, which grows
  // with the rows (about 10 us at one row, 112 us at 128 on the H200); above it the router is a
  // GEMV followed by the top-k and grouping launches. At most 256 (the fused router's limit).
  int64_t fused_router_max_rows = 32;
};

// What a profile step measured (CudaM3Options::kv_pages_after_profile): after the weights were
// loaded and one prefill step of `profile_tokens` tokens ran, the device's memory split into the
// weights, everything else this process and others hold (the CUDA context and module images,
// cuBLASLt workspaces, the decode buffers, the step allocator's cached blocks at the step's
// peak), and what is free. The temporary KV pages of the profile step are not in any of them.
struct CudaMemoryProfile {
  int64_t total_bytes = 0;
  int64_t weight_bytes = 0;
  int64_t working_bytes = 0;
  int64_t free_bytes = 0;
  int64_t profile_tokens = 0;
};

// Kernel choices: each switch selects the newer kernel (checked against the CPU by
// tools/device/run-all.sh prefill); off, the kernel it replaced. The defaults follow the
// measurements in docs/performance.md.
struct CudaM3Kernels {
  // Prefill attention: kTiled (query tiles over the union of their selected blocks, staged in
  // shared memory) and the fused indexer kFusedMaxPool, instead of kTensorCore + kGemmScores
  // (the whole attention 1.3-2.4x and the indexer 4.1-4.4x faster at 8K and 32K tokens on an
  // H200).
  bool tiled_prefill_attention = true;
  // Prefill routed experts: kGroupedInLoop (all experts in one launch, NVFP4 / MXFP8 dequantised
  // in the main loop, no host sync), instead of kDequantCublas, at every step size. kDequantCublas
  // dequantises all 128 experts into bf16 whatever the step's size, then runs cuBLASLt per expert
  // and synchronises the stream once; its buffers (gathered rows, gate|up in float32, expert
  // outputs: ~2.2 GB at 8K tokens against ~1 GB) come out of the KV pool. The register-weights
  // kernel below is ahead of it at every measured size: 11.5 against 23.2 ms at 8K tokens and
  // 43.2 against 44.5 at 32K (one layer's routed experts, one H100, cuda_prefill_bench, both in
  // one call; docs/performance.md); at 2K an earlier, slower version already took 5.8 against 19.5.
  bool grouped_expert_gemm = true;
  // With grouped_expert_gemm: the Hopper wgmma main loop (kGroupedWgmma,
  // docs/design/prefill-expert-gemm.md) instead of mma.sync: 1.23x faster at 8K and at 32K
  // tokens on an H200 (27.3 against 33.6 ms for one layer's routed experts at 8K), the same
  // per-element check against the CPU (prefill_gemm_test).
  bool grouped_expert_wgmma = true;
  // With grouped_expert_wgmma: the NVFP4 weights as wgmma's register operand
  // (kGroupedWgmmaRegisterWeights, docs/design/prefill-expert-gemm.md) for the matrices in the
  // NVFP4 mma layouts, the wgmma loop for the others: one layer's routed experts in 5.8 ms at 2K
  // tokens and 14.0 ms at 8K against 10.9 and 27.3 for the wgmma loop and 19.5 and 23.2 for
  // kDequantCublas (one H100, cuda_prefill_bench --experts; later versions: above).
  bool grouped_expert_register_weights = true;
  // Steps whose rows fit the decode buffers (max_batch) run on the decode path whatever their
  // slices, so a prefill chunk's tokens are decode rows there (the grouped expert GEMVs read each
  // touched expert's weights once per 16 rows); off, only one-token rows and a draft's short
  // slices do, and any prefill chunk takes the general path (the grouped expert GEMM, whose NVFP4
  // decode made 512 tokens cost 13.2 ms per MoE layer with mma.sync on an H200).
  bool small_steps_on_decode_path = true;
  // Decode sampling: kMultiCta (each row over many CTAs), instead of kOneCtaPerRow: with top-k
  // 40 and top-p 0.95, 44 us instead of 609 us at batch 1 on an H200 (about 5 us slower for
  // greedy rows and 0.1 ms for top-p without top-k, where both kernels take ~1.4 ms).
  bool multi_cta_sampling = true;
  // Decode with tensor parallelism over the one-shot all-reduce (CudaTensorParallel::one_shot):
  // the all-reduce of the attention output and of the feed-forward block fused with the residual
  // add and the RMSNorm after it (one launch instead of two, the sum never stored); off, the
  // all-reduce then the norm. The fused norm is the one-CTA-per-row norm's arithmetic, so at up to
  // tuning.cluster_norm_max_rows rows its last bits can differ from the unfused (cluster) norm's.
  bool fused_all_reduce_norm = true;

  // The routed experts' kernel for a prefill step, from the switches above.
  cuda::PrefillMoeKernel prefill_moe_kernel() const {
    using K = cuda::PrefillMoeKernel;
    if (!grouped_expert_gemm) return K::kDequantCublas;
    if (!grouped_expert_wgmma) return K::kGroupedInLoop;
    return grouped_expert_register_weights ? K::kGroupedWgmmaRegisterWeights : K::kGroupedWgmma;
  }
};

// Tensor parallelism over GPUs (tensor_parallel.h, --tp): the model is rank `rank` of `ranks`. It
// holds rank_slices(cfg, rank, ranks)'s weights (its query heads with their KV and index heads,
// 1/ranks of every intermediate dimension and its vocabulary rows of the embedding and head;
// norms and router whole), runs at rank_config's shapes, and all-reduces the embedding lookup, the
// attention output projection and the feed-forward block (float32, in place) over the
// communicator; the head's slices are all-gathered. Every rank's load() and forward() run
// concurrently, one thread per rank, with the same batch; rank 0's outputs are the model's (the
// other ranks return no logits).
//
// Expert parallelism (--ep E, E divides ranks; tensor_parallel.h's placement, SGLang's meaning):
// rank r holds the routed experts [e·N/E, (e+1)·N/E) of its expert-parallel rank e = r / (ranks/E),
// whole or split by their intermediate dimension over the ranks/E ranks sharing them; attention,
// the dense MLPs and the shared expert stay split over all ranks. Every rank holds every token of
// the step (attention is all-reduced), routes all of them over all experts, runs only its own
// experts (the other experts' slots are skipped on the device, no host sync) and the all-reduce
// after the combine adds the other ranks' experts: no all-to-all (docs/parallel.md says why).
//
// Attention data parallelism (--enable-dp-attention --dp D, D divides ranks; tensor_parallel.h):
// the rank is in group g = rank / (ranks/D), holds rank_slices(..., dp)'s heads (its group's
// ranks/D-way split) and a KV pool of its group's pages, and runs attention on the step's slices
// of group g only; the feed-forward blocks stay split over all ranks and run on every group's
// rows. Every rank holds the residual stream of every group's rows (step_rows.h lays them out,
// group by group), so the layer's two collectives stay two all-reduces over all ranks:
//  * attention: each rank writes its o_proj partial sum into its group's rows of a zeroed
//    [rows, hidden] delta; the all-reduce over all ranks sums each group's partials (the
//    all-reduce within the group) and hands every rank the other groups' rows at once (the
//    gather of the groups' rows before the feed-forward block): SGLang's dp_gather_partial;
//  * feed-forward: the partial sums of all rows, all-reduced as under --tp; each rank then holds
//    every group's layer output, its own group's rows among them.
// The decode path pads every group to the same bucket of rows (the largest group's), so the
// messages, the one-shot fused norms and the CUDA graphs keep fixed shapes. Every rank holds every
// group's final rows, so the head runs for all of them as under --tp, and rank 0 samples.
struct CudaTensorParallel {
  int rank = 0;
  int ranks = 1;
  int ep = 1;
  int dp = 1;
  // Called once by load() with the model's compute stream, on which the collectives must queue
  // (NCCL: comm/nccl_communicator.h; they then order with the kernels around them and are
  // captured into the decode graphs). Required when ranks > 1.
  std::function<Result<std::unique_ptr<comm::Communicator>>(CUstream_st* stream)>
      make_communicator;
  // The one-shot all-reduce group behind the communicator's small sums, if any (rank `rank` of
  // it): with CudaM3Kernels::fused_all_reduce_norm, a decode all-reduce that a norm follows runs
  // fused with that residual add + RMSNorm (OneShotAllReduce::all_reduce_add_rms_norm) where the
  // message fits it. Null: every all-reduce through the communicator, then the norm.
  std::shared_ptr<cuda::OneShotAllReduce> one_shot;
  // Every rank holds its slice of the vocabulary's rows of the embedding and the head
  // (tensor_parallel.h, vocab_slice). With this, rank 0 loads them whole (it still looks up and
  // computes only its slice): a DSpark draft beside it reads the whole embedding and head
  // (cuda_dspark_draft.h).
  bool whole_vocab_on_rank0 = false;
};

struct CudaM3Options {
  // KV cache pages (page ids 0 .. num_kv_pages - 1). 0: sized after a profile step by
  // kv_pages_after_profile, which is then required.
  int64_t num_kv_pages = 0;
  // With num_kv_pages 0: load() loads the weights and the decode buffers, runs one prefill step
  // of profile_tokens tokens (one sequence, on temporary KV pages freed after it), measures the
  // device's memory (CudaMemoryProfile) and allocates the pages this returns. An error from it
  // is load()'s error.
  std::function<Result<int64_t>(const CudaMemoryProfile&)> kv_pages_after_profile;
  int64_t profile_tokens = 8192;
  // The KV cache's storage (--kv-cache-dtype): bf16, or fp8_e4m3 / fp4_e2m1 (quant/kv_quant.h),
  // which the decode kernels read directly and the prefill kernels through a bf16 staging copy of
  // one layer's pages (kv_bytes_per_page counts it).
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kBF16;
  // Decode rows per step on the GEMV path (larger steps: general); --cuda-graph-max-bs. At 256
  // rows the decode path is ~8x the general path's speed (docs/performance.md).
  int64_t max_batch = 256;
  int device = 0;
  // Decode steps captured into a CUDA graph per (batch bucket, table width) on first use and
  // replayed (bitwise the eager launches); off: every step launched eagerly.
  bool use_graphs = true;
  // --load-format dummy: ignore the WeightSource's values and generate random weights in the
  // storage formats on the GPU (gpu_weights.h, make_dummy_dev_weights) from dummy_seed.
  bool gpu_dummy_weights = false;
  uint64_t dummy_seed = 0;
  CudaM3Tuning tuning;
  CudaM3Kernels kernels;
  CudaTensorParallel tp;
};

struct CudaM3Stats {
  int64_t decode_steps = 0, general_steps = 0;
  int64_t graph_captures = 0, graph_replays = 0;
  // Steps whose one-token rows attended every block without the indexer (block tables no wider
  // than the indexer's top-k, which would select every block).
  int64_t indexer_skipped_steps = 0;
  double graph_launch_us = 0;      // host time inside cudaGraphLaunch, summed over the replays
  int64_t bf16_fallbacks = 0;      // fused matrices stored BF16 although quantised on disk
  int64_t quantised_matrices = 0;  // fused matrices kept MXFP8 / NVFP4
  int64_t weight_bytes = 0, kv_bytes = 0, buffer_bytes = 0;  // device memory at load
  CudaMemoryProfile profile;  // when the pool was sized by a profile step (else zeros)
};

class CudaM3Model {
 public:
  // `cfg` is the whole model's; with options.tp.ranks > 1 the model runs at rank_config's shapes
  // (config() returns them).
  static Result<std::unique_ptr<CudaM3Model>> load(const MiniMaxM3Config& cfg,
                                                   const WeightSource& src,
                                                   const CudaM3Options& options);
  ~CudaM3Model();
  CudaM3Model(const CudaM3Model&) = delete;
  CudaM3Model& operator=(const CudaM3Model&) = delete;

  // Bytes of one KV page over all layers (K, V and the sparse layers' index keys in `dtype`, and
  // a quantised pool's bf16 staging share: real_shape_kv_pool_bytes_per_page) on one rank of
  // `tp_ranks` (`ep`: the layout's expert-parallel ranks; the page does not depend on it, but the
  // layout must be valid).
  // With `dp` attention groups a rank's page is its group's (the KV heads split ranks/dp-way).
  static int64_t kv_bytes_per_page(const MiniMaxM3Config& cfg, int tp_ranks = 1, int ep = 1,
                                   KvCacheDtype dtype = KvCacheDtype::kBF16, int dp = 1);

  const MiniMaxM3Config& config() const;
  int64_t num_kv_pages() const;
  int64_t page_size() const { return 128; }
  CudaM3Stats stats() const;

  // Model::forward semantics (the KV cache is the model's own), including `capture_layers`: the
  // residual stream after those decoder layers for every token (out->hidden, float32). A step
  // that captures (a draft's) runs every slice of up to 16 tokens as decode rows, one per token
  // (a verify block on the GEMVs, graphs keyed by the capture set too), and takes the general
  // path when a slice is longer. Errors in the inputs are invalid_argument before anything runs.
  // Under --dp (CudaTensorParallel::dp) every rank takes the whole batch: it runs attention (and
  // writes its pool) for its group's slices (SequenceInput::dp_group) and everything else for all
  // of them, and rank 0 returns every slice's outputs, as Model::forward's ranks do between them.
  Status forward(std::span<const SequenceInput> batch, ForwardOutput* out,
                 std::span<const int32_t> capture_layers = {});

  // What a draft model on the same GPU shares (the DSpark draft reads the embedding table, the
  // lm_head and the final norm): the loaded weights, the compute stream and the device. The
  // draft's work must be ordered with the model's steps on this stream or synchronised with it.
  const DevWeights& dev_weights() const;
  CUstream_st* stream() const;
  int device() const;

  // Where KV page `page` (0 .. num_kv_pages() - 1) lives: one contiguous (device pointer, bytes)
  // run per layer and tensor, K, V and the sparse layers' index keys, in layer order (quantised:
  // each tensor's codes, fp4 block scales and page-head scales). What a page copy moves
  // (cuda_kv_page_copier.h); the runs add up to real_shape_kv_bytes_per_page at this rank's shape.
  std::vector<std::pair<void*, int64_t>> kv_page_runs(int64_t page) const;

  struct Impl;

 private:
  CudaM3Model() = default;
  // num_kv_pages 0: the profile step, then the pool (CudaM3Options::kv_pages_after_profile).
  Status profile_and_size_kv();
  std::unique_ptr<Impl> impl_;
};

}  // namespace m3::minimax_m3
