// trainsup/mutex.h — the mutex, scoped lock and condition variable of trainsup's own threads.
//
// Contract: Mutex is std::mutex with Clang thread-safety annotations (trainsup/thread_annotations.h),
// so that TRAINSUP_GUARDED_BY members are checked at compile time. MutexLock holds it for a scope
// (unlock()/lock() in between are allowed and checked). CondVar waits on a Mutex the caller
// holds; a predicate runs with the mutex held and says so with mu.assertHeld(), e.g.
//   cv_.wait(mu_, [&] { mu_.assertHeld(); return stopping_; });
// Not recursive; not copyable. Costs what std::mutex and std::condition_variable cost.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "trainsup/thread_annotations.h"

namespace trainsup {

class TRAINSUP_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() TRAINSUP_ACQUIRE() { mu_.lock(); }
  void unlock() TRAINSUP_RELEASE() { mu_.unlock(); }
  // Tells the analysis that the caller holds this mutex (in a CondVar predicate); checks nothing.
  void assertHeld() const TRAINSUP_ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

class TRAINSUP_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) TRAINSUP_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() TRAINSUP_RELEASE() {
    if (held_) mu_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // For a call that must run without the lock (a callback, a blocking send).
  void unlock() TRAINSUP_RELEASE() {
    mu_.unlock();
    held_ = false;
  }
  void lock() TRAINSUP_ACQUIRE() {
    mu_.lock();
    held_ = true;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

class CondVar {
 public:
  void notifyOne() { cv_.notify_one(); }
  void notifyAll() { cv_.notify_all(); }

  // Blocks until pred() is true; `mu` is held on entry and on return, released while waiting.
  template <class Predicate>
  void wait(Mutex& mu, Predicate pred) TRAINSUP_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock, pred);
    lock.release();
  }
  // As wait(), for at most `timeout`; returns pred() (false: timed out with pred() false).
  template <class Rep, class Period, class Predicate>
  bool waitFor(Mutex& mu, std::chrono::duration<Rep, Period> timeout, Predicate pred) TRAINSUP_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    bool result = cv_.wait_for(lock, timeout, pred);
    lock.release();
    return result;
  }
  template <class ClockType, class Duration, class Predicate>
  bool waitUntil(Mutex& mu, std::chrono::time_point<ClockType, Duration> deadline, Predicate pred)
      TRAINSUP_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    bool result = cv_.wait_until(lock, deadline, pred);
    lock.release();
    return result;
  }

 private:
  std::condition_variable cv_;
};

}  // namespace trainsup
