// The MiniMax-M3 text model on the real-shape CUDA kernels: weights in their storage
// formats (MXFP8 / NVFP4 / BF16, see gpu_weights.h), a bf16 paged KV cache per layer in the
// scheduler's page layout (cuda::KvCacheBf16View, page = sparse block = 128 tokens), bf16
// activations and a float32 residual stream. forward() has exactly minimax_m3::Model::forward's
// semantics (model.h): decode rows and prefill chunks of several sequences in one batch.
//
// Two paths per step:
//  * decode (every sequence has one token and there are at most max_batch of them): the streaming
//    GEMVs (quant_gemv.h), indexer_decode + sparse_decode, grouped expert GEMVs. Rows are padded
//    to a batch bucket (1, 2, 4, ..., 128) and the block tables to a power-of-two width; padding
//    rows have block-table -1 (no KV write, no attention) and position 0. All buffers are made at
//    load, so the step allocates nothing, and with graphs on it is captured into a CUDA graph per
//    (batch bucket, table width) on its first use (that step runs eagerly) and replayed after.
//    Graph replay and the eager launches are the same kernels on the same buffers: bitwise equal.
//  * general (any prefill chunk): linears through PrefillGemm on all tokens of the step
//    (dequantise to bf16 + cuBLASLt; routed experts grouped by expert), decode rows of the step
//    through indexer_decode + sparse_decode, each prefill chunk through launch_prefill_attention.
//    Scratch comes from a caching allocator.
//
// Every layer must be an MSA sparse layer; check_real_shape_fit (fit_check.h) lists what else the
// kernels need, and load() returns its invalid_argument so the caller can fall back to the float32
// path. Not thread-safe: one caller (the engine thread) at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/status.h"
#include "loader/model_config.h"
#include "loader/weight_source.h"
#include "model/minimax_m3/model.h"

