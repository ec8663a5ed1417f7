#include "subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

extern char** environ;

namespace trainsup::testing {

Subprocess::Subprocess(std::vector<std::string> argv, std::map<std::string, std::string> env) {
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(pipefd[1]);
  out_fd_ = pipefd[0];
  pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
}

Subprocess::~Subprocess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
  if (pidfd_ >= 0) close(pidfd_);
}

ProcessResult Subprocess::wait(std::chrono::milliseconds timeout) {
  ProcessResult r;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool out_open = true;
  bool done = false;
  char buf[4096];
  // Read output and wait for the exit together, so a chatty child never blocks on a full pipe.
  while (!done) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      kill(pid_, SIGKILL);
      break;
    }
    pollfd fds[2] = {{out_open ? out_fd_ : -1, POLLIN, 0}, {pidfd_, POLLIN, 0}};
    int n = poll(fds, 2, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (fds[0].revents & (POLLIN | POLLHUP)) {
      ssize_t got = read(out_fd_, buf, sizeof(buf));
      if (got > 0) r.output.append(buf, static_cast<size_t>(got));
      if (got <= 0) out_open = false;
    }
    if (pidfd_ < 0 || (fds[1].revents & POLLIN)) {
      int status = 0;
      pid_t w = waitpid(pid_, &status, pidfd_ < 0 ? WNOHANG : 0);
      if (w == pid_) {
        r.ended = std::chrono::steady_clock::now();
        done = true;
        pid_ = -1;
        if (WIFEXITED(status)) {
          r.exited = true;
          r.exit_code = WEXITSTATUS(status);
        } else if (WIFSIGNALED(status)) {
          r.signal = WTERMSIG(status);
        }
      }
    }
  }
  // Drain what is left of the output.
  for (;;) {
    ssize_t got = read(out_fd_, buf, sizeof(buf));
    if (got <= 0) break;
    r.output.append(buf, static_cast<size_t>(got));
  }
  if (r.timed_out && pid_ > 0) {
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  return r;
}

}  // namespace trainsup::testing
