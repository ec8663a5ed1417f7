// _trainsup_torch: the process-group wrapper for Python (torch-version-specific; built against
// the installed torch and linked with torch_python so that torch.distributed's ProcessGroup
// objects convert to c10d::ProcessGroup here). Import torch.distributed before this module.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <vector>

#include "trainsup/tracking_process_group.h"

namespace py = pybind11;

PYBIND11_MODULE(_trainsup_torch, m) {
  m.doc() = "trainsup's c10d process-group wrapper that feeds the collective tracker";
  py::module::import("torch.distributed");  // registers c10d::ProcessGroup with pybind11
  py::class_<trainsup::TrackingProcessGroup, c10d::ProcessGroup, c10::intrusive_ptr<trainsup::TrackingProcessGroup>>(
      m, "TrackingProcessGroup")
      .def(py::init([](const c10::intrusive_ptr<c10d::ProcessGroup>& inner) {
             return c10::make_intrusive<trainsup::TrackingProcessGroup>(inner);
           }),
           py::arg("inner"))
      .def_property_readonly("inner", &trainsup::TrackingProcessGroup::inner);
  // Store.compare_set of torch 1.13's Python binding builds its bytes result with the GIL
  // released, which corrupts the interpreter when other Python threads run (seen as
  // segfaults in the launcher's agents). This one holds the GIL for everything Python.
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
