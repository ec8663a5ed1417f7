#include "trainsup/node_monitor.h"
#include "trainsup/mutex.h"

#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "telemetry/telemetry_wire.h"

namespace trainsup {

namespace asio = boost::asio;
using asio::ip::tcp;
using local = asio::local::stream_protocol;

namespace {

// Moves every record of `queue` into frames of at most kRecordsPerFrame records of `type`
// (whose records live in `field` of WireMessage), appended to `out`; returns the record count.
template <class T>
uint64_t drainInFrames(std::deque<T>& queue, WireType type, std::vector<T> WireMessage::*field, const JobToken& token,
                       std::string& out) {
  uint64_t records = 0;
  while (!queue.empty()) {
    WireMessage m;
    m.type = type;
    size_t n = std::min(queue.size(), kRecordsPerFrame);
    (m.*field).assign(queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(n));
    queue.erase(queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(n));
    out += encodeFrame(m, token);
    records += n;
  }
  return records;
}
asio::steady_timer::duration toDuration(double s) {
  return std::chrono::duration_cast<asio::steady_timer::duration>(std::chrono::duration<double>(s));
}
}  // namespace

class LocalRank;

// Everything below runs on the I/O thread, except the counters (counters_mu) and the
// coordinator address (address_mu), which other threads may read or change.
struct NodeMonitor::Impl {
  JobToken token;
  NodeMonitorOptions options;
  asio::io_context io;
  local::acceptor acceptor{io};
  asio::steady_timer timer{io};
  asio::steady_timer accept_retry{io};
  std::thread thread;
  std::once_flag stopped;

  Mutex address_mu;
  std::string host TRAINSUP_GUARDED_BY(address_mu);
  uint16_t port TRAINSUP_GUARDED_BY(address_mu) = 0;
  uint64_t address_generation TRAINSUP_GUARDED_BY(address_mu) = 0;  // bumped by setCoordinator

  mutable Mutex counters_mu;
  Counters counters TRAINSUP_GUARDED_BY(counters_mu);

  // Local ranks.
  std::vector<std::weak_ptr<LocalRank>> locals;
  std::map<int32_t, WireHello> hellos;        // every rank that said hello, re-sent on connect
  std::map<std::pair<int32_t, uint64_t>, WireGroup> groups;  // (rank, group) claims, re-sent on connect
  std::set<int32_t> said_goodbye;             // ranks that ended normally
  std::set<int32_t> stopping;                 // ranks asked to stop, re-announced on connect

  // Outbound, waiting for the coordinator.
  std::deque<WireStall> out_stalls;
  std::deque<WireHello> out_hellos;
  std::deque<WireGroup> out_groups;
  std::deque<WireGone> out_gones;
  std::deque<WireCollective> out_collectives;
  std::map<int32_t, WireHeartbeat> out_heartbeats;  // newest per rank

  // The coordinator connection.
  enum class Up { kIdle, kConnecting, kConnected };
  Up up = Up::kIdle;
  std::unique_ptr<tcp::socket> upstream;
  uint64_t up_id = 0;  // which connection attempt `upstream` is; handlers of older ones stop
  uint64_t connected_generation = 0;
  std::string connected_host;  // the coordinator `upstream` is connected to
  uint16_t connected_port = 0;
  asio::steady_timer connect_timer{io};
  bool writing = false;
  bool moving = false;  // told to move while a write was under way: say goodbye after it
  std::unique_ptr<FrameDecoder> inbound;
  std::array<uint8_t, 4096> inbound_buf;

