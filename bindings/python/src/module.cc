// _trainsup: the C++ supervisor for Python. The watchdog runs on its own C++ threads and never
// takes the GIL, so it catches a rank stuck while holding the GIL. Calls that block or copy
// (close, checkpoint snapshots, restore reads) release the GIL. This file includes no torch
// header: tensors cross as (pointer, size, dtype, shape, device) tuples, and the c10d store as
// any Python object with set/get/add/delete methods, so one build serves every torch version.
// One bind function per layer of libsupervisor that a rank uses (bindBase ... bindRank), in
// layer order; the agent layer is _trainsup_agent (agent_module.cc), which ranks never load.
#include <Python.h>
#include <fcntl.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <optional>
#include <thread>

#include "trainsup/checkpointer.h"
#include "trainsup/collective_tracker.h"
#include "trainsup/completion_watcher.h"
#include "trainsup/config.h"
#include "trainsup/exit_codes.h"
#include "trainsup/nccl.h"
#include "trainsup/supervisor.h"
#include "trainsup/version.h"
#include "py_status.h"

// CPython's own all-threads traceback dump (what faulthandler uses from its watchdog thread):
// it reads the thread states without the GIL and writes with write(2).
extern "C" const char* _Py_DumpTracebackThreads(int fd, PyInterpreterState* interp, PyThreadState* current_tstate);

namespace py = pybind11;
using namespace trainsup;
using trainsup::python::isStatusError;
using trainsup::python::raiseStatus;

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

// Every Python thread's stack, without the GIL, into a memory file, read back as text.
std::string dumpPythonStacks() {
  int fd = memfd_create("trainsup-pystacks", MFD_CLOEXEC);
  if (fd < 0) return "(cannot create a memory file for the Python dump)";
  const char* err = _Py_DumpTracebackThreads(fd, nullptr, nullptr);
  std::string text;
  off_t size = lseek(fd, 0, SEEK_END);
  if (size > 0) {
    text.resize(static_cast<size_t>(size));
    ssize_t got = pread(fd, text.data(), text.size(), 0);
    text.resize(got > 0 ? static_cast<size_t>(got) : 0);
  }
  close(fd);
  if (err != nullptr) text += std::string("(") + err + ")\n";
  return text;
}

// Whether the interpreter is being torn down. A thread of ours must not take the GIL then: Python
// ends any thread but the finalizing one that does (pthread_exit), and unwinding through a C++
// destructor (noexcept) on the way ends the whole process with "terminate called without an
// active exception" (issue 19). What such a thread would release is leaked instead.
bool interpreterFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return !Py_IsInitialized() || Py_IsFinalizing();
#else
  return !Py_IsInitialized() || _Py_IsFinalizing();
#endif
}

// A CommitChannel over a Python object with set(key, str), get(key, timeout_s) -> str,
// add(key, int) -> int and remove(key): trainsup.PyStoreChannel wraps a c10d store so.
class PyChannel final : public CommitChannel {
 public:
  explicit PyChannel(py::object target) : target_(std::move(target)) {}
  ~PyChannel() override {
    if (interpreterFinalizing()) {
      target_.release();  // leaked: the process is ending
      return;
    }
    py::gil_scoped_acquire gil;
    target_ = py::object();
  }
  Status set(const std::string& key, const std::string& value) override {
    return call("set", key, [&] { target_.attr("set")(key, value); });
  }
  Result<std::string> get(const std::string& key, Nanos timeout) override {
    std::string out;
    Status s = call("get", key, [&] { out = target_.attr("get")(key, toSeconds(timeout)).cast<std::string>(); });
    if (!s.isOk()) return s;
    return out;
  }
  Result<int64_t> add(const std::string& key, int64_t delta) override {
    int64_t v = 0;
    Status s = call("add", key, [&] { v = target_.attr("add")(key, delta).cast<int64_t>(); });
    if (!s.isOk()) return s;
    return v;
  }
  Status remove(const std::string& key) override { return call("remove", key, [&] { target_.attr("remove")(key); }); }

