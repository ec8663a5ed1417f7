#include "telemetry/telemetry_client.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include "trainsup/clock.h"
#include "trainsup/mutex.h"

namespace trainsup {

namespace asio = boost::asio;
using asio::ip::tcp;
using Socket = asio::generic::stream_protocol::socket;

struct TelemetryClient::Impl {
  // Set at construction.
  TelemetryClientOptions options;
  CollectiveTracker* tracker = nullptr;

  mutable Mutex mu;
  // Wakes the sender thread (a stall report, a stop notice, stop()): an eventfd, polled with
  // the connection's socket, so that an abort order is read as it arrives.
  int wake_fd = -1;
  void wake() const {
    const uint64_t one = 1;
    if (wake_fd >= 0) (void)!::write(wake_fd, &one, sizeof(one));
  }
  ~Impl() {
    if (wake_fd >= 0) ::close(wake_fd);
  }
  bool stopping TRAINSUP_GUARDED_BY(mu) = false;
  // What to say when stopping; kGoneClosed = nothing (dropConnection).
  int32_t goodbye_reason TRAINSUP_GUARDED_BY(mu) = kGoneFinished;
  std::deque<WireStall> stalls TRAINSUP_GUARDED_BY(mu);
  bool stop_requested TRAINSUP_GUARDED_BY(mu) = false;  // reportStopping() was called
  bool stop_announced = false;       // sender thread: said so on the current connection
  Counters counters TRAINSUP_GUARDED_BY(mu);
  std::thread thread;

  // Sender thread only.
  asio::io_context io;
  std::unique_ptr<Socket> socket;
  uint64_t next_seq = 1;              // first seq not yet sent as completed
  std::set<uint64_t> sent_enter;      // open collectives already announced
  std::set<uint64_t> sent_done;       // completed ones already sent (>= next_seq)
  std::deque<WireCollective> pending; // records waiting for a connection
  std::unique_ptr<FrameDecoder> inbound;  // frames from the coordinator
  size_t groups_sent = 0;             // tracker->groups() announced on this connection
  bool sendGroups();
  bool receive();

