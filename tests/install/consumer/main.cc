#include <iostream>

#include "trainsup/supervisor.h"
#include "trainsup/version.h"

int main() {
  auto config = trainsup::Config::fromEnvironment();
  if (!config) {
    std::cerr << config.status().toString() << "\n";
    return trainsup::kExitBadConfig;
  }
  auto sup = trainsup::Supervisor::create(*config);
  if (!sup) {
    std::cerr << sup.status().toString() << "\n";
    return 1;
  }
  for (int64_t s = 0; s < 10; ++s) {
    auto scope = (*sup)->step(s);
  }
  std::cout << "consumer linked trainsup " << trainsup::kVersionString << " and ran 10 supervised steps\n";
  return (*sup)->progress().stats(trainsup::kStepSection).count == 10 ? 0 : 1;
}
