#include "model/minimax_m3/cuda/cuda_m3_model_impl.h"

namespace m3::minimax_m3 {

CudaM3Model::~CudaM3Model() = default;

const DevWeights& CudaM3Model::dev_weights() const { return impl_->w; }
CUstream_st* CudaM3Model::stream() const { return impl_->st(); }
int CudaM3Model::device() const { return impl_->opt.device; }

std::vector<std::pair<void*, int64_t>> CudaM3Model::kv_page_runs(int64_t page) const {
  std::vector<std::pair<void*, int64_t>> runs;
  // [pages, page_size, heads, dim]: a page is one contiguous run of each tensor (and of its
  // scales, [pages, heads] and [pages, page_size, heads, dim / 16]).
  auto tensor = [&](const cuda::KvCacheView& v, uint16_t* bf16, const KvQuantStore& q,
                    int64_t heads, int64_t dim) {
    const int64_t elems = v.page_size * heads * dim;
    if (!v.quantised()) {
      runs.emplace_back(bf16 + page * elems, elems * 2);
      return;
    }
    const int64_t rows = v.page_size * heads;
    const int64_t code = kv_row_code_bytes(v.dtype, dim);
    const int64_t bs = kv_row_block_scale_bytes(v.dtype, dim);
    runs.emplace_back(q.codes + page * rows * code, rows * code);
    if (bs > 0) runs.emplace_back(q.block_scales + page * rows * bs, rows * bs);
    runs.emplace_back(q.page_scales + page * heads, heads * 4);
  };
  for (const cuda::KvCacheView& v : impl_->kv) {
    tensor(v, v.k, v.kq, v.num_kv_heads, v.head_dim);
    tensor(v, v.v, v.vq, v.num_kv_heads, v.head_dim);
    if (v.has_index_keys()) tensor(v, v.idx_k, v.iq, 1, v.index_head_dim);
  }
  return runs;
}

const MiniMaxM3Config& CudaM3Model::config() const {
  return impl_->cfg;
}
int64_t CudaM3Model::num_kv_pages() const {
  return impl_->opt.num_kv_pages;
}
CudaM3Stats CudaM3Model::stats() const {
  return impl_->stats;
}

Status CudaM3Model::forward(std::span<const SequenceInput> batch, ForwardOutput* out,
                            std::span<const int32_t> capture_layers) {
  Impl& im = *impl_;
  const int64_t pages = im.opt.num_kv_pages;
  if (batch.empty()) return invalid_argument("[model.minimax_m3.cuda.forward] empty batch");
  for (int32_t l : capture_layers)
    if (l < 0 || l >= im.cfg.num_hidden_layers)
      return invalid_argument("[model.minimax_m3.cuda.forward] capture layer " + std::to_string(l) +
                              " is not a decoder layer (0.." +
                              std::to_string(im.cfg.num_hidden_layers - 1) + ")");
  // The engine calls from its own thread; the current device is per thread.
  M3_RETURN_IF_ERROR(cuda::set_current_device(im.opt.device));
  // ---- Validate (the messages of Model::forward), then lay out the rows (step_rows.h): one-token
  // rows first, under --dp group by group. Every rank validates every slice, so a bad one fails
  // all ranks before the first collective.
  int64_t t_all = 0, n_dec = 0, mb = 1;
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceInput& in = batch[s];
    const std::string who = "[model.minimax_m3.cuda.forward] sequence " + std::to_string(s) + ": ";
    if (in.tokens.empty()) return invalid_argument(who + "no tokens");
    if (in.dp_group < 0 || in.dp_group >= im.dp)
      return invalid_argument(who + "dp_group " + std::to_string(in.dp_group) + " outside [0, " +
                              std::to_string(im.dp) + ") (--dp " + std::to_string(im.dp) + ")");
    if (in.start_pos < 0) return invalid_argument(who + "negative start_pos");
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    const int64_t end = in.start_pos + n;
    if (end > INT32_MAX) return invalid_argument(who + "positions beyond int32");
    const int64_t need = (end + kPage - 1) / kPage;
    if (static_cast<int64_t>(in.block_table.size()) < need)
      return invalid_argument(who + "block table has " + std::to_string(in.block_table.size()) +
                              " pages, positions up to " + std::to_string(end - 1) + " need " +
                              std::to_string(need));
    for (int32_t pg : in.block_table)
      if (pg < 0 || pg >= pages)
        return invalid_argument(who + "page id " + std::to_string(pg) + " outside the cache (" +
                                std::to_string(pages) + " pages)");
    for (int32_t id : in.tokens)
      if (id < 0 || id >= im.vocab)
        return invalid_argument(who + "token id " + std::to_string(id) +
                                " outside the vocabulary [0, " + std::to_string(im.vocab) + ")");
    for (int32_t r : in.logits_rows)
      if (r < 0 || r >= static_cast<int32_t>(n))
        return invalid_argument(who + "logits row " + std::to_string(r) + " out of range");
    for (const InputEmbedding& e : in.embeddings) {
      if (e.token_index < 0 || e.token_index >= static_cast<int32_t>(n))
        return invalid_argument(who + "input embedding for token " +
                                std::to_string(e.token_index) + " out of range");
      if (static_cast<int64_t>(e.values.size()) != im.hd)
        return invalid_argument(who + "input embedding of " + std::to_string(e.values.size()) +
                                " values; the hidden size is " + std::to_string(im.hd));
    }
    t_all += n;
    if (n == 1) ++n_dec;
    mb = std::max(mb, need);
  }
  if (t_all > INT32_MAX) return invalid_argument("[model.minimax_m3.cuda.forward] batch too large");