  template <class F>
  void count(F f) {
    MutexLock lock(counters_mu);
    f(counters);
  }
  void accept();
  void tick();
  void onMessage(const WireMessage& m, std::set<int32_t>& ranks);
  void onLocalClosed(const std::set<int32_t>& ranks);
  void connectUpstream();
  void dropUpstream();
  void readUpstream();
  void sendToLocals(const WireMessage& m);
  void flush();
  void leaveForAnother();
};

class LocalRank : public std::enable_shared_from_this<LocalRank> {
 public:
  LocalRank(local::socket s, NodeMonitor::Impl* owner) : socket_(std::move(s)), owner_(owner), decoder_(owner->token) {}
  void read() {
    auto self = shared_from_this();
    socket_.async_read_some(asio::buffer(buf_), [self](const boost::system::error_code& ec, size_t n) {
      if (ec) {
        self->owner_->onLocalClosed(self->ranks_);
        return;
      }
      auto before = self->decoder_.counters();
      auto messages = self->decoder_.feed(self->buf_.data(), n);
      auto after = self->decoder_.counters();
      uint64_t dropped = (after.oversized - before.oversized) + (after.bad_version - before.bad_version) +
                         (after.bad_type - before.bad_type) + (after.bad_length - before.bad_length) +
                         (after.bad_token - before.bad_token);
      const uint64_t garbage = after.bad_magic_bytes - before.bad_magic_bytes;
      if (dropped > 0 || garbage > 0) {
        self->owner_->count([&](NodeMonitor::Counters& c) {
          c.dropped_frames += dropped;
          c.garbage_bytes += garbage;
        });
      }
      for (const auto& m : messages) self->owner_->onMessage(m, self->ranks_);
      self->read();
    });
  }
  void send(std::shared_ptr<std::string> frame) {
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(*frame), [self, frame](const boost::system::error_code&, size_t) {});
  }
  void close() {
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

 private:
  local::socket socket_;
  NodeMonitor::Impl* owner_;
  FrameDecoder decoder_;
  std::array<uint8_t, 64 * 1024> buf_;
  std::set<int32_t> ranks_;
};

void NodeMonitor::Impl::accept() {
  acceptor.async_accept([this](const boost::system::error_code& ec, local::socket s) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;  // stopping
    if (ec) {
      // Out of file descriptors, or a peer gone before accept: keep serving, retry shortly.
      count([](Counters& c) { ++c.accept_errors; });
      accept_retry.expires_after(std::chrono::milliseconds(50));
      accept_retry.async_wait([this](const boost::system::error_code& e) {
        if (!e) accept();
      });
      return;
    }
    count([](Counters& c) { ++c.local_connections; });
    auto r = std::make_shared<LocalRank>(std::move(s), this);
    // Closed connections leave expired entries (whose memory make_shared keeps): drop them.
    locals.erase(std::remove_if(locals.begin(), locals.end(), [](const auto& w) { return w.expired(); }),
                 locals.end());
    locals.push_back(r);
    r->read();
    accept();
  });
}

void NodeMonitor::Impl::onMessage(const WireMessage& m, std::set<int32_t>& ranks) {
  size_t n = m.collectives.size() + m.heartbeats.size() + m.stalls.size() + m.hellos.size() + m.gones.size() +
             m.groups.size();
  count([&](Counters& c) {
    ++c.frames_in;
    c.records_in += n;
  });
  if (m.type == WireType::kAbort) return;  // only the coordinator gives orders
  for (const auto& c : m.collectives) {
    ranks.insert(c.rank);
    out_collectives.push_back(c);
  }
  uint64_t dropped = 0;
  while (out_collectives.size() > options.queue_capacity) {
    out_collectives.pop_front();
    ++dropped;
  }
  if (dropped > 0) count([&](Counters& c) { c.records_dropped += dropped; });
  for (const auto& h : m.heartbeats) {
    ranks.insert(h.rank);
    out_heartbeats[h.rank] = h;
  }
  for (const auto& s : m.stalls) {
    ranks.insert(s.rank);
    out_stalls.push_back(s);
  }
  for (const auto& h : m.hellos) {
    ranks.insert(h.rank);
    hellos[h.rank] = h;
    said_goodbye.erase(h.rank);
    out_hellos.push_back(h);
  }
  for (const auto& g : m.groups) {  // a rank's groups, before its records that name them
    ranks.insert(g.rank);
    groups[{g.rank, g.group}] = g;
    out_groups.push_back(g);
  }
  for (const auto& g : m.gones) {
    if (g.reason == kGoneFinished || g.reason == kGoneFailed) said_goodbye.insert(g.rank);
    if (g.reason == kGoneStopping) stopping.insert(g.rank);
    out_gones.push_back(g);
  }
  // Stall reports are what the coordinator must hear first: do not wait for the next tick.
  if (!m.stalls.empty()) flush();
}

void NodeMonitor::Impl::onLocalClosed(const std::set<int32_t>& ranks) {
  for (int32_t r : ranks) {
    if (said_goodbye.count(r) != 0) continue;
    out_gones.push_back({r, kGoneClosed});
  }
  if (!ranks.empty()) flush();
}

void NodeMonitor::Impl::dropUpstream() {
  if (upstream) {
    boost::system::error_code ignored;
    upstream->close(ignored);
  }
  upstream.reset();
  ++up_id;
  inbound.reset();
  up = Up::kIdle;
  writing = false;
  moving = false;
  count([](Counters& c) { c.coordinator_connected = false; });
}

