#include "trainsup/watchdog.h"
#include "trainsup/mutex.h"

#include <algorithm>
#include <stdexcept>

namespace trainsup {

Result<std::unique_ptr<Watchdog>> Watchdog::create(ProgressTracker& progress, Clock& clock,
                                                   WatchdogOptions options, Hooks hooks) {
  std::vector<Nanos> explicit_by_id(ProgressTracker::kMaxSections, Nanos(0));
  for (const auto& [name, seconds] : options.explicit_budgets_s) {
    auto id = progress.intern(name);
    if (!id) return id.status();
    explicit_by_id[*id] = fromSeconds(seconds);
  }
  if (options.interval.count() <= 0 || options.heartbeat_timeout <= options.interval) {
    return Status::invalidArgument("watchdog interval must be positive and below the heartbeat timeout");
  }
  return std::unique_ptr<Watchdog>(
      new Watchdog(progress, clock, std::move(options), std::move(hooks), std::move(explicit_by_id)));
}

Watchdog::Watchdog(ProgressTracker& progress, Clock& clock, WatchdogOptions options, Hooks hooks,
                   std::vector<Nanos> explicit_by_id)
    : progress_(progress),
      clock_(clock),
      options_(std::move(options)),
      hooks_(std::move(hooks)),
      explicit_by_id_(std::move(explicit_by_id)),
      heartbeat_changed_at_(clock.monotonicNow()) {}

Watchdog::~Watchdog() { stop(); }

void Watchdog::start() {
  MutexLock lock(mu_);
  if (started_) throw std::logic_error("trainsup::Watchdog::start() called twice");
  started_ = true;
  heartbeat_changed_at_ = clock_.monotonicNow();
  watch_thread_ = std::thread([this] { watchLoop(); });
  monitor_thread_ = std::thread([this] { monitorLoop(); });
}

void Watchdog::stop() {
  {
    MutexLock lock(mu_);
    if (stopping_ || !started_) {
      stopping_ = true;
      return;
    }
    stopping_ = true;
  }
  cv_.notifyAll();
  if (watch_thread_.joinable()) watch_thread_.join();
  if (monitor_thread_.joinable()) monitor_thread_.join();
}

Budget Watchdog::budgetFor(SectionId id) const {
  Nanos explicit_limit = (id >= 0 && id < static_cast<int>(explicit_by_id_.size())) ? explicit_by_id_[id] : Nanos(0);
  return computeBudget(id, progress_.stats(id), options_.policy, explicit_limit);
}

Watchdog::Check Watchdog::checkOnce() {
  Check check;
  ProgressTracker::Snapshot snap = progress_.snapshot();
  Nanos now = clock_.monotonicNow();
  StallReport& r = check.report;
  r.section_id = snap.section;
  r.step = snap.step >= 0 ? snap.step : snap.last_step;
  r.depth = snap.depth;
  r.elapsed = snap.elapsedAt(now);
  r.budget = budgetFor(snap.section);
  // The section may have ended while we computed: only a snapshot that is still current
  // (same generation, hence the same stats) may raise anything.
  if (progress_.snapshot().generation != snap.generation) return check;
  if (r.elapsed > r.budget.limit) {
    if (stalled_generation_ == snap.generation &&
        (stall_deferred_until_ns_ == 0 || now.count() < stall_deferred_until_ns_)) {
      return check;  // already reported (and not deferred, or not yet due again)
    }
    stalled_generation_ = snap.generation;
    stall_deferred_until_ns_ = 0;
    check.verdict = Verdict::kStall;
  } else if (static_cast<double>(r.elapsed.count()) >
             options_.policy.warn_fraction * static_cast<double>(r.budget.limit.count())) {
    if (warned_generation_ == snap.generation || options_.policy.warn_fraction >= 1.0) return check;
    warned_generation_ = snap.generation;
    check.verdict = Verdict::kWarn;
  } else {
    return check;
  }
  r.section = progress_.sectionName(snap.section);
  return check;
}

bool Watchdog::checkHeartbeatOnce() {
  if (fired_) return false;
  Nanos now = clock_.monotonicNow();
  int64_t deadline = abort_deadline_ns_.load(std::memory_order_acquire);
  if (deadline != 0) {
    // Aborting: the watchdog thread is busy dumping and running callbacks, so its heartbeat
    // is expected to stop; only the deadline matters now.
    if (now.count() < deadline) return false;
    fired_ = true;
    if (hooks_.on_abort_deadline) hooks_.on_abort_deadline();
    return true;
  }
  uint64_t hb = heartbeat_.load(std::memory_order_relaxed);
  if (hb != seen_heartbeat_) {
    seen_heartbeat_ = hb;
    heartbeat_changed_at_ = now;
    return false;
  }
  Nanos silent = now - heartbeat_changed_at_;
  if (silent <= options_.heartbeat_timeout) return false;
  fired_ = true;
  if (hooks_.on_unresponsive) hooks_.on_unresponsive(silent);
  return true;
}

void Watchdog::setAbortDeadline(Nanos deadline) {
  abort_deadline_ns_.store(std::max<int64_t>(deadline.count(), 1), std::memory_order_release);
  cv_.notifyAll();
}

void Watchdog::clearAbortDeadline() { abort_deadline_ns_.store(0, std::memory_order_release); }

void Watchdog::watchLoop() {
  MutexLock lock(mu_);
  for (;;) {
    if (cv_.waitFor(mu_, options_.interval, [this] { mu_.assertHeld(); return stopping_; })) return;
    lock.unlock();
    bumpHeartbeat();
    if (hooks_.on_tick) hooks_.on_tick();
    Check c = checkOnce();
    if (c.verdict == Verdict::kWarn && hooks_.on_warn) hooks_.on_warn(c.report);
    if (c.verdict == Verdict::kStall && hooks_.on_stall) hooks_.on_stall(c.report);
    lock.lock();
  }
}

void Watchdog::monitorLoop() {
  // Check often enough to honour the heartbeat timeout; once a stall is being handled, wake at
  // the abort deadline itself. stop() does not end this loop while an abort is under way: a
  // close() racing with a hung abort callback must not switch the deadline off.
  const Nanos period = std::min<Nanos>(options_.interval, options_.heartbeat_timeout / 4);
  auto aborting = [this] { return abort_deadline_ns_.load(std::memory_order_acquire) != 0; };
  MutexLock lock(mu_);
  for (;;) {
    Nanos wait = period;
    if (int64_t d = abort_deadline_ns_.load(std::memory_order_acquire); d != 0) {
      wait = std::clamp(Nanos(d) - clock_.monotonicNow(), Nanos(std::chrono::milliseconds(1)), period);
    }
    cv_.waitFor(mu_, wait, [&] { mu_.assertHeld(); return stopping_ && !aborting(); });
    if (stopping_ && !aborting()) return;
    lock.unlock();
    bool fired = checkHeartbeatOnce();
    lock.lock();
    if (fired && stopping_) return;
  }
}

}  // namespace trainsup
