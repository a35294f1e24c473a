// The lane: on a job whose ranks share one host, every submission of this
// rank meets the fast lane (fast_lane.h) here before it reaches the engine.
// A blocking op of a cached name may run on the lane on its caller's thread;
// an async one is deferred until its caller waits, and then runs there with
// the other ranks' (docs/architecture.md, "The fast lane", "Deferred async
// ops"). What the lane does not run goes back to the engine through Sink.
//
// Deferred entries are resolved, always all of them and in submission order,
// when their caller waits (attempted on the lane), on another submission, a
// poll() or by the watch thread once this rank has deferred nothing for
// `defer` (cancelled on the lane, sent to the engine): a rank whose caller
// waits elsewhere holds a peer waiting for its op no longer than that. A
// caller still submitting is not waiting elsewhere, so a long burst stays
// deferred until its first synchronize.
//
// Threading: submit(), resolveAll(), setPaused() and the diagnostics may be
// called from any thread, at once. learn(), learnSlots(), bystander(),
// joined() and fail() only by the engine's baton holder; stop() by the
// engine's shutdown() (and the destructor). The lane owns its watch thread,
// which only resolves deferred entries. Locks, in this order: resolving_
// (held across one resolution of the deferred entries, so that instances
// register in submission order; the watch thread only tries it) -> mu_ (the
// deferred queue, the watch thread's state) -> the engine's mutex (inside
// Sink's methods). The engine never calls the lane holding its mutex. mu_
// and the engine's mutex are never held while waiting for peers; resolving_
// and FastLane's running_ are: a second caller's resolution waits for the
// first one's, at most each entry's patience.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "entry.h"
#include "fast_lane.h"
#include "message.h"
#include "submit_mode.h"

namespace hvd {

class Lane {
 public:
  // The engine, as the lane sees it: where an entry the lane does not run
  // goes. Each method may take the engine's mutex; none waits for peers.
  class Sink {
   public:
    // Ok while the engine takes submissions; else the status they get.
    virtual Status stopped() = 0;
    // Queues `e` for the engine's next round; false when it stopped
    // meanwhile (then `e`'s work is completed with stopped()).
    virtual bool queueForEngine(Entry&& e) = 0;
    // Wakes the background thread for entries queueForEngine() queued.
    virtual void wake() = 0;

   protected:
    ~Sink() = default;
  };

  // `fast`: the lane in shared memory (the control segment, which outlives
  // this). `defer`: how long deferred entries wait once this rank stopped
  // deferring (HVD_TORCH_FAST_LANE_DEFER_US); 0 defers nothing and starts no
  // watch thread.
  Lane(std::unique_ptr<FastLane> fast, std::chrono::microseconds defer, Sink& sink);
  ~Lane();
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  // Any thread, with `e` accepted by the engine (its work set, its name not
  // in flight). True: the lane took it, ran it (its work complete), deferred
  // it (kAsync), or refused it (the engine stopped: its work complete).
  // False: its instance is registered: the caller queues it for the engine.
  // Any deferred entries are resolved first (attempted when `mode` is
  // kCallerWaits, else cancelled): the lane counts each name's submissions.
  bool submit(Entry& e, SubmitMode mode);
  // Any thread: resolves every deferred entry, in submission order.
  // `attempt`: they run on the lane (the caller is about to wait:
  // Engine::drive); else they are cancelled there and go to the engine (a
  // poll() that finds its op not done).
  void resolveAll(bool attempt) {
    if (count_.load(std::memory_order_acquire) != 0) resolve(attempt, {});
  }
  // Baton holder (Engine::fail): completes every deferred entry with
  // `status`, and returns once no resolution is in flight.
  void fail(const Status& status);
  // Stops and joins the watch thread; deferred entries stay for fail().
  void stop();

  // The fast lane's, for the engine's baton holder (fast_lane.h).
  void learn(const Request& own, const Response& r, size_t i) { fast_->learn(own, r, i); }
  void learnSlots(const Response& r) { fast_->learnSlots(r); }
  void bystander(const std::string& name) { fast_->bystander(name); }
  void joined(bool yes) { fast_->joined(yes); }
  // Any thread (fast_lane.h).
  void setPaused(bool paused) { fast_->setPaused(paused); }
  uint64_t ranOps() const { return fast_->ranOps(); }
  uint64_t gaveUp() const { return fast_->gaveUp(); }
  bool off() const { return fast_->off(); }

 private:
  struct Deferred {
    Entry entry;
    FastLane::Ticket ticket;
    std::chrono::steady_clock::time_point at;
  };
  // Keeps `e` for the lane; false when it cannot (then the lane registers it now).
  bool defer(Entry& e);
  // resolveAll(); `only_older`: just the entries deferred before it (the
  // watch thread, which gives way to a caller resolving already).
  void resolve(bool attempt, std::chrono::steady_clock::time_point only_older);
  void watch();

  const std::unique_ptr<FastLane> fast_;
  const std::chrono::microseconds defer_;
  Sink& sink_;

  std::mutex resolving_;  // held while deferred entries are taken and resolved
  std::mutex mu_;
  std::condition_variable watch_cv_;
  std::deque<Deferred> deferred_;  // in submission order, under mu_
  bool watch_idle_ = false;        // under mu_: the watch thread waits without a deadline
  bool watch_stop_ = false;        // under mu_
  std::atomic<size_t> count_{0};   // deferred_.size(), for a look without mu_
  std::thread watch_thread_;       // last: started once the rest is built
};

}  // namespace hvd
