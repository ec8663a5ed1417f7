// trainsup-warm-client: what torchrun starts as each worker when warm starts are on, in place
// of trainsup/launch/warm_client.py (same protocol, same behaviour; see that file and
// trainsup/launch/zygote.py). A Python client spends ~25 ms starting its interpreter and
// importing json/socket before it can ask the zygote for the worker; this one ~1 ms.
//
//   trainsup-warm-client PYTHON SOCKET SCRIPT [ARGS...]
//
// Sends the zygote at SOCKET its argv [SCRIPT, ARGS...], environment and working directory as
// JSON after an 8-byte big-endian length, with its standard streams (SCM_RIGHTS); reads
// {"pid": N}\n; relays SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the worker;
// reads the worker's end, {"code": C}\n or {"signal": S}\n, and ends the same way. When no
// zygote answers, it runs `PYTHON -u SCRIPT ARGS` itself (execv), as torchrun would have.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

extern char** environ;

namespace {

volatile sig_atomic_t g_worker = 0;

void relay(int sig) {
  if (g_worker > 0) ::kill(static_cast<pid_t>(g_worker), sig);
}

[[noreturn]] void fallback(const std::string& python, char** script_and_args, const std::string& why) {
  std::fprintf(stderr, "[trainsup] warm start unavailable (%s); starting %s cold\n", why.c_str(), script_and_args[0]);
  std::fflush(stderr);
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(python.c_str()));
  argv.push_back(const_cast<char*>("-u"));
  for (char** a = script_and_args; *a != nullptr; ++a) argv.push_back(*a);
  argv.push_back(nullptr);
  ::execv(python.c_str(), argv.data());
  std::fprintf(stderr, "[trainsup] cannot start %s: %s\n", python.c_str(), std::strerror(errno));
  ::_exit(127);
}

// One line from the zygote (without its newline); false when the connection ended first.
bool readLine(int fd, std::string& line) {
  line.clear();
  char c;
  for (;;) {
    ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;  // a relayed signal
    if (n <= 0) return false;
    if (c == '\n') return true;
    line.push_back(c);
  }
}

bool sendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: trainsup-warm-client PYTHON SOCKET SCRIPT [ARGS...]\n");
    return 2;
  }
  const std::string python = argv[1];
  const std::string path = argv[2];
  char** script_and_args = argv + 3;

  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (fd < 0) fallback(python, script_and_args, std::string("socket: ") + std::strerror(errno));
  if (path.size() >= sizeof(addr.sun_path)) fallback(python, script_and_args, path + ": path too long");
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    fallback(python, script_and_args, path + ": " + std::strerror(errno));
  }

  nlohmann::json request;
  request["argv"] = nlohmann::json::array();
  for (char** a = script_and_args; *a != nullptr; ++a) request["argv"].push_back(*a);
  nlohmann::json env = nlohmann::json::object();
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq == nullptr) continue;
    env[std::string(*e, static_cast<size_t>(eq - *e))] = std::string(eq + 1);
  }
  request["env"] = std::move(env);
  std::vector<char> cwd(4096);
  while (::getcwd(cwd.data(), cwd.size()) == nullptr && errno == ERANGE) cwd.resize(cwd.size() * 2);
  request["cwd"] = std::string(cwd.data());
  // Bytes that are not UTF-8 (an environment may hold any) are replaced, not refused.
  const std::string body = request.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);

  unsigned char header[8];
  for (int i = 0; i < 8; ++i) header[i] = static_cast<unsigned char>((static_cast<uint64_t>(body.size()) >> (56 - 8 * i)) & 0xff);
  // The header and the standard streams in one message (the zygote's first recvmsg takes both),
  // then whatever of the body that message did not carry.
  iovec iov[2] = {{header, sizeof(header)}, {const_cast<char*>(body.data()), body.size()}};
  int fds[3] = {0, 1, 2};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(fds))] = {};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(fds));
  std::memcpy(CMSG_DATA(cm), fds, sizeof(fds));
  ssize_t sent;
  do {
    sent = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent < static_cast<ssize_t>(sizeof(header))) {
    ::close(fd);
    fallback(python, script_and_args, std::string("sendmsg: ") + (sent < 0 ? std::strerror(errno) : "short"));
  }
  const size_t body_sent = static_cast<size_t>(sent) - sizeof(header);
  std::string line;
  long long pid = 0;
  try {
    if (!sendAll(fd, body.data() + body_sent, body.size() - body_sent)) throw std::runtime_error("sending the request");
    if (!readLine(fd, line)) throw std::runtime_error("the zygote closed the connection");
    pid = nlohmann::json::parse(line).at("pid").get<long long>();
  } catch (const std::exception& e) {
    ::close(fd);
    fallback(python, script_and_args, e.what());
  }
  g_worker = static_cast<sig_atomic_t>(pid);

  struct sigaction sa{};
  sa.sa_handler = relay;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: the read below retries on EINTR itself
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) ::sigaction(sig, &sa, nullptr);

  // The zygote writes the worker's wait status when it ends.
  if (!readLine(fd, line)) {
    std::fprintf(stderr, "[trainsup] the zygote went away before the worker ended\n");
    ::_exit(1);
  }
  int code = 1;
  try {
    nlohmann::json end = nlohmann::json::parse(line);
    int sig = end.value("signal", 0);
    if (sig > 0) {
      ::signal(sig, SIG_DFL);  // SIGKILL and SIGSTOP take none: their default is all they have
      ::kill(::getpid(), sig);
    }
    code = end.value("code", 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[trainsup] unreadable end from the zygote: %s\n", e.what());
  }
  ::_exit(code);
}
