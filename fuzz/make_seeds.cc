// trainsup_fuzz_seeds DIR: writes the seed corpora of fuzz/seeds.h into DIR/<target>/seed-N.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "seeds.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: trainsup_fuzz_seeds DIR\n";
    return 2;
  }
  namespace fs = std::filesystem;
  auto write = [&](const std::string& target, const std::vector<std::string>& seeds) {
    fs::path dir = fs::path(argv[1]) / target;
    fs::create_directories(dir);
    for (size_t i = 0; i < seeds.size(); ++i) {
      std::ofstream(dir / ("seed-" + std::to_string(i)), std::ios::binary) << seeds[i];
    }
    std::cout << target << ": " << seeds.size() << " seeds\n";
    return !seeds.empty();
  };
  bool ok = write("telemetry_frame", trainsup::fuzz::telemetryFrameSeeds());
  ok = write("checkpoint", trainsup::fuzz::checkpointSeeds()) && ok;
  return ok ? 0 : 1;
}
