// Internal: the rank's spdlog logger. Every line reads
//   [2026-12-02 10:30:01.123] [error] [trainsup host=nodeA rank=3] message
// on stderr (optional) and in `<log_dir>/<job>-<host>-r<rank>.log`. Not a public header:
// users log through Supervisor::log(), so spdlog stays a private dependency.
#pragma once

#include <memory>
#include <string>

#include "trainsup/config.h"
#include "trainsup/status.h"

namespace spdlog {
class logger;
}

namespace trainsup {

struct RankLogger {
  std::shared_ptr<spdlog::logger> logger;
  std::string path;
};

// Creates the file (appending) and the logger. IoError names the path it could not open.
Result<RankLogger> openRankLogger(const Config& config, const std::string& path);

}  // namespace trainsup
