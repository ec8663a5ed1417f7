// rank/stack_dump.h — native stacks of every thread of this process, on demand.
//
// Contract: dumpAllThreadStacks() lists the threads in /proc/self/task, asks each one for its
// stack with a real-time signal (stackDumpSignal(), SIGRTMIN+6; never SIGUSR1/SIGUSR2, which
// Slurm uses), and waits at most `timeout` for the answers. The calling thread records its own
// stack directly. A thread that cannot answer (signal blocked, stuck in the kernel, stopped)
// is listed with answered=false and its /proc state (e.g. 'D'), never waited for beyond the
// timeout. Frames are symbolized with dladdr + demangling as "symbol+0xoff (module+0xoff)";
// the module offset feeds addr2line for file:line. Executables need -rdynamic (CMake
// ENABLE_EXPORTS) for their own function names. One dump runs at a time (others wait); safe
// to call from any thread except inside a signal handler. Costs a few ms per thread.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "trainsup/export.h"

namespace trainsup {

struct ThreadStack {
  int tid = 0;
  std::string name;        // /proc/self/task/<tid>/comm
  char state = '?';        // /proc/self/task/<tid>/stat state: R, S, D, T, ...
  bool answered = false;   // false: no stack (see state)
  bool is_caller = false;  // the thread that asked for the dump
  std::vector<std::string> frames;
};

struct StackDump {
  std::vector<ThreadStack> threads;
  int answered = 0;
};

TRAINSUP_EXPORT StackDump dumpAllThreadStacks(
    std::chrono::milliseconds timeout = std::chrono::milliseconds(2000));

// Human-readable lines: one header per thread, then "  #N frame" lines.
TRAINSUP_EXPORT std::vector<std::string> formatStackDump(const StackDump& dump);

TRAINSUP_EXPORT int stackDumpSignal();

// Installs the signal handler and loads the unwinder now (Supervisor::create calls it), so that
// a later dump does not need the dynamic loader's lock, which a stuck thread may hold.
TRAINSUP_EXPORT void prepareStackDumps();

}  // namespace trainsup
