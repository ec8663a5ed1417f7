// Each fuzz target defines its entry point with TRAINSUP_FUZZ_ENTRY(name). In the fuzz build
// (fuzz/CMakeLists.txt, clang's libFuzzer) it is LLVMFuzzerTestOneInput; the replay test in the
// normal build (tests/core/fuzz_replay_test.cc) compiles every target into one binary, each
// under its own name, and feeds it the seeds and the crash regressions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#ifdef TRAINSUP_FUZZ_REPLAY
#define TRAINSUP_FUZZ_ENTRY(name) extern "C" int name(const uint8_t* data, size_t size)
#else
#define TRAINSUP_FUZZ_ENTRY(name) extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
#endif

// An invariant broken: a crash the fuzzer reports (and the replay test sees as a death).
#define TRAINSUP_FUZZ_CHECK(cond)                                                        \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: fuzz invariant broken: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)
