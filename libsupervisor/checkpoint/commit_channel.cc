#include "trainsup/commit_channel.h"
#include "trainsup/mutex.h"

namespace trainsup {

Status LocalCommitChannel::set(const std::string& key, const std::string& value) {
  {
    MutexLock lock(mu_);
    values_[key] = value;
  }
  cv_.notifyAll();
  return Status::ok();
}

Result<std::string> LocalCommitChannel::get(const std::string& key, Nanos timeout) {
  MutexLock lock(mu_);
  if (!cv_.waitFor(mu_, timeout, [&] { mu_.assertHeld(); return values_.count(key) != 0; })) {
    return Status::timedOut("key '" + key + "' did not appear within " + std::to_string(toSeconds(timeout)) + " s");
  }
  return values_.at(key);
}

Result<int64_t> LocalCommitChannel::add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  {
    MutexLock lock(mu_);
    auto it = values_.find(key);
    if (it != values_.end()) v = std::stoll(it->second);
    v += delta;
    values_[key] = std::to_string(v);
  }
  cv_.notifyAll();
  return v;
}

Status LocalCommitChannel::remove(const std::string& key) {
  MutexLock lock(mu_);
  values_.erase(key);
  return Status::ok();
}

size_t LocalCommitChannel::size() const {
  MutexLock lock(mu_);
  return values_.size();
}

}  // namespace trainsup
