// trainsup/exit_codes.h — the process exit codes trainsup uses, and what a launcher should do.
//
// Contract: these values are stable across releases (docs/exit-codes.md is the table users
// read). They sit in 90..99, clear of shell (126..165), sysexits (64..78) and Python's 1/2.
#pragma once

#include "trainsup/export.h"

namespace trainsup {

// Stopped on request (SIGTERM/SIGINT, e.g. a preemption notice) after finishing cleanly.
// A scheduler may requeue the job.
inline constexpr int kExitStopRequested = 90;
// The watchdog found a section (step, eval, user-defined, ...) over its budget, dumped the
// stacks of every thread into the rank log and ended the process (also when the dump and the
// abort callbacks ran past abort_grace_s). A launcher may restart the job.
inline constexpr int kExitStall = 91;
// The watchdog thread itself stopped answering (its heartbeat stalled for
// heartbeat_timeout_s); the heartbeat monitor ended the process.
inline constexpr int kExitWatchdogUnresponsive = 92;
// The configuration (a TRAINSUP_* or torchrun variable, or a Config field) is invalid.
// Restarting will not help: fix the setting.
inline constexpr int kExitBadConfig = 93;

// The job coordinator reached a verdict (another rank, or this one, hung, died or stalled)
// and told every rank to abort; the rank log names the culprit and its host. Relaunch the job,
// without the culprit's host.
inline constexpr int kExitAborted = 94;

// Launcher agents (trainsup.run) exit with these three.
// This host is quarantined (a verdict named it, or its preflight failed): its agent left the
// job so that the others go on without it. Do not place the job on this host again until the
// quarantine record expires or an operator removes it.
inline constexpr int kExitQuarantined = 95;
// The job gave up: past the restart cap, or restarts that never moved the newest valid
// checkpoint. Requeueing would repeat the failure: look at the cause first.
inline constexpr int kExitDoNotRequeue = 96;
// The job cannot go on with the hosts its allocation has left: fewer than the rendezvous's
// minimum remain once the quarantined and lost ones are taken out, and no other host can join
// (a Slurm allocation; TRAINSUP_ALLOCATION_HOSTS). Requeue the job: its quarantined hosts are
// drained, or excluded from the next placement (`trainsup quarantine exclude-arg`).
inline constexpr int kExitRequeue = 97;

// Human-readable name of one of the codes above ("stall", ...), or "unknown".
TRAINSUP_EXPORT const char* exitCodeName(int code);

}  // namespace trainsup
