// base/worker_threads.h — one job run by the calling thread and a few helper threads, with
// every thread joined on every path (internal; the checkpoint copies and the libtorch loader).
//
// Contract: runOnThreads(threads, work, what) runs `work` on the calling thread and on up to
// `threads - 1` helpers, and returns once every one of them has returned. `work` must finish
// the whole job with any number of runners (each pulls items from a shared counter until none
// is left), because a helper that cannot be started (std::system_error: the process or user is
// at its thread limit) is simply not there: the others do its share. An exception that escapes
// `work` on any thread is caught; the first one becomes the Internal status returned, naming
// `what`, and the runners that did not throw still finish. No std::thread is ever destroyed
// joinable, the mistake that ends a process with "terminate called without an active
// exception" (issue 19). Costs one thread creation per helper.
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "trainsup/status.h"

namespace trainsup {

// How helpers are started: std::thread's constructor, or a test's stand-in that fails.
using ThreadStarter = std::function<std::thread(std::function<void()>)>;

inline Status runOnThreads(unsigned threads, const std::function<void()>& work, const std::string& what,
                           const ThreadStarter& start = nullptr) {
  std::mutex mu;
  std::string first_error;
  auto guarded = [&] {
    std::string error;
    try {
      work();
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "an exception that is not a std::exception";
    }
    if (!error.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first_error.empty()) first_error = error;
    }
  };
  std::vector<std::thread> helpers;
  struct JoinAll {
    std::vector<std::thread>& threads;
    ~JoinAll() {
      for (auto& t : threads) {
        if (t.joinable()) t.join();
      }
    }
  } join_all{helpers};
  try {
    helpers.reserve(threads);  // so that push_back never reallocates (and never throws) below
  } catch (const std::bad_alloc&) {
    threads = 1;
  }
  for (unsigned i = 1; i < threads; ++i) {
    try {
      helpers.push_back(start ? start(guarded) : std::thread(guarded));
    } catch (const std::system_error&) {
      break;  // at the thread limit: the threads already running (and this one) do the rest
    } catch (const std::bad_alloc&) {
      break;
    }
  }
  guarded();
  for (auto& t : helpers) t.join();
  if (!first_error.empty()) return Status::internal(what + ": " + first_error);
  return Status::ok();
}

}  // namespace trainsup
