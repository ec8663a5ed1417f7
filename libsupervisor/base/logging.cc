#include "base/logging.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace trainsup {
namespace {

spdlog::level::level_enum toSpd(LogLevel l) {
  switch (l) {
    case LogLevel::kTrace: return spdlog::level::trace;
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarn: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
  }
  return spdlog::level::info;
}

}  // namespace

Result<RankLogger> openRankLogger(const Config& config, const std::string& path) {
  std::vector<spdlog::sink_ptr> sinks;
  try {
    sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false));
  } catch (const spdlog::spdlog_ex& e) {
    return Status::ioError("cannot open rank log '" + path + "': " + e.what());
  }
  if (config.log_to_stderr) sinks.push_back(std::make_shared<spdlog::sinks::stderr_sink_mt>());
  // Not registered globally: the application's own spdlog setup stays untouched.
  auto logger = std::make_shared<spdlog::logger>("trainsup", sinks.begin(), sinks.end());
  // Host and rank are literal text in the pattern; '%' in them would be a pattern flag.
  std::string who = "host=" + config.identity.host + " rank=" + std::to_string(config.identity.rank);
  std::string escaped;
  for (char c : who) {
    if (c == '%') escaped += '%';
    escaped += c;
  }
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] [trainsup " + escaped + "] %v");
  logger->set_level(toSpd(config.log_level));
  // Lines must survive SIGKILL and _exit(); info and above are rare enough to flush each.
  logger->flush_on(spdlog::level::info);
  return RankLogger{std::move(logger), path};
}

}  // namespace trainsup
