// Deferred async ops (engine.h): an async submission of a cached name, on a
// job with the fast lane, waits in this rank's deferred_ queue instead of
// going to the engine. When its caller waits for it (drive()), or another
// op is submitted, every deferred entry is resolved in submission order: run
// on the lane, where the other ranks doing the same meet it in one pass each
// (K async ops then K synchronizes), or cancelled there and sent to the
// engine. poll(), and a watch thread once the rank has deferred nothing for
// config_.lane_defer, send them to the engine: a rank whose caller waits
// elsewhere (not in hvd) holds a peer waiting for its op no longer than that.
// A caller still submitting is not waiting elsewhere, so a long burst (K in
// the thousands) stays deferred until its first synchronize.
#include <chrono>

#include "engine.h"

namespace hvd {

namespace {
// A caller that submits async ops without ever waiting: past this many, they
// all go to the engine (memory stays bounded).
constexpr size_t kMaxDeferred = 4096;
}  // namespace

bool Engine::deferEntry(Entry& e) {
  if (config_.lane_defer.count() <= 0 ||
      deferred_count_.load(std::memory_order_relaxed) >= kMaxDeferred)
    return false;
  FastLane::Ticket ticket = lane_->defer(e);
  if (ticket.op == nullptr) return false;
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepting()) {
      // Stopped meanwhile: fail() has taken the queue already.
      e.work->complete(refusal());
      return true;
    }
    first = deferred_.empty();
    deferred_.push_back({std::move(e), std::move(ticket), std::chrono::steady_clock::now()});
    deferred_count_.fetch_add(1, std::memory_order_release);
  }
  if (first && deferral_idle_.load()) {
    std::lock_guard<std::mutex> lock(deferral_mu_);
    deferral_cv_.notify_one();
  }
  return true;
}

void Engine::resolveDeferred(bool attempt, std::chrono::steady_clock::time_point only_older) {
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
      deferred_count_.fetch_sub(1, std::memory_order_release);
      if (!accepting()) {
        d.entry.work->complete(refusal());
        continue;
      }
    }
    if (lane_->resolve(d.entry, d.ticket, attempt) == FastLane::Outcome::kRan) {
      d.entry.work->complete(Status());
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepting()) {
      d.entry.work->complete(refusal());
      continue;
    }
    queue_.push_back(std::move(d.entry));
    queued = true;
  }
  one.unlock();
  if (queued) wake();
}

void Engine::watchDeferred() {
  std::unique_lock<std::mutex> lock(deferral_mu_);
  while (!deferral_stop_) {
    std::chrono::steady_clock::time_point newest{};
    {
      std::lock_guard<std::mutex> q(mu_);
      if (!deferred_.empty()) newest = deferred_.back().at;
    }
    if (newest == std::chrono::steady_clock::time_point{}) {
      // Nothing deferred: sleep until an entry comes (deferEntry rings while
      // we are idle; checked again under deferral_mu_, so none is missed).
      deferral_idle_.store(true);
      deferral_cv_.wait(lock, [&] {
        std::lock_guard<std::mutex> q(mu_);
        return deferral_stop_ || !deferred_.empty();
      });
      deferral_idle_.store(false);
      continue;
    }
    const auto due = newest + config_.lane_defer;
    if (std::chrono::steady_clock::now() < due) {
      deferral_cv_.wait_until(lock, due);
      continue;
    }
    lock.unlock();
    resolveDeferred(false, std::chrono::steady_clock::now() - config_.lane_defer);
    lock.lock();
    // A caller was resolving them: look again a little later.
    deferral_cv_.wait_for(lock, config_.lane_defer / 4);
  }
}

void Engine::stopDeferralWatch() {
  if (!deferral_thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(deferral_mu_);
    deferral_stop_ = true;
    deferral_cv_.notify_one();
  }
  deferral_thread_.join();
}

std::deque<Engine::Deferred> Engine::takeDeferred() {
  std::deque<Deferred> taken;
  std::lock_guard<std::mutex> lock(mu_);
  taken.swap(deferred_);
  deferred_count_.store(0, std::memory_order_release);
  return taken;
}

}  // namespace hvd
