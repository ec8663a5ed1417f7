#include "trainsup/progress.h"
#include "trainsup/mutex.h"

#include <algorithm>
#include <stdexcept>

namespace trainsup {

namespace {
constexpr auto kRelaxed = std::memory_order_relaxed;
}

ProgressTracker::ProgressTracker(Nanos start, int warmup_count)
    : warmup_count_(warmup_count), gap_start_ns_(start.count()) {
  names_[kStartupSection] = "startup";
  names_[kIdleSection] = "idle";
  names_[kStepSection] = "step";
  name_count_ = 3;
}

Result<SectionId> ProgressTracker::intern(std::string_view name) {
  if (name.empty()) return Status::invalidArgument("section name must not be empty");
  MutexLock lock(names_mu_);
  for (int i = 0; i < name_count_; ++i) {
    if (names_[i] == name) return i;
  }
  if (name_count_ == kMaxSections) {
    return Status::invalidArgument("section '" + std::string(name) + "': more than " +
                                   std::to_string(kMaxSections) + " distinct section names");
  }
  names_[name_count_] = std::string(name);
  return name_count_++;
}

std::string ProgressTracker::sectionName(SectionId id) const {
  MutexLock lock(names_mu_);
  if (id < 0 || id >= name_count_) return "section#" + std::to_string(id);
  return names_[id];
}

// Writer side of the seqlock: generation is odd while fields change. The training thread is
// the only writer, so plain load+store on the counters is enough.
void ProgressTracker::enter(SectionId id, int64_t step, Nanos now) {
  int d = depth_.load(kRelaxed);
  if (d == kMaxDepth) throw std::logic_error("trainsup: sections nested deeper than 16");
  if (id < 0 || id >= kMaxSections) throw std::logic_error("trainsup: invalid section id");
  uint64_t g = generation_.load(kRelaxed);
  generation_.store(g + 1, kRelaxed);
  std::atomic_thread_fence(std::memory_order_release);
  if (d == 0) {
    // The gap before this section was "idle" (or "startup" before the first section).
    if (any_section_.load(kRelaxed)) observe(kIdleSection, now - Nanos(gap_start_ns_.load(kRelaxed)));
    any_section_.store(true, kRelaxed);
  }
  Frame& f = frames_[d];
  f.id.store(id, kRelaxed);
  f.step.store(step, kRelaxed);
  f.start_ns.store(now.count(), kRelaxed);
  f.child_ns.store(0, kRelaxed);
  if (step >= 0) last_step_.store(step, kRelaxed);
  depth_.store(d + 1, kRelaxed);
  generation_.store(g + 2, std::memory_order_release);
}

void ProgressTracker::exit(Nanos now) {
  int d = depth_.load(kRelaxed);
  if (d == 0) throw std::logic_error("trainsup: section exit without a matching enter");
  uint64_t g = generation_.load(kRelaxed);
  generation_.store(g + 1, kRelaxed);
  std::atomic_thread_fence(std::memory_order_release);
  Frame& f = frames_[d - 1];
  int64_t inclusive = now.count() - f.start_ns.load(kRelaxed);
  observe(f.id.load(kRelaxed), Nanos(inclusive - f.child_ns.load(kRelaxed)));
  if (d > 1) {
    Frame& parent = frames_[d - 2];
    parent.child_ns.store(parent.child_ns.load(kRelaxed) + inclusive, kRelaxed);
  } else {
    gap_start_ns_.store(now.count(), kRelaxed);
  }
  depth_.store(d - 1, kRelaxed);
  generation_.store(g + 2, std::memory_order_release);
}

void ProgressTracker::observe(SectionId id, Nanos duration) {
  Stats& s = stats_[id];
  int64_t n = s.count.load(kRelaxed) + 1;
  s.count.store(n, kRelaxed);
  if (n <= warmup_count_) return;
  // Max before count: a reader that sees the new count also sees a max that includes it.
  if (duration.count() > s.max_learned_ns.load(kRelaxed)) s.max_learned_ns.store(duration.count(), kRelaxed);
  s.learned_count.store(s.learned_count.load(kRelaxed) + 1, std::memory_order_release);
}

ProgressTracker::Snapshot ProgressTracker::snapshot() const {
  Snapshot s;
  for (;;) {
    uint64_t g1 = generation_.load(std::memory_order_acquire);
    if (g1 & 1) continue;  // a writer is mid-update; it finishes in nanoseconds
    s.generation = g1;
    s.depth = depth_.load(kRelaxed);
    s.last_step = last_step_.load(kRelaxed);
    if (s.depth == 0) {
      s.section = any_section_.load(kRelaxed) ? kIdleSection : kStartupSection;
      s.step = -1;
      s.started = Nanos(gap_start_ns_.load(kRelaxed));
      s.children = Nanos(0);
    } else {
      const Frame& f = frames_[s.depth - 1];
      s.section = f.id.load(kRelaxed);
      s.step = f.step.load(kRelaxed);
      s.started = Nanos(f.start_ns.load(kRelaxed));
      s.children = Nanos(f.child_ns.load(kRelaxed));
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (generation_.load(kRelaxed) == g1) return s;
  }
}

SectionStats ProgressTracker::stats(SectionId id) const {
  SectionStats out;
  if (id < 0 || id >= kMaxSections) return out;
  const Stats& s = stats_[id];
  out.count = s.count.load(kRelaxed);
  out.learned_count = s.learned_count.load(std::memory_order_acquire);
  out.max_learned = Nanos(s.max_learned_ns.load(kRelaxed));
  return out;
}

void ProgressTracker::seedStats(SectionId id, const SectionStats& stats) {
  if (id < 0 || id >= kMaxSections) throw std::logic_error("trainsup: invalid section id");
  Stats& s = stats_[id];
  s.count.store(stats.count, kRelaxed);
  s.learned_count.store(stats.learned_count, kRelaxed);
  s.max_learned_ns.store(stats.max_learned.count(), kRelaxed);
}

const char* budgetKindName(BudgetKind kind) {
  switch (kind) {
    case BudgetKind::kExplicit: return "explicit";
    case BudgetKind::kWarmup: return "warm-up";
    case BudgetKind::kLearned: return "learned";
  }
  return "?";
}

Budget computeBudget(SectionId id, const SectionStats& stats, const BudgetPolicy& policy, Nanos explicit_limit) {
  if (explicit_limit.count() > 0) return {explicit_limit, BudgetKind::kExplicit};
  if (id == kStartupSection || stats.learned_count == 0) return {fromSeconds(policy.warmup_s), BudgetKind::kWarmup};
  Nanos learned = Nanos(static_cast<int64_t>(static_cast<double>(stats.max_learned.count()) * policy.multiplier));
  return {std::max(learned, fromSeconds(policy.floor_s)), BudgetKind::kLearned};
}

}  // namespace trainsup
