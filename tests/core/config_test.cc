#include "trainsup/config.h"

#include <gtest/gtest.h>

namespace trainsup {
namespace {

Result<Config> load(std::map<std::string, std::string> vars) {
  return Config::fromEnvironment(Environment::fromMap(std::move(vars)));
}

void expectBad(std::map<std::string, std::string> vars, const std::string& var, const std::string& value) {
  auto c = load(vars);
  ASSERT_FALSE(c.isOk()) << var << "=" << value << " was accepted";
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(var), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find(value), std::string::npos) << c.status().message();
}

TEST(ConfigTest, DefaultsWithoutEnvironment) {
  auto c = load({});
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->identity.rank, 0);
  EXPECT_EQ(c->identity.world_size, 1);
  EXPECT_EQ(c->identity.job_id, "local");
  EXPECT_FALSE(c->identity.host.empty());
  EXPECT_EQ(c->stall_action, StallAction::kExit);
  EXPECT_DOUBLE_EQ(c->budgets.multiplier, 5.0);
  EXPECT_TRUE(c->watchdog_enabled);
}

TEST(ConfigTest, ReadsTorchrunVariables) {
  auto c = load({{"RANK", "5"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"},
                 {"GROUP_RANK", "1"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"},
                 {"TORCHELASTIC_RUN_ID", "run42"}, {"TORCHELASTIC_RESTART_COUNT", "3"}});
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  const Identity& id = c->identity;
  EXPECT_EQ(id.rank, 5);
  EXPECT_EQ(id.local_rank, 1);
  EXPECT_EQ(id.world_size, 8);
  EXPECT_EQ(id.local_world_size, 4);
  EXPECT_EQ(id.group_rank, 1);
  EXPECT_EQ(id.master_addr, "10.0.0.1");
  EXPECT_EQ(id.master_port, 29500);
  EXPECT_EQ(id.run_id, "run42");
  EXPECT_EQ(id.restart_count, 3);
  EXPECT_EQ(id.job_id, "run42");  // run id beats "local"
}

TEST(ConfigTest, NodeNameAndJobIdOverrides) {
  auto c = load({{"TRAINSUP_NODE_NAME", "node-b"}, {"SLURM_JOB_ID", "777"}});
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->identity.host, "node-b");
  EXPECT_EQ(c->identity.job_id, "777");
  c = load({{"TRAINSUP_JOB_ID", "mine"}, {"SLURM_JOB_ID", "777"}, {"TORCHELASTIC_RUN_ID", "r"}});
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->identity.job_id, "mine");
}

TEST(ConfigTest, ReadsTrainsupSettings) {
  auto c = load({{"TRAINSUP_LOG_DIR", "/tmp/x"}, {"TRAINSUP_LOG_LEVEL", "debug"}, {"TRAINSUP_LOG_STDERR", "off"},
                 {"TRAINSUP_WATCHDOG", "0"}, {"TRAINSUP_WATCHDOG_INTERVAL_S", "0.05"},
                 {"TRAINSUP_WATCHDOG_HEARTBEAT_TIMEOUT_S", "7"}, {"TRAINSUP_ABORT_GRACE_S", "3"},
                 {"TRAINSUP_STALL_ACTION", "warn"}, {"TRAINSUP_BUDGET_MULTIPLIER", "3"},
                 {"TRAINSUP_BUDGET_FLOOR_S", "1.5"}, {"TRAINSUP_BUDGET_WARMUP_COUNT", "0"},
                 {"TRAINSUP_BUDGET_WARMUP_S", "60"}, {"TRAINSUP_WARN_FRACTION", "0.75"},
                 {"TRAINSUP_SECTION_BUDGETS", " step=2 , eval=600.5,"}, {"TRAINSUP_HANDLE_SIGNALS", "no"}});
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->log_dir, "/tmp/x");
  EXPECT_EQ(c->log_level, LogLevel::kDebug);
  EXPECT_FALSE(c->log_to_stderr);
  EXPECT_FALSE(c->watchdog_enabled);
  EXPECT_DOUBLE_EQ(c->watchdog_interval_s, 0.05);
  EXPECT_DOUBLE_EQ(c->heartbeat_timeout_s, 7);
  EXPECT_DOUBLE_EQ(c->abort_grace_s, 3);
  EXPECT_EQ(c->stall_action, StallAction::kWarn);
  EXPECT_DOUBLE_EQ(c->budgets.multiplier, 3);
  EXPECT_DOUBLE_EQ(c->budgets.floor_s, 1.5);
  EXPECT_EQ(c->budgets.warmup_count, 0);
  EXPECT_DOUBLE_EQ(c->budgets.warmup_s, 60);
  EXPECT_DOUBLE_EQ(c->budgets.warn_fraction, 0.75);
  ASSERT_EQ(c->section_budgets_s.size(), 2u);
  EXPECT_DOUBLE_EQ(c->section_budgets_s.at("step"), 2);
  EXPECT_DOUBLE_EQ(c->section_budgets_s.at("eval"), 600.5);
  EXPECT_FALSE(c->handle_signals);
}

