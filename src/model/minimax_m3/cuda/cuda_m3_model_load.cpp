// CudaM3Model::load and what it sets up: the weights' repacking into the GEMV layouts, the decode
// buffers, and the KV pool (sized by a profile step when asked).
#include "model/minimax_m3/cuda/cuda_m3_model_impl.h"

namespace m3::minimax_m3 {

// The MXFP8 dense matrices into the mma layout of kMmaDirect (quant/mxfp8_mma_layout.h: 2-KB
// contiguous runs per 16-row tile, which kMmaDirect reads at 85-98 % of a plain read): qkv,
// o_proj and the downs in tiles of 16 rows, the gate|up matrices in gate/up row pairs (read with
// the SwiGLU epilogue). Routed experts (grouped) and the router stay as they are.
Status CudaM3Model::Impl::repack_mxfp8() {
  auto repack = [&](DevMatrix& m, mxfp8_mma::Tiling t) -> Status {
    if (m.format != QuantFormat::kMxfp8 || m.groups != 1 || m.layout != WeightLayout::kRowMajor ||
        !mxfp8_mma::fits(m.n, m.k, t))
      return Status::ok();
    M3_RETURN_IF_ERROR(cuda::mxfp8_mma_repack_in_place(m.w, 1, m.n, m.k, t, st()));
    m.layout = static_cast<WeightLayout>(t);
    return Status::ok();
  };
  for (DevLayer& L : w.layers) {
    for (DevMatrix* m : {&L.qkv, &L.o, &L.mlp_down, &L.shared_down})
      M3_RETURN_IF_ERROR(repack(*m, mxfp8_mma::Tiling::kRows16));
    for (DevMatrix* m : {&L.mlp_gu, &L.shared_gu})
      M3_RETURN_IF_ERROR(repack(*m, mxfp8_mma::Tiling::kSwigluPairs));
  }
  return Status::ok();
}

// NVFP4 matrices, whose decode GEMV always runs kMmaRing, go into the mma layout (2x fewer
// dequantisation instructions; quant/nvfp4_mma_layout.h). A gate|up / down pair only when both
// are NVFP4 (then the SwiGLU output is always f16 and the down GEMV is kMmaRing too); qkv and
// o_proj always read f16 inputs. Prefill dequantises either layout.
Status CudaM3Model::Impl::repack_nvfp4() {
  auto fits = [](const DevMatrix& m, nvfp4_mma::Tiling t) {
    return m.format == QuantFormat::kNvfp4 && m.n > 0 && nvfp4_mma::fits(m.n, m.k, t);
  };
  auto repack = [&](DevMatrix& m, nvfp4_mma::Tiling t) -> Status {
    M3_RETURN_IF_ERROR(cuda::nvfp4_mma_repack_in_place(m.w, m.groups, m.n, m.k, t, st()));
    m.layout = static_cast<WeightLayout>(t);
    return Status::ok();
  };
  auto pair = [&](DevMatrix& gu, DevMatrix& down) -> Status {
    if (fits(gu, nvfp4_mma::Tiling::kSwigluPairs) && fits(down, nvfp4_mma::Tiling::kRows16)) {
      M3_RETURN_IF_ERROR(repack(gu, nvfp4_mma::Tiling::kSwigluPairs));
      M3_RETURN_IF_ERROR(repack(down, nvfp4_mma::Tiling::kRows16));
    }
    return Status::ok();
  };
  for (DevLayer& L : w.layers) {
    for (DevMatrix* m : {&L.qkv, &L.o})
      if (fits(*m, nvfp4_mma::Tiling::kRows16)) M3_RETURN_IF_ERROR(repack(*m, nvfp4_mma::Tiling::kRows16));
    M3_RETURN_IF_ERROR(pair(L.mlp_gu, L.mlp_down));
    M3_RETURN_IF_ERROR(pair(L.shared_gu, L.shared_down));
    M3_RETURN_IF_ERROR(pair(L.experts_gu, L.experts_down));
  }
  return Status::ok();
}

Status CudaM3Model::Impl::alloc_decode_buffers() {
  const int64_t r = dec_rows, mb = dec_mb_cap;
  Bufs& b = dec;
  cuda::DeviceArena& a = arena;
  const std::string what = "decode buffers";
  M3_ASSIGN_OR_RETURN(b.ids, a.alloc<int32_t>(r, what));
  M3_ASSIGN_OR_RETURN(b.positions, a.alloc<int32_t>(r, what));
  M3_ASSIGN_OR_RETURN(b.tables, a.alloc<int32_t>(r * mb, what));
  M3_ASSIGN_OR_RETURN(b.residual, a.alloc<float>(r * hd, what));
  M3_ASSIGN_OR_RETURN(b.delta, a.alloc<float>(r * hd, what));
  M3_ASSIGN_OR_RETURN(b.h, a.alloc<uint16_t>(r * hd, what));
  M3_ASSIGN_OR_RETURN(b.qkv, a.alloc<float>(r * nqkv, what));
  M3_ASSIGN_OR_RETURN(b.q, a.alloc<uint16_t>(r * nh * d, what));
  M3_ASSIGN_OR_RETURN(b.iq, a.alloc<uint16_t>(r * hix * dix, what));
  M3_ASSIGN_OR_RETURN(b.attn, a.alloc<uint16_t>(r * nh * d, what));
  if (opt.kv_cache_dtype != KvCacheDtype::kBF16) {
    M3_ASSIGN_OR_RETURN(b.kv_k_rows, a.alloc<uint16_t>(r * hkv * d, what));
    M3_ASSIGN_OR_RETURN(b.kv_v_rows, a.alloc<uint16_t>(r * hkv * d, what));
    M3_ASSIGN_OR_RETURN(b.kv_ik_rows, a.alloc<uint16_t>(r * dix, what));
  }
  M3_ASSIGN_OR_RETURN(b.router_logits, a.alloc<float>(r * ne, what));
  M3_ASSIGN_OR_RETURN(b.topk_ids, a.alloc<int32_t>(r * kk, what));
  M3_ASSIGN_OR_RETURN(b.topk_w, a.alloc<float>(r * kk, what));
  M3_ASSIGN_OR_RETURN(b.offs, a.alloc<int32_t>(ne + 1, what));
  M3_ASSIGN_OR_RETURN(b.sorted, a.alloc<int32_t>(r * kk, what));
  M3_ASSIGN_OR_RETURN(b.active, a.alloc<int32_t>(ne, what));
  M3_ASSIGN_OR_RETURN(b.route_counter, a.alloc<uint32_t>(1, what));
  M3_ASSIGN_OR_RETURN(b.sample_rows, a.alloc<cuda::SampleRowParams>(r, what));
  M3_ASSIGN_OR_RETURN(b.sampled, a.alloc<int32_t>(r, what));
  M3_ASSIGN_OR_RETURN(b.greedy_value, a.alloc<float>(r * cuda::kSampleGreedySplits, what));
  M3_ASSIGN_OR_RETURN(b.greedy_index, a.alloc<int32_t>(r * cuda::kSampleGreedySplits, what));
  M3_ASSIGN_OR_RETURN(b.greedy_tickets, a.alloc<uint32_t>(r, what));
  M3_RETURN_IF_ERROR(cuda::fill_zero(b.greedy_tickets, static_cast<size_t>(r) * 4));
  {
    const cuda::SampleMultiCtaSizes z = cuda::sample_multi_cta_workspace(r, vocab);
    cuda::SampleMultiCtaWorkspace& m = b.sample_multi;
    M3_ASSIGN_OR_RETURN(m.cand_z, a.alloc<float>(z.candidates, what));
    M3_ASSIGN_OR_RETURN(m.cand_id, a.alloc<int32_t>(z.candidates, what));
    M3_ASSIGN_OR_RETURN(m.slice_max, a.alloc<float>(z.slices, what));
    M3_ASSIGN_OR_RETURN(m.slice_arg, a.alloc<int32_t>(z.slices, what));
    M3_ASSIGN_OR_RETURN(m.slice_cut, a.alloc<float>(z.slices, what));
    M3_ASSIGN_OR_RETURN(m.slice_mass, a.alloc<double>(z.slices, what));
    M3_ASSIGN_OR_RETURN(m.tickets, a.alloc<uint32_t>(z.rows, what));
    M3_RETURN_IF_ERROR(cuda::fill_zero(m.tickets, static_cast<size_t>(z.rows) * 4));
    m.max_batch = r;
  }
  M3_RETURN_IF_ERROR(cuda::fill_zero(b.route_counter, sizeof(uint32_t)));
  if (comm != nullptr) {
    M3_ASSIGN_OR_RETURN(agree, a.alloc<int64_t>(1, "KV pool agreement"));
  }
  M3_ASSIGN_OR_RETURN(b.act, a.alloc<uint16_t>(r * kk * inter, what));
  M3_ASSIGN_OR_RETURN(b.act_s, a.alloc<uint16_t>(r * max_mlp, what));
  M3_ASSIGN_OR_RETURN(b.contrib, a.alloc<float>(r * kk * hd, what));
  M3_ASSIGN_OR_RETURN(b.shared, a.alloc<float>(r * hd, what));
  M3_ASSIGN_OR_RETURN(b.block_scores, a.alloc<float>(r * hix * mb, what));
  M3_ASSIGN_OR_RETURN(b.selected, a.alloc<int32_t>(r * hix * top_k, what));
  M3_ASSIGN_OR_RETURN(b.o_part, a.alloc<float>(r * nh * attn_states * d, what));
  M3_ASSIGN_OR_RETURN(b.ml, a.alloc<float>(r * nh * attn_states * 2, what));
  // The logits: the output rank's [r, V]; with ranks every rank's slices' all-gather (Impl::head).
  if (output_rank()) {
    M3_ASSIGN_OR_RETURN(b.logits, a.alloc<float>(r * vocab, what));
  }
  if (comm != nullptr) {
    M3_ASSIGN_OR_RETURN(b.logits_gather, a.alloc<float>(opt.tp.ranks * r * head_width, what));
  }
  M3_ASSIGN_OR_RETURN(b.h16, a.alloc<uint16_t>(r * hd, what));
  M3_ASSIGN_OR_RETURN(b.h_inv, a.alloc<float>(r, what));
  M3_ASSIGN_OR_RETURN(b.attn16, a.alloc<uint16_t>(r * nh * d, what));
  M3_ASSIGN_OR_RETURN(b.attn_inv, a.alloc<float>(r, what));
  M3_ASSIGN_OR_RETURN(b.act16, a.alloc<uint16_t>(r * kk * inter, what));
  M3_ASSIGN_OR_RETURN(b.act_s16, a.alloc<uint16_t>(r * max_mlp, what));
  // Split-K scratch: the largest GEMV of a step.
  int64_t need = 0;
  auto fit = [&](const DevMatrix& m, int64_t rows) {
    if (m.n > 0)
      need = std::max(need, cuda::quant_gemv_num_slices(m.format, m.k) * rows * m.n);
  };
  for (const DevLayer& L : w.layers) {
    fit(L.qkv, r);
    fit(L.o, r);
    fit(L.mlp_gu, r);
    fit(L.mlp_down, r);
    fit(L.experts_gu, r * kk);
    fit(L.experts_down, r * kk);
    fit(L.shared_gu, r);
    fit(L.shared_down, r);
  }
  fit(head_slice(), 1);  // from two rows the head is a GEMM (Impl::head)
  b.partial_elems = need;
  M3_ASSIGN_OR_RETURN(b.partial, a.alloc<float>(need, what + " (GEMV split-K scratch)"));
  need = 0;
  for (const DevLayer& L : w.layers) {
    fit(L.shared_gu, r);
    fit(L.shared_down, r);
  }
  b.partial_side_elems = need;
  M3_ASSIGN_OR_RETURN(b.partial_side,
                      a.alloc<float>(std::max<int64_t>(need, 1), what + " (side split-K scratch)"));
  return Status::ok();
}

// Per layer K, V [P, 128, Hkv, D] and, on sparse layers, index keys [P, 128, Dix], zeroed (a
// full_attention layer's view has no index keys: attention_inputs writes none there), in
// opt.kv_cache_dtype. A quantised pool also gets `kv_stage`: one layer's pages in bf16, where a
// prefill chunk's pages are dequantised for the prefill kernels (launch_kv_dequantise_pages).
Status CudaM3Model::Impl::alloc_kv(cuda::DeviceArena& a, int64_t pages) {
  const KvCacheDtype dt = opt.kv_cache_dtype;
  kv.clear();
  kv_stage = cuda::KvCacheView{};
  auto shape = [&](cuda::KvCacheView& v) {
    v.num_pages = pages;
    v.page_size = kPage;
    v.num_kv_heads = hkv;
    v.head_dim = d;
    v.index_head_dim = dix;
  };
  auto quant_store = [&](KvQuantStore& q, int64_t heads, int64_t dim,
                         const std::string& what) -> Status {
    const int64_t rows = pages * kPage * heads;
    M3_ASSIGN_OR_RETURN(q.codes, a.alloc<uint8_t>(rows * kv_row_code_bytes(dt, dim), what));
    M3_ASSIGN_OR_RETURN(q.page_scales, a.alloc<float>(pages * heads, what));
    if (kv_row_block_scale_bytes(dt, dim) > 0) {
      M3_ASSIGN_OR_RETURN(q.block_scales,
                          a.alloc<uint8_t>(rows * kv_row_block_scale_bytes(dt, dim), what));
    }
    return Status::ok();
  };
  bool any_sparse = false;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    cuda::KvCacheView v;
    v.dtype = dt;
    const std::string what = "KV cache of layer " + std::to_string(l);
    const bool sparse = cfg.is_sparse_layer(l);
    any_sparse |= sparse;
    if (dt == KvCacheDtype::kBF16) {
      M3_ASSIGN_OR_RETURN(v.k, a.alloc<uint16_t>(pages * kPage * hkv * d, what));
      M3_ASSIGN_OR_RETURN(v.v, a.alloc<uint16_t>(pages * kPage * hkv * d, what));
      if (sparse) {
        M3_ASSIGN_OR_RETURN(v.idx_k, a.alloc<uint16_t>(pages * kPage * dix, what));
      }
    } else {
      M3_RETURN_IF_ERROR(quant_store(v.kq, hkv, d, what));
      M3_RETURN_IF_ERROR(quant_store(v.vq, hkv, d, what));
      if (sparse) M3_RETURN_IF_ERROR(quant_store(v.iq, 1, dix, what));
    }
    shape(v);
    kv.push_back(v);
  }
  if (dt != KvCacheDtype::kBF16) {
    const std::string what = "bf16 staging of the quantised KV cache";
    M3_ASSIGN_OR_RETURN(kv_stage.k, a.alloc<uint16_t>(pages * kPage * hkv * d, what));
    M3_ASSIGN_OR_RETURN(kv_stage.v, a.alloc<uint16_t>(pages * kPage * hkv * d, what));
    if (any_sparse) {
      M3_ASSIGN_OR_RETURN(kv_stage.idx_k, a.alloc<uint16_t>(pages * kPage * dix, what));
    }
    shape(kv_stage);
  }
  return Status::ok();
}

