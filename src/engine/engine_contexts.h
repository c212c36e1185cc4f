// The engine's per-request and per-sequence state (engine.cpp and engine_speculative.cpp).
#pragma once

#include <memory>
#include <vector>

#include "engine/engine.h"
#include "model/draft_model.h"

namespace m3 {

struct Engine::SeqCtx {
  SeqId id = -1;
  int32_t index = 0;
  int32_t generated = 0;
  bool finished = false;
  PenaltyState penalties;
  std::unique_ptr<TextDetokenizer> detok;
  StopStringFilter stop;
  // Speculative decoding (ReqCtx::speculative): the draft's context of this sequence, the
  // proposal waiting to be verified (drafts and the distributions they were drawn from, made
  // for the anchor at proposal_pos), and the number of verify rounds so far (part of the random
  // keys, so no uniform is ever used twice).
  std::unique_ptr<DraftState> draft;
  std::vector<int32_t> proposal;
  std::vector<std::vector<double>> proposal_q;
  int64_t proposal_pos = -1;
  uint64_t spec_round = 0;
};

struct Engine::ReqCtx {
  RequestId id = 0;
  GenerateRequest req;
  std::shared_ptr<RequestStream> stream;
  std::vector<std::unique_ptr<SeqCtx>> seqs;
  std::vector<int32_t> min_tokens_mask;  // EOS + stop token ids
  uint64_t seed = 0;
  int32_t max_tokens = 0;
  int32_t num_unfinished = 0;
  bool scheduled = false;
  Usage usage;
  RequestTimes times;
  // GenerateRequest::prompt_logits: [prompt_len, vocab], filled by position as the prefill runs
  // (a preempted prefill recomputes into the same rows), handed over with the first token.
  std::vector<float> prompt_logits;
  bool prompt_logits_sent = false;
  // Decoded with the draft (Engine::enable_speculative); the draft samples with draft_params:
  // the request's temperature, top-k, top-p and min-p, nothing else.
  bool speculative = false;
  SamplingParams draft_params;
};

}  // namespace m3
