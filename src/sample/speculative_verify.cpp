#include "sample/speculative_verify.h"

#include <algorithm>

#include "core/status.h"
#include "sample/sampler.h"

namespace m3 {

namespace {

// Y ~ norm(max(scale · p − q, 0)), falling back to p when that has no mass.
int32_t draw_residual(std::span<const double> p, std::span<const double> q, double scale,
                      double u) {
  std::vector<double> r(p.size());
  double total = 0.0;
  for (size_t x = 0; x < p.size(); ++x) {
    r[x] = std::max(scale * p[x] - q[x], 0.0);
    total += r[x];
  }
  if (total > 0.0) return draw_from_mass(r, total, u);
  double p_total = 0.0;
  for (double v : p) p_total += v;
  return draw_from_mass(p, p_total, u);
}

int32_t draw_target(std::span<const double> p, double u) {
  double total = 0.0;
  for (double v : p) total += v;
  return draw_from_mass(p, total, u);
}

VerifyResult token_wise(std::span<const int32_t> drafts, std::span<const std::vector<double>> q,
                        std::span<const std::vector<double>> p, const VerifyUniforms& u) {
  const int32_t gamma = static_cast<int32_t>(drafts.size());
  for (int32_t i = 0; i < gamma; ++i) {
    const int32_t x = drafts[i];
    if (u.accept(i) * q[i][x] < p[i][x]) continue;
    return {i, draw_residual(p[i], q[i], 1.0, u.residual())};
  }
  return {gamma, draw_target(p[gamma], u.residual())};
}

VerifyResult block(std::span<const int32_t> drafts, std::span<const std::vector<double>> q,
                   std::span<const std::vector<double>> p, const VerifyUniforms& u) {
  const int32_t gamma = static_cast<int32_t>(drafts.size());
  std::vector<double> rho(gamma + 1, 1.0), h(gamma + 1, 0.0);
  for (int32_t i = 1; i <= gamma; ++i) {
    const int32_t x = drafts[i - 1];
    const double qx = q[i - 1][x];
    // q(x) > 0 for a drawn draft; a ratio of 0/0 cannot occur.
    rho[i] = qx > 0.0 ? std::min(1.0, rho[i - 1] * p[i - 1][x] / qx) : 0.0;
  }
  for (int32_t i = 1; i < gamma; ++i) {
    double r = 0.0;
    const std::vector<double>& pn = p[i];
    const std::vector<double>& qn = q[i];
    for (size_t x = 0; x < pn.size(); ++x) r += std::max(rho[i] * pn[x] - qn[x], 0.0);
    const double denom = r + 1.0 - rho[i];
    h[i] = denom > 0.0 ? r / denom : 1.0;
  }
  if (gamma > 0) h[gamma] = rho[gamma];
  int32_t tau = 0;
  // Every η_i is drawn (they are keyed by slot, so drawing them all costs nothing extra); τ is the
  // last success.
  for (int32_t i = 1; i <= gamma; ++i) {
    if (u.accept(i - 1) <= h[i]) tau = i;
  }
  if (tau == gamma) return {tau, draw_target(p[gamma], u.residual())};
  return {tau, draw_residual(p[tau], q[tau], rho[tau], u.residual())};
}

}  // namespace

VerifyResult verify_draft(VerifyMethod method, std::span<const int32_t> drafts,
                          std::span<const std::vector<double>> q,
                          std::span<const std::vector<double>> p, const VerifyUniforms& uniforms) {
  M3_CHECK(q.size() == drafts.size() && p.size() == drafts.size() + 1,
           "[verify] " + std::to_string(drafts.size()) + " drafts with " +
               std::to_string(q.size()) + " draft and " + std::to_string(p.size()) +
               " target distributions");
  VerifyResult r = method == VerifyMethod::kBlock ? block(drafts, q, p, uniforms)
                                                  : token_wise(drafts, q, p, uniforms);
  M3_CHECK(r.next_token >= 0, "[verify] the target distribution has no mass");
  return r;
}

}  // namespace m3