 private:
  template <class F>
  Status call(const char* op, const std::string& key, F&& f) {
    if (interpreterFinalizing()) {
      return Status::unavailable(std::string("store ") + op + " '" + key + "': the Python interpreter is shutting down");
    }
    py::gil_scoped_acquire gil;
    try {
      f();
      return Status::ok();
    } catch (py::error_already_set& e) {
      std::string msg = std::string("store ") + op + " '" + key + "': " + e.what();
      bool timeout = e.matches(PyExc_TimeoutError) || msg.find("imeout") != std::string::npos;
      return timeout ? Status::timedOut(msg) : Status::unavailable(msg);
    }
  }
  py::object target_;
};

// A shard for Python readers: its index, and checksummed reads into caller memory.
class PyShard {
 public:
  PyShard(const ShardReader* reader, std::unique_ptr<ShardReader> owner = nullptr)
      : reader_(reader), owner_(std::move(owner)), valid_(std::make_shared<bool>(true)) {}
  // A shard lent to a restore callback is only valid during the callback.
  std::shared_ptr<bool> validity() const { return valid_; }
  py::list entries() const {
    check();
    py::list out;
    for (const auto& e : reader_->info().tensors) {
      py::dict d;
      d["name"] = e.meta.name;
      d["dtype"] = dtypeName(e.meta.dtype);
      d["shape"] = e.meta.shape;
      d["nbytes"] = e.length;
      out.append(d);
    }
    return out;
  }
  void readInto(const std::string& name, uintptr_t address, size_t nbytes) const {
    check();
    const TensorEntry* e = reader_->find(name);
    if (e == nullptr) throw py::key_error("'" + name + "' is not in " + reader_->path());
    Status s;
    {
      py::gil_scoped_release release;
      s = reader_->read(*e, reinterpret_cast<void*>(address), nbytes);
    }
    if (!s.isOk()) raiseStatus(s);
  }
  int rank() const { return reader_->info().rank; }
  int worldSize() const { return reader_->info().world_size; }
  int64_t step() const { return reader_->info().step; }
  std::string path() const { return reader_->path(); }

 private:
  void check() const {
    if (!*valid_) throw std::runtime_error("trainsup: this shard was lent to a restore callback that has returned");
  }
  const ShardReader* reader_;
  std::shared_ptr<ShardReader> owner_;
  std::shared_ptr<bool> valid_;
};

py::dict manifestDict(const Manifest& m) {
  py::dict d;
  d["step"] = m.step;
  d["world_size"] = m.world_size;
  d["created_unix_s"] = m.created_unix_s;
  d["library_version"] = m.library_version;
  d["job_id"] = m.job_id;
  d["metadata"] = m.metadata;
  py::list shards;
  for (const auto& s : m.shards) {
    py::dict sd;
    sd["rank"] = s.rank;
    sd["file"] = s.file;
    sd["size"] = s.size;
    shards.append(sd);
  }
  d["shards"] = shards;
  return d;
}

// Settings given as TRAINSUP_*/torchrun variable names take precedence over the environment.
// Destroying a Supervisor joins its threads, and the checkpoint writer may need the GIL to
// finish a commit through the Python store channel: never hold the GIL while deleting.
struct ReleaseGilDelete {
  void operator()(Supervisor* s) const {
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      delete s;
    } else {
      delete s;
    }
  }
};

std::unique_ptr<Supervisor, ReleaseGilDelete> create(std::map<std::string, std::string> overrides) {
  Environment process = Environment::process();
  Environment env([&](const std::string& name) -> std::optional<std::string> {
    auto it = overrides.find(name);
    if (it != overrides.end()) return it->second.empty() ? std::nullopt : std::optional<std::string>(it->second);
    return process.get(name);
  });
  auto config = Config::fromEnvironment(env);
  if (!config) raiseStatus(config.status());
  Result<std::unique_ptr<Supervisor>> sup = Status::internal("unset");
  {
    py::gil_scoped_release release;  // opens the log files, starts the threads
    sup = Supervisor::create(*config);
  }
  if (!sup) raiseStatus(sup.status());
  (*sup)->addStackDumpHook("python", dumpPythonStacks);
  return std::unique_ptr<Supervisor, ReleaseGilDelete>(sup->release());
}

std::string outcomeName(Checkpointer::Outcome o) {
  switch (o) {
    case Checkpointer::Outcome::kNotDue: return "not_due";
    case Checkpointer::Outcome::kStarted: return "started";
    case Checkpointer::Outcome::kSkippedBusy: return "skipped_busy";
  }
  return "?";
}

