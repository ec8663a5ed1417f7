#include "trainsup/commit_channel.h"

namespace trainsup {

Status LocalCommitChannel::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
  }
  cv_.notify_all();
  return Status::ok();
}

Result<std::string> LocalCommitChannel::get(const std::string& key, Nanos timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return values_.count(key) != 0; })) {
    return Status::timedOut("key '" + key + "' did not appear within " + std::to_string(toSeconds(timeout)) + " s");
  }
  return values_.at(key);
}

Result<int64_t> LocalCommitChannel::add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    if (it != values_.end()) v = std::stoll(it->second);
    v += delta;
    values_[key] = std::to_string(v);
  }
  cv_.notify_all();
  return v;
}

Status LocalCommitChannel::remove(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  values_.erase(key);
  return Status::ok();
}

size_t LocalCommitChannel::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return values_.size();
}

}  // namespace trainsup