TEST(ConfigTest, NonNumericValuesNameTheVariable) {
  expectBad({{"RANK", "abc"}}, "RANK", "'abc'");
  expectBad({{"WORLD_SIZE", "4x"}}, "WORLD_SIZE", "'4x'");
  expectBad({{"MASTER_PORT", "http"}}, "MASTER_PORT", "'http'");
  expectBad({{"TRAINSUP_WATCHDOG_INTERVAL_S", "fast"}}, "TRAINSUP_WATCHDOG_INTERVAL_S", "'fast'");
  expectBad({{"TRAINSUP_BUDGET_FLOOR_S", "nan"}}, "TRAINSUP_BUDGET_FLOOR_S", "'nan'");
  expectBad({{"TRAINSUP_WATCHDOG", "maybe"}}, "TRAINSUP_WATCHDOG", "'maybe'");
  expectBad({{"TRAINSUP_SECTION_BUDGETS", "step=abc"}}, "TRAINSUP_SECTION_BUDGETS[step]", "'abc'");
  expectBad({{"TRAINSUP_SECTION_BUDGETS", "step"}}, "TRAINSUP_SECTION_BUDGETS", "'step'");
}

TEST(ConfigTest, NegativeValuesNameTheVariable) {
  expectBad({{"RANK", "-1"}}, "RANK", "'-1'");
  expectBad({{"LOCAL_RANK", "-2"}}, "LOCAL_RANK", "'-2'");
  expectBad({{"TORCHELASTIC_RESTART_COUNT", "-1"}}, "TORCHELASTIC_RESTART_COUNT", "'-1'");
  expectBad({{"TRAINSUP_ABORT_GRACE_S", "-3"}}, "TRAINSUP_ABORT_GRACE_S", "'-3'");
  expectBad({{"TRAINSUP_BUDGET_WARMUP_COUNT", "-5"}}, "TRAINSUP_BUDGET_WARMUP_COUNT", "'-5'");
  expectBad({{"TRAINSUP_SECTION_BUDGETS", "step=-2"}}, "TRAINSUP_SECTION_BUDGETS[step]", "'-2'");
  expectBad({{"MASTER_PORT", "70000"}}, "MASTER_PORT", "'70000'");
}

TEST(ConfigTest, UnknownEnumWordsNameTheVariable) {
  expectBad({{"TRAINSUP_LOG_LEVEL", "loud"}}, "TRAINSUP_LOG_LEVEL", "'loud'");
  expectBad({{"TRAINSUP_STALL_ACTION", "reboot"}}, "TRAINSUP_STALL_ACTION", "'reboot'");
  expectBad({{"TRAINSUP_CHECKPOINT_BUSY_POLICY", "queue"}}, "TRAINSUP_CHECKPOINT_BUSY_POLICY", "'queue'");
  expectBad({{"TRAINSUP_CHECKPOINT_SNAPSHOT", "lazy"}}, "TRAINSUP_CHECKPOINT_SNAPSHOT", "'lazy'");
  expectBad({{"TRAINSUP_CHECKPOINT_FORMAT", "safetensors"}}, "TRAINSUP_CHECKPOINT_FORMAT", "'safetensors'");
}

