// _trainsup_agent: the agent layer for the launcher (trainsup/launch/node_services.py, trainsup/launch/run.py):
// the job coordinator, the node monitor, the detector's defaults and the agent's event log. A separate extension
// module so that a training process, which imports only _trainsup, never maps libtrainsup_agent
// and its Boost.Asio servers (tests/python/test_layers.py checks it). Like _trainsup it includes
// no torch header.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <memory>
#include <utility>
#include <string>
#include <tuple>
#include <vector>

#include "py_status.h"
#include "trainsup/coordinator.h"
#include "trainsup/detector.h"
#include "trainsup/event_log.h"
#include "trainsup/config.h"
#include "trainsup/job_token.h"
#include "trainsup/node_monitor.h"

namespace py = pybind11;
using namespace trainsup;
using trainsup::python::raiseStatus;

namespace {

// The job coordinator for the launcher (trainsup/launch/node_services.py): verdicts are buffered here and
// taken by Python, so the coordinator's I/O thread never needs the GIL.
class PyCoordinator {
 public:
  PyCoordinator(int world, const std::string& token_hex, const std::string& bind, int port, double hang_floor_s,
                double heartbeat_timeout_s, double expect_within_s,
                const std::vector<std::tuple<int, int, std::string, std::string>>& known,
                const std::string& collective_budgets, double network_grace_s) {
    auto token = parseJobToken(token_hex);
    if (!token) raiseStatus(token.status());
    std::vector<RankInfo> ranks;
    for (int r = 0; r < world; ++r) ranks.push_back({r, 0, "", ""});
    for (const auto& [rank, local_rank, host, gpu] : known) {
      if (rank >= 0 && rank < world) ranks[rank] = {rank, local_rank, host, gpu};
    }
    CoordinatorOptions o;
    o.bind_address = bind;
    o.port = static_cast<uint16_t>(port);
    o.expect_ranks_within_s = expect_within_s;
    DetectorOptions d;
    d.hang_floor_s = hang_floor_s;
    d.heartbeat_timeout_s = heartbeat_timeout_s;
    d.network_grace_s = network_grace_s;
    if (Status s = parseOpBudgets(collective_budgets, d); !s.isOk()) raiseStatus(s);
    auto c = Coordinator::start(ranks, *token, o, d, [this](const Verdict& v) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        verdicts_.push_back(v);
      }
      verdict_cv_.notify_all();
    });
    if (!c) raiseStatus(c.status());
    coordinator_ = std::move(*c);
  }
  int port() const { return coordinator_->port(); }
  void setSlowHosts(std::vector<std::string> hosts) { coordinator_->setSlowHosts(std::move(hosts)); }
  // Blocks (the GIL released by the binding) until a verdict is waiting to be taken or
  // timeout_s passes; true when one is. The agent's services wait here between their ticks, so a
  // verdict is published as soon as the coordinator reaches it, not at the next tick.
  // wake() ends the current (or next) wait early, once, with or without a verdict: the agent's
  // services call it when they close, so that the end of a round does not wait out a tick.
  bool waitVerdicts(double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    verdict_cv_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, timeout_s)),
                         [this] { return !verdicts_.empty() || woken_; });
    woken_ = false;
    return !verdicts_.empty();
  }
  void wake() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      woken_ = true;
    }
    verdict_cv_.notify_all();
  }
  py::list takeVerdicts() {
    std::vector<Verdict> got;
    {
      std::lock_guard<std::mutex> lock(mu_);
      got.swap(verdicts_);
    }
    py::list out;
    for (const auto& v : got) {
      py::dict d;
      d["kind"] = verdictKindName(v.kind);
      d["ranks"] = v.ranks;
      d["hosts"] = v.hosts;
      d["local_ranks"] = v.local_ranks;
      d["gpus"] = v.gpus;
      d["seq"] = v.seq;
      d["op"] = v.op;
      d["group"] = v.group;
      d["other_op"] = v.other_op;
      d["section"] = v.section;
      d["step"] = v.step;
      d["evidence"] = v.evidence;
      d["onset_s"] = v.onset_s;
      out.append(d);
    }
    return out;
  }
  // Coordinator::snapshot() as plain Python values (see DetectorSnapshot in trainsup/detector.h).
  py::dict snapshot() const {
    DetectorSnapshot s = coordinator_->snapshot();
    py::list ranks;
    for (const auto& r : s.ranks) {
      py::dict d;
      d["rank"] = r.rank;
      d["host"] = r.host;
      d["step"] = r.step;
      d["section"] = r.section;
      d["step_s"] = r.step_s;
      d["silent_s"] = r.silent_s;
      d["dead"] = r.dead;
      d["finished"] = r.finished;
      ranks.append(d);
    }
    py::list oldest;
    for (const auto& o : s.oldest) {
      py::dict d;
      d["what"] = o.what;
      d["bytes"] = o.bytes;
      d["age_s"] = o.age_s;
      d["members"] = o.members;
      d["entered"] = o.entered;
      d["missing"] = o.missing;
      oldest.append(d);
    }
    py::dict out;
    out["ranks"] = ranks;
    out["oldest_open"] = oldest;
    out["open"] = s.open;
    return out;
  }
  std::vector<std::tuple<int, int, std::string, std::string>> knownRanks() const {
    std::vector<std::tuple<int, int, std::string, std::string>> out;
    for (const auto& r : coordinator_->knownRanks()) out.emplace_back(r.rank, r.local_rank, r.host, r.gpu);
    return out;
  }
  py::dict counters() const {
    auto c = coordinator_->counters();
    py::dict d;
    d["connections"] = c.connections;
    d["frames"] = c.frames;
    d["records"] = c.records;
    d["dropped_frames"] = c.dropped_frames;
    d["verdicts"] = c.verdicts;
    d["consequences"] = c.consequences;
    d["garbage_bytes"] = c.garbage_bytes;
    d["conflicting_records"] = c.conflicting_records;
    d["accept_errors"] = c.accept_errors;
    d["deposed_verdicts"] = c.deposed_verdicts;
    d["unknown_group_records"] = c.unknown_group_records;
    d["bad_group_claims"] = c.bad_group_claims;
    return d;
  }
  void stop() { coordinator_->stop(); }

 private:
  std::unique_ptr<Coordinator> coordinator_;
  std::mutex mu_;
  std::vector<Verdict> verdicts_;  // guarded by mu_
  std::condition_variable verdict_cv_;  // signalled when verdicts_ gains one, or by wake()
  bool woken_ = false;                  // guarded by mu_
};

