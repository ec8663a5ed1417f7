// trainsup/status.h — expected failures as values.
//
// Contract: functions that can fail for reasons outside the program's control (bad
// configuration, a corrupt file, a full disk, a peer that timed out) return a Status or a
// Result<T>. The message names the thing and the place ("TRAINSUP_LOG_LEVEL='loud' is not one
// of trace|debug|info|warn|error"). Bugs (broken invariants) throw std::logic_error instead.
// Status is a small value type: copyable, cheap when OK, safe to use from any thread.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "trainsup/export.h"

namespace trainsup {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // a setting or argument has a value we cannot use
  kNotFound,
  kIoError,          // the OS refused (ENOSPC, EIO, EACCES, ...)
  kCorruption,       // data exists but does not verify
  kTimedOut,
  kUnavailable,      // a peer or service is not there
  kInternal,
};

TRAINSUP_EXPORT const char* statusCodeName(StatusCode code);

class TRAINSUP_EXPORT Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  static Status invalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status notFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status ioError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  static Status corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
  static Status timedOut(std::string m) { return {StatusCode::kTimedOut, std::move(m)}; }
  static Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool isOk() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return isOk(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "OK" or "<code name>: <message>".
  std::string toString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Either a T or a non-OK Status. Accessing value() of a failed Result is a bug and throws
// std::logic_error carrying the status text.
template <class T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.isOk()) throw std::logic_error("trainsup::Result built from an OK status without a value");
  }

  bool isOk() const { return value_.has_value(); }
  explicit operator bool() const { return isOk(); }
  const Status& status() const { return status_; }

  T& value() & { check(); return *value_; }
  const T& value() const& { check(); return *value_; }
  T&& value() && { check(); return std::move(*value_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void check() const {
    if (!value_) throw std::logic_error("trainsup::Result has no value: " + status_.toString());
  }
  std::optional<T> value_;
  Status status_;
};

}  // namespace trainsup
