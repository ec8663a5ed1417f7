// trainsup/event_log.h — the structured event log: one JSON object per line, one file per rank.
//
// Contract: every line carries "ts" (UTC, ISO 8601 with microseconds), "wall_s" (seconds since
// the Unix epoch), "mono_ns" (CLOCK_MONOTONIC, comparable across processes of one host),
// "host", "rank", "local_rank", "world_size", "pid", "job_id", "restart", "seq" (per-file
// counter) and "event", followed by the event's own fields. A launcher agent's log (openAgent)
// has the same lines without the rank fields ("rank", "local_rank", "world_size", "restart")
// and with "time", the same value as "wall_s" (the name earlier releases of the agent wrote).
// docs/events.md is the schema; this file is the one writer of both.
// write() is thread-safe and flushes each line to the kernel, so a line survives the
// process dying right after; it is not on any hot path (events are rare). A write that fails
// (disk full) is counted, reported once on stderr, and never throws into the caller.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "trainsup/clock.h"
#include "trainsup/config.h"
#include "trainsup/export.h"
#include "trainsup/status.h"

namespace trainsup {

// Serialized JSON to embed as a field value (for nested objects or arrays).
struct RawJson {
  std::string text;
};

class EventField {
 public:
  using Value = std::variant<std::nullptr_t, bool, int64_t, double, std::string, RawJson>;

  template <class T>
  EventField(std::string key, T value) : key_(std::move(key)), value_(convert(std::move(value))) {}

  const std::string& key() const { return key_; }
  const Value& value() const { return value_; }

 private:
  template <class T>
  static Value convert(T v) {
    if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::nullptr_t> ||
                  std::is_same_v<T, RawJson> || std::is_same_v<T, std::string>) {
      return Value(std::move(v));
    } else if constexpr (std::is_integral_v<T>) {
      return Value(static_cast<int64_t>(v));
    } else if constexpr (std::is_floating_point_v<T>) {
      return Value(static_cast<double>(v));
    } else {
      return Value(std::string(v));  // const char*, std::string_view
    }
  }
  std::string key_;
  Value value_;
};
using EventFields = std::vector<EventField>;

class TRAINSUP_EXPORT EventLog {
 public:
  // Opens (appends to) `path`, creating it. Fails with IoError naming the path.
  static Result<std::unique_ptr<EventLog>> open(const std::string& path, const Identity& identity,
                                                Clock& clock);
  // The log of a launcher agent on `host` (no rank): the same format, without the rank fields.
  static Result<std::unique_ptr<EventLog>> openAgent(const std::string& path, const std::string& host,
                                                     const std::string& job_id, Clock& clock);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  void write(std::string_view event, const EventFields& fields = {});
  const std::string& path() const;
  uint64_t failedWrites() const;

 private:
  struct Impl;
  static Result<std::unique_ptr<EventLog>> openLog(const std::string& path, const Identity& identity, Clock& clock,
                                                   bool agent);
  explicit EventLog(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainsup
