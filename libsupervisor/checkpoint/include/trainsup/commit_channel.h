// trainsup/commit_channel.h — how the ranks of a job agree on checkpoint decisions and commits.
//
// Contract: a small key-value interface with the semantics of c10d::Store (set, blocking get
// with a timeout, atomic add, delete). In production the torch layer adapts the job's c10d
// store (TCPStore) to it (trainsup/torch_state.h); LocalCommitChannel serves one process and
// tests that run ranks as threads. All methods are thread-safe. get() waits for the key to
// exist and fails with TimedOut naming the key; a closed or unreachable store is Unavailable.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>

#include "trainsup/clock.h"
#include "trainsup/export.h"
#include "trainsup/mutex.h"
#include "trainsup/status.h"

namespace trainsup {

class TRAINSUP_EXPORT CommitChannel {
 public:
  virtual ~CommitChannel() = default;
  virtual Status set(const std::string& key, const std::string& value) = 0;
  virtual Result<std::string> get(const std::string& key, Nanos timeout) = 0;
  virtual Result<int64_t> add(const std::string& key, int64_t delta) = 0;
  virtual Status remove(const std::string& key) = 0;  // missing key: OK
};

// In-memory channel. Waits use a condition variable on the real clock.
class TRAINSUP_EXPORT LocalCommitChannel final : public CommitChannel {
 public:
  Status set(const std::string& key, const std::string& value) override;
  Result<std::string> get(const std::string& key, Nanos timeout) override;
  Result<int64_t> add(const std::string& key, int64_t delta) override;
  Status remove(const std::string& key) override;
  size_t size() const;

 private:
  mutable Mutex mu_;
  CondVar cv_;
  std::map<std::string, std::string> values_ TRAINSUP_GUARDED_BY(mu_);
};

}  // namespace trainsup
