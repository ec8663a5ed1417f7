// Every thread's native stack, collected by signalling each thread in turn.
//
// The handler only does async-signal-safe work: backtrace() into a preallocated slot (glibc's
// backtrace is safe once libgcc_s is loaded, which install() forces) and a write() to an
// eventfd that the dumping thread polls. Symbolization happens afterwards, on the caller.
#include "rank/stack_dump.h"
#include "trainsup/mutex.h"
#include "trainsup/supervisor.h"

#include <cxxabi.h>
#include <dirent.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <exception>
#include <sstream>

namespace trainsup {
namespace {

constexpr int kMaxFrames = 64;
constexpr int kMaxThreads = 1024;

struct Slot {
  std::atomic<int> tid{0};  // the thread asked to fill this slot; -tid once it claimed it
  void* frames[kMaxFrames];
  std::atomic<int> count{-1};  // -1 until the thread answered
};

// One slot per thread of a dump, so that a thread answering after we gave up on it can only
// write into its own slot. Only one dump runs at a time (g_dump_mu).
Slot g_slots[kMaxThreads];
std::atomic<int> g_current{-1};  // index of the slot being asked for, or -1
std::atomic<int> g_event_fd{-1};
Mutex g_dump_mu;
std::once_flag g_install_once;
bool g_installed = false;

int currentTid() { return static_cast<int>(syscall(SYS_gettid)); }

void onDumpSignal(int, siginfo_t*, void*) {
  int saved_errno = errno;
  int i = g_current.load(std::memory_order_acquire);
  int me = currentTid();
  int expected = me;
  // Claim the slot (tid -> -tid); a stale signal finds another thread's tid and does nothing.
  if (i >= 0 && g_slots[i].tid.compare_exchange_strong(expected, -me, std::memory_order_acq_rel)) {
    Slot& slot = g_slots[i];
    int n = backtrace(slot.frames, kMaxFrames);
    slot.count.store(n, std::memory_order_release);
    int fd = g_event_fd.load(std::memory_order_acquire);
    if (fd >= 0) {
      uint64_t one = 1;
      ssize_t ignored = write(fd, &one, sizeof(one));
      (void)ignored;
    }
  }
  errno = saved_errno;
}

void install() {
  void* warm[4];
  backtrace(warm, 4);  // loads libgcc_s now, outside any signal handler
  int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) return;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = onDumpSignal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(stackDumpSignal(), &sa, nullptr) != 0) {
    close(fd);
    return;
  }
  g_event_fd.store(fd, std::memory_order_release);
  g_installed = true;
}

std::string readFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

char threadState(int tid) {
  // /proc/self/task/<tid>/stat: "tid (comm) S ..."; comm may contain spaces or ')'.
  std::string stat = readFirstLine("/proc/self/task/" + std::to_string(tid) + "/stat");
  size_t close_paren = stat.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= stat.size()) return '?';
  return stat[close_paren + 2];
}

std::vector<int> listThreads() {
  std::vector<int> tids;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return tids;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    tids.push_back(std::atoi(e->d_name));
  }
  closedir(dir);
  return tids;
}

std::string symbolize(void* addr) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%p", addr);
  std::string out = buf;
  Dl_info info;
  if (dladdr(addr, &info) == 0) return out + " ??";
  auto a = reinterpret_cast<uintptr_t>(addr);
  if (info.dli_sname != nullptr) {
    int status = 0;
    char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    out += " in ";
    out += (status == 0 && demangled != nullptr) ? demangled : info.dli_sname;
    std::free(demangled);
    std::snprintf(buf, sizeof(buf), "+0x%lx", static_cast<unsigned long>(a - reinterpret_cast<uintptr_t>(info.dli_saddr)));
    out += buf;
  } else {
    out += " in ??";
  }
  if (info.dli_fname != nullptr) {
    std::snprintf(buf, sizeof(buf), "+0x%lx)", static_cast<unsigned long>(a - reinterpret_cast<uintptr_t>(info.dli_fbase)));
    out += " (";
    out += info.dli_fname;
    out += buf;
  }
  return out;
}

bool waitForAnswer(const Slot& slot, int fd, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    if (slot.count.load(std::memory_order_acquire) >= 0) return true;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 100)) + 1);
    if (r > 0) {
      uint64_t v;
      ssize_t ignored = read(fd, &v, sizeof(v));
      (void)ignored;
    }
  }
}

}  // namespace

