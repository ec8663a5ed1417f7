// A rank's requests to its host's agent (checkpoint/agent_link.h): plain blocking sockets with
// a deadline, one request per connection.
#include "checkpoint/agent_link.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace trainsup::checkpoint_internal {

namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int msLeft(Nanos deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::real().monotonicNow()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

Status waitFor(int fd, short events, Nanos deadline, const std::string& what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, msLeft(deadline));
    if (n > 0) return Status::ok();
    if (n == 0) return Status::timedOut(what + ": no answer in time");
    if (errno != EINTR) return Status::ioError(what + ": poll: " + std::strerror(errno));
  }
}

}  // namespace

Result<nlohmann::json> AgentLink::call(nlohmann::json request, Nanos timeout) const {
  const std::string what = "the snapshot service of this host's agent (" + address_ + ")";
  if (address_.empty()) return Status::unavailable(what + ": no address (TRAINSUP_SNAPSHOT_AGENT is not set)");
  const Nanos deadline = Clock::real().monotonicNow() + timeout;
  const size_t colon = address_.rfind(':');
  if (colon == std::string::npos) return Status::invalidArgument("TRAINSUP_SNAPSHOT_AGENT=" + address_ + " is not host:port");
  std::string host = address_.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port = address_.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int e = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); e != 0) {
    return Status::unavailable(what + ": " + ::gai_strerror(e));
  }
  Fd s;
  Status connected = Status::unavailable(what + ": no address to connect to");
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    s.fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (s.fd < 0) continue;
    if (::connect(s.fd, a->ai_addr, a->ai_addrlen) == 0) {
      connected = Status::ok();
      break;
    }
    if (errno == EINPROGRESS) {
      connected = waitFor(s.fd, POLLOUT, deadline, what);
      int err = 0;
      socklen_t len = sizeof(err);
      if (connected.isOk() && ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) break;
      if (connected.isOk()) connected = Status::unavailable(what + ": connect: " + std::strerror(err));
    } else {
      connected = Status::unavailable(what + ": connect: " + std::strerror(errno));
    }
    ::close(s.fd);
    s.fd = -1;
  }
  ::freeaddrinfo(found);
  if (!connected.isOk()) return connected;
  request["token"] = token_;
  const std::string line = request.dump() + "\n";
  for (size_t sent = 0; sent < line.size();) {
    if (Status w = waitFor(s.fd, POLLOUT, deadline, what); !w.isOk()) return w;
    ssize_t n = ::send(s.fd, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return Status::unavailable(what + ": send: " + std::strerror(errno));
    sent += static_cast<size_t>(n);
  }
  std::string answer;
  char buf[4096];
  while (answer.find('\n') == std::string::npos) {
    if (answer.size() > (1u << 20)) return Status::corruption(what + ": answer longer than 1 MiB");
    if (Status r = waitFor(s.fd, POLLIN, deadline, what); !r.isOk()) return r;
    ssize_t n = ::recv(s.fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return Status::unavailable(what + ": recv: " + std::strerror(errno));
    if (n == 0) return Status::unavailable(what + ": closed the connection without an answer");
    answer.append(buf, static_cast<size_t>(n));
  }
  nlohmann::json j = nlohmann::json::parse(answer.substr(0, answer.find('\n')), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("ok")) return Status::corruption(what + ": an answer that is not {\"ok\": ...}");
  if (!j["ok"].get<bool>()) {
    std::string error = j.value("error", std::string("no reason given"));
    std::string code = j.value("code", std::string());
    if (code == "not_found") return Status::notFound(error);
    if (code == "no_space") return Status::ioError(error);
    return Status::unavailable(error);
  }
  return j;
}

Result<std::string> AgentLink::replicate(const std::string& file, Nanos timeout) const {
  auto r = call({{"op", "replicate"}, {"file", file}}, timeout);
  if (!r) return r.status();
  return r->value("peer", std::string());
}

Status AgentLink::fetch(const std::string& file, const std::vector<std::string>& hosts, Nanos timeout) const {
  auto r = call({{"op", "fetch"}, {"file", file}, {"hosts", hosts}}, timeout);
  return r.status();
}

}  // namespace trainsup::checkpoint_internal