  void loop();
  void pump();
  bool connect();
  bool sendFrame(const WireMessage& m);
  bool sendPending();
};

void TelemetryClient::Impl::pump() {
  // New and newly completed collectives since the last pump.
  auto records = tracker->recent(CollectiveTracker::kCapacity);
  for (const auto& r : records) {
    if (r.seq < next_seq) continue;
    if (r.group == kUnmatchedGroup || (isPointToPoint(r.op) && r.peer < 0)) {  // nobody else names it so
      sent_done.insert(r.seq);
      continue;
    }
    // On the wire a collective is (group, group_seq[, peer]): what every member calls it.
    const uint8_t op = static_cast<uint8_t>(r.op);
    if (r.exit_ns != 0) {  // completed (or untracked): send once with its exit
      if (sent_done.insert(r.seq).second) {
        pending.push_back({options.rank, r.group, r.group_seq, r.peer, op, r.bytes, r.enter_ns, r.exit_ns});
      }
    } else if (sent_enter.insert(r.seq).second) {  // open: announce its enter once
      pending.push_back({options.rank, r.group, r.group_seq, r.peer, op, r.bytes, r.enter_ns, 0});
    }
  }
  // Forget what is settled: the completed prefix, and anything the ring has overwritten.
  if (!records.empty()) next_seq = std::max(next_seq, records.front().seq);
  while (sent_done.count(next_seq) != 0) ++next_seq;
  sent_done.erase(sent_done.begin(), sent_done.lower_bound(next_seq));
  sent_enter.erase(sent_enter.begin(), sent_enter.lower_bound(next_seq));
  uint64_t dropped = 0;
  while (pending.size() > options.queue_capacity) {
    pending.pop_front();
    ++dropped;
  }
  if (dropped > 0) {
    MutexLock lock(mu);
    counters.records_dropped += dropped;
  }
}

bool TelemetryClient::Impl::connect() {
  if (socket) return true;
  try {
    const bool local = !options.unix_path.empty();
    const asio::generic::stream_protocol::endpoint ep =
        local ? asio::generic::stream_protocol::endpoint(asio::local::stream_protocol::endpoint(options.unix_path))
              : asio::generic::stream_protocol::endpoint(
                    tcp::endpoint(asio::ip::make_address(options.host), options.port));
    auto s = std::make_unique<Socket>(io, ep.protocol());
    s->connect(ep);
    if (!local) s->set_option(tcp::no_delay(true));
    socket = std::move(s);
    stop_announced = false;  // a new connection (perhaps a new coordinator) is told again
    groups_sent = 0;         // ...and learns the groups again
    {
      MutexLock lock(mu);
      ++counters.connects;
    }
    // Who we are, first: a coordinator that took over learns it from this.
    WireMessage hello;
    hello.type = WireType::kHello;
    WireHello h;
    h.rank = options.rank;
    h.local_rank = options.local_rank;
    std::strncpy(h.host, options.node_name.c_str(), sizeof(h.host) - 1);
    std::strncpy(h.gpu, options.gpu.c_str(), sizeof(h.gpu) - 1);
    hello.hellos.push_back(h);
    if (!sendFrame(hello)) {
      socket.reset();
      return false;
    }
    return true;
  } catch (const std::exception&) {
    socket.reset();
    return false;  // try again next interval
  }
}

bool TelemetryClient::Impl::sendFrame(const WireMessage& m) {
  std::string frame = encodeFrame(m, options.token);
  boost::system::error_code ec;
  asio::write(*socket, asio::buffer(frame), ec);
  MutexLock lock(mu);
  if (ec) {
    ++counters.send_errors;
    return false;
  }
  ++counters.frames_sent;
  counters.records_sent += m.collectives.size() + m.heartbeats.size() + m.stalls.size() + m.hellos.size() +
                          m.gones.size() + m.groups.size();
  return true;
}

// This rank's group memberships not yet announced on this connection: before any record that
// names them, so that the coordinator knows every group its records refer to.
bool TelemetryClient::Impl::sendGroups() {
  const auto groups = tracker->groups();
  while (groups_sent < groups.size()) {
    WireMessage m;
    m.type = WireType::kGroup;
    const size_t n = std::min(groups.size() - groups_sent, kRecordsPerFrame);
    for (size_t i = groups_sent; i < groups_sent + n; ++i) {
      WireGroup g;
      g.rank = options.rank;
      g.group = groups[i].group;
      g.group_rank = groups[i].group_rank;
      g.group_size = groups[i].group_size;
      std::strncpy(g.desc, groups[i].desc.c_str(), sizeof(g.desc) - 1);
      m.groups.push_back(g);
    }
    if (!sendFrame(m)) return false;
    groups_sent += n;
  }
  return true;
}

// The queued collective records, in frames of at most kRecordsPerFrame; what could not be sent stays
// queued (bounded by pump()).
bool TelemetryClient::Impl::sendPending() {
  while (!pending.empty()) {
    WireMessage m;
    m.type = WireType::kCollectives;
    size_t n = std::min(pending.size(), kRecordsPerFrame);
    m.collectives.assign(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(n));
    if (!sendFrame(m)) return false;
    pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(n));
  }
  return true;
}

// Orders from the coordinator, without blocking: only what has already arrived. False when
// nothing could be read (the peer closed the connection, or an error): the caller stops
// waiting on the socket until the next interval, whose send finds out.
bool TelemetryClient::Impl::receive() {
  if (!socket) return false;
  boost::system::error_code ec;
  size_t n = socket->available(ec);
  if (ec || n == 0) return false;
  std::vector<uint8_t> buf(std::min<size_t>(n, 1 << 16));
  size_t got = socket->read_some(asio::buffer(buf), ec);
  if (ec) return false;
  if (!inbound) inbound = std::make_unique<FrameDecoder>(options.token);
  for (const auto& m : inbound->feed(buf.data(), got)) {
    for (const auto& a : m.aborts) {
      if (options.on_abort) options.on_abort(a);
    }
  }
  return true;
}

