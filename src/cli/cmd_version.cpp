#include <cstdio>

#include "app/devices.h"
#include "cli/commands.h"

#ifndef M3_VERSION
#define M3_VERSION "0.0.0"
#endif
#ifndef M3_GIT_COMMIT
#define M3_GIT_COMMIT "unknown"
#endif

namespace m3::cli {

int cmd_version(const std::vector<std::string>& /*args*/) {
  std::printf("m3serve %s (commit %s)\n", M3_VERSION, M3_GIT_COMMIT);
  std::printf(app::cuda_built_in() ? "cuda: yes (sm_90a)\n" : "cuda: no\n");
  return 0;
}

}  // namespace m3::cli
