// Test helper: run a program with extra environment, capture its output, wait with a bound.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace trainsup::testing {

struct ProcessResult {
  bool exited = false;     // false: killed by a signal or by our timeout
  int exit_code = -1;
  int signal = 0;
  bool timed_out = false;
  std::chrono::steady_clock::time_point ended;  // when waitpid() returned
  std::string output;      // stdout + stderr
};

class Subprocess {
 public:
  Subprocess(std::vector<std::string> argv, std::map<std::string, std::string> env);
  ~Subprocess();
  pid_t pid() const { return pid_; }
  // Waits until the process ends or `timeout` passes (then SIGKILLs it).
  ProcessResult wait(std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int pidfd_ = -1;
};

}  // namespace trainsup::testing