// collect() returns (buffers, metadata); buffers are (name, dtype, shape, address, nbytes,
// device) tuples whose memory the Python side keeps alive until save() returns.
// Returns (outcome, error of an earlier background persist or ""): a failed persist (a full
// disk) fails that checkpoint only, so Python gets a warning, not an exception.
std::pair<std::string, std::string> save(Supervisor& sup, int64_t step, const py::function& collect, bool now) {
  py::object keep;  // the Python result, alive until the copy is done
  Checkpointer::Collect c = [&](std::vector<BufferRef>& buffers, std::map<std::string, std::string>& meta) -> Status {
    py::gil_scoped_acquire gil;
    try {
      auto tier = meta.find("trainsup.tier");
      keep = collect(tier == meta.end() ? std::string("disk") : tier->second);
      auto tup = keep.cast<py::tuple>();
      for (auto item : tup[0].cast<py::list>()) {
        auto t = item.cast<py::tuple>();
        BufferRef r;
        r.meta.name = t[0].cast<std::string>();
        auto dt = dtypeFromName(t[1].cast<std::string>());
        if (!dt) return Status::invalidArgument("'" + r.meta.name + "': unknown dtype " + t[1].cast<std::string>());
        r.meta.dtype = *dt;
        r.meta.shape = t[2].cast<std::vector<int64_t>>();
        r.data = reinterpret_cast<const void*>(t[3].cast<uintptr_t>());
        r.nbytes = t[4].cast<size_t>();
        r.device = t[5].cast<int>();
        buffers.push_back(std::move(r));
      }
      for (auto kv : tup[1].cast<py::dict>()) meta[kv.first.cast<std::string>()] = kv.second.cast<std::string>();
      return Status::ok();
    } catch (py::error_already_set& e) {
      // Out of memory or an OS error (staging copies, a file a state reads) is the resource's
      // failure, not the state's: IoError; anything else (a state trainsup cannot save) is bad input.
      const std::string what = std::string("collecting the state: ") + e.what();
      if (e.matches(PyExc_OSError) || e.matches(PyExc_MemoryError)) return Status::ioError(what);
      return Status::invalidArgument(what);
    }
  };
  Result<Checkpointer::Outcome> r = Status::internal("unset");
  Status earlier;
  {
    py::gil_scoped_release release;
    // Taken after the save (which first awaits an outstanding copy): a persist that ends while
    // this save waits for it (busy policy "wait") is a warning too.
    r = sup.save(step, c, now, &earlier);
  }
  keep = py::object();
  if (!r) raiseStatus(r.status());
  return {outcomeName(*r), earlier.isOk() ? std::string() : earlier.toString()};
}

std::optional<int64_t> restore(Supervisor& sup, const py::function& load) {
  Checkpointer::Load l = [&](const Manifest& m, const ShardReader& shard) -> Status {
    py::gil_scoped_acquire gil;
    PyShard lent(&shard);
    auto valid = lent.validity();
    struct Expire {
      std::shared_ptr<bool> v;
      ~Expire() { *v = false; }
    } expire{valid};
    try {
      load(lent, manifestDict(m));
      return Status::ok();
    } catch (py::error_already_set& e) {
      // Only trainsup's own read errors (checksums, short files) mean "this checkpoint is bad,
      // try an older one". Anything else — the state does not match, out of memory, a bug in a
      // load_state_dict — stops the restore on every rank instead of silently falling back.
      std::string what = e.what();
      if (isStatusError(e, {"Corruption", "IoError"})) return Status::corruption(what);
      return Status::invalidArgument(what);
    }
  };
  Result<std::optional<int64_t>> r = Status::internal("unset");
  {
    py::gil_scoped_release release;
    r = sup.restore(l);
  }
  if (!r) raiseStatus(r.status());
  return *r;
}

// A Python object kept by callbacks that trainsup's own threads run and drop: whichever drops
// the last reference takes the GIL to release it (leaked if the interpreter is going away).
template <class T>
std::shared_ptr<T> heldFromThreads(T obj) {
  return std::shared_ptr<T>(new T(std::move(obj)), [](T* f) {
    if (interpreterFinalizing()) {
      f->release();  // leaked: see interpreterFinalizing()
      delete f;
      return;
    }
    py::gil_scoped_acquire gil;
    delete f;
  });
}

