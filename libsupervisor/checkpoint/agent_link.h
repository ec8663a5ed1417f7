// checkpoint/agent_link.h (internal) — a rank's requests to its host's launcher agent about
// in-memory snapshots (docs/snapshots.md, "The agent's snapshot service").
//
// One TCP connection per request: a JSON line out, a JSON line back ({"ok": true, ...} or
// {"ok": false, "error": "..."}). Every request carries the agents' token. Blocking, with a
// deadline; called on the checkpointer's writer thread (replicate) and the training thread
// during restore (fetch). Thread-safe (no shared state).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainsup/clock.h"
#include "trainsup/status.h"

namespace trainsup::checkpoint_internal {

class AgentLink {
 public:
  AgentLink(std::string address, std::string token) : address_(std::move(address)), token_(std::move(token)) {}
  bool configured() const { return !address_.empty(); }
  const std::string& address() const { return address_; }

  // The agent copies `file` (a path relative to the snapshot directory) to a peer host's agent,
  // which verifies every checksum before it answers. Returns that peer's host name, or "" when
  // the round has no other host.
  Result<std::string> replicate(const std::string& file, Nanos timeout) const;
  // The agent brings `file` into this host's snapshot directory from the first of `hosts` that
  // has a copy that verifies (empty: any host of the current round). NotFound, naming every
  // host tried and why, when none has.
  Status fetch(const std::string& file, const std::vector<std::string>& hosts, Nanos timeout) const;

 private:
  Result<nlohmann::json> call(nlohmann::json request, Nanos timeout) const;
  std::string address_;
  std::string token_;
};

}  // namespace trainsup::checkpoint_internal
