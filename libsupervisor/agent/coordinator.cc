#include "trainsup/coordinator.h"

#include <boost/asio.hpp>
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "telemetry/telemetry_wire.h"
#include "trainsup/clock.h"
#include "trainsup/mutex.h"

namespace trainsup {

namespace asio = boost::asio;
using asio::ip::tcp;

// Handlers hold a plain pointer: the Impl outlives the I/O thread, and destroying it destroys
// the io_context with every pending handler (and so every Connection).
struct Coordinator::Impl {
  // Set at construction.
  JobToken token;
  CoordinatorOptions options;
  OnVerdict on_verdict;

  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer timer{io};
  bool armed = false;  // an evaluation is due at timer.expiry() (I/O thread only)
  asio::steady_timer accept_retry{io};
  std::thread thread;
  uint16_t port = 0;

  // I/O thread only.
  std::unique_ptr<Detector> detector;
  std::vector<std::weak_ptr<class Connection>> connections;
  // The connection that last said hello for each rank: only it speaks for the rank, and only
  // its closing is the rank's departure (frames of that rank replayed on another connection,
  // or a stale connection closing late, change nothing). Ranks nobody said hello for (older
  // peers) are spoken for by any connection, as before.
  // (Identity only, never dereferenced; every connection leaves through Connection::closed(),
  // which takes its entries out, before it can be destroyed.)
  std::map<int, const class Connection*> owner;
  // The abort order once given (null before): a rank that connects after it (still starting
  // when the verdict came) is told too, rather than entering collectives that nobody will answer.
  std::shared_ptr<std::string> abort_frame;
  bool aborted() const { return abort_frame != nullptr; }
  bool deposed = false;  // I/O thread: a node monitor said it moved to another coordinator
  void broadcastAbort(const Verdict& v);

  mutable Mutex counters_mu;
  Counters counters TRAINSUP_GUARDED_BY(counters_mu);
  std::vector<RankInfo> known TRAINSUP_GUARDED_BY(counters_mu);  // updated by hellos
  DetectorSnapshot snapshot TRAINSUP_GUARDED_BY(counters_mu);   // copied by the I/O thread
  int64_t snapshot_at_ns = INT64_MIN / 2;                        // I/O thread only
  std::once_flag stopped;

