// _trainsup: the C++ supervisor for Python. The watchdog runs on its own C++ threads and never
// takes the GIL, so it catches a rank stuck while holding the GIL. Blocking calls release it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include "trainsup/exit_codes.h"
#include "trainsup/supervisor.h"
#include "trainsup/version.h"

namespace py = pybind11;
using trainsup::Supervisor;

namespace {

// A Python context manager around a C++ Scope.
class PyScope {
 public:
  PyScope(Supervisor* sup, std::optional<int64_t> step, std::string section)
      : sup_(sup), step_(step), section_(std::move(section)) {}
  PyScope& enter() {
    if (scope_) throw std::logic_error("trainsup: this scope was already entered");
    scope_.emplace(step_ ? sup_->step(*step_) : sup_->section(section_));
    return *this;
  }
  void exit(py::object, py::object, py::object) { scope_.reset(); }

 private:
  Supervisor* sup_;
  std::optional<int64_t> step_;
  std::string section_;
  std::optional<Supervisor::Scope> scope_;
};

// Settings given as TRAINSUP_*/torchrun variable names take precedence over the environment.
std::unique_ptr<Supervisor> create(std::map<std::string, std::string> overrides) {
  trainsup::Environment process = trainsup::Environment::process();
  trainsup::Environment env([&](const std::string& name) -> std::optional<std::string> {
    auto it = overrides.find(name);
    if (it != overrides.end()) return it->second.empty() ? std::nullopt : std::optional<std::string>(it->second);
    return process.get(name);
  });
  auto config = trainsup::Config::fromEnvironment(env);
  if (!config) throw py::value_error(config.status().message());
  auto sup = Supervisor::create(*config);
  if (!sup) throw std::runtime_error(sup.status().toString());
  return std::move(*sup);
}

}  // namespace

PYBIND11_MODULE(_trainsup, m) {
  m.doc() = "trainsup C++ core (use the `trainsup` package)";
  m.attr("__version__") = trainsup::kVersionString;
  m.attr("EXIT_STOP_REQUESTED") = trainsup::kExitStopRequested;
  m.attr("EXIT_STALL") = trainsup::kExitStall;
  m.attr("EXIT_WATCHDOG_UNRESPONSIVE") = trainsup::kExitWatchdogUnresponsive;
  m.attr("EXIT_BAD_CONFIG") = trainsup::kExitBadConfig;

  py::class_<PyScope>(m, "Scope")
      .def("__enter__", &PyScope::enter, py::return_value_policy::reference)
      .def("__exit__", &PyScope::exit);

  py::class_<Supervisor>(m, "Supervisor")
      .def(py::init(&create), py::arg("overrides"))
      .def("step", [](Supervisor& s, int64_t n) { return PyScope(&s, n, ""); }, py::keep_alive<0, 1>())
      .def("section", [](Supervisor& s, std::string name) { return PyScope(&s, std::nullopt, std::move(name)); },
           py::keep_alive<0, 1>())
      .def_property_readonly("stop_requested", &Supervisor::stopRequested)
      .def("log", [](Supervisor& s, const std::string& level, const std::string& msg) {
        trainsup::LogLevel l = level == "debug" ? trainsup::LogLevel::kDebug
                               : level == "warn" ? trainsup::LogLevel::kWarn
                               : level == "error" ? trainsup::LogLevel::kError
                                                  : trainsup::LogLevel::kInfo;
        s.log(l, msg);
      })
      .def("event", [](Supervisor& s, const std::string& name, const std::map<std::string, std::string>& fields) {
        trainsup::EventFields f;
        for (const auto& [k, v] : fields) f.emplace_back(k, v);
        s.event(name, f);
      }, py::arg("name"), py::arg("fields") = std::map<std::string, std::string>{})
      .def_property_readonly("host", [](Supervisor& s) { return s.identity().host; })
      .def_property_readonly("rank", [](Supervisor& s) { return s.identity().rank; })
      .def_property_readonly("log_file", &Supervisor::logFilePath)
      .def_property_readonly("event_log", &Supervisor::eventLogPath)
      .def("close", &Supervisor::close, py::call_guard<py::gil_scoped_release>());
}