namespace {

std::terminate_handler g_previous_terminate = nullptr;

void writeAll(const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(2, text.data() + done, text.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

[[noreturn]] void reportTerminate() {
  const int tid = currentTid();
  std::string name = readFirstLine("/proc/self/task/" + std::to_string(tid) + "/comm");
  void* frames[64];
  const int n = backtrace(frames, 64);
  std::string text = "trainsup: std::terminate on thread " + std::to_string(tid) + " '" + name + "' of pid " +
                     std::to_string(getpid()) + "; its stack:\n";
  for (int i = 1; i < n; ++i) text += "  #" + std::to_string(i - 1) + " " + symbolize(frames[i]) + "\n";
  writeAll(text);
  if (g_previous_terminate != nullptr) g_previous_terminate();
  std::abort();
}

}  // namespace

void installTerminateReporter() {
  static std::once_flag once;
  std::call_once(once, [] {
    void* warm[4];
    backtrace(warm, 4);  // loads libgcc_s now, not while terminating
    g_previous_terminate = std::set_terminate(reportTerminate);
  });
}

int stackDumpSignal() { return SIGRTMIN + 6; }

void prepareStackDumps() { std::call_once(g_install_once, install); }

StackDump dumpAllThreadStacks(std::chrono::milliseconds timeout) {
  MutexLock lock(g_dump_mu);
  prepareStackDumps();
  StackDump dump;
  const int self = currentTid();
  const pid_t pid = getpid();
  const int fd = g_event_fd.load(std::memory_order_acquire);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int index = -1;
  for (int tid : listThreads()) {
    ++index;
    ThreadStack t;
    t.tid = tid;
    t.name = readFirstLine("/proc/self/task/" + std::to_string(tid) + "/comm");
    t.state = threadState(tid);
    t.is_caller = tid == self;
    void* frames[kMaxFrames];
    int n = -1;
    if (t.is_caller) {
      n = backtrace(frames, kMaxFrames);
    } else if (g_installed && index < kMaxThreads && std::chrono::steady_clock::now() < deadline) {
      Slot& slot = g_slots[index];
      slot.count.store(-1, std::memory_order_relaxed);
      slot.tid.store(tid, std::memory_order_release);
      g_current.store(index, std::memory_order_release);
      bool answered = syscall(SYS_tgkill, pid, tid, stackDumpSignal()) == 0 && waitForAnswer(slot, fd, deadline);
      int expected = tid;
      if (!answered && !slot.tid.compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) {
        // The handler claimed the slot just as we gave up; give it a moment, never forever.
        answered = waitForAnswer(slot, fd, std::chrono::steady_clock::now() + std::chrono::milliseconds(50));
      }
      if (answered) {
        n = slot.count.load(std::memory_order_acquire);
        std::memcpy(frames, slot.frames, sizeof(void*) * n);
      }
      g_current.store(-1, std::memory_order_release);
    }
    if (n >= 0) {
      t.answered = true;
      ++dump.answered;
      // Skip our own frames: backtrace() caller (this function or the handler + trampoline).
      int skip = t.is_caller ? 1 : 2;
      for (int i = std::min(skip, n); i < n; ++i) t.frames.push_back(symbolize(frames[i]));
    }
    dump.threads.push_back(std::move(t));
  }
  return dump;
}

std::vector<std::string> formatStackDump(const StackDump& dump) {
  std::vector<std::string> lines;
  lines.push_back("stack dump: " + std::to_string(dump.threads.size()) + " threads, " +
                  std::to_string(dump.answered) + " answered");
  for (const ThreadStack& t : dump.threads) {
    std::ostringstream head;
    head << "thread " << t.tid << " '" << t.name << "' state=" << t.state;
    if (t.is_caller) head << " (the dumping thread)";
    if (!t.answered) head << ": no stack (did not answer: signal blocked, stopped or in the kernel)";
    lines.push_back(head.str());
    for (size_t i = 0; i < t.frames.size(); ++i) {
      lines.push_back("  #" + std::to_string(i) + " " + t.frames[i]);
    }
  }
  return lines;
}

}  // namespace trainsup
