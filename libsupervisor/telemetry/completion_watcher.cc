#include "trainsup/completion_watcher.h"
#include "trainsup/mutex.h"

#include <exception>
#include <utility>

namespace trainsup {

CompletionWatcher::CompletionWatcher(CollectiveTracker& tracker, std::chrono::microseconds interval, bool threaded)
    : tracker_(tracker), interval_(interval), threaded_(threaded) {}

CompletionWatcher::~CompletionWatcher() { stop(); }

CompletionWatcher& CompletionWatcher::global() {
  // Never destroyed: works may still be polled while static destructors run.
  static CompletionWatcher* w = new CompletionWatcher(CollectiveTracker::global());
  return *w;
}

void CompletionWatcher::ensureThreadLocked() {
  if (threaded_ && !thread_.joinable() && !stopping_) thread_ = std::thread([this] { run(); });
}

void CompletionWatcher::watch(uint64_t seq, Poll poll) {
  {
    MutexLock lock(mu_);
    incoming_.push_back(Entry{seq, std::move(poll)});
    ensureThreadLocked();
  }
  cv_.notifyOne();
}

void CompletionWatcher::nudge() {
  {
    MutexLock lock(mu_);
    nudged_ = true;
  }
  cv_.notifyOne();
}

size_t CompletionWatcher::pollOnce() {
  MutexLock poll_lock(poll_mu_);
  {
    MutexLock lock(mu_);
    for (auto& e : incoming_) active_.push_back(std::move(e));
    incoming_.clear();
    nudged_ = false;
  }
  size_t ended = 0;
  size_t kept = 0;
  for (size_t i = 0; i < active_.size(); ++i) {
    std::optional<bool> outcome;
    try {
      outcome = active_[i].poll();
    } catch (const std::exception&) {
      outcome = false;  // a work that cannot even say whether it finished has failed
    }
    if (outcome) {
      tracker_.end(active_[i].seq, *outcome);
      ++ended;
    } else {
      if (kept != i) active_[kept] = std::move(active_[i]);
      ++kept;
    }
  }
  active_.resize(kept);  // ended entries (and the works they hold) are released here
  {
    MutexLock lock(mu_);
    polling_ = kept;
  }
  return ended;
}

size_t CompletionWatcher::pending() const {
  MutexLock lock(mu_);
  return incoming_.size() + polling_;
}

void CompletionWatcher::run() {
  MutexLock lock(mu_);
  while (!stopping_) {
    if (incoming_.empty() && polling_ == 0) {
      cv_.wait(mu_, [&] { mu_.assertHeld(); return stopping_ || !incoming_.empty(); });
    } else {
      cv_.waitFor(mu_, interval_, [&] { mu_.assertHeld(); return stopping_ || nudged_; });
    }
    if (stopping_) break;
    lock.unlock();
    pollOnce();
    lock.lock();
  }
}

void CompletionWatcher::stop() {
  std::thread t;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    t = std::move(thread_);
  }
  cv_.notifyAll();
  if (!t.joinable()) return;
  // From the polling thread itself (a poll that ends in stop()) the thread cannot be joined:
  // it ends after this round; a joinable std::thread left to its destructor would terminate.
  if (t.get_id() == std::this_thread::get_id()) {
    t.detach();
  } else {
    t.join();
  }
}

}  // namespace trainsup
