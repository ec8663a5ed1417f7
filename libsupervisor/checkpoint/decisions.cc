// Decision points: rank 0 decides when to save (every N steps or T seconds, or a stop), the
// others read its decision through the commit channel; every rank acts at the same step.
#include "checkpoint/checkpointer_impl.h"

namespace trainsup {

using namespace checkpoint_internal;

// A stop request of a rank other than 0 goes to rank 0 as a count under <base>/stop, read at its
// decision points (a failure to say it leaves the stop to the supervisor's fallback).
void Checkpointer::Impl::announceStop() {
  if (!stop_local || stop_announced || identity.world_size <= 1 || identity.rank == 0) return;
  stop_announced = true;
  if (auto r = channel->add(key_base + "/stop", 1); !r) {
    log(LogLevel::kWarn, "could not tell rank 0 that this rank was asked to stop: " + r.status().message());
  }
}

void Checkpointer::requestStop() {
  Impl& m = *impl_;
  if (m.stop_local) return;
  m.stop_local = true;
  if (m.identity.world_size <= 1) m.stop_agreed.store(true);
}

bool Checkpointer::stopAgreed() const { return impl_->stop_agreed.load(); }

// Decision points: rank 0 decides, the others read its decision. With one rank, no channel.
Result<Checkpointer::Impl::Action> Checkpointer::Impl::decide(int64_t step, bool explicit_save) {
  const Nanos now = clock->monotonicNow();
  const bool multi = identity.world_size > 1;
  // A step at or below the last one saved or restored is never saved again: that would
  // rewrite a committed checkpoint in place (rank 0 decides this too, for everyone).
  const bool already = step <= last_snapshot_step;
  if (!multi) {
    if (already || (!explicit_save && !localDue(step, now))) return Action::kNone;
    return (isBusy() && options.busy_policy == BusyPolicy::kSkip) ? Action::kSkip : Action::kSave;
  }
  const int64_t seq = ++decision_seq;
  const std::string key = key_base + "/decision/" + std::to_string(seq);
  std::string value;
  if (identity.rank == 0) {
    Action a = Action::kNone;
    if (!already && (explicit_save || localDue(step, now))) {
      a = (isBusy() && options.busy_policy == BusyPolicy::kSkip) ? Action::kSkip : Action::kSave;
    }
    // Space the next decision point about kDecisionSpacingS apart (or a tenth of the interval).
    if (last_decision_step >= 0 && step > last_decision_step) {
      double step_s = toSeconds(now - last_decision_time) / static_cast<double>(step - last_decision_step);
      double target = options.interval_s > 0 ? std::min(kDecisionSpacingS, options.interval_s / 10) : kDecisionSpacingS;
      if (step_s > 0) sync_steps = static_cast<int>(std::clamp(std::floor(target / step_s), 1.0, 10000.0));
    }
    // Stop when this rank, or any other (through the channel), was asked to.
    bool stop = stop_local;
    if (!stop) {
      auto n = channel->add(key_base + "/stop", 0);
      stop = n && *n > 0;
    }
    value = std::string(a == Action::kSave ? "save" : a == Action::kSkip ? "skip" : "none") + " " +
            std::to_string(sync_steps) + (stop ? " stop" : "");
    if (Status s = channel->set(key, value); !s.isOk()) return s;
    if (seq > 2) channel->remove(key_base + "/decision/" + std::to_string(seq - 2));
  } else {
    auto got = channel->get(key, commitTimeout());
    if (!got) return Status(got.status().code(), "checkpoint decision from rank 0: " + got.status().message());
    value = *got;
  }
  last_decision_time = now;
  last_decision_step = step;
  size_t sp = value.find(' ');
  std::string word = value.substr(0, sp);
  if (sp != std::string::npos) sync_steps = std::max(1, std::atoi(value.c_str() + sp + 1));
  if (value.find(" stop") != std::string::npos && !stop_agreed.exchange(true)) {
    event("stop_agreed", {{"step", step}});
    log(LogLevel::kWarn, "every rank stops after step " + std::to_string(step) + " (a rank was asked to stop)");
  }
  if (word == "save") return Action::kSave;
  if (word == "skip") return Action::kSkip;
  return Action::kNone;
}

}  // namespace trainsup