// Checkpointer::PersistHook over a Python callable persist(step_dir, step) -> [(name, bytes)],
// run on the writer thread with the GIL. Its exceptions fail that checkpoint: trainsup's own
// IoError/Corruption keep their code; anything else is an I/O error of the data writer.
Checkpointer::PersistHook persistHook(py::object fn) {
  auto held = heldFromThreads(std::move(fn));
  return [held](const std::string& dir, int64_t step) -> Result<std::vector<std::pair<std::string, std::string>>> {
    if (interpreterFinalizing()) return Status::unavailable("the Python interpreter is shutting down");
    py::gil_scoped_acquire gil;
    try {
      std::vector<std::pair<std::string, std::string>> out;
      for (auto item : (*held)(dir, step)) {
        auto t = item.cast<py::tuple>();
        out.emplace_back(t[0].cast<std::string>(), t[1].cast<std::string>());
      }
      return out;
    } catch (py::error_already_set& e) {
      if (isStatusError(e, {"Corruption"})) return Status::corruption(e.what());
      return Status::ioError(e.what());
    }
  };
}

// base: version, exit codes, the settings a rank reads
void bindBase(py::module_& m) {
  m.attr("__version__") = kVersionString;
  m.attr("EXIT_STOP_REQUESTED") = kExitStopRequested;
  m.attr("EXIT_STALL") = kExitStall;
  m.attr("EXIT_WATCHDOG_UNRESPONSIVE") = kExitWatchdogUnresponsive;
  m.attr("EXIT_BAD_CONFIG") = kExitBadConfig;
  m.attr("EXIT_ABORTED") = kExitAborted;
  m.attr("EXIT_QUARANTINED") = kExitQuarantined;
  m.attr("EXIT_DO_NOT_REQUEUE") = kExitDoNotRequeue;
  m.attr("EXIT_REQUEUE") = kExitRequeue;
  m.def("exit_code_name", &exitCodeName, py::arg("code"));
  m.attr("SETTING_VARIABLES") = Config::variableNames();  // what a rank reads, in order
}

// device: NCCL communicators made outside torch
void bindDevice(py::module_& m) {
  // NCCL communicators made outside torch (an ncclComm_t as an integer address) join the list the
  // Supervisor aborts on its abort paths (trainsup/nccl.h); scripts/gpu_check.py uses them.
  m.def("_register_nccl_communicator", [](uintptr_t comm) { registerNcclCommunicator(reinterpret_cast<void*>(comm)); });
  m.def("_unregister_nccl_communicator",
        [](uintptr_t comm) { unregisterNcclCommunicator(reinterpret_cast<void*>(comm)); });
  m.def("_nccl_status", [] { return loadNccl().toString(); });
}

