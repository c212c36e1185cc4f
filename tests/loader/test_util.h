// Helpers for loader tests: a fresh temporary directory per test.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace m3::testing_util {

inline std::string make_temp_dir() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("m3_loader_" + std::string(info->test_suite_name()) + "_" +
                               info->name() + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace m3::testing_util
