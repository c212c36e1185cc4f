// Helpers for loader tests: a fresh temporary directory per test, removed when the test binary
// exits (a test that fails or returns early leaves nothing behind in /tmp either).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace m3::testing_util {

// The directories make_temp_dir created; the destructor of the one static instance removes them.
struct TempDirs {
  std::vector<std::filesystem::path> dirs;
  ~TempDirs() {
    for (const std::filesystem::path& d : dirs) {
      std::error_code ignored;
      std::filesystem::remove_all(d, ignored);
    }
  }
};
inline TempDirs& temp_dirs() {
  static TempDirs t;
  return t;
}

inline std::string make_temp_dir() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("m3_loader_" + std::string(info->test_suite_name()) + "_" +
                               info->name() + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  temp_dirs().dirs.push_back(dir);
  return dir.string();
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace m3::testing_util
