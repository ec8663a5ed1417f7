// For the harness tools (trainsup_coordinator, trainsup_node_monitor): blocks until stdin
// closes (the harness that started the tool ended) or SIGTERM/SIGINT arrives.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <thread>

namespace trainsup::tools {

inline void waitForEnd() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread reader([] {
    char buf[256];
    while (::read(0, buf, sizeof(buf)) > 0) {
    }
    ::kill(::getpid(), SIGTERM);
  });
  reader.detach();
  int sig = 0;
  sigwait(&set, &sig);
}

}  // namespace trainsup::tools