// The agent pointed this monitor at another coordinator (a takeover). The one it leaves hears
// that each local rank moved (kGoneMoved) before the connection closes, so that it takes the
// departures for what they are, not for ranks dying (it would name them dead and order the
// ranks still connected to it to abort). Bounded: a coordinator that does not read (the reason
// for most takeovers) is dropped after connect_timeout_s.
void NodeMonitor::Impl::leaveForAnother() {
  std::string h;
  uint16_t p;
  {
    MutexLock lock(address_mu);
    h = host;
    p = port;
  }
  if (h == connected_host && p == connected_port) {  // the same coordinator again: reconnect only
    dropUpstream();
    return;
  }
  WireMessage m;
  m.type = WireType::kGone;
  for (const auto& [rank, hello] : hellos) m.gones.push_back({rank, kGoneMoved});
  if (m.gones.empty()) {
    dropUpstream();
    return;
  }
  auto out = std::make_shared<std::string>(encodeFrame(m, token));
  writing = true;
  const uint64_t id = up_id;
  connect_timer.expires_after(toDuration(options.connect_timeout_s));
  connect_timer.async_wait([this, id](const boost::system::error_code& e) {
    if (!e && id == up_id) dropUpstream();  // the old coordinator does not read
  });
  asio::async_write(*upstream, asio::buffer(*out), [this, id, out](const boost::system::error_code&, size_t) {
    if (id != up_id) return;
    connect_timer.cancel();
    dropUpstream();  // the next tick connects to the new one
  });
}

void NodeMonitor::Impl::connectUpstream() {
  std::string h;
  uint16_t p;
  uint64_t generation;
  {
    MutexLock lock(address_mu);
    h = host;
    p = port;
    generation = address_generation;
  }
  if (p == 0) return;
  boost::system::error_code ec;
  auto address = asio::ip::make_address(h, ec);
  if (ec) return;  // validated by setCoordinator/start; nothing to connect to
  up = Up::kConnecting;
  upstream = std::make_unique<tcp::socket>(io);
  const uint64_t id = ++up_id;
  connect_timer.expires_after(toDuration(options.connect_timeout_s));
  connect_timer.async_wait([this, id](const boost::system::error_code& e) {
    if (!e && id == up_id && up == Up::kConnecting) dropUpstream();  // took too long
  });
  upstream->async_connect(tcp::endpoint(address, p), [this, id, generation, h, p](const boost::system::error_code& e) {
    if (id != up_id) return;  // given up already
    connect_timer.cancel();
    if (e) {
      dropUpstream();
      return;
    }
    boost::system::error_code ignored;
    upstream->set_option(tcp::no_delay(true), ignored);
    up = Up::kConnected;
    connected_generation = generation;
    connected_host = h;  // what `generation` stood for (a later change bumps it again)
    connected_port = p;
    count([](Counters& c) {
      ++c.coordinator_connects;
      c.coordinator_connected = true;
    });
    // A new coordinator (or the same one after a break) learns who is here.
    out_hellos.clear();
    for (const auto& [rank, hello] : hellos) out_hellos.push_back(hello);
    out_groups.clear();
    for (const auto& [key, group] : groups) out_groups.push_back(group);
    for (int32_t r : stopping) out_gones.push_back({r, kGoneStopping});
    inbound = std::make_unique<FrameDecoder>(token);
    readUpstream();
    flush();
  });
}

void NodeMonitor::Impl::readUpstream() {
  const uint64_t id = up_id;
  upstream->async_read_some(asio::buffer(inbound_buf), [this, id](const boost::system::error_code& e, size_t n) {
    if (id != up_id) return;
    if (e) {
      dropUpstream();
      return;
    }
    for (const auto& m : inbound->feed(inbound_buf.data(), n)) {
      if (!m.aborts.empty()) sendToLocals(m);
    }
    readUpstream();
  });
}

// An abort order to every local rank (from the coordinator, or from this host's agent).
void NodeMonitor::Impl::sendToLocals(const WireMessage& m) {
  auto frame = std::make_shared<std::string>(encodeFrame(m, token));
  uint64_t relayed = 0;
  for (auto& weak : locals) {
    if (auto r = weak.lock()) {
      r->send(frame);
      ++relayed;
    }
  }
  count([&](Counters& c) { c.aborts_relayed += relayed; });
}

// Sends what is waiting, one write at a time.
void NodeMonitor::Impl::flush() {
  if (up != Up::kConnected || writing || moving) return;
  auto out = std::make_shared<std::string>();
  uint64_t records = 0;
  // Stall reports first; departures after the collectives that came before them.
  records += drainInFrames(out_stalls, WireType::kStall, &WireMessage::stalls, token, *out);
  records += drainInFrames(out_hellos, WireType::kHello, &WireMessage::hellos, token, *out);
  records += drainInFrames(out_groups, WireType::kGroup, &WireMessage::groups, token, *out);
  records += drainInFrames(out_collectives, WireType::kCollectives, &WireMessage::collectives, token, *out);
  records += drainInFrames(out_gones, WireType::kGone, &WireMessage::gones, token, *out);
  if (!out_heartbeats.empty()) {
    WireMessage m;
    m.type = WireType::kHeartbeat;
    for (const auto& [rank, hb] : out_heartbeats) m.heartbeats.push_back(hb);
    out_heartbeats.clear();
    records += m.heartbeats.size();
    *out += encodeFrame(m, token);
  }
  if (out->empty()) return;
  writing = true;
  const uint64_t id = up_id;
  asio::async_write(*upstream, asio::buffer(*out), [this, id, out, records](const boost::system::error_code& e, size_t) {
    if (id != up_id) {
      count([&](Counters& c) { c.records_dropped += records; });
      return;
    }
    writing = false;
    if (e) {
      count([&](Counters& c) { c.records_dropped += records; });
      dropUpstream();
      return;
    }
    count([&](Counters& c) { c.records_forwarded += records; });
    if (moving) {
      leaveForAnother();
      return;
    }
    flush();
  });
}