// checkpoint: shards, manifests, the one validity check, directory names
void bindCheckpoint(py::module_& m) {
  py::class_<PyShard>(m, "Shard")
      .def("entries", &PyShard::entries)
      .def("read_into", &PyShard::readInto, py::arg("name"), py::arg("address"), py::arg("nbytes"))
      .def_property_readonly("rank", &PyShard::rank)
      .def_property_readonly("world_size", &PyShard::worldSize)
      .def_property_readonly("step", &PyShard::step)
      .def_property_readonly("path", &PyShard::path);

  // Every call below that reads files releases the GIL while it does: the launcher calls them
  // on torchrun's thread, and a slow or hung checkpoint file system must not stop its other
  // threads (the keep-alives: a peer would take this healthy host for dead; issue 19).
  m.def("read_manifest", [](const std::string& dir) {
    Result<Manifest> r = Status::internal("unset");
    {
      py::gil_scoped_release release;
      r = readManifest(FileSystem::posix(), dir);
    }
    if (!r) raiseStatus(r.status());
    return manifestDict(*r);
  }, py::arg("dir"));
  // The one definition of a valid checkpoint (checkpoint_format.h): raises the typed error of
  // the first thing wrong, else returns the manifest.
  m.def("check_checkpoint", [](const std::string& dir) {
    Result<Manifest> r = Status::internal("unset");
    {
      py::gil_scoped_release release;
      auto manifest = readManifest(FileSystem::posix(), dir);
      r = manifest ? checkCheckpoint(FileSystem::posix(), dir, manifest->step) : Result<Manifest>(manifest.status());
    }
    if (!r) raiseStatus(r.status());
    const std::string name = dir.substr(dir.find_last_of('/') + 1);
    if (auto s = parseCheckpointDirName(name); s && *s != r->step) {
      raiseStatus(Status::corruption("the manifest is of step " + std::to_string(r->step) + ", its directory '" + dir +
                                     "' of step " + std::to_string(*s)));
    }
    return manifestDict(*r);
  }, py::arg("dir"));
  m.def("newest_valid_checkpoint", [](const std::string& root) {
    Result<NewestCheckpoint> r = Status::internal("unset");
    {
      py::gil_scoped_release release;
      r = newestValidCheckpoint(FileSystem::posix(), root);
    }
    if (!r) raiseStatus(r.status());
    py::dict d;
    d["step"] = r->step;
    d["dir"] = r->dir;
    d["skipped"] = r->skipped;
    return d;
  }, py::arg("root"));
  m.def("open_shard", [](const std::string& path) {
    Result<std::unique_ptr<ShardReader>> r = Status::internal("unset");
    {
      py::gil_scoped_release release;
      r = ShardReader::open(FileSystem::posix(), path);
    }
    if (!r) raiseStatus(r.status());
    const ShardReader* raw = r->get();
    return PyShard(raw, std::move(*r));
  });
  // A shard file read in full: every checksum, and the header's rank, world size and step
  // against what its name says (the agents check each snapshot copy they take this way).
  m.def("verify_shard_file", [](const std::string& path, int rank, int world_size, int64_t step) {
    Status st;
    {
      py::gil_scoped_release release;
      auto r = ShardReader::open(FileSystem::posix(), path);
      if (!r) {
        st = r.status();
      } else if ((*r)->info().rank != rank || (*r)->info().world_size != world_size || (*r)->info().step != step) {
        st = Status::corruption(path + ": the shard is rank " + std::to_string((*r)->info().rank) + " of " +
                                std::to_string((*r)->info().world_size) + " at step " +
                                std::to_string((*r)->info().step) + ", not rank " + std::to_string(rank) + " of " +
                                std::to_string(world_size) + " at step " + std::to_string(step));
      } else {
        st = (*r)->verifyAll();
      }
    }
    if (!st.isOk()) raiseStatus(st);
  }, py::arg("path"), py::arg("rank"), py::arg("world_size"), py::arg("step"));
  // Shard `rank` of the checkpoint in `dir`, checked against its manifest as restore checks
  // its own (checkpoint_format.h: size, index checksum, identity, companion files).
  m.def("open_checked_shard", [](const std::string& dir, int rank) {
    Result<std::unique_ptr<ShardReader>> r = Status::internal("unset");
    {
      py::gil_scoped_release release;
      auto manifest = readManifest(FileSystem::posix(), dir);
      r = manifest ? openCheckedShard(FileSystem::posix(), dir, *manifest, rank, manifest->step)
                   : Result<std::unique_ptr<ShardReader>>(manifest.status());
    }
    if (!r) raiseStatus(r.status());
    const ShardReader* raw = r->get();
    return PyShard(raw, std::move(*r));
  }, py::arg("dir"), py::arg("rank"));
  // XXH3-64, the checksum of every checkpoint byte (docs/checkpoint-format.md), for the data
  // that Python writes and reads itself (torch.distributed.checkpoint files): update() takes
  // any buffer and releases the GIL over large ones.
  struct Xxh3 {
    std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state{XXH3_createState(), &XXH3_freeState};
    Xxh3() { XXH3_64bits_reset(state.get()); }
  };
  py::class_<Xxh3>(m, "Xxh3")
      .def(py::init<>())
      .def("update", [](Xxh3& h, py::buffer b) {
        py::buffer_info info = b.request();
        const size_t n = static_cast<size_t>(info.size * info.itemsize);
        std::optional<py::gil_scoped_release> release;
        if (n >= (size_t{1} << 16)) release.emplace();
        XXH3_64bits_update(h.state.get(), info.ptr, n);
      }, py::arg("data"))
      .def("hexdigest", [](Xxh3& h) {
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits_digest(h.state.get())));
        return std::string(hex);
      })
      .def("reset", [](Xxh3& h) { XXH3_64bits_reset(h.state.get()); });
  m.def("checkpoint_dir_name", &checkpointDirName);
  m.def("parse_checkpoint_dir_name", [](const std::string& name) { return parseCheckpointDirName(name); },
        py::arg("name"), "The step of a checkpoint directory's name, or None for any other name.");
}

