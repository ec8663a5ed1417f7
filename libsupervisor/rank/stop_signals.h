// Internal: SIGTERM/SIGINT -> a "stop requested" flag.
//
// install() saves the previous dispositions and installs a handler that records the first
// signal; a second signal of the same kind, at least 2 s after the first, restores
// the default disposition and re-raises it (so a second Ctrl-C still kills a loop that ignores
// the flag). One within that window is the same request delivered twice: a scheduler signals
// every process of the job (Slurm's scancel, a time limit) and torchrun forwards the signal to
// its workers too, and the rank must still save. uninstall() restores what was there. Process-wide: one owner at a time (install() while installed is a no-op returning
// false). SIGUSR1/SIGUSR2 are never touched.
#pragma once

#include <cstdint>

namespace trainsup {
namespace stop_signals {

bool install();
void uninstall();
int requestedBy();  // 0, SIGTERM or SIGINT; async-signal-safe read
int64_t requestedForNs();  // how long ago the first signal came; 0 when none
void reset();       // tests only

}  // namespace stop_signals
}  // namespace trainsup
