// An out-of-tree launcher that runs trainsup's job coordinator (trainsup::agent) on a free port.
#include <iostream>

#include "trainsup/coordinator.h"

int main() {
  trainsup::JobToken token{};
  token.fill(7);
  std::vector<trainsup::RankInfo> ranks(2);
  ranks[0].host = ranks[1].host = "consumer-host";
  ranks[1].rank = ranks[1].local_rank = 1;
  auto coordinator = trainsup::Coordinator::start(ranks, token, {}, {}, [](const trainsup::Verdict&) {});
  if (!coordinator) {
    std::cerr << coordinator.status().toString() << "\n";
    return 1;
  }
  uint16_t port = (*coordinator)->port();
  (*coordinator)->stop();
  std::cout << "consumer started a coordinator for 2 ranks on port " << port << "\n";
  return port != 0 ? 0 : 1;
}
