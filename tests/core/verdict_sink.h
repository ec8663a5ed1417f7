// Test helper: collects a coordinator's verdicts and resolves a future on the first one.
#pragma once

#include <future>
#include <mutex>
#include <vector>

#include "trainsup/coordinator.h"

namespace trainsup::testing {

struct VerdictSink {
  std::mutex mu;
  std::vector<Verdict> all;  // guarded by mu
  std::promise<Verdict> first;
  bool got = false;          // guarded by mu
  Coordinator::OnVerdict callback() {
    return [this](const Verdict& v) {
      std::lock_guard<std::mutex> lock(mu);
      all.push_back(v);
      if (!got) {
        got = true;
        first.set_value(v);
      }
    };
  }
};

}  // namespace trainsup::testing
