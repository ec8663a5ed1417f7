#include "trainsup/completion_watcher.h"
#include "trainsup/mutex.h"

#include <chrono>
#include <exception>
#include <thread>
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

void CompletionWatcher::watch(uint64_t seq, Poll poll, Releasable releasable) {
  {
    MutexLock lock(mu_);
    incoming_.push_back(Entry{seq, std::move(poll), std::move(releasable)});
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
      if (active_[i].releasable) retiring_.push_back(std::move(active_[i]));  // checked below
    } else {
      if (kept != i) active_[kept] = std::move(active_[i]);
      ++kept;
    }
  }
  active_.resize(kept);  // ended entries (and the works they hold) are released here...
  const size_t retiring = releaseRetiredLocked();  // ...or once nobody else holds them
  {
    MutexLock lock(mu_);
    polling_ = kept;
    retiring_count_ = retiring;
  }
  return ended;
}

size_t CompletionWatcher::releaseRetiredLocked() {
  size_t kept = 0;
  for (size_t i = 0; i < retiring_.size(); ++i) {
    bool releasable = true;
    try {
      releasable = retiring_[i].releasable();
    } catch (const std::exception&) {
      releasable = false;  // cannot tell: keep it
    }
    if (releasable) continue;
    if (kept != i) retiring_[kept] = std::move(retiring_[i]);
    ++kept;
  }
  retiring_.resize(kept);
  return kept;
}

size_t CompletionWatcher::retiring() const {
  MutexLock lock(mu_);
  return retiring_count_;
}

size_t CompletionWatcher::releaseAtExit(std::chrono::milliseconds wait) {
  stop();
  // Kept for the life of the process: released by nobody, so by no thread during finalization.
  static auto* kept_forever = new std::vector<Entry>();
  MutexLock poll_lock(poll_mu_);
  // The owners left are backend threads finishing their iteration (microseconds): poll, with a
  // bound, for them to let go; nothing notifies when a reference count drops.
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (releaseRetiredLocked() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<Entry> incoming;
  {
    MutexLock lock(mu_);
    incoming.swap(incoming_);
    polling_ = 0;
    retiring_count_ = 0;
  }
  const size_t n = retiring_.size() + active_.size() + incoming.size();
  for (auto* list : {&retiring_, &active_, &incoming}) {
    for (auto& e : *list) kept_forever->push_back(std::move(e));
    list->clear();
  }
  return n;
}

size_t CompletionWatcher::pending() const {
  MutexLock lock(mu_);
  return incoming_.size() + polling_;
}

void CompletionWatcher::run() {
  MutexLock lock(mu_);
  while (!stopping_) {
    if (incoming_.empty() && polling_ == 0 && retiring_count_ == 0) {
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