class PyNodeMonitor {
 public:
  PyNodeMonitor(const std::string& socket_path, const std::string& host, int port, const std::string& token_hex,
                double forward_interval_s) {
    auto token = parseJobToken(token_hex);
    if (!token) raiseStatus(token.status());
    NodeMonitorOptions o;
    o.socket_path = socket_path;
    o.coordinator_host = host;
    o.coordinator_port = static_cast<uint16_t>(port);
    o.forward_interval_s = forward_interval_s;
    auto m = NodeMonitor::start(o, *token);
    if (!m) raiseStatus(m.status());
    monitor_ = std::move(*m);
  }
  void setCoordinator(const std::string& host, int port) {
    live().setCoordinator(host, static_cast<uint16_t>(port));
  }
  void abortLocalRanks(int culprit_rank, const std::string& kind, const std::string& host) {
    live().abortLocalRanks(culprit_rank, kind, host);
  }
  py::dict counters() const {
    auto c = live().counters();
    py::dict d;
    d["local_connections"] = c.local_connections;
    d["records_in"] = c.records_in;
    d["records_forwarded"] = c.records_forwarded;
    d["records_dropped"] = c.records_dropped;
    d["dropped_frames"] = c.dropped_frames;
    d["coordinator_connects"] = c.coordinator_connects;
    d["coordinator_connected"] = c.coordinator_connected;
    d["aborts_relayed"] = c.aborts_relayed;
    d["garbage_bytes"] = c.garbage_bytes;
    d["accept_errors"] = c.accept_errors;
    return d;
  }
  void stop() {
    std::unique_ptr<NodeMonitor> gone;
    {
      std::lock_guard<std::mutex> lock(mu_);
      gone = std::move(monitor_);
    }
  }

 private:
  // Other Python threads may still call in after stop(): they get an error, not a crash.
  NodeMonitor& live() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!monitor_) throw std::runtime_error("node monitor stopped");
    return *monitor_;
  }
  mutable std::mutex mu_;
  std::unique_ptr<NodeMonitor> monitor_;
};