// telemetry: the process's collective tracker and completion watcher
void bindTelemetry(py::module_& m) {
  m.def("collective_stats", [] {
    auto st = CollectiveTracker::global().stats();
    py::dict d, count, bytes;
    for (int i = 0; i < kCollectiveOpCount; ++i) {
      const char* name = collectiveOpName(static_cast<CollectiveOp>(i));
      count[name] = st.count[i];
      bytes[name] = st.bytes[i];
    }
    d["count"] = count;
    d["bytes"] = bytes;
    d["issued"] = st.issued;
    d["completed"] = st.completed;
    d["failed"] = st.failed;
    d["untracked"] = st.untracked;
    d["pending"] = st.pending();
    return d;
  });
  m.def("stop_completion_watcher", [] { CompletionWatcher::global().stop(); },
        py::call_guard<py::gil_scoped_release>(),
        "Stops polling collectives for completion (at interpreter exit); records in flight stay pending.");
  m.def("release_completion_watcher_at_exit",
        [](double wait_s) {
          return CompletionWatcher::global().releaseAtExit(
              std::chrono::milliseconds(static_cast<int64_t>(std::max(0.0, wait_s) * 1000)));
        },
        py::arg("wait_s") = 1.0, py::call_guard<py::gil_scoped_release>(),
        "At interpreter exit, before finalization: stops polling, waits up to wait_s for backend threads "
        "to let go of the works it keeps, releases those here and keeps the rest until the process ends "
        "(so that no backend thread drops the last reference to a Python tensor while Python finalizes). "
        "Returns how many it kept.");
  m.def("recent_collectives", [](size_t n) {
    py::list out;
    for (const auto& r : CollectiveTracker::global().recent(n)) {
      py::dict d;
      d["seq"] = r.seq;
      d["group"] = r.group;
      d["group_seq"] = r.group_seq;
      d["peer"] = r.peer;
      d["op"] = collectiveOpName(r.op);
      d["bytes"] = r.bytes;
      d["enter_ns"] = r.enter_ns;
      d["exit_ns"] = r.exit_ns;
      d["ok"] = r.ok;
      out.append(d);
    }
    return out;
  }, py::arg("n") = 100);
  m.def("tracked_groups", [] {
    py::list out;
    for (const auto& g : CollectiveTracker::global().groups()) {
      py::dict d;
      d["group"] = g.group;
      d["name"] = g.name;
      d["desc"] = g.desc;
      d["group_rank"] = g.group_rank;
      d["group_size"] = g.group_size;
      out.append(d);
    }
    return out;
  }, "This rank's tracked process groups: id, torch's name, description, its rank in it, size.");
}

