#include "trainsup/event_log.h"

#include "../test_util.h"
#include "base/manual_clock.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

namespace trainsup {
namespace {

std::string tempDir() {
  std::string dir = testing::tempDir("trainsup_test");
  std::filesystem::create_directories(dir);
  return dir;
}

std::vector<nlohmann::json> readLines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(EventLogTest, EveryLineCarriesIdentityAndTimes) {
  ManualClock clock;
  Identity id;
  id.host = "node-a";
  id.rank = 3;
  id.local_rank = 1;
  id.world_size = 8;
  id.job_id = "job7";
  id.restart_count = 2;
  std::string path = tempDir() + "/e.jsonl";
  auto log = EventLog::open(path, id, clock);
  ASSERT_TRUE(log.isOk()) << log.status().toString();
  (*log)->write("stall", {{"section", "step"}, {"step", 12}, {"elapsed_s", 2.5}, {"ok", false},
                          {"nested", RawJson{"{\"a\":[1,2]}"}}});
  clock.advance(std::chrono::seconds(1));
  (*log)->write("exit", {{"code", 91}});
  auto lines = readLines(path);
  ASSERT_EQ(lines.size(), 2u);
  const auto& e = lines[0];
  EXPECT_EQ(e["event"], "stall");
  EXPECT_EQ(e["host"], "node-a");
  EXPECT_EQ(e["rank"], 3);
  EXPECT_EQ(e["local_rank"], 1);
  EXPECT_EQ(e["world_size"], 8);
  EXPECT_EQ(e["job_id"], "job7");
  EXPECT_EQ(e["restart"], 2);
  EXPECT_EQ(e["pid"], getpid());
  EXPECT_EQ(e["seq"], 0);
  EXPECT_EQ(e["section"], "step");
  EXPECT_EQ(e["step"], 12);
  EXPECT_DOUBLE_EQ(e["elapsed_s"].get<double>(), 2.5);
  EXPECT_EQ(e["ok"], false);
  EXPECT_EQ(e["nested"]["a"][1], 2);
  EXPECT_EQ(e["ts"].get<std::string>().size(), std::string("2023-11-14T22:13:20.000000Z").size());
  EXPECT_EQ(lines[1]["seq"], 1);
  EXPECT_EQ(lines[1]["mono_ns"].get<int64_t>() - e["mono_ns"].get<int64_t>(), 1'000'000'000);
  EXPECT_NEAR(lines[1]["wall_s"].get<double>() - e["wall_s"].get<double>(), 1.0, 1e-6);
}

// A launcher agent's log is written by the same code: the same common fields, without a rank's.
TEST(EventLogTest, AnAgentsLinesHaveTheSameFormatWithoutTheRankFields) {
  ManualClock clock;
  std::string path = tempDir() + "/agent.jsonl";
  auto log = EventLog::openAgent(path, "host-b", "run9", clock);
  ASSERT_TRUE(log.isOk()) << log.status().toString();
  (*log)->write("verdict", {{"round", 2}, {"hosts", RawJson{"[\"host-a\"]"}}, {"host", "not-the-agent"}});
  auto lines = readLines(path);
  ASSERT_EQ(lines.size(), 1u);
  const auto& e = lines[0];
  EXPECT_EQ(e["event"], "verdict");
  EXPECT_EQ(e["host"], "host-b");
  EXPECT_EQ(e["field_host"], "not-the-agent") << "a field never replaces the line's identity";
  EXPECT_EQ(e["job_id"], "run9");
  EXPECT_EQ(e["pid"], getpid());
  EXPECT_EQ(e["seq"], 0);
  EXPECT_EQ(e["round"], 2);
  EXPECT_EQ(e["hosts"][0], "host-a");
  EXPECT_DOUBLE_EQ(e["time"].get<double>(), e["wall_s"].get<double>());
  EXPECT_TRUE(e.contains("ts") && e.contains("mono_ns"));
  for (const char* rank_field : {"rank", "local_rank", "world_size", "restart"}) {
    EXPECT_FALSE(e.contains(rank_field)) << rank_field;
  }
}

TEST(EventLogTest, ConcurrentWritersProduceWholeLines) {
  Identity id;
  id.host = "h";
  id.job_id = "j";
  std::string path = tempDir() + "/e.jsonl";
  auto log = EventLog::open(path, id, Clock::real());
  ASSERT_TRUE(log.isOk());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) (*log)->write("tick", {{"thread", t}, {"i", i}, {"pad", std::string(200, 'x')}});
    });
  }
  for (auto& th : threads) th.join();
  auto lines = readLines(path);  // throws on a torn line
  ASSERT_EQ(lines.size(), 2000u);
  std::set<int64_t> seqs;
  for (const auto& l : lines) seqs.insert(l["seq"].get<int64_t>());
  EXPECT_EQ(seqs.size(), 2000u);
}

TEST(EventLogTest, UnopenablePathIsAnIoErrorNamingIt) {
  Identity id;
  auto log = EventLog::open("/proc/nonexistent/dir/e.jsonl", id, Clock::real());
  ASSERT_FALSE(log.isOk());
  EXPECT_EQ(log.status().code(), StatusCode::kIoError);
  EXPECT_NE(log.status().message().find("/proc/nonexistent/dir/e.jsonl"), std::string::npos);
}

TEST(EventLogTest, AFullDiskCountsFailuresWithoutThrowing) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  Identity id;
  auto log = EventLog::open("/dev/full", id, Clock::real());
  ASSERT_TRUE(log.isOk());
  (*log)->write("a");
  (*log)->write("b");
  EXPECT_EQ((*log)->failedWrites(), 2u);
}

}  // namespace
}  // namespace trainsup

namespace trainsup {
namespace {

TEST(EventLogTest, InvalidRawJsonIsKeptAsText) {
  Identity id;
  std::string path = tempDir() + "/e.jsonl";
  auto log = EventLog::open(path, id, Clock::real());
  ASSERT_TRUE(log.isOk());
  (*log)->write("x", {{"bad", RawJson{"{not json"}}, {"host", "spoofed"}, {"event", "other"}});
  auto lines = readLines(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["bad"], "{not json");
  // A caller's field never replaces the identifying ones.
  EXPECT_EQ(lines[0]["event"], "x");
  EXPECT_EQ(lines[0]["field_host"], "spoofed");
  EXPECT_EQ(lines[0]["field_event"], "other");
}

}  // namespace
}  // namespace trainsup