// The profile step: one prefill chunk of profile_tokens tokens on temporary pages (their own
// arena, freed before the real pool is made), so the step allocator grows to the chunk's peak
// and cuBLASLt and the kernels' modules are loaded, as in serving. What the device then has in use
// besides the weights and the temporary pages is the working memory that the pool must leave room
// for. The step allocator keeps its cached blocks: serving reuses them.
Status CudaM3Model::profile_and_size_kv() {
  Impl& im = *impl_;
  const int64_t tokens = im.opt.profile_tokens;
  // Under --dp the step's tokens are split over the groups, one slice each (the scheduler splits
  // the chunked-prefill budget so): every rank runs the feed-forward blocks on all of them and
  // attention on its group's share, over that many pages of its own pool.
  const int64_t per_group = (tokens + im.dp - 1) / im.dp;
  const int64_t temp_pages = (per_group + kPage - 1) / kPage;
  int64_t temp_bytes = 0;
  {
    cuda::DeviceArena temp;
    M3_RETURN_IF_ERROR(im.alloc_kv(temp, temp_pages));
    temp_bytes = temp.bytes();
    im.opt.num_kv_pages = temp_pages;
    std::vector<int32_t> ids(static_cast<size_t>(per_group), 0),
        table(static_cast<size_t>(temp_pages));
    for (int64_t p = 0; p < temp_pages; ++p) table[static_cast<size_t>(p)] = static_cast<int32_t>(p);
    std::vector<SequenceInput> in(static_cast<size_t>(im.dp));
    for (int g = 0; g < im.dp; ++g) {
      SequenceInput& s = in[static_cast<size_t>(g)];
      s.tokens = ids;
      s.block_table = table;
      s.logits_rows = {static_cast<int32_t>(per_group - 1)};
      s.dp_group = g;
    }
    ForwardOutput out;
    const Status run = forward(in, &out);
    im.kv.clear();
    im.kv_stage = cuda::KvCacheView{};
    im.opt.num_kv_pages = 0;
    if (!run.is_ok()) {
      return Status(run.code(), "[model.minimax_m3.cuda] the profile step of " +
                                    std::to_string(tokens) + " tokens failed: " + run.message());
    }
    M3_RETURN_IF_ERROR(cuda::synchronize_device());
    M3_ASSIGN_OR_RETURN(cuda::DeviceMemoryInfo mem, cuda::device_memory_info());
    CudaMemoryProfile& p = im.stats.profile;
    p.total_bytes = mem.total_bytes;
    p.weight_bytes = im.stats.weight_bytes;
    p.free_bytes = mem.free_bytes + temp_bytes;
    p.working_bytes = std::max<int64_t>(0, mem.total_bytes - p.free_bytes - p.weight_bytes);
    p.profile_tokens = tokens;
  }  // the temporary pages are freed here
  M3_ASSIGN_OR_RETURN(int64_t pages, im.opt.kv_pages_after_profile(im.stats.profile));
  if (im.tp()) {
    // Every rank holds the same pages (the scheduler's page ids index each rank's share of
    // them; under --dp every group's pool has as many): the smallest pool any rank's memory
    // allows, as the maximum of the negated counts.
    const int64_t negated = -pages;
    M3_RETURN_IF_ERROR(cuda::copy_to_device_async(im.agree, &negated, sizeof(negated), im.st()));
    M3_RETURN_IF_ERROR(im.comm->all_reduce(im.agree, 1, comm::DataType::kI64, comm::ReduceOp::kMax));
    int64_t agreed = 0;
    M3_RETURN_IF_ERROR(cuda::copy_to_host_async(&agreed, im.agree, sizeof(agreed), im.st()));
    M3_RETURN_IF_ERROR(im.finish_step());
    pages = -agreed;
  }
  if (pages <= 0 || pages > (int64_t{1} << 30))
    return invalid_argument("[model.minimax_m3.cuda] the KV pool planned after the profile step "
                            "has " + std::to_string(pages) + " pages, outside [1, 2^30]");
  const int64_t before = im.arena.bytes();
  M3_RETURN_IF_ERROR(im.alloc_kv(im.arena, pages));
  im.stats.kv_bytes = im.arena.bytes() - before;
  im.opt.num_kv_pages = pages;
  return Status::ok();
}

