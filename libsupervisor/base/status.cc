#include "trainsup/status.h"

#include "trainsup/exit_codes.h"

namespace trainsup {

const char* statusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kIoError: return "IoError";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kTimedOut: return "TimedOut";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

std::string Status::toString() const {
  if (isOk()) return "OK";
  return std::string(statusCodeName(code_)) + ": " + message_;
}

const char* exitCodeName(int code) {
  switch (code) {
    case 0: return "ok";
    case kExitStopRequested: return "stop_requested";
    case kExitStall: return "stall";
    case kExitWatchdogUnresponsive: return "watchdog_unresponsive";
    case kExitBadConfig: return "bad_config";
    case kExitAborted: return "aborted_by_verdict";
    case kExitQuarantined: return "quarantined";
    case kExitDoNotRequeue: return "do_not_requeue";
    case kExitRequeue: return "requeue";
    default: return "unknown";
  }
}

}  // namespace trainsup
