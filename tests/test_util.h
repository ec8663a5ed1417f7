// Small helpers shared by the C++ test suites.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace trainsup::testing {

// A fresh directory under the temp dir, unique to this process and `tag` (default: the test).
inline std::string tempDir(const std::string& prefix, std::string tag = "") {
  if (tag.empty()) tag = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  auto dir = std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(getpid()) + "_" + tag);
  std::filesystem::remove_all(dir);
  return dir.string();
}

// Polls `pred` until it holds or `limit` has passed; true when it held. For conditions only
// observable from outside (a server's counters), never a fixed sleep that hopes it was enough.
template <class Pred>
bool waitUntil(Pred pred, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace trainsup::testing