namespace m3::minimax_m3 {

struct CudaM3Options {
  int64_t num_kv_pages = 0;  // KV cache pages (page ids 0 .. num_kv_pages - 1); required
  int64_t max_batch = 128;   // decode rows per step on the GEMV path (larger batches: general)
  bool use_graphs = true;    // CUDA graphs for decode steps
  // Decode: the shared expert's GEMVs on a second stream, concurrent with the router, grouping
  // and routed-expert GEMVs (both read the post-attention norm; joined before the combine).
  bool overlap_shared_expert = true;
  // With the overlap: the main stream at the device's greatest priority and the side stream at
  // its least, so the block scheduler places the critical path's CTAs (router, routed experts)
  // before the shared expert's (graphs keep the priorities per kernel node). Without it the
  // shared expert's GEMV filled the SMs first and the fused router took 20 instead of 10 us
  // per layer at batch 1 (H200 CUPTI trace).
  bool prioritize_critical_path = true;
  // With the overlap: fork the shared expert after the router instead of beside it. Off: the
  // router then takes ~20 instead of ~10 us at batch 1 (it waits for SMs the shared expert
  // holds), but the routed experts start sooner; 8-layer steps at batch 1 on the H200 were 1.80
  // ms forked first against 1.85 ms forked after.
  bool shared_expert_after_router = false;
  // Decode: the GEMVs (variants 3 and 7), their split-K epilogues and the attention inputs
  // launched with programmatic dependent launch (backend/cuda/runtime/pdl.cuh): a GEMV streams
  // its first weights while the kernel before it finishes. Same results bit for bit; on the
  // H200 never slower beyond the noise in repeated 8-layer A/Bs at batch 1 and 8, and the
  // 60-layer batch-1 step 9.79 against 10.69 ms.
  bool pdl = true;
  // With `pdl`: every other kernel of the decode step's critical path launched the same way too
  // (the norms, the fused router, the variant-5 GEMVs on the main stream, the indexer's scoring
  // and the attention's split kernel); each waits for the kernel before it at its start, after
  // requesting what depends on no kernel (norm weights, router rows into L2, positions and block
  // tables). Same results bit for bit. Off: inside a CUDA graph the gap between two dependent
  // kernels is already 0.25-0.5 us (H200 CUPTI trace), and the chain's early-resident CTAs cost
  // more than that at batch 1 (8-layer steps 1.73-1.75 against 1.71-1.73 ms at 4K, 1.70-1.72
  // against 1.64 ms at 1K); it gained 1.5 % at batch 32.
  bool pdl_chain = false;
  // With `pdl`: the fused router launched as a programmatic dependent of the norm even without
  // pdl_chain (its CTAs take their SMs and fetch their weight rows into L2 while the norm runs;
  // same results). H200, 8-layer steps, three rounds off / on: batch 1 1K 1.591 / 1.580,
  // 1.586 / 1.579, 1.601 / 1.581 ms; 4K 1.662 / 1.647, 1.652 / 1.650, 1.666 / 1.645; batch 8
  // 4K 3.047 / 3.024, 3.027 / 3.029, 3.044 / 3.036.
  bool pdl_router = true;
  // With `pdl`: the indexer's scoring launched as a programmatic dependent of the attention
  // inputs even without pdl_chain, loading the index keys of earlier positions before its wait
  // (IndexerDecodeParams::keys_before_wait: decode rows are one per sequence, so those keys were
  // written in earlier steps); the attention inputs let it start only after their own wait, so
  // its CTAs never sit beside the q/k/v GEMV. Same results bit for bit. H200, 8-layer steps,
  // on / off in one call, three rounds: batch 1 4K 1.650 /
  // 1.653 / 1.650 against 1.676 / 1.663 / 1.677 ms, 32K 1.675 / 1.674 / 1.677 against 1.695 /
  // 1.680 / 1.694; batch 8 level. The split
  // attention as a programmatic dependent too was slower (32K 1.75-1.80 against 1.72-1.76 ms):
  // its wait ends later than a graph edge would start it, and its few loads gain nothing.
  bool pdl_indexer = true;
  // The tensor-core decode attention's 16 split CTAs of a KV group as one thread-block cluster
  // that merges its partial states in distributed shared memory (SparseDecodeParams::
  // cluster_combine): no combine launch. Same results bit for bit. H200, 8-layer steps: batch 1
  // -1.6 / -0.9 / -0.7 % at 1K / 4K / 32K (batch 8 +2.1 %, hence batch 1-2 only).
  bool cluster_attention_combine = true;
  // With the clustered split (cluster_attention_combine, batch 1-2), up to 1024 blocks of
  // context: the cluster also computes the indexer's top-k from its block scores
  // (SparseDecodeParams::block_scores): no top-k launch. Same results bit for bit. H200, 8-layer
  // steps: -0.4 % at 4K, -1.5 % at 32K.
  bool cluster_attention_select = true;
  // With `pdl`: the clustered split attention (batch 1-2) launched as a programmatic dependent
  // of the kernel before it (the indexer's scoring, or the attention inputs); it reads only the
  // positions before its wait. Same results. H200, 8-layer steps, three rounds in one call
  // -0.4 to -1.5 % at 1K / 4K / 32K. (The unclustered split under PDL was slower: its wait ended
  // later than a graph edge started it.)
  bool pdl_cluster_attention = true;
  // With pdl_cluster_attention and the cluster's own selection: the o_proj GEMV may launch at
  // the split's start, its first weight stages streaming while the indexer's scoring computes
  // (SparseDecodeParams::dependents_at_start). Same results. H200, in-kernel %globaltimer stamps
  // (median over 15 steps): o_proj ends 0.76 us sooner at 4K and at 32K; 8-layer steps, four
  // rounds in one call: -0.3 % at 4K, -0.2 % at 32K, faster in every round at 4K and 8K.
  bool split_dependents_early = true;
  // With `pdl`: the routed experts' down product (variant 5) launched as a programmatic
  // dependent of their gate|up, its CTAs reading the routing and requesting their first stages
  // of weights before they wait (QuantGemvParams::weights_before_wait), so that its stream
  // starts in the gate|up kernel's tail instead of one HBM round trip after it ends. Same
  // results bit for bit. H200, 8-layer steps off / on in one call: batch 1 1K 1.582 / 1.570,
  // 1.579 / 1.568 ms; 4K 1.643 / 1.628, 1.642 / 1.637; batch 8 2.872 / 2.848, 2.868 / 2.854.
  bool expert_down_early = true;
  // Decode at one row, variant 5: the router writes the top-k without the grouping
  // (MoeRouteParams::topk_only) and the routed experts' CTAs read their slot's expert from the
  // top-k ids (QuantGemvParams::token_topk_ids: one word instead of the grouping's two dependent
  // reads). Bitwise the same results (a one-token grouping is the sorted top-k). H200, with
  // pdl_norms (both changes against neither): 8-layer steps, six rounds in one call, batch 1 4K
  // 1.531 -> 1.507 ms, 32K 1.546 -> 1.521; 60 layers (from the 24-layer model, three rounds)
  // 7.48-7.51 -> 7.18-7.22 ms at 4K, 7.62-7.63 -> 7.29-7.34 at 32K (docs/performance.md).
  bool route_in_experts = true;
  // With `pdl`, decode norms launched as programmatic dependents of the kernel before them: bit 1
  // the post-attention norm (after o_proj), bit 2 the input norm (after the MoE / MLP down; its
  // edge from the shared expert's stream stays a plain one). The norm waits before it reads;
  // its own dependents (the router, the q/k/v GEMV) then launch under its predecessor's tail.
  // Same results. (Slower while o_proj was not yet one wave of variant 7.) H200, 8-layer steps
  // with route_in_experts, ms at 4K / 32K: neither 1.513 / 1.527, bit 1 1.511 / 1.528 (three
  // rounds), bit 2 1.513 / 1.530, both 1.507 / 1.521 (six rounds; three more in another run:
  // 1.501 / 1.518): each alone level, the two together -0.5 to -0.8 %.
  int pdl_norms = 3;
  // Decode: where the block tables' width is at most index_topk_blocks (contexts up to 2K tokens
  // on M3.1-Flash), the indexer would select every block of every row: its two launches per
  // layer are skipped and the attention reads every block (the same set of keys; bit for bit
  // the attention of the selection 0, 1, ..., top_k - 1). H200, 8-layer steps at 1K context:
  // batch 1 1.64 against 1.70-1.71 ms, batch 8 2.96-3.00 against 3.04-3.05 ms.
  bool skip_indexer_when_every_block_fits = true;
  // Decode GEMV variant for the MXFP8 / NVFP4 linears: 5 (tensor cores, epilogue fused, f16
  // inputs written by the norms; quant_gemv_mma.cuh) or 3 (split-K + epilogue launch).
  int decode_gemv_variant = 5;
  // With decode_gemv_variant >= 5: the MXFP8 dense matrices (qkv, o_proj, the dense MLP and the
  // shared expert) are repacked at load into the mma layout (quant/mxfp8_mma_layout.h, 2-KB
  // contiguous runs per 16-row tile) and every decode GEMV of them runs variant 7 (weights fed
  // to the tensor cores from registers; gemv_mma_direct.cu). H200, one row: qkv 19.1 against
  // 22.5 us (variant 3), o_proj 17.1-18.5 against 20.7, the shared expert's gate|up 14.3 and down
  // 9.6 against 17.7 and 11.1 (variant 5). Prefill dequantises
  // either layout.
  bool mxfp8_mma_layout = true;
  // Decode norms of up to this many rows spread each row over a cluster of 8 CTAs
  // (AddRmsNormParams::cluster_rows); 0: one CTA per row. H200, 8-layer steps, two rounds:
  // batch 1 1K 1.592 / 1.592 against 1.603 / 1.597 ms, 4K 1.663 / 1.662 against 1.670 / 1.667.
  int64_t norm_cluster_rows = 16;
  // Decode attention on the tensor cores (SparseDecodeParams::mma: one CTA per selected block)
  // instead of float32 FMAs (with key splits below batch 8). H200, graph-timed split + combine
  // at batch 1: 6.5-6.9 against 8.8-9.0 us.
  bool mma_decode_attention = true;
  int device = 0;
  int prefill_attention_variant = 1;  // PrefillAttentionParams::variant (sparse_prefill.h)
  int prefill_indexer_variant = 1;    // PrefillAttentionParams::indexer_variant
  // --load-format dummy: ignore the WeightSource's values and generate random weights in the
  // storage formats on the GPU (gpu_weights.h, make_dummy_dev_weights) from dummy_seed.
  bool gpu_dummy_weights = false;
  uint64_t dummy_seed = 0;
};

struct CudaM3Stats {
  int64_t decode_steps = 0, general_steps = 0;
  int64_t graph_captures = 0, graph_replays = 0;
  // Steps whose one-token rows attended every block without the indexer
  // (skip_indexer_when_every_block_fits).
  int64_t indexer_skipped_steps = 0;
  double graph_launch_us = 0;      // host time inside cudaGraphLaunch, summed over the replays
  int64_t bf16_fallbacks = 0;      // fused matrices stored BF16 although quantised on disk
  int64_t quantised_matrices = 0;  // fused matrices kept MXFP8 / NVFP4
  int64_t weight_bytes = 0, kv_bytes = 0, buffer_bytes = 0;  // device memory at load
};

class CudaM3Model {
 public:
  static Result<std::unique_ptr<CudaM3Model>> load(const MiniMaxM3Config& cfg,
                                                   const WeightSource& src,
                                                   const CudaM3Options& options);
  ~CudaM3Model();
  CudaM3Model(const CudaM3Model&) = delete;
  CudaM3Model& operator=(const CudaM3Model&) = delete;

  // Bytes of one KV page over all layers (bf16 K, V and index keys).
  static int64_t kv_bytes_per_page(const MiniMaxM3Config& cfg);

  const MiniMaxM3Config& config() const;
  int64_t num_kv_pages() const;
  int64_t page_size() const { return 128; }
  CudaM3Stats stats() const;

  // Model::forward semantics (the KV cache is the model's own). Errors in the inputs are
  // invalid_argument before anything runs.
  Status forward(std::span<const SequenceInput> batch, ForwardOutput* out);

  struct Impl;

 private:
  CudaM3Model() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace m3::minimax_m3
