// Counter-based random numbers for sampling: the uniform for (seed, sequence index, output
// position) is a pure function of those three values. So a seeded request samples the same tokens
// whatever else is in the batch, however its prefill was chunked, and after preemption and
// recompute (a stateful generator would have to be checkpointed and replayed for that).
#pragma once

#include <cstdint>

namespace m3 {

// SplitMix64 finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mix with full avalanche.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct RngKey {
  uint64_t seed = 0;
  uint64_t stream = 0;   // sequence index within the request (n > 1)
  uint64_t counter = 0;  // output position (tokens generated before this one)
};

// Uniform double in [0, 1) with 53 random bits.
inline double uniform01(const RngKey& k) {
  const uint64_t h = splitmix64(splitmix64(splitmix64(k.seed) ^ k.stream) ^ k.counter);
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

}  // namespace m3
