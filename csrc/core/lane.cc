// The lane (lane.h): submissions that meet the fast lane, and the deferred
// async ops with their watch thread.
#include "lane.h"

namespace hvd {

namespace {
// A caller that submits async ops without ever waiting: past this many, they
// all go to the engine (memory stays bounded).
constexpr size_t kMaxDeferred = 4096;
}  // namespace

Lane::Lane(std::unique_ptr<FastLane> fast, std::chrono::microseconds defer, Sink& sink)
    : fast_(std::move(fast)), defer_(defer), sink_(sink) {
  if (defer_.count() > 0) watch_thread_ = std::thread([this] { watch(); });
}

Lane::~Lane() { stop(); }

bool Lane::submit(Entry& e, SubmitMode mode) {
  const bool waits = mode == SubmitMode::kCallerWaits;
  // An async op of a cached name waits for its caller's synchronize, to run
  // on the lane then; any other submission first resolves those, in order
  // (the lane counts each name's submissions).
  if (!waits && defer(e)) return true;
  resolveAll(waits);
  // Every submission of a name with a lane slot registers there: a blocking
  // one may run on the lane and be done here.
  if (fast_->submit(e, waits) != FastLane::Outcome::kRan) return false;
  e.work->complete(Status());
  return true;
}

bool Lane::defer(Entry& e) {
  if (defer_.count() <= 0 || count_.load(std::memory_order_relaxed) >= kMaxDeferred) return false;
  FastLane::Ticket ticket = fast_->defer(e);
  if (ticket.op == nullptr) return false;
  std::unique_lock<std::mutex> lock(mu_);
  // Asked under mu_: the engine stops taking submissions before fail()
  // empties the queue, so an entry is either refused here or failed there.
  Status refused = sink_.stopped();
  if (!refused.ok()) {
    lock.unlock();
    e.work->complete(std::move(refused));
    return true;
  }
  const bool first = deferred_.empty();
  deferred_.push_back({std::move(e), std::move(ticket), std::chrono::steady_clock::now()});
  count_.fetch_add(1, std::memory_order_release);
  if (first && watch_idle_) watch_cv_.notify_one();
  return true;
}

void Lane::resolve(bool attempt, std::chrono::steady_clock::time_point only_older) {
  const bool watch = only_older != std::chrono::steady_clock::time_point{};
  std::unique_lock<std::mutex> one(resolving_, std::defer_lock);
  if (watch) {
    if (!one.try_lock()) return;  // a caller is resolving them all
  } else {
    one.lock();
  }
  bool queued = false;
  while (true) {
    Deferred d;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (deferred_.empty() || (watch && deferred_.front().at > only_older)) break;
      d = std::move(deferred_.front());
      deferred_.pop_front();
      count_.fetch_sub(1, std::memory_order_release);
    }
    Status refused = sink_.stopped();
    if (!refused.ok()) {
      d.entry.work->complete(std::move(refused));
      continue;
    }
    if (fast_->resolve(d.entry, d.ticket, attempt) == FastLane::Outcome::kRan) {
      d.entry.work->complete(Status());
      continue;
    }
    queued = sink_.queueForEngine(std::move(d.entry)) || queued;
  }
  one.unlock();
  if (queued) sink_.wake();
}

void Lane::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!watch_stop_) {
    if (deferred_.empty()) {
      // Nothing deferred: sleep until an entry comes (defer() notifies while
      // we are idle; both under mu_, so none is missed).
      watch_idle_ = true;
      watch_cv_.wait(lock, [&] { return watch_stop_ || !deferred_.empty(); });
      watch_idle_ = false;
      continue;
    }
    // A pause in submissions, not the oldest entry's age: a burst being
    // submitted is not split between the engine and the lane.
    const auto due = deferred_.back().at + defer_;
    if (std::chrono::steady_clock::now() < due) {
      watch_cv_.wait_until(lock, due);
      continue;
    }
    lock.unlock();
    resolve(false, std::chrono::steady_clock::now() - defer_);
    lock.lock();
    // A caller was resolving them: look again a little later.
    watch_cv_.wait_for(lock, defer_ / 4, [&] { return watch_stop_; });
  }
}

void Lane::stop() {
  if (!watch_thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    watch_stop_ = true;
  }
  watch_cv_.notify_one();
  watch_thread_.join();
}

void Lane::fail(const Status& status) {
  std::deque<Deferred> taken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    taken.swap(deferred_);
    count_.store(0, std::memory_order_release);
  }
  for (Deferred& d : taken) d.entry.work->complete(status);
  // A deferred entry being resolved on the lane ends before its memory goes.
  std::lock_guard<std::mutex> resolving(resolving_);
}

}  // namespace hvd