// agent: the job coordinator and the node monitor, and their defaults
void bindAgent(py::module_& m) {
  {  // The job coordinator's defaults, one home: trainsup.run and NodeServices read them here.
    const DetectorOptions d;
    py::dict defaults;
    defaults["hang_floor_s"] = d.hang_floor_s;
    defaults["heartbeat_timeout_s"] = d.heartbeat_timeout_s;
    defaults["network_grace_s"] = d.network_grace_s;
    defaults["slow_link_multiplier"] = d.slow_link_multiplier;
    m.attr("DETECTOR_DEFAULTS") = defaults;
  }

  py::class_<PyCoordinator>(m, "Coordinator")
      .def(py::init<int, const std::string&, const std::string&, int, double, double, double,
                    const std::vector<std::tuple<int, int, std::string, std::string>>&, const std::string&, double>(),
           py::arg("world"), py::arg("token"), py::arg("bind") = "127.0.0.1", py::arg("port") = 0,
           py::arg("hang_floor_s") = 5.0, py::arg("heartbeat_timeout_s") = 5.0, py::arg("expect_within_s") = 0.0,
           py::arg("known_ranks") = std::vector<std::tuple<int, int, std::string, std::string>>{},
           py::arg("collective_budgets") = "", py::arg("network_grace_s") = DetectorOptions{}.network_grace_s)
      .def_property_readonly("port", &PyCoordinator::port)
      .def("take_verdicts", &PyCoordinator::takeVerdicts)
      .def("wait_verdicts", &PyCoordinator::waitVerdicts, py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>())
      .def("wake", &PyCoordinator::wake)
      .def("set_slow_hosts", &PyCoordinator::setSlowHosts, py::arg("hosts"))
      .def("known_ranks", &PyCoordinator::knownRanks)
      .def("snapshot", &PyCoordinator::snapshot)
      .def("counters", &PyCoordinator::counters)
      .def("stop", &PyCoordinator::stop, py::call_guard<py::gil_scoped_release>());
  py::class_<PyNodeMonitor>(m, "NodeMonitor")
      .def(py::init<const std::string&, const std::string&, int, const std::string&, double>(), py::arg("socket_path"),
           py::arg("host"), py::arg("port"), py::arg("token"), py::arg("forward_interval_s") = 0.05)
      .def("set_coordinator", &PyNodeMonitor::setCoordinator)
      .def("abort_local_ranks", &PyNodeMonitor::abortLocalRanks, py::arg("culprit_rank"), py::arg("kind"),
           py::arg("host"))
      .def("counters", &PyNodeMonitor::counters)
      .def("stop", &PyNodeMonitor::stop, py::call_guard<py::gil_scoped_release>());

  // The agent's event log (trainsup/launch/agent_events.py): lines in the ranks' format, by the same
  // writer (trainsup/event_log.h). Fields cross as (name, JSON text) pairs, in order; a write
  // releases the GIL (a hung file system must not hold the agent's other threads).
  py::class_<EventLog>(m, "AgentEventLog")
      .def(py::init([](const std::string& path, const std::string& host, const std::string& job_id) {
             Result<std::unique_ptr<EventLog>> log = Status::internal("unset");
             {
               py::gil_scoped_release release;  // opens a file: the file system may hang
               log = EventLog::openAgent(path, host, job_id, Clock::real());
             }
             if (!log) raiseStatus(log.status());
             return std::move(*log);
           }),
           py::arg("path"), py::arg("host"), py::arg("job_id"))
      .def("write", [](EventLog& log, const std::string& event,
                       const std::vector<std::pair<std::string, std::string>>& json_fields) {
        EventFields f;
        for (const auto& [k, v] : json_fields) f.emplace_back(k, RawJson{v});
        log.write(event, f);
      }, py::arg("event"), py::arg("json_fields"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("path", &EventLog::path)
      .def_property_readonly("failed_writes", &EventLog::failedWrites);

  // Raises InvalidArgumentError naming the bad entry of "allreduce=30,broadcast=120".
  m.def("check_collective_budgets", [](const std::string& text) {
    DetectorOptions d;
    if (Status s = parseOpBudgets(text, d); !s.isOk()) raiseStatus(s);
  });
}

}  // namespace

PYBIND11_MODULE(_trainsup_agent, m) {
  m.doc() = "trainsup's agent layer: job coordinator and node monitor (use trainsup.launch.node_services)";
  bindAgent(m);
}
