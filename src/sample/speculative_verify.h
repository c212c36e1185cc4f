// Lossless verification of a speculative draft (docs/dspark.md, "Verification"): given the
// drafted tokens X_1..X_γ, the distributions q_i they were drawn from and the target's
// distributions p_1..p_{γ+1} (p_i conditioned on X_1..X_{i-1}, after every logits processor:
// sampling_distribution), decide how many drafts to accept (τ) and the token that follows them.
// Whatever the draft, the emitted tokens are distributed exactly as sampling from the target.
//
//   token-wise (Leviathan et al. 2023): accept X_i while u_i · q_i(X_i) < p_i(X_i); at the first
//     rejection emit Y ~ norm(max(p_i − q_i, 0)); if every draft passes, Y ~ p_{γ+1}.
//   block (Sun et al. 2024, Algorithm 2): ρ_0 = 1, ρ_i = min(1, ρ_{i−1} · p_i(X_i) / q_i(X_i));
//     h_i = R_i / (R_i + 1 − ρ_i) with R_i = Σ_x max(ρ_i · p_{i+1}(x) − q_{i+1}(x), 0) for i < γ
//     (1 where the denominator is 0), h_γ = ρ_γ; τ = max{i : η_i ≤ h_i} (0 if none) over
//     independent η_i; Y ~ p_{γ+1} if τ = γ, else norm(max(ρ_τ · p_{τ+1} − q_{τ+1}, 0)). Never
//     accepts fewer tokens in expectation than token-wise.
// A residual of zero mass (probability 0, reachable in floating point) falls back to p.
// With one-hot p and q (greedy target and draft) both reduce to "accept while the target's
// argmax equals the draft, then emit the target's argmax".
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace m3 {

enum class VerifyMethod : uint8_t { kTokenWise, kBlock };

struct VerifyResult {
  int32_t num_accepted = 0;  // τ: drafts X_1..X_τ are kept
  int32_t next_token = -1;   // Y, emitted after them
};

// Uniforms in [0, 1): accept(i) is u_i / η_i for draft i (0-based), residual() is the one draw of
// Y. Each must be independent of the others and of the draws that produced the drafts.
struct VerifyUniforms {
  std::function<double(int32_t)> accept;
  std::function<double()> residual;
};

// drafts: [γ]; q: γ distributions; p: γ + 1 distributions, all of the same vocabulary size.
VerifyResult verify_draft(VerifyMethod method, std::span<const int32_t> drafts,
                          std::span<const std::vector<double>> q,
                          std::span<const std::vector<double>> p, const VerifyUniforms& uniforms);

}  // namespace m3
