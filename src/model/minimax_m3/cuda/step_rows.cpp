#include "model/minimax_m3/cuda/step_rows.h"

#include <algorithm>

namespace m3::minimax_m3 {

StepRows plan_step_rows(std::span<const ModelSlice> batch, int dp, int64_t stride) {
  StepRows p;
  const size_t groups = static_cast<size_t>(std::max(dp, 1));
  p.group_first.assign(groups, 0);
  p.group_tokens.assign(groups, 0);
  p.group_decode.assign(groups, 0);
  int64_t at = 0;
  for (size_t g = 0; g < groups; ++g) {
    const int64_t first = stride > 0 ? static_cast<int64_t>(g) * stride : at;
    p.group_first[g] = first;
    int64_t row = first;
    // One-token slices first: the decode kernels take a group's first rows.
    for (int pass = 0; pass < 2; ++pass)
      for (size_t s = 0; s < batch.size(); ++s) {
        const ModelSlice& in = batch[s];
        if (static_cast<size_t>(in.dp_group) != g) continue;
        const int64_t n = static_cast<int64_t>(in.tokens.size());
        if ((n == 1) != (pass == 0)) continue;
        p.slices.push_back({s, in.dp_group, row, n});
        row += n;
        if (n == 1) ++p.group_decode[g];
      }
    p.group_tokens[g] = row - first;
    p.max_group = std::max(p.max_group, p.group_tokens[g]);
    at = row;
  }
  p.rows = stride > 0 ? static_cast<int64_t>(groups) * stride : at;
  return p;
}

int64_t decode_group_stride(int64_t max_group, int dp, int64_t decode_rows) {
  const int64_t per_group = decode_rows / std::max(dp, 1);
  if (max_group < 1 || max_group > per_group) return 0;
  int64_t bucket = 1;
  while (bucket < max_group) bucket *= 2;
  return std::min(bucket, per_group);
}

}  // namespace m3::minimax_m3