// rank: the Supervisor facade and its scopes
void bindRank(py::module_& m) {
  py::class_<PyScope>(m, "Scope")
      .def("__enter__", &PyScope::enter, py::return_value_policy::reference)
      .def("__exit__", &PyScope::exit);

  py::class_<Supervisor, std::unique_ptr<Supervisor, ReleaseGilDelete>>(m, "Supervisor")
      .def(py::init(&create), py::arg("overrides"))
      .def("step", [](Supervisor& s, int64_t n) { return PyScope(&s, n, ""); }, py::keep_alive<0, 1>())
      .def("section", [](Supervisor& s, std::string name) { return PyScope(&s, std::nullopt, std::move(name)); },
           py::keep_alive<0, 1>())
      .def_property_readonly("stop_requested", &Supervisor::stopRequested)
      .def("log", [](Supervisor& s, const std::string& level, const std::string& msg) {
        LogLevel l = level == "debug" ? LogLevel::kDebug
                     : level == "warn" ? LogLevel::kWarn
                     : level == "error" ? LogLevel::kError
                                        : LogLevel::kInfo;
        py::gil_scoped_release release;  // a write to the rank's log file
        s.log(l, msg);
      })
      .def("event", [](Supervisor& s, const std::string& name,
                       const std::vector<std::pair<std::string, std::string>>& json_fields) {
        // (name, JSON text) pairs in order (trainsup/events.py), as the agent's event log takes.
        EventFields f;
        for (const auto& [k, v] : json_fields) f.emplace_back(k, RawJson{v});
        py::gil_scoped_release release;  // a write to the rank's event log
        s.event(name, f);
      }, py::arg("name"), py::arg("json_fields"))
      .def("enable_checkpoints", [](Supervisor& s, py::object channel, py::object persist) {
        std::shared_ptr<CommitChannel> c;
        if (!channel.is_none()) c = std::make_shared<PyChannel>(channel);
        Status st;
        {
          py::gil_scoped_release release;  // creates the checkpoint directory
          auto r = s.checkpointer(c);
          if (!r) st = r.status();
          c.reset();  // ~PyChannel takes the GIL itself: let it go (if last) with the GIL released
          if (r && !persist.is_none()) {
            py::gil_scoped_acquire gil;
            (*r)->setPersistHook(persistHook(std::move(persist)));
          }
        }
        if (!st.isOk()) raiseStatus(st);
      }, py::arg("channel"), py::arg("persist") = py::none(),
      "persist(step_dir, step) -> [(name, bytes)], if given, runs on the writer thread at every persist "
      "before this rank's shard is written; what it returns goes into the shard (checkpointer.h).")
      .def("save", &save, py::arg("step"), py::arg("collect"), py::arg("now"))
      .def("restore", &restore, py::arg("load"))
      .def("add_abort_callback", [](Supervisor& s, const std::string& name, py::function fn) {
        // Called on the watchdog or telemetry thread, where waiting for the GIL could last
        // forever (a stuck thread may hold it): a helper thread takes the GIL and runs the
        // callback; we wait for it at most 1 s and move on.
        auto held = heldFromThreads(std::move(fn));
        s.addAbortCallback(name, [held](const StallReport& r) {
          auto done = std::make_shared<std::promise<std::string>>();
          auto result = done->get_future();
          std::thread([held, done, section = r.section, step = r.step] {
            if (interpreterFinalizing()) {
              done->set_value("not run: the Python interpreter is shutting down");
              return;
            }
            py::gil_scoped_acquire gil;
            std::string error;
            try {
              (*held)(section, step);
            } catch (py::error_already_set& e) {
              error = e.what();
            }
            done->set_value(error);
          }).detach();
          if (result.wait_for(std::chrono::seconds(1)) != std::future_status::ready) {
            throw std::runtime_error("did not run within 1 s: another thread holds the GIL");
          }
          std::string error = result.get();
          if (!error.empty()) throw std::runtime_error(error);
        });
      }, py::arg("name"), py::arg("callback"))
      .def("await_snapshot", [](Supervisor& s) {
        Status st;
        {
          py::gil_scoped_release release;
          st = s.awaitSnapshot();
        }
        return st.isOk() ? std::string() : st.toString();
      })
      .def_property_readonly("snapshot_outstanding", [](Supervisor& s) { return s.snapshotOutstanding(); })
      .def_property_readonly("host", [](Supervisor& s) { return s.identity().host; })
      .def_property_readonly("rank", [](Supervisor& s) { return s.identity().rank; })
      .def_property_readonly("world_size", [](Supervisor& s) { return s.identity().world_size; })
      .def_property_readonly("log_file", &Supervisor::logFilePath)
      .def_property_readonly("event_log", &Supervisor::eventLogPath)
      .def_property_readonly("checkpoint_dir", [](Supervisor& s) { return s.config().checkpoint.dir; })
      .def_property_readonly("checkpoint_format", [](Supervisor& s) { return s.config().checkpoint.format; })
      .def_property_readonly("checkpoint_commit_timeout_s",
                             [](Supervisor& s) { return s.config().checkpoint.commit_timeout_s; })
      .def("close", &Supervisor::close, py::arg("failed") = false, py::call_guard<py::gil_scoped_release>());
}

}  // namespace

PYBIND11_MODULE(_trainsup, m) {
  m.doc() = "trainsup C++ core (use the `trainsup` package)";
  installTerminateReporter();  // a process that imports trainsup and terminates says where
  // One function per layer of libsupervisor (docs/architecture.md), in layer order.
  bindBase(m);
  bindDevice(m);
  bindCheckpoint(m);
  bindTelemetry(m);
  bindRank(m);
}
