// _trainsup_torch: trainsup's c10d Backend wrapper for Python (torch-version-specific). Built
// against the torch of the environment and with torch's own pybind11 headers, linked with
// torch_python, so that torch.distributed's ProcessGroup and Backend objects convert here.
// Import torch.distributed before this module.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

#include <string>
#include <vector>

#include "trainsup/tracking_backend.h"

namespace py = pybind11;

PYBIND11_MODULE(_trainsup_torch, m) {
  m.doc() = "trainsup's c10d Backend wrapper that feeds the collective tracker";
  m.attr("BUILT_WITH_TORCH") = TORCH_VERSION;
  py::module::import("torch.distributed");  // registers c10d::ProcessGroup and Backend with pybind11
  // Its destructor releases the GIL, as torch's own Backend bindings do: destroying the wrapper
  // destroys the real backend, and ~ProcessGroupGloo joins worker threads that may need the GIL
  // to free a collective's tensors (a deadlock, seen in PyTorch's DDP tests, when the last
  // reference went away in Python).
  static_assert(PYBIND11_VERSION_HEX >= 0x020C0000,
                "trainsup needs torch's pybind11 >= 2.12 (py::release_gil_before_calling_cpp_dtor)");
  py::class_<trainsup::TrackingBackend, c10d::Backend, c10::intrusive_ptr<trainsup::TrackingBackend>>(
      m, "TrackingBackend", py::release_gil_before_calling_cpp_dtor(),
      "A c10d Backend in front of the real one; every collective is recorded in the tracker")
      .def_property_readonly("inner", &trainsup::TrackingBackend::inner,
                             "the real backend (ProcessGroupGloo, ProcessGroupNCCL, ...)");
  m.def(
      "track_process_group",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group, std::vector<int> global_ranks, const std::string& desc) {
        return trainsup::trackProcessGroup(*group, trainsup::CollectiveTracker::global(),
                                           trainsup::CompletionWatcher::global(), std::move(global_ranks), desc);
      },
      py::arg("group"), py::arg("global_ranks") = std::vector<int>{}, py::arg("desc") = "",
      "Puts the tracking wrapper in front of each device type's backend of `group` and registers this "
      "rank's membership (group id from the group's name); returns how many device types it wrapped now "
      "(0 when already tracked). global_ranks: the members' global ranks by group rank (empty: the group "
      "of all ranks); desc: the group's description (default: the group's own, e.g. 'mesh_tp').");
  m.def("hold_tracked_backends_until_exit", &trainsup::holdTrackedBackendsUntilExit,
        py::call_guard<py::gil_scoped_release>(),
        "At interpreter exit: keeps the tracked backends alive until the process ends, so that none "
        "is destroyed (joining gloo's threads) while the interpreter is torn down.");
  // Store.compare_set of some torch versions' Python binding builds its bytes result with the
  // GIL released, which corrupts the interpreter when other Python threads run (seen as
  // segfaults in the launcher's agents on torch 1.13). This one holds the GIL for everything
  // Python.
  m.def(
      "store_compare_set",
      [](const c10::intrusive_ptr<c10d::Store>& store, const std::string& key, const std::string& expected,
         const std::string& desired) {
        std::vector<uint8_t> value;
        {
          py::gil_scoped_release release;
          value = store->compareSet(key, std::vector<uint8_t>(expected.begin(), expected.end()),
                                    std::vector<uint8_t>(desired.begin(), desired.end()));
        }
        return py::bytes(reinterpret_cast<const char*>(value.data()), value.size());
      },
      py::arg("store"), py::arg("key"), py::arg("expected"), py::arg("desired"));
}