int64_t CudaM3Model::kv_bytes_per_page(const MiniMaxM3Config& c, int tp_ranks, int ep,
                                       KvCacheDtype dtype, int dp) {
  const MiniMaxM3Config& rc =
      tp_ranks <= 1 || !check_tensor_parallel(c, tp_ranks, ep, dp).is_ok()
          ? c
          : rank_config(c, 0, tp_ranks, ep, dp);
  return real_shape_kv_pool_bytes_per_page(rc, dtype);
}

Result<std::unique_ptr<CudaM3Model>> CudaM3Model::load(const MiniMaxM3Config& whole,
                                                       const WeightSource& src,
                                                       const CudaM3Options& options) {
  const CudaTensorParallel& tp = options.tp;
  if (tp.ranks < 1 || tp.rank < 0 || tp.rank >= tp.ranks)
    return invalid_argument("[model.minimax_m3.cuda] tensor-parallel rank " +
                            std::to_string(tp.rank) + " of " + std::to_string(tp.ranks));
  if (tp.ranks > 1 && !tp.make_communicator)
    return invalid_argument("[model.minimax_m3.cuda] --tp " + std::to_string(tp.ranks) +
                            " needs a communicator");
  if (tp.ep < 1 || tp.ranks % tp.ep != 0)
    return invalid_argument("[model.minimax_m3.cuda] --ep " + std::to_string(tp.ep) +
                            " must divide --tp " + std::to_string(tp.ranks));
  if (tp.dp < 1 || tp.ranks % tp.dp != 0)
    return invalid_argument("[model.minimax_m3.cuda] --dp " + std::to_string(tp.dp) +
                            " must divide --tp " + std::to_string(tp.ranks));
  M3_RETURN_IF_ERROR(check_tensor_parallel(whole, tp.ranks, tp.ep, tp.dp));
  // The rank's shapes: the kernels' limits apply to them (16 query heads per KV head, for one).
  // Under --dp the heads are the rank's share of its attention group's.
  const MiniMaxM3Config cfg = rank_config(whole, tp.rank, tp.ranks, tp.ep, tp.dp);
  const RankSlices slices = rank_slices(whole, tp.rank, tp.ranks, tp.ep, tp.dp);
  M3_RETURN_IF_ERROR(check_real_shape_fit(cfg));
  const bool profile = options.num_kv_pages == 0 && options.kv_pages_after_profile;
  if (!profile && (options.num_kv_pages <= 0 || options.num_kv_pages > (int64_t{1} << 30)))
    return invalid_argument("[model.minimax_m3.cuda] num_kv_pages " +
                            std::to_string(options.num_kv_pages) + " outside [1, 2^30]");
  if (profile && options.profile_tokens < 1)
    return invalid_argument("[model.minimax_m3.cuda] profile_tokens " +
                            std::to_string(options.profile_tokens) + " < 1");
  if (options.max_batch < 1 || options.max_batch > 4096)
    return invalid_argument("[model.minimax_m3.cuda] max_batch " +
                            std::to_string(options.max_batch) + " outside [1, 4096]");
  if (options.tuning.cluster_norm_max_rows < 0)
    return invalid_argument("[model.minimax_m3.cuda] tuning.cluster_norm_max_rows " +
                            std::to_string(options.tuning.cluster_norm_max_rows) + " is negative");
  if (options.tuning.fused_router_max_rows < 0 || options.tuning.fused_router_max_rows > 256)
    return invalid_argument("[model.minimax_m3.cuda] tuning.fused_router_max_rows " +
                            std::to_string(options.tuning.fused_router_max_rows) +
                            " outside [0, 256] (the fused router's limit)");
  M3_ASSIGN_OR_RETURN(cuda::DeviceInfo info, cuda::select_device(options.device));
  (void)info;
  std::unique_ptr<CudaM3Model> m(new CudaM3Model());
  m->impl_ = std::make_unique<Impl>();
  Impl& im = *m->impl_;
  im.cfg = cfg;
  im.opt = options;
  const MiniMaxM3Config& c = cfg;
  im.hd = c.hidden_size;
  im.nh = c.num_attention_heads;
  im.hkv = c.num_key_value_heads;
  im.d = c.head_dim;
  im.hix = c.index_n_heads;
  im.dix = c.index_head_dim;
  im.vocab = c.vocab_size;
  im.off_k = im.nh * im.d;
  im.off_v = im.off_k + im.hkv * im.d;
  im.off_iq = im.off_v + im.hkv * im.d;
  im.off_ik = im.off_iq + im.hix * im.dix;
  im.nqkv = im.off_ik + im.dix;
  im.ne = c.num_local_experts;
  im.expert_base = slices.expert_begin;
  im.local_experts = slices.expert_count;
  im.kk = c.num_experts_per_tok;
  im.inter = c.intermediate_size;
  im.dense_inter = c.dense_intermediate_size;
  im.shared_inter = c.shared_intermediate_size * c.n_shared_experts;
  im.max_mlp = std::max<int64_t>({im.dense_inter, im.shared_inter, 1});
  im.top_k = c.index_topk_blocks;
  im.attn_states = std::max<int64_t>(1, im.top_k * kKeySplits);
  im.eps = static_cast<float>(c.rms_norm_eps);
  im.alpha = static_cast<float>(c.swiglu_alpha);
  im.limit = static_cast<float>(c.swiglu_limit);
  im.scale = 1.0f / std::sqrt(static_cast<float>(im.d));
  im.routed_scale = static_cast<float>(c.routed_scaling_factor);
  im.dp = tp.dp;
  im.dp_group = tp.rank / (tp.ranks / tp.dp);

  // The main stream at the device's greatest priority and the side stream (the shared expert) at
  // its least, so that the block scheduler places the critical path's CTAs (router, routed
  // experts) first; graphs keep the priorities per kernel node.
  int greatest = 0, least = 0;
  cuda::Stream::priority_range(&greatest, &least);
  M3_ASSIGN_OR_RETURN(im.stream, cuda::Stream::create(greatest));
  M3_ASSIGN_OR_RETURN(im.side, cuda::Stream::create(least));
  M3_ASSIGN_OR_RETURN(im.fork_ev, cuda::Event::create());
  M3_ASSIGN_OR_RETURN(im.join_ev, cuda::Event::create());
  if (tp.ranks > 1) {
    M3_ASSIGN_OR_RETURN(im.comm, tp.make_communicator(im.st()));
    if (im.comm == nullptr || im.comm->rank() != tp.rank || im.comm->size() != tp.ranks)
      return invalid_argument("[model.minimax_m3.cuda] the communicator is not rank " +
                              std::to_string(tp.rank) + " of " + std::to_string(tp.ranks));
  }
  im.alloc = std::make_unique<cuda::CachingAllocator>();
  M3_ASSIGN_OR_RETURN(im.gemm, cuda::PrefillGemm::create(im.alloc.get()));
  // The vocabulary this rank looks up and computes logits of, and the rows it holds.
  im.vocab_begin = slices.vocab_begin;
  im.vocab_count = slices.vocab_count;
  im.head_width = vocab_slice(im.vocab, 0, tp.ranks).count;
  RankSlices held = slices;
  if (tp.rank == 0 && tp.whole_vocab_on_rank0) {
    held.vocab_begin = 0;
    held.vocab_count = im.vocab;
  }
  if (options.gpu_dummy_weights) {
    M3_ASSIGN_OR_RETURN(im.w, make_dummy_dev_weights(cfg, options.dummy_seed, &im.arena,
                                                     slices.expert_count, held.vocab_begin,
                                                     held.vocab_count));
  } else {
    M3_ASSIGN_OR_RETURN(im.w, load_dev_weights(whole, src, held, &im.arena));
  }
  // The uploads run on the legacy stream; the repack below reads them on im.stream.
  M3_RETURN_IF_ERROR(cuda::synchronize_device());
  M3_RETURN_IF_ERROR(im.repack_nvfp4());
  M3_RETURN_IF_ERROR(im.repack_mxfp8());
  im.stats.weight_bytes = im.arena.bytes();
  im.stats.bf16_fallbacks = im.w.bf16_fallbacks;
  im.stats.quantised_matrices = im.w.quantised_matrices;

  if (!profile) {
    M3_RETURN_IF_ERROR(im.alloc_kv(im.arena, options.num_kv_pages));
    im.stats.kv_bytes = im.arena.bytes() - im.stats.weight_bytes;
  }
  // Decode buffers: max_batch rows; block tables up to the cache size (at most 1M tokens). Before
  // a profile step the size of the pool is not known yet: its widest table.
  im.dec_rows = options.max_batch;
  im.dec_mb_cap = std::clamp<int64_t>(profile ? kMaxTablePages : options.num_kv_pages, 1,
                                      kMaxTablePages);
  const int64_t before_buffers = im.arena.bytes();
  M3_RETURN_IF_ERROR(im.alloc_decode_buffers());
  im.stats.buffer_bytes = im.arena.bytes() - before_buffers;
  if (profile) {
    M3_RETURN_IF_ERROR(m->profile_and_size_kv());
  }
  // The uploads (cudaMemcpy from pageable memory, cudaMemset) run on the legacy stream, which a
  // non-blocking stream does not wait for: finish them before the first step.
  M3_RETURN_IF_ERROR(cuda::synchronize_device());
  return m;
}

}  // namespace m3::minimax_m3