  void accept();
  void tick(int64_t evaluated_at);
  void arm(std::chrono::nanoseconds wait);
  void judgeNow();
  void count(uint64_t Counters::*field, uint64_t n = 1) {
    MutexLock lock(counters_mu);
    counters.*field += n;
  }
};

namespace {

int64_t nowNs() { return Clock::real().monotonicNow().count(); }

}  // namespace

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // Queues a frame to this peer (I/O thread).
  void send(std::shared_ptr<std::string> frame) {
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(*frame), [self, frame](const boost::system::error_code&, size_t) {});
  }
  Connection(tcp::socket socket, Coordinator::Impl* owner)
      : socket_(std::move(socket)), owner_(owner), decoder_(owner_->token) {}
  void read() {
    auto self = shared_from_this();
    socket_.async_read_some(asio::buffer(buf_), [self](const boost::system::error_code& ec, size_t n) {
      if (ec) {
        self->closed();
        return;
      }
      self->consume(n);
      self->read();
    });
  }

 private:
  void consume(size_t n) {
    Coordinator::Impl& o = *owner_;
    auto before = decoder_.counters();
    auto messages = decoder_.feed(buf_.data(), n);
    auto after = decoder_.counters();
    uint64_t dropped = (after.oversized - before.oversized) + (after.bad_version - before.bad_version) +
                       (after.bad_type - before.bad_type) + (after.bad_length - before.bad_length) +
                       (after.bad_token - before.bad_token);
    if (dropped > 0) o.count(&Coordinator::Counters::dropped_frames, dropped);
    if (after.bad_magic_bytes > before.bad_magic_bytes) {
      o.count(&Coordinator::Counters::garbage_bytes, after.bad_magic_bytes - before.bad_magic_bytes);
    }
    const int64_t now = nowNs();
    const size_t ranks_before = ranks_.size();
    uint64_t conflicting = 0;
    // Another connection said hello for this rank more recently: this one does not speak for it.
    auto foreign = [&](int rank) {
      auto it = o.owner.find(rank);
      const bool other = it != o.owner.end() && it->second != this;
      conflicting += other;
      return other;
    };
    for (const auto& m : messages) {
      o.count(&Coordinator::Counters::frames);
      // Hellos first: a connection's first frame may carry its hello and records together.
      for (const auto& h : m.hellos) {
        ranks_.insert(h.rank);
        o.owner[h.rank] = this;
        RankInfo info;
        info.rank = h.rank;
        info.local_rank = h.local_rank;
        info.host = h.host;
        info.gpu = h.gpu;
        o.detector->setRankInfo(info);
        {
          MutexLock lock(o.counters_mu);
          if (h.rank >= 0 && static_cast<size_t>(h.rank) < o.known.size()) mergeRankInfo(o.known[h.rank], info);
        }
      }
      // Group claims before records: a rank's first frames name its groups.
      for (const auto& g : m.groups) {
        if (foreign(g.rank)) continue;
        o.detector->onGroup(g.rank, g.group, g.group_rank, g.group_size, g.desc);
      }
      for (const auto& c : m.collectives) {
        if (foreign(c.rank)) continue;
        ranks_.insert(c.rank);
        auto op = c.op < kCollectiveOpCount ? static_cast<CollectiveOp>(c.op) : CollectiveOp::kOther;
        o.detector->onEnter(c.rank, c.group, c.seq, c.peer, op, c.bytes, now);
        if (c.exit_ns > 0) o.detector->onExit(c.rank, c.group, c.seq, c.peer, op, c.exit_ns - c.enter_ns, now);
      }
      for (const auto& h : m.heartbeats) {
        if (foreign(h.rank)) continue;
        ranks_.insert(h.rank);
        o.detector->onHeartbeat(h.rank, now, h.sent_ns);
        if (h.section[0] != '\0') o.detector->onProgress(h.rank, h.step, h.section, h.in_section_ns, now);
      }
      for (const auto& s : m.stalls) {
        if (foreign(s.rank)) continue;
        ranks_.insert(s.rank);
        o.detector->onRankStalled(s.rank, s.section, s.step, now);
      }
      for (const auto& g : m.gones) {
        if (foreign(g.rank)) continue;
        if (g.reason == kGoneFinished) {
          o.detector->onFinished(g.rank);
        } else if (g.reason == kGoneFailed) {
          o.detector->onFailed(g.rank);
        } else if (g.reason == kGoneStopping) {
          o.detector->onStopping(g.rank, now);
        } else if (g.reason == kGoneMoved) {
          // A node monitor moved to another coordinator: its agent follows the one the job
          // elected since. This one was replaced (a takeover) and judges nobody any more: its
          // view is emptying as the node monitors leave, which would otherwise read as ranks dying.
          o.detector->onFinished(g.rank);
          o.deposed = true;
        } else {
          o.detector->onDisconnect(g.rank, now);
          o.judgeNow();
        }
      }
      o.count(&Coordinator::Counters::records, m.collectives.size() + m.heartbeats.size() + m.stalls.size() +
                                                   m.hellos.size() + m.gones.size() + m.groups.size());
    }
    if (conflicting > 0) o.count(&Coordinator::Counters::conflicting_records, conflicting);
    // A rank heard on this connection for the first time: its silence timeout may expire
    // before the evaluation the timer waits for.
    if (ranks_.size() != ranks_before) o.tick(now);
    {
      const auto& dc = o.detector->counters();
      MutexLock lock(o.counters_mu);
      o.counters.unknown_group_records = dc.unknown_group;
      o.counters.bad_group_claims = dc.bad_claims;
    }
  }
  void closed() {
    const int64_t now = nowNs();
    auto& owner = owner_->owner;
    for (int r : ranks_) {
      auto it = owner.find(r);
      if (it != owner.end() && it->second != this) continue;  // it said hello elsewhere since: still there
      if (it != owner.end()) owner.erase(it);
      owner_->detector->onDisconnect(r, now);
      owner_->judgeNow();
    }
  }

  tcp::socket socket_;
  Coordinator::Impl* owner_;
  FrameDecoder decoder_;
  std::array<uint8_t, 64 * 1024> buf_;
  std::set<int> ranks_;
};

void Coordinator::Impl::accept() {
  Impl* self = this;
  acceptor.async_accept([self](const boost::system::error_code& ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;  // stopping
    if (ec) {
      // Out of file descriptors (a flood of connections) or a peer gone before accept: keep
      // serving; try again shortly rather than never.
      self->count(&Counters::accept_errors);
      self->accept_retry.expires_after(std::chrono::milliseconds(50));
      self->accept_retry.async_wait([self](const boost::system::error_code& e) {
        if (!e) self->accept();
      });
      return;
    }
    self->count(&Counters::connections);
    auto conn = std::make_shared<Connection>(std::move(socket), self);
    // Closed connections leave expired entries (whose memory make_shared keeps): drop them.
    auto& list = self->connections;
    list.erase(std::remove_if(list.begin(), list.end(), [](const auto& w) { return w.expired(); }), list.end());
    self->connections.push_back(conn);
    conn->read();
    if (self->abort_frame) conn->send(self->abort_frame);
    self->accept();
  });
}

void Coordinator::Impl::tick(int64_t evaluated_at) {
  // The next evaluation: after evaluate_interval_s, or sooner when a silence timeout or a
  // collective's budget expires before that (judged when it expires, not up to a tick later).
  auto wait = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(options.evaluate_interval_s));
  const int64_t until = detector->nextDeadlineNs(evaluated_at) - nowNs();
  if (until < wait.count()) wait = std::chrono::nanoseconds(std::max<int64_t>(0, until));
  arm(wait);
}

// A rank's connection closed: judged now, not at the next tick (the rule that the first rank
// to go is the culprit holds either way: departures are ordered by when they arrived here).
void Coordinator::Impl::judgeNow() { arm(std::chrono::nanoseconds(0)); }

