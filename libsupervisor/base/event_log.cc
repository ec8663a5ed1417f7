#include "trainsup/event_log.h"
#include "trainsup/mutex.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>

namespace trainsup {

struct EventLog::Impl {
  // Set at construction.
  std::string path;
  Identity identity;
  Clock* clock;
  int fd;
  int pid;
  bool agent;  // a launcher agent's log: no rank fields

  Mutex mu;
  uint64_t seq TRAINSUP_GUARDED_BY(mu) = 0;
  std::atomic<uint64_t> failed{0};
};

namespace {

std::string isoTime(WallTime t) {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  time_t secs = static_cast<time_t>(us / 1000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[48];
  size_t n = std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof(buf) - n, ".%06lldZ", static_cast<long long>(us % 1000000));
  return buf;
}

}  // namespace

Result<std::unique_ptr<EventLog>> EventLog::openLog(const std::string& path, const Identity& identity, Clock& clock,
                                                    bool agent) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Status::ioError("cannot open event log '" + path + "': " + std::strerror(errno));
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->identity = identity;
  impl->clock = &clock;
  impl->fd = fd;
  impl->pid = static_cast<int>(getpid());
  impl->agent = agent;
  return std::unique_ptr<EventLog>(new EventLog(std::move(impl)));
}

Result<std::unique_ptr<EventLog>> EventLog::open(const std::string& path, const Identity& identity, Clock& clock) {
  return openLog(path, identity, clock, /*agent=*/false);
}

Result<std::unique_ptr<EventLog>> EventLog::openAgent(const std::string& path, const std::string& host,
                                                      const std::string& job_id, Clock& clock) {
  Identity identity;
  identity.host = host;
  identity.job_id = job_id;
  return openLog(path, identity, clock, /*agent=*/true);
}

EventLog::EventLog(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EventLog::~EventLog() {
  if (impl_ && impl_->fd >= 0) ::close(impl_->fd);
}

const std::string& EventLog::path() const { return impl_->path; }
uint64_t EventLog::failedWrites() const { return impl_->failed.load(); }

void EventLog::write(std::string_view event, const EventFields& fields) {
  Impl& m = *impl_;
  nlohmann::ordered_json j;
  WallTime wall = m.clock->wallNow();
  j["ts"] = isoTime(wall);
  const double wall_s = std::chrono::duration<double>(wall.time_since_epoch()).count();
  j["wall_s"] = wall_s;
  if (m.agent) j["time"] = wall_s;
  j["mono_ns"] = m.clock->monotonicNow().count();
  j["host"] = m.identity.host;
  if (!m.agent) {
    j["rank"] = m.identity.rank;
    j["local_rank"] = m.identity.local_rank;
    j["world_size"] = m.identity.world_size;
  }
  j["pid"] = m.pid;
  j["job_id"] = m.identity.job_id;
  if (!m.agent) j["restart"] = m.identity.restart_count;
  j["seq"] = 0;
  j["event"] = std::string(event);
  for (const EventField& f : fields) {
    // The common fields identify the line: a caller's field of the same name goes beside them.
    const std::string key = j.contains(f.key()) ? "field_" + f.key() : f.key();
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, RawJson>) {
            auto parsed = nlohmann::ordered_json::parse(v.text, nullptr, /*allow_exceptions=*/false);
            // Invalid JSON from a caller is kept as text rather than breaking the line.
            if (parsed.is_discarded()) {
              j[key] = v.text;
            } else {
              j[key] = std::move(parsed);
            }
          } else {
            j[key] = v;
          }
        },
        f.value());
  }
  MutexLock lock(m.mu);
  j["seq"] = m.seq++;
  // Invalid UTF-8 (e.g. from a thread name) is replaced rather than thrown on.
  std::string line = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  line.push_back('\n');
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(m.fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (m.failed.fetch_add(1) == 0) {
        std::fprintf(stderr, "trainsup: cannot write event log '%s': %s (further failures are counted only)\n",
                     m.path.c_str(), std::strerror(errno));
      }
      return;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace trainsup
