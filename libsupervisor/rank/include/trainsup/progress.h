// trainsup/progress.h — where the training loop is, readable by the watchdog without locks.
//
// Contract: one thread (the training loop) calls enter()/exit() — the hot path, a few relaxed
// atomic stores and no lock or allocation; any thread may call snapshot(), stats() and
// sectionName(). Sections nest up to kMaxDepth; the innermost open section is the one being
// timed, and a parent's elapsed time excludes the time spent in its children (so a long
// checkpoint inside a step does not count against the step's budget). Time outside any section
// is timed as section "idle" (between sections) or "startup" (before the first section).
// Each completed section (and each idle gap after the first section) is an observation; the
// first `warmup_count` observations of a section are counted but not learned from.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "trainsup/clock.h"
#include "trainsup/config.h"
#include "trainsup/export.h"
#include "trainsup/mutex.h"
#include "trainsup/status.h"

namespace trainsup {

using SectionId = int;
inline constexpr SectionId kStartupSection = 0;  // "startup": before the first section
inline constexpr SectionId kIdleSection = 1;     // "idle": between sections
inline constexpr SectionId kStepSection = 2;     // "step": Supervisor::step()
inline constexpr const char* kCheckpointSectionName = "checkpoint";  // Supervisor::checkpoint()

struct SectionStats {
  int64_t count = 0;          // completed observations
  int64_t learned_count = 0;  // observations after the warm-up
  Nanos max_learned{0};       // largest duration among the learned observations
};

class TRAINSUP_EXPORT ProgressTracker {
 public:
  static constexpr int kMaxSections = 64;
  static constexpr int kMaxDepth = 16;

  ProgressTracker(Nanos start, int warmup_count);
  ProgressTracker(const ProgressTracker&) = delete;
  ProgressTracker& operator=(const ProgressTracker&) = delete;

  // Returns the id for `name`, registering it on first use. Thread-safe; takes a lock.
  // InvalidArgument past kMaxSections distinct names or for an empty name.
  Result<SectionId> intern(std::string_view name);
  std::string sectionName(SectionId id) const;

  // Training thread only. enter() past kMaxDepth and exit() at depth 0 are bugs (logic_error).
  void enter(SectionId id, int64_t step, Nanos now);
  void exit(Nanos now);

  struct Snapshot {
    uint64_t generation = 0;  // changes on every enter/exit: equal snapshots = no progress
    int depth = 0;
    SectionId section = kStartupSection;  // innermost open section, or startup/idle at depth 0
    int64_t step = -1;                    // step of the innermost open section (-1: none)
    int64_t last_step = -1;               // last step number seen by enter()
    Nanos started{0};                     // when the innermost section (or the gap) began
    Nanos children{0};                    // time spent in its finished children
    Nanos elapsedAt(Nanos now) const { return now - started - children; }
  };
  Snapshot snapshot() const;
  SectionStats stats(SectionId id) const;
  // Seeds learned statistics (e.g. from a checkpoint's metadata, so a restart starts calibrated).
  void seedStats(SectionId id, const SectionStats& stats);

 private:
  struct Frame {
    std::atomic<int> id{0};
    std::atomic<int64_t> step{-1};
    std::atomic<int64_t> start_ns{0};
    std::atomic<int64_t> child_ns{0};
  };
  struct Stats {
    std::atomic<int64_t> count{0};
    std::atomic<int64_t> learned_count{0};
    std::atomic<int64_t> max_learned_ns{0};
  };
  void observe(SectionId id, Nanos duration);

  const int warmup_count_;
  // Seqlock: odd while the training thread is changing the fields below.
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> depth_{0};
  std::atomic<int64_t> gap_start_ns_;
  std::atomic<bool> any_section_{false};
  std::atomic<int64_t> last_step_{-1};
  std::array<Frame, kMaxDepth> frames_;
  std::array<Stats, kMaxSections> stats_;

  mutable Mutex names_mu_;
  std::array<std::string, kMaxSections> names_ TRAINSUP_GUARDED_BY(names_mu_);
  int name_count_ TRAINSUP_GUARDED_BY(names_mu_) = 0;
};

enum class BudgetKind { kExplicit, kWarmup, kLearned };
TRAINSUP_EXPORT const char* budgetKindName(BudgetKind kind);

struct Budget {
  Nanos limit{0};
  BudgetKind kind = BudgetKind::kWarmup;
};

// The budget rule (see BudgetPolicy in config.h). explicit_limit <= 0 means "none".
// "startup" is never learned: it gets warmup_s unless set explicitly.
TRAINSUP_EXPORT Budget computeBudget(SectionId id, const SectionStats& stats,
                                     const BudgetPolicy& policy, Nanos explicit_limit);

}  // namespace trainsup
