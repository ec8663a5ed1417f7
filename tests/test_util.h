// Small helpers shared by the C++ test suites.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace trainsup::testing {

// A fresh directory under the temp dir, unique to this process and `tag` (default: the test).
inline std::string tempDir(const std::string& prefix, std::string tag = "") {
  if (tag.empty()) tag = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  auto dir = std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(getpid()) + "_" + tag);
  std::filesystem::remove_all(dir);
  return dir.string();
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace trainsup::testing
