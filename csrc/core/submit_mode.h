// How a submission's caller will wait for it: passed by the kernel that
// knows it, through the adapter, to Engine::enqueue. It decides whether the
// background thread is woken, and whether the fast lane may run the op on
// the caller's thread (docs/architecture.md, "Callers drive", "The fast lane").
#pragma once

namespace hvd {

enum class SubmitMode {
  // The caller gets a handle and waits later, maybe never on this thread: the
  // background thread is woken; an op of a cached name may be deferred for
  // the lane until its caller waits.
  kAsync,
  // The caller waits on this thread right after (a blocking kernel): it
  // drives the engine itself (Engine::drive), so the background thread is not
  // woken; a cached op may run on the lane at once, done on return.
  kCallerWaits,
  // One member of a grouped op, negotiated with the others: not woken; the
  // group's submitter calls Engine::wake() once after the last member.
  kGroupMember,
};

}  // namespace hvd