void TelemetryClient::Impl::loop() {
  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(options.interval_s));
  for (;;) {
    std::deque<WireStall> new_stalls;
    bool last = false;
    bool announce = false;
    int32_t reason = kGoneFinished;
    {
      // Until the next interval, a stall report or stop; abort orders are read as they arrive
      // meanwhile (the socket is polled with the wake eventfd), so that every rank acts on one
      // within moments of the others.
      const auto deadline = std::chrono::steady_clock::now() + interval;
      bool socket_quiet = false;  // readable with nothing to read: closed; not polled till the next interval
      for (;;) {
        {
          MutexLock lock(mu);
          // A stop notice ends the wait only when there is a connection to say it on; without
          // one, the next interval's reconnect says it (no busy loop while the coordinator is gone).
          if (stopping || !stalls.empty() || (stop_requested && !stop_announced && socket != nullptr)) break;
        }
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline) break;
        const auto left_ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
        pollfd fds[2] = {{wake_fd, POLLIN, 0}, {-1, POLLIN, 0}};
        nfds_t count = 1;
        if (socket && !socket_quiet) {
          fds[1].fd = socket->native_handle();
          count = 2;
        }
        const int ready = ::poll(fds, count, static_cast<int>(left_ms));
        if (ready < 0 && errno != EINTR) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));  // cannot poll: the old pace
          receive();
          continue;
        }
        if (fds[0].revents & POLLIN) {
          uint64_t drained;
          (void)!::read(wake_fd, &drained, sizeof(drained));
        }
        if (count == 2 && fds[1].revents != 0 && !receive()) socket_quiet = true;
      }
      MutexLock lock(mu);
      last = stopping;
      reason = goodbye_reason;
      announce = stop_requested;
      if (last && reason == kGoneClosed) return;  // dropped: as if the process died
      new_stalls.swap(stalls);
    }
    if (last) {
      // A normal end: what is pending, then goodbye, so the coordinator does not take the
      // closing connection for a crash. Only over a connection that is already up.
      if (socket) {
        pump();
        bool ok = sendGroups() && sendPending();
        WireMessage bye;
        bye.type = WireType::kGone;
        bye.gones.push_back({options.rank, reason});
        if (ok) sendFrame(bye);
      }
      return;
    }
    pump();
    if (!connect()) continue;
    bool ok = true;
    if (!new_stalls.empty()) {
      WireMessage m;
      m.type = WireType::kStall;
      m.stalls.assign(new_stalls.begin(), new_stalls.end());
      ok = sendFrame(m);
    }
    if (ok && announce && !stop_announced) {
      WireMessage m;
      m.type = WireType::kGone;
      m.gones.push_back({options.rank, kGoneStopping});
      ok = stop_announced = sendFrame(m);
    }
    if (ok) ok = sendGroups() && sendPending();
    if (ok) {
      WireMessage hb;
      hb.type = WireType::kHeartbeat;
      WireHeartbeat beat;
      beat.rank = options.rank;
      beat.sent_ns = Clock::real().monotonicNow().count();
      if (options.progress) options.progress(beat);
      hb.heartbeats.push_back(beat);
      ok = sendFrame(hb);
    }
    if (ok) receive();
    if (!ok) {
      socket.reset();  // reconnect next interval; pending records wait (bounded)
      stop_announced = false;
    }
  }
}

Result<std::unique_ptr<TelemetryClient>> TelemetryClient::start(TelemetryClientOptions options,
                                                                CollectiveTracker& tracker) {
  if (options.unix_path.empty()) {
    boost::system::error_code ec;
    asio::ip::make_address(options.host, ec);
    if (ec) return Status::invalidArgument("telemetry coordinator address '" + options.host + "': " + ec.message());
    if (options.port == 0) return Status::invalidArgument("telemetry coordinator port must not be 0");
  } else if (options.unix_path.size() >= sizeof(sockaddr_un::sun_path)) {
    return Status::invalidArgument("telemetry node monitor socket '" + options.unix_path + "' is too long");
  }
  auto impl = std::make_unique<Impl>();
  impl->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->wake_fd < 0) return Status::unavailable(std::string("telemetry client: eventfd: ") + std::strerror(errno));
  impl->options = std::move(options);
  impl->tracker = &tracker;
  impl->next_seq = tracker.stats().last_seq + 1;  // what happened before we started is not news
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->loop(); });
  return std::unique_ptr<TelemetryClient>(new TelemetryClient(std::move(impl)));
}

TelemetryClient::TelemetryClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TelemetryClient::~TelemetryClient() { stop(); }

void TelemetryClient::reportStall(const std::string& section, int64_t step) {
  WireStall s;
  s.rank = impl_->options.rank;
  s.step = step;
  std::strncpy(s.section, section.c_str(), sizeof(s.section) - 1);
  {
    MutexLock lock(impl_->mu);
    impl_->stalls.push_back(s);
  }
  impl_->wake();
}

void TelemetryClient::reportStopping() {
  {
    MutexLock lock(impl_->mu);
    impl_->stop_requested = true;
  }
  impl_->wake();
}

void TelemetryClient::stopFailed() {
  {
    MutexLock lock(impl_->mu);
    impl_->goodbye_reason = kGoneFailed;
  }
  stop();
}

void TelemetryClient::dropConnection() {
  {
    MutexLock lock(impl_->mu);
    impl_->goodbye_reason = kGoneClosed;
  }
  stop();
  impl_->socket.reset();  // the thread is joined: closing here is safe
}

void TelemetryClient::stop() {
  {
    MutexLock lock(impl_->mu);
    if (impl_->stopping) return;
    impl_->stopping = true;
  }
  impl_->wake();
  if (impl_->thread.joinable()) impl_->thread.join();
}

TelemetryClient::Counters TelemetryClient::counters() const {
  MutexLock lock(impl_->mu);
  return impl_->counters;
}

}  // namespace trainsup