TEST(ConfigTest, TheLaunchersRoundWinsOverTorchrunsPerAgentRestartCount) {
  EXPECT_EQ(load({{"TORCHELASTIC_RESTART_COUNT", "3"}})->identity.restart_count, 3);
  EXPECT_EQ(load({{"TORCHELASTIC_RESTART_COUNT", "0"}, {"TRAINSUP_RESTART_COUNT", "2"}})->identity.restart_count, 2);
}

TEST(ConfigTest, ReadsCheckpointSnapshotMode) {
  EXPECT_EQ(load({})->checkpoint.snapshot, SnapshotMode::kBlocking);
  auto c = load({{"TRAINSUP_CHECKPOINT_SNAPSHOT", "overlapped"}});
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->checkpoint.snapshot, SnapshotMode::kOverlapped);
  EXPECT_EQ(load({})->checkpoint.format, "auto");
  EXPECT_EQ(load({{"TRAINSUP_CHECKPOINT_FORMAT", " dcp "}})->checkpoint.format, "dcp");
}

TEST(ConfigTest, CrossFieldRules) {
  expectBad({{"RANK", "4"}, {"WORLD_SIZE", "4"}}, "RANK", "4");
  expectBad({{"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}, "LOCAL_RANK", "2");
  expectBad({{"TRAINSUP_NODE_NAME", "bad/host"}}, "TRAINSUP_NODE_NAME", "'bad/host'");
  expectBad({{"TRAINSUP_WARN_FRACTION", "1.5"}}, "TRAINSUP_WARN_FRACTION", "1.5");
  expectBad({{"TRAINSUP_WATCHDOG_INTERVAL_S", "5"}, {"TRAINSUP_WATCHDOG_HEARTBEAT_TIMEOUT_S", "2"}},
            "TRAINSUP_WATCHDOG_HEARTBEAT_TIMEOUT_S", "2");
}

TEST(ConfigTest, CodeOverridesAreValidatedToo) {
  auto c = load({});
  ASSERT_TRUE(c.isOk());
  Config cfg = *c;
  cfg.identity.rank = 3;  // world_size stays 1
  Status s = cfg.validate();
  EXPECT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("rank"), std::string::npos);
  cfg.identity.rank = 0;
  cfg.section_budgets_s["eval"] = 0;
  EXPECT_FALSE(cfg.validate().isOk());
}

// Issue 14, defect 3: one parser for TRAINSUP_COORDINATOR, and it checks the port. Before,
// "host:70000" became port 4464 (a cast) and a 20-digit port threw out of Supervisor::create.
TEST(ConfigTest, CoordinatorAddressesAreParsedOnceAndPortsChecked) {
  auto tcp = parseCoordinatorAddress("10.0.0.7:29500");
  ASSERT_TRUE(tcp.isOk()) << tcp.status().toString();
  EXPECT_EQ(tcp->host, "10.0.0.7");
  EXPECT_EQ(tcp->port, 29500);
  auto unix_socket = parseCoordinatorAddress("unix:/tmp/x.sock");
  ASSERT_TRUE(unix_socket.isOk());
  EXPECT_EQ(unix_socket->unix_path, "/tmp/x.sock");
  for (const char* bad : {"host:70000", "host:0", "host:99999999999999999999", "host:", ":80", "host", "unix:",
                          "host:8o"}) {
    auto r = parseCoordinatorAddress(bad);
    ASSERT_FALSE(r.isOk()) << bad;
    EXPECT_NE(r.status().message().find("TRAINSUP_COORDINATOR"), std::string::npos) << r.status().toString();
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().toString();
  }
  Config cfg;
  cfg.identity.host = "node-1";
  cfg.coordinator = "host:70000";
  cfg.job_token = std::string(32, 'a');
  Status s = cfg.validate();
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("outside 1..65535"), std::string::npos) << s.toString();
}

}  // namespace
}  // namespace trainsup