void NodeMonitor::Impl::tick() {
  timer.expires_after(toDuration(options.forward_interval_s));
  timer.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    uint64_t generation;
    {
      MutexLock lock(address_mu);
      generation = address_generation;
    }
    if (up == Up::kConnected && generation != connected_generation && !moving) {  // told to move
      if (writing) {
        moving = true;  // after the write under way
      } else {
        moving = true;
        leaveForAnother();
      }
    }
    if (up == Up::kIdle) connectUpstream();
    // Collectives wait while the coordinator is away (bounded); heartbeats are only news
    // while fresh, and stay coalesced per rank either way.
    flush();
    tick();
  });
}

Result<std::unique_ptr<NodeMonitor>> NodeMonitor::start(NodeMonitorOptions options, const JobToken& token) {
  if (options.socket_path.empty()) return Status::invalidArgument("node monitor: socket path is empty");
  if (options.socket_path.size() >= sizeof(sockaddr_un::sun_path)) {
    return Status::invalidArgument("node monitor socket path '" + options.socket_path + "' is longer than " +
                                   std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes");
  }
  if (!(options.forward_interval_s > 0) || !(options.connect_timeout_s > 0) || options.queue_capacity == 0) {
    return Status::invalidArgument("node monitor: forward_interval_s, connect_timeout_s and queue_capacity must be > 0");
  }
  boost::system::error_code ec;
  if (options.coordinator_port != 0) {
    asio::ip::make_address(options.coordinator_host, ec);
    if (ec) return Status::invalidArgument("node monitor: coordinator address '" + options.coordinator_host + "': " + ec.message());
  }
  auto impl = std::make_shared<Impl>();
  impl->token = token;
  impl->options = options;
  {
    MutexLock lock(impl->address_mu);  // not shared yet; held for the analysis
    impl->host = options.coordinator_host;
    impl->port = options.coordinator_port;
  }
  // A socket file left by a crashed monitor would make bind fail; anything else is not ours.
  struct stat st;
  if (::lstat(options.socket_path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status::invalidArgument("node monitor: '" + options.socket_path + "' exists and is not a socket");
    }
    ::unlink(options.socket_path.c_str());
  }
  local::endpoint endpoint(options.socket_path);
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec && ::chmod(options.socket_path.c_str(), 0600) != 0) {
    ec = boost::system::error_code(errno, boost::system::system_category());
  }
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status::unavailable("node monitor cannot listen on " + options.socket_path + ": " + ec.message());
  impl->accept();
  impl->tick();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->io.run(); });
  auto m = std::unique_ptr<NodeMonitor>(new NodeMonitor());
  m->impl_ = std::move(impl);
  return m;
}

NodeMonitor::~NodeMonitor() {
  stop();
  if (impl_) ::unlink(impl_->options.socket_path.c_str());
}

void NodeMonitor::setCoordinator(const std::string& host, uint16_t port) {
  MutexLock lock(impl_->address_mu);
  impl_->host = host;
  impl_->port = port;
  ++impl_->address_generation;
}

void NodeMonitor::abortLocalRanks(int32_t culprit_rank, const std::string& kind, const std::string& host) {
  WireMessage m;
  m.type = WireType::kAbort;
  WireAbort a;
  a.culprit_rank = culprit_rank;
  std::strncpy(a.kind, kind.c_str(), sizeof(a.kind) - 1);
  std::strncpy(a.host, host.c_str(), sizeof(a.host) - 1);
  m.aborts.push_back(a);
  asio::post(impl_->io, [impl = impl_.get(), m] { impl->sendToLocals(m); });
}

const std::string& NodeMonitor::socketPath() const { return impl_->options.socket_path; }

void NodeMonitor::stop() {
  if (!impl_) return;
  std::call_once(impl_->stopped, [this] {
    asio::post(impl_->io, [impl = impl_.get()] {
      boost::system::error_code ignored;
      impl->acceptor.close(ignored);
      impl->timer.cancel();
      impl->io.stop();
    });
    if (impl_->thread.joinable()) impl_->thread.join();
  });
}

NodeMonitor::Counters NodeMonitor::counters() const {
  MutexLock lock(impl_->counters_mu);
  return impl_->counters;
}

}  // namespace trainsup
