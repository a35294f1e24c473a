// The engine's side of issue #47: cached ops agreed among the ranks by
// rounds of a BitAgreement over PartnerLinks, with no work for rank 0
// (docs/control_plane_scale.md, "The agreement"). What rank 0 negotiates
// (new names, renegotiations, everything while a rank has joined) still comes
// as response batches; every rank runs a batch at the round that counts it,
// then the round's agreed ops, so every rank runs the same ops in the same
// order. All of it on the baton holder's thread.
#include <algorithm>

#include "engine.h"
#include "log.h"

namespace hvd {

void Engine::connectAgreement(const std::string& prefix) {
  // Rank 0 decides for the job, as for the fast lane: every rank must take
  // part, or none.
  bool on = false;
  if (topology_.rank == 0) {
    const bool wanted = config_.agreement == EngineConfig::Agreement::kOn ||
                        (config_.agreement == EngineConfig::Agreement::kAuto &&
                         topology_.cross_size > 1);
    on = wanted && !lane_ && config_.cache_capacity > 0;
    store_->set(prefix + "on", on ? "1" : "0");
  } else {
    on = store_->get(prefix + "on", config_.start_timeout) == "1";
  }
  if (!on) return;
  rounds_ = std::make_unique<CachedRounds>(config_.cache_capacity, config_.fusion_threshold);
  if (coordinator_) {
    rounds_->announceFusionThreshold(config_.fusion_threshold);
    coordinator_->keepSlotRequests(false);  // every arrival comes in full
  }
  agreement_ = std::make_unique<BitAgreement>(topology_.size, topology_.rank, rounds_->layout());
  partners_.connect(*store_, prefix, agreement_->partners());
  agreed_progress_ = std::chrono::steady_clock::now();
  HVD_LOG(kDebug) << "rank " << topology_.rank << ": cached ops agreed with "
                  << agreement_->partners().size() << " partners";
}

bool Engine::submitToAgreement(Entry& e, const std::string& key) {
  auto known = slot_of_key_.find(key);
  if (known == slot_of_key_.end()) return false;  // new, or not agreed: rank 0's
  const int32_t slot = known->second;
  const ReadyOp* op = rounds_->find(slot);
  if (op == nullptr) return false;
  if (rank_cache_.lookup(key, e.request) == slot) {
    // What fusion plans with must be the same on every member: an
    // allgather's rows are the set's first rank's, the device is no one's.
    Request plan = e.request;
    plan.device = -1;
    if (plan.type == OpType::kAllgather && !op->response.rank_first_dims.empty() &&
        !op->response.rank_first_dims[0].empty() && !plan.shape.empty())
      plan.shape[0] = op->response.rank_first_dims[0][0];
    rounds_->submit(slot, plan);
  } else {
    // Another shape (or op, or scale) under a cached name: every rank
    // forgets the slot at the next round, and this op goes to rank 0 then.
    rounds_->invalidate(slot);
  }
  addPending(key, std::move(e));
  return true;
}

void Engine::sentInline(const std::string& key) {
  auto known = slot_of_key_.find(key);
  if (known != slot_of_key_.end()) rounds_->sentToCoordinator(known->second);
}

void Engine::learnSlots(const Response& response, bool member) {
  if (response.kind != Response::kExecute && response.kind != Response::kInline) return;
  for (size_t i = 0; i < response.names.size() && i < response.cache_ids.size(); ++i) {
    const int32_t slot = response.cache_ids[i];
    if (slot < 0 || static_cast<size_t>(slot) >= config_.cache_capacity) continue;
    if (rounds_->find(slot) != nullptr) continue;  // known: an agreed op's own response
    ReadyOp op;
    Response& r = op.response;
    // Agreed, it runs as a collective: no rank 0 to reduce it inline.
    r.kind = Response::kExecute;
    r.type = response.type;
    r.names = {response.names[i]};
    r.process_set = response.process_set;
    r.cache_ids = {slot};
    if (i < response.rank_first_dims.size()) r.rank_first_dims = {response.rank_first_dims[i]};
    if (i < response.alltoall_splits.size()) r.alltoall_splits = {response.alltoall_splits[i]};
    rounds_->learn(slot, std::move(op), member);
    const std::string key = tableKey(response.process_set, response.names[i]);
    if (slot_keys_.size() <= static_cast<size_t>(slot)) slot_keys_.resize(slot + 1);
    slot_keys_[slot] = key;
    slot_of_key_[key] = slot;
  }
}

void Engine::readPartners() {
  std::vector<std::string> frames;
  const size_t words = rounds_->layout().total();
  for (int p : partners_.partners()) {
    frames.clear();
    const bool open = partners_.readFrom(p, frames);
    for (const std::string& frame : frames) {
      AgreementMessage m;
      try {
        m = AgreementMessage::decode(frame, words);
      } catch (const WireError& e) {
        // An authenticated partner that sends what it should not: a bug.
        throw InternalError("agreement: rank " + std::to_string(p) + "'s message: " + e.what());
      }
      Status s = agreement_->receive(p, std::move(m));
      if (!s.ok()) throw InternalError(s.message);
    }
    if (!open && gone_partner_ < 0) {
      // What it sent before closing is in: a round it finished is not lost.
      gone_partner_ = p;
      partners_.drop(p);
    }
  }
}

void Engine::sendAgreement() {
  std::vector<std::pair<int, AgreementMessage>> sends;
  agreement_->takeSends(sends);
  for (auto& [to, m] : sends) partners_.send(to, m.encode());
}

void Engine::progressRounds() {
  readPartners();
  checkAgreementStall();
  while (true) {
    // What the round owes its partners goes out before any op runs: the
    // extra ranks' results, above all, which a collective would wait for.
    sendAgreement();
    if (outcome_pending_) {
      if (!applyOutcome()) break;  // waiting for rank 0's batches
      continue;
    }
    if (agreement_->active()) break;
    if (agreement_->round() > rounds_applied_) {
      ++rounds_applied_;
      agreement_rounds_.fetch_add(1, std::memory_order_relaxed);
      outcome_ = rounds_->apply(agreement_->result());
      outcome_pending_ = true;
      HVD_LOG(kTrace) << "rank " << topology_.rank << ": round " << agreement_->round()
                      << ": batches through " << outcome_.batches << ", " << outcome_.run.size()
                      << " response(s), " << outcome_.stale.size() << " stale";
      continue;
    }
    if (rounds_->hasNews() || agreement_->peerStartedNext()) {
      HVD_LOG(kTrace) << "rank " << topology_.rank << ": starts round " << agreement_->round() + 1
                      << (rounds_->hasNews() ? " (news)" : " (a peer began it)");
      agreement_->start(rounds_->vector());
      sendAgreement();
      continue;
    }
    break;
  }
  sendAgreement();
  // A round cannot end without every rank: a partner gone while one runs,
  // or while ops wait for one, fails them (as rank 0 fails the ops of a rank
  // that left). Rank 0's own word on why comes first, when it has one.
  // Rank 0 gone: what waits for a batch it never sent, or for a round no
  // longer under way, can never complete.
  const bool stuck = !agreement_->active() &&
                     (outcome_pending_ || (!pending_.empty() && !rounds_->hasNews()));
  if (coordinator_gone_ && stuck) {
    throw control_.coordinatorLost();
  }
  // A partner that left after its last message of this round (a rank that
  // finished the job's last op first) holds nothing up.
  const bool needed = gone_partner_ >= 0 && (agreement_->active() ? agreement_->awaits(gone_partner_)
                                                                 : rounds_->waiting() > 0);
  if (needed) {
    const Status why = control_.diagnosePeerFailure();
    if (!why.ok()) throw StatusError(why);
    throw transportFailure("rank " + std::to_string(gone_partner_) +
                           " exited or lost its agreement link to rank " +
                           std::to_string(topology_.rank) + "; collectives that need it cannot complete");
  }
}

bool Engine::applyOutcome() {
  if (batches_run_ + batches_.size() < outcome_.batches) return false;
  while (batches_run_ < outcome_.batches) {
    std::vector<Response> batch = std::move(batches_.front());
    batches_.pop_front();
    ++batches_run_;
    runBatch(std::move(batch));
  }
  outcome_pending_ = false;
  renegotiate(outcome_.stale);
  renegotiate(outcome_.to_coordinator);
  if (!outcome_.run.empty()) agreed_progress_ = std::chrono::steady_clock::now();
  for (const Response& r : outcome_.run) {
    agreed_ops_.fetch_add(r.names.size(), std::memory_order_relaxed);
    run(r);
  }
  outcome_ = CachedRounds::Outcome();
  return true;
}

void Engine::renegotiate(const std::vector<int32_t>& slots) {
  if (slots.empty()) return;
  std::vector<Arrival> arrivals;
  std::vector<const Request*> own;
  for (int32_t slot : slots) {
    if (static_cast<size_t>(slot) >= slot_keys_.size()) continue;
    auto it = pending_.find(slot_keys_[slot]);
    if (it == pending_.end()) continue;
    Arrival a;
    a.rank = topology_.rank;
    a.request = it->second.request;  // in full: rank 0 compares every rank's
    arrivals.push_back(std::move(a));
    own.push_back(&it->second.request);
  }
  if (coordinator_) {
    for (size_t i = 0; i < arrivals.size(); ++i) arrive(std::move(arrivals[i]), own[i]);
    dispatch(coordinator_->takeReady());
  } else if (!arrivals.empty()) {
    control_.sendToCoordinator(encodeArrivals(arrivals));
  }
}

void Engine::checkAgreementStall() {
  if (!config_.stall_check || rounds_->waiting() == 0) return;
  // Half the warning time without an agreed op while some wait: they go to
  // rank 0, whose stall inspector warns (and fails) naming who is missing.
  const auto now = std::chrono::steady_clock::now();
  const auto patience = std::chrono::duration_cast<std::chrono::milliseconds>(config_.stall_warning) / 2;
  if (now - agreed_progress_ < patience) return;
  HVD_LOG(kDebug) << "rank " << topology_.rank << ": " << rounds_->waiting()
                  << " cached op(s) not agreed for " << patience.count() << " ms: to rank 0";
  rounds_->staleAllSubmitted();
  agreed_progress_ = now;
}

}  // namespace hvd
