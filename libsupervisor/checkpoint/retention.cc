// Retention: which checkpoint directories to remove after a commit (never the newest valid one,
// never one newer than the commit), and removing them.
#include "checkpoint/checkpointer_impl.h"

namespace trainsup {

using namespace checkpoint_internal;

void Checkpointer::Impl::applyRetention(int64_t committed_step) {
  auto plan = planRetention(*fs, options.dir, options.keep, committed_step);
  if (!plan) {
    log(LogLevel::kWarn, "checkpoint retention skipped: " + plan.status().message());
    return;
  }
  for (int64_t step : plan->remove) {
    Status s = removeCheckpoint(*fs, stepDir(step));
    event("checkpoint_removed", {{"step", step}, {"dir", stepDir(step)}, {"ok", s.isOk()}, {"error", s.message()}});
    if (!s.isOk()) log(LogLevel::kWarn, "retention could not remove " + stepDir(step) + ": " + s.message());
  }
}


Result<RetentionPlan> planRetention(FileSystem& fs, const std::string& dir, int keep, int64_t committed_step) {
  auto names = fs.listDir(dir);
  if (!names) return names.status();
  std::vector<int64_t> steps;
  for (const auto& n : *names) {
    auto s = parseCheckpointDirName(n);
    // Directories newer than what was just committed are not ours to judge (a skipped,
    // possibly corrupt checkpoint of an earlier attempt): they neither count nor go.
    if (s && *s <= committed_step) steps.push_back(*s);
  }
  std::sort(steps.rbegin(), steps.rend());
  RetentionPlan plan;
  bool seen_valid = false;
  for (int64_t step : steps) {
    const std::string d = joinPath(dir, checkpointDirName(step));
    const bool valid = checkCheckpoint(fs, d, step).isOk();  // as restore sees it, short of the data
    if (step == committed_step || (valid && static_cast<int>(plan.keep.size()) < keep)) {
      plan.keep.push_back(step);  // the just-committed one is always kept
      seen_valid = seen_valid || valid || step == committed_step;
    } else if (seen_valid) {
      plan.remove.push_back(step);  // older than the newest valid: a surplus or a broken one
    }
  }
  return plan;
}

Status removeCheckpoint(FileSystem& fs, const std::string& step_dir) {
  if (Status s = fs.removeFile(joinPath(step_dir, kManifestName)); !s.isOk()) return s;
  if (Status s = fs.syncDir(step_dir); !s.isOk() && s.code() != StatusCode::kIoError) return s;
  auto names = fs.listDir(step_dir);
  if (!names) return names.status().code() == StatusCode::kNotFound ? Status::ok() : names.status();
  for (const auto& n : *names) {
    if (Status s = fs.removeFile(joinPath(step_dir, n)); !s.isOk()) return s;
  }
  return fs.removeDir(step_dir);
}

}  // namespace trainsup
