// Internal: SIGTERM/SIGINT -> a "stop requested" flag.
//
// install() saves the previous dispositions and installs a handler that records the first
// signal; a second signal of the same kind restores the default disposition and re-raises it
// (so a second Ctrl-C still kills a loop that ignores the flag). uninstall() restores what was
// there. Process-wide: one owner at a time (install() while installed is a no-op returning
// false). SIGUSR1/SIGUSR2 are never touched.
#pragma once

namespace trainsup {
namespace stop_signals {

bool install();
void uninstall();
int requestedBy();  // 0, SIGTERM or SIGINT; async-signal-safe read
void reset();       // tests only

}  // namespace stop_signals
}  // namespace trainsup
