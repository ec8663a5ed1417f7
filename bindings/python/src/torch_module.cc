// _trainsup_torch: the process-group wrapper for Python (torch-version-specific; built against
// the installed torch and linked with torch_python so that torch.distributed's ProcessGroup
// objects convert to c10d::ProcessGroup here). Import torch.distributed before this module.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

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
}