void Coordinator::Impl::arm(std::chrono::nanoseconds wait) {
  Impl* self = this;
  const auto at = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(wait);
  if (armed && timer.expiry() <= at) return;  // the evaluation already due comes first
  armed = true;
  // Re-arming cancels the wait under way (its handler sees operation_aborted and returns).
  timer.expires_at(at);
  timer.async_wait([self](const boost::system::error_code& ec) {
    if (ec) return;
    self->armed = false;
    const int64_t now = nowNs();
    if (now - self->snapshot_at_ns >= static_cast<int64_t>(self->options.snapshot_interval_s * 1e9)) {
      DetectorSnapshot snap = self->detector->snapshot(now);
      self->snapshot_at_ns = now;
      MutexLock lock(self->counters_mu);
      self->snapshot = std::move(snap);
    }
    for (const Verdict& v : self->detector->evaluate(now)) {
      if (self->deposed) {
        self->count(&Counters::deposed_verdicts);  // replaced: not ours to report or act on
        continue;
      }
      if (self->aborted()) {
        // After the abort order, ranks leaving and collectives left open are its consequences.
        self->count(&Counters::consequences);
        continue;
      }
      self->count(&Counters::verdicts);
      if (self->on_verdict) self->on_verdict(v);
      // A straggler slows the job but does not stop it: reported, not aborted for.
      if (!self->aborted() && self->options.abort_on_verdict && v.kind != VerdictKind::kStraggler) {
        self->broadcastAbort(v);
      }
    }
    self->tick(now);
  });
}

// The first verdict ends the job: every rank still connected is told to abort, naming the
// culprit, so that nobody waits out a collective timeout.
void Coordinator::Impl::broadcastAbort(const Verdict& v) {
  WireMessage m;
  m.type = WireType::kAbort;
  WireAbort a;
  a.culprit_rank = v.ranks.empty() ? -1 : v.ranks.front();
  std::strncpy(a.kind, verdictKindName(v.kind), sizeof(a.kind) - 1);
  if (!v.hosts.empty()) std::strncpy(a.host, v.hosts.front().c_str(), sizeof(a.host) - 1);
  m.aborts.push_back(a);
  abort_frame = std::make_shared<std::string>(encodeFrame(m, token));
  for (auto& weak : connections) {
    if (auto c = weak.lock()) c->send(abort_frame);
  }
}

Result<std::unique_ptr<Coordinator>> Coordinator::start(std::vector<RankInfo> ranks, const JobToken& token,
                                                        CoordinatorOptions options, DetectorOptions detector,
                                                        OnVerdict on_verdict) {
  auto impl = std::make_shared<Impl>();
  impl->token = token;
  impl->options = options;
  impl->on_verdict = std::move(on_verdict);
  {
    MutexLock lock(impl->counters_mu);  // not shared yet; held for the analysis
    impl->known = ranks;
  }
  std::vector<int> heard_before;
  for (const auto& r : ranks) {
    if (!r.host.empty()) heard_before.push_back(r.rank);
  }
  impl->detector = std::make_unique<Detector>(std::move(ranks), detector);
  if (options.expect_ranks_within_s > 0) {
    impl->detector->expectRanks(nowNs(), options.expect_ranks_within_s, heard_before);
  }
  boost::system::error_code ec;
  auto address = asio::ip::make_address(options.bind_address, ec);
  if (ec) return Status::invalidArgument("coordinator bind address '" + options.bind_address + "': " + ec.message());
  tcp::endpoint endpoint(address, options.port);
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status::unavailable("coordinator cannot listen on " + options.bind_address + ":" +
                               std::to_string(options.port) + ": " + ec.message());
  }
  impl->port = impl->acceptor.local_endpoint().port();
  impl->accept();
  impl->tick(nowNs());
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->io.run(); });
  auto c = std::unique_ptr<Coordinator>(new Coordinator(nullptr));
  c->impl_ = std::move(impl);
  return c;
}

Coordinator::Coordinator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Coordinator::~Coordinator() { stop(); }

uint16_t Coordinator::port() const { return impl_->port; }

void Coordinator::setSlowHosts(std::vector<std::string> hosts) {
  // The detector belongs to the I/O thread: hand the list over there (the thread ends, and its
  // pending handlers with it, before Impl does, as for stop()).
  if (!impl_) return;
  asio::post(impl_->io, [impl = impl_.get(), hosts = std::move(hosts)]() mutable {
    impl->detector->setSlowHosts(std::move(hosts));
  });
}

void Coordinator::stop() {
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

std::vector<RankInfo> Coordinator::knownRanks() const {
  MutexLock lock(impl_->counters_mu);
  return impl_->known;
}

DetectorSnapshot Coordinator::snapshot() const {
  MutexLock lock(impl_->counters_mu);
  return impl_->snapshot;
}

Coordinator::Counters Coordinator::counters() const {
  MutexLock lock(impl_->counters_mu);
  return impl_->counters;
}

}  // namespace trainsup
