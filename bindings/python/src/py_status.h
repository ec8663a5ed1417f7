// Status values across the Python boundary, shared by the extension modules (_trainsup and
// _trainsup_agent): one Python exception class per status code (trainsup/errors.py), so
// callers catch by type and never by searching a message.
#pragma once

#include <pybind11/pybind11.h>

#include <initializer_list>

#include "trainsup/status.h"

namespace trainsup::python {

// Raises the Python exception of the status's code; trainsup.errors.Error if the code has none.
[[noreturn]] inline void raiseStatus(const Status& s) {
  namespace py = pybind11;
  py::object errors = py::module_::import("trainsup.errors");
  py::object cls = errors.attr("BY_CODE").attr("get")(statusCodeName(s.code()), errors.attr("Error"));
  PyErr_SetString(cls.ptr(), s.message().c_str());
  throw py::error_already_set();
}

// Whether a Python exception is one of trainsup's errors of these codes ("Corruption", ...).
inline bool isStatusError(pybind11::error_already_set& e, std::initializer_list<const char*> codes) {
  pybind11::object errors = pybind11::module_::import("trainsup.errors");
  for (const char* code : codes) {
    if (e.matches(errors.attr("BY_CODE")[code])) return true;
  }
  return false;
}

}  // namespace trainsup::python