  // Multi-token slices on the decode path: every token is a row with its own position and block
  // table, all rows' K / V / index keys are written before any row attends, and each row attends
  // causally up to its own position with its own indexer top-k, so a slice's rows see each other
  // exactly as in a prefill chunk. A draft's steps (capture_layers set) run their short slices
  // (verify blocks, decode tokens) there; with kernels.small_steps_on_decode_path every step
  // whose rows fit the decode buffers does (prefill chunks beside decode rows, short prompts).
  bool short_slices = true;
  for (const SequenceInput& in : batch)
    short_slices &= static_cast<int64_t>(in.tokens.size()) <= kMaxDecodeSliceRows;
  const bool capturing = !capture_layers.empty();
  const bool slices_ok = im.opt.kernels.small_steps_on_decode_path ||
                         (capturing ? short_slices : n_dec == t_all);
  // The decode path pads each group's rows to the batch bucket of the largest group's (all rows
  // without --dp), within the decode buffers; the general path packs them.
  const StepRows packed = plan_step_rows(batch, im.dp);
  const int64_t stride = decode_group_stride(packed.max_group, im.dp, im.dec_rows);
  const bool decode = slices_ok && stride > 0 && mb <= im.dec_mb_cap;
  const StepRows plan = decode ? plan_step_rows(batch, im.dp, stride) : packed;
  std::vector<Impl::Seq> seqs;
  for (const StepRowSlice& r : plan.slices) {
    const SequenceInput& in = batch[r.index];
    const int64_t need = (in.start_pos + r.tokens + kPage - 1) / kPage;
    seqs.push_back({r.index, r.offset, r.tokens, need, r.group});
  }
  // This rank's attention rows (Impl::att_first): its group's under --dp.
  const size_t g = static_cast<size_t>(im.dp_group);
  im.att_first = im.dp_attention() ? plan.group_first[g] : 0;
  im.att_rows = im.dp_attention() ? (decode ? stride : plan.group_tokens[g]) : plan.rows;
  im.att_decode = im.dp_attention() ? plan.group_decode[g] : n_dec;
  // The step's input embeddings by row, cleared however forward() returns.
  struct InjectScope {
    Impl& im;
    ~InjectScope() { im.inject.clear(); }
  } inject_scope{im};
  for (const Impl::Seq& s : seqs)
    for (const InputEmbedding& e : batch[s.index].embeddings)
      im.inject.emplace_back(s.offset + e.token_index, e.values.data());
  if (decode) {
    out->hidden.clear();
    // Padded to the batch bucket (per group under --dp) and a power-of-two table width (both
    // bounded by the buffers). `span`: the rows up to the last real one (t_all without --dp; under
    // --dp the groups' padding rows lie in between).
    const int64_t rows = plan.rows;
    int64_t span = 0;
    for (const Impl::Seq& s : seqs) span = std::max(span, s.offset + s.n);
    const int64_t width = std::min(next_pow2(mb), im.dec_mb_cap);
    // Rows the caller lets the model sample (SequenceInput::sample): sampled on the GPU after the
    // head (backend/cuda/sampling/sample.h, the CPU sampler's semantics), so only their token ids
    // come back; the logits come back only when some row was not sampled.
    const auto sampled_here = [](const SequenceInput& in) {
      return in.sample.has_value() && in.logits_rows.size() == 1 && in.tokens.size() == 1;
    };
    int64_t n_sample = 0, n_logit_seqs = 0;
    for (const Impl::Seq& s : seqs) {
      n_sample += sampled_here(batch[s.index]) ? 1 : 0;
      n_logit_seqs += batch[s.index].logits_rows.empty() ? 0 : 1;
    }
    const bool copy_logits = n_sample < n_logit_seqs;
    // One staging area: [ids rows][positions rows][tables rows x width] int32, the sampling knobs
    // and sampled tokens of the span rows, then their logits (the padding rows' are never
    // read).
    const size_t in_bytes = static_cast<size_t>(rows * (2 + width)) * 4;
    const size_t knob_bytes = n_sample > 0 ? static_cast<size_t>(span) * sizeof(cuda::SampleRowParams) : 0;
    const size_t token_bytes = static_cast<size_t>((span + 3) / 4 * 4) * 4;  // keeps 16-byte alignment
    const size_t head_bytes = in_bytes + knob_bytes + token_bytes;
    const size_t logit_bytes = copy_logits ? static_cast<size_t>(span * im.vocab) * 4 : 0;
    M3_ASSIGN_OR_RETURN(uint8_t * host, im.host_stage.reserve(head_bytes + logit_bytes, im.st()));
    int32_t* ids = reinterpret_cast<int32_t*>(host);
    int32_t* pos = ids + rows;
    int32_t* tabs = pos + rows;
    std::fill(ids, ids + 2 * rows, 0);
    std::fill(tabs, tabs + rows * width, -1);
    for (const Impl::Seq& s : seqs) {
      const SequenceInput& in = batch[s.index];
      const int64_t nb = std::min<int64_t>(static_cast<int64_t>(in.block_table.size()), width);
      for (int64_t i = 0; i < s.n; ++i) {  // one row per token (s.n == 1 without capture)
        const int64_t r = s.offset + i;
        ids[r] = in.tokens[static_cast<size_t>(i)];
        pos[r] = static_cast<int32_t>(in.start_pos + i);
        std::copy(in.block_table.begin(), in.block_table.begin() + nb, tabs + r * width);
      }
    }
    cudaStream_t st = im.st();
    M3_RETURN_IF_ERROR(cuda::copy_to_device_async(im.dec.ids, ids, rows * 4, st));
    M3_RETURN_IF_ERROR(cuda::copy_to_device_async(im.dec.positions, pos, rows * 4, st));
    M3_RETURN_IF_ERROR(cuda::copy_to_device_async(im.dec.tables, tabs, rows * width * 4, st));
    auto* knobs = reinterpret_cast<cuda::SampleRowParams*>(host + in_bytes);
    auto* tokens = reinterpret_cast<int32_t*>(host + in_bytes + knob_bytes);
    if (n_sample > 0) {
      for (int64_t r = 0; r < span; ++r) knobs[r] = cuda::SampleRowParams{0.0f, 0, 1.0f, 0.0f, 0, 0, 0};
      for (const Impl::Seq& s : seqs) {
        const SequenceInput& in = batch[s.index];
        if (!sampled_here(in)) continue;
        const DeviceSampling& d = *in.sample;
        knobs[s.offset] = cuda::SampleRowParams{d.temperature, d.top_k, d.top_p, d.min_p,
                                                d.rng.seed, d.rng.stream, d.rng.counter};
      }
      M3_RETURN_IF_ERROR(cuda::copy_to_device_async(im.dec.sample_rows, knobs, knob_bytes, st));
    }
    im.dec_capture = -1;
    if (capturing) {
      M3_ASSIGN_OR_RETURN(im.dec_capture, im.decode_capture_for(capture_layers));
    }
    const Status ran = im.run_decode(rows, width);
    const int64_t capture_set = im.dec_capture;
    im.dec_capture = -1;
    M3_RETURN_IF_ERROR(ran);
    if (capture_set >= 0 && im.output_rank()) {
      const float* buf = im.dec_captures[static_cast<size_t>(capture_set)].buf;
      const int64_t n_cap = static_cast<int64_t>(capture_layers.size());
      out->hidden.resize(batch.size());
      for (const Impl::Seq& s : seqs) {
        std::vector<float>& dst = out->hidden[s.index];
        dst.resize(static_cast<size_t>(n_cap * s.n * im.hd));
        for (int64_t c = 0; c < n_cap; ++c)
          M3_RETURN_IF_ERROR(cuda::copy_to_host_async(
              dst.data() + c * s.n * im.hd, buf + (c * im.dec_rows + s.offset) * im.hd,
              static_cast<size_t>(s.n * im.hd) * 4, st));
      }
    }
    if (!im.output_rank()) {  // no head on this rank: nothing to return
      M3_RETURN_IF_ERROR(im.finish_step());
      out->logits.assign(batch.size(), {});
      out->tokens.clear();
      ++im.stats.decode_steps;
      return Status::ok();
    }
    if (n_sample > 0) {
      cuda::SampleParams sp;
      sp.logits = im.dec.logits;
      sp.batch = span;
      sp.vocab = im.vocab;
      sp.ld = im.vocab;
      sp.rows = im.dec.sample_rows;
      sp.out = im.dec.sampled;
      sp.greedy_value = im.dec.greedy_value;
      sp.greedy_index = im.dec.greedy_index;
      sp.greedy_tickets = im.dec.greedy_tickets;
      // One CTA per row took ~0.67 ms at batch 1 with top_k 40 (tools/bench/sampling_bench.cpp
      // times both kernels).
      sp.kernel = im.opt.kernels.multi_cta_sampling ? cuda::SampleKernel::kMultiCta
                                                    : cuda::SampleKernel::kOneCtaPerRow;
      sp.multi = im.dec.sample_multi;
      M3_RETURN_IF_ERROR(cuda::launch_sample(sp, st));
      M3_RETURN_IF_ERROR(cuda::copy_to_host_async(tokens, im.dec.sampled, span * 4, st));
    }
    float* logits = reinterpret_cast<float*>(host + head_bytes);
    if (copy_logits) {
      // Each sequence's logits rows come back as one range (from its first to its last wanted
      // row), not all rows of the step: a prefill chunk wants at most its last row.
      for (const Impl::Seq& s : seqs) {
        const SequenceInput& in = batch[s.index];
        if (sampled_here(in) || in.logits_rows.empty()) continue;
        const auto [lo, hi] = std::minmax_element(in.logits_rows.begin(), in.logits_rows.end());
        const int64_t first = s.offset + *lo, count = *hi - *lo + 1;
        M3_RETURN_IF_ERROR(cuda::copy_to_host_async(
            logits + first * im.vocab, im.dec.logits + first * im.vocab,
            static_cast<size_t>(count * im.vocab) * 4, st));
      }
    }
    M3_RETURN_IF_ERROR(im.finish_step());
    out->logits.resize(batch.size());
    out->tokens.assign(n_sample > 0 ? batch.size() : 0, -1);
    for (const Impl::Seq& s : seqs) {
      const SequenceInput& in = batch[s.index];
      const std::vector<int32_t>& want = in.logits_rows;
      std::vector<float>& dst = out->logits[s.index];
      dst.clear();  // keeps the capacity of a reused ForwardOutput
      if (sampled_here(in)) {
        out->tokens[s.index] = tokens[s.offset];
        continue;
      }
      for (size_t j = 0; j < want.size(); ++j) {  // the slice's rows start at s.offset
        const float* row = logits + (s.offset + want[j]) * im.vocab;
        dst.insert(dst.end(), row, row + im.vocab);
      }
    }
    ++im.stats.decode_steps;
    if (im.every_block_fits(width)) ++im.stats.indexer_skipped_steps;
    return Status::ok();
  }

  std::vector<int32_t> ids(static_cast<size_t>(t_all)), pos(static_cast<size_t>(t_all)),
      tabs(static_cast<size_t>(t_all * mb), -1);
  for (const Impl::Seq& s : seqs) {
    const SequenceInput& in = batch[s.index];
    const int64_t nb = std::min<int64_t>(static_cast<int64_t>(in.block_table.size()), mb);
    for (int64_t i = 0; i < s.n; ++i) {
      const size_t r = static_cast<size_t>(s.offset + i);
      ids[r] = in.tokens[static_cast<size_t>(i)];
      pos[r] = static_cast<int32_t>(in.start_pos + i);
      std::copy(in.block_table.begin(), in.block_table.begin() + nb,
                tabs.begin() + static_cast<int64_t>(r) * mb);
    }
  }
  M3_RETURN_IF_ERROR(
      im.general_step(batch, seqs, t_all, n_dec, mb, ids, pos, tabs, capture_layers, out));
  ++im.stats.general_steps;
  if (n_dec > 0 && im.every_block_fits(mb)) ++im.stats.indexer_skipped_steps;
  return Status::ok();
}

}  // namespace m3::minimax_m3
