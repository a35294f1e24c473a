// Fuzz target: the agreement of issue #47 (csrc/core/bit_agreement.h), whose
// messages every rank reads from its peers: AgreementMessage::decode, and a
// BitAgreement fed whatever those peers send, honest or not.
//
// Input: one byte picks the part.
//  - decode: a byte picks the layout's word count (from 0 to 2^64 - 1, so a
//    count that only matches once cut to 32 bits shows), the rest is the
//    message. A decode throws WireError or gives a message of the expected
//    size whose encoding is exactly the bytes read.
//  - agreement: bytes pick the size (1 to 12), the rank and the layout (0 to
//    6 words), then up to kMaxOps ops: start a round with a vector; receive
//    raw bytes, decoded with the layout's count; or receive a message built
//    from choices (step, sender, round relative to this rank's, a word count
//    right or wrong), through the wire or, with a wrong count, straight into
//    receive() too, as a check of its own. The oracle: receive() never
//    throws; a refused message changes nothing that can be seen (active(),
//    round(), peerStartedNext(), result(), no sends); receive() never changes
//    round(), start() adds exactly one; a round ends after exactly
//    sendsPerRound() messages of the schedule, each to a rank in [0, size)
//    other than this one whose schedule expects it from this rank at that
//    step, plus at most one poke from a rank r < E to r + P; every message
//    sent decodes again, with the layout's count, to itself; a rank below P
//    only ever combines its own vector into its result (AND within it, OR and
//    MAX above it), and a lone rank's result is its own vector.
#include <algorithm>
#include <exception>
#include <utility>
#include <vector>

#include "core/bit_agreement.h"
#include "core/wire.h"
#include "fuzz_check.h"

using namespace hvd;

namespace {

// Bounds each input: a few rounds of a dozen ranks need well under this.
constexpr int kMaxOps = 256;
constexpr int kMaxSize = 12;
constexpr uint8_t kPoke = AgreementMessage::kPokeStep;

// The schedule of bit_agreement.h's header restated, independently of the
// class: which rank `rank` of `size` hears from at `step` (-1 for none).
struct Schedule {
  int size, pow2 = 1, log2p = 0, extras = 0;
  explicit Schedule(int n) : size(n) {
    while (pow2 * 2 <= size) {
      pow2 *= 2;
      ++log2p;
    }
    extras = size - pow2;
  }
  int last() const { return log2p + 1; }
  int senderOf(int rank, int step) const {
    if (step == kPoke) return rank >= pow2 ? rank - pow2 : -1;
    if (step == 0) return rank < extras ? rank + pow2 : -1;
    if (step >= 1 && step <= log2p) return rank < pow2 ? rank ^ (1 << (step - 1)) : -1;
    if (step == last()) return rank >= pow2 ? rank - pow2 : -1;
    return -1;
  }
};

void checkDecode(fuzz::Input& in) {
  static const size_t kWords[] = {0, 1, 2, 3, 5, 64, size_t{1} << 32, ~size_t{0}};
  const size_t words = kWords[in.byte() % 8];
  const std::string bytes = in.rest();
  try {
    const AgreementMessage m = AgreementMessage::decode(bytes, words);
    FUZZ_CHECK(m.words.size() == (m.step == kPoke ? 0 : words));
    FUZZ_CHECK(bytes.size() == AgreementMessage::encodedBytes(m.words.size()));
    FUZZ_CHECK(m.encode() == bytes);
  } catch (const WireError&) {
    // A cut or padded message, or another count: the engine fails the peer.
  }
}

// What a caller sees of a BitAgreement between two calls.
struct Seen {
  bool active, next;
  uint64_t round;
  std::vector<uint64_t> result;
  explicit Seen(const BitAgreement& a)
      : active(a.active()), next(a.peerStartedNext()), round(a.round()), result(a.result()) {}
  bool operator==(const Seen& o) const {
    return active == o.active && next == o.next && round == o.round && result == o.result;
  }
};

class Harness {
 public:
  Harness(fuzz::Input& in, int size, int rank, AgreementLayout layout)
      : in_(in), schedule_(size), rank_(rank), layout_(layout), a_(size, rank, layout) {}

  void run() {
    for (int op = 0; op < kMaxOps && !in_.empty(); ++op) {
      switch (in_.byte() % 4) {
        case 0: start(); break;
        case 1: rawMessage(); break;
        default: builtMessage(); break;
      }
      FUZZ_CHECK(!(a_.active() && a_.peerStartedNext()));
    }
  }

 private:
  std::vector<uint64_t> words(size_t n) {
    std::vector<uint64_t> v(n);
    for (auto& w : v) w = in_.u64();
    return v;
  }

  void start() {
    const std::vector<uint64_t> mine = words(layout_.total());
    if (a_.active()) return;  // start() is for a finished round only
    const uint64_t before = a_.round();
    mine_ = mine;
    sent_ = 0;
    pokes_ = 0;
    a_.start(mine);
    FUZZ_CHECK(a_.round() == before + 1);
    FUZZ_CHECK(!a_.peerStartedNext());
    drain(true);
  }

  // A sender: the one the schedule names for `step` (when the top bit is set
  // and there is one), else any rank, or one just outside [0, size).
  int pickFrom(int step) {
    const uint8_t b = in_.byte();
    const int named = schedule_.senderOf(rank_, step);
    if ((b & 0x80) && named >= 0) return named;
    return static_cast<int>((b & 0x7f) % (schedule_.size + 2)) - 1;
  }

  void rawMessage() {
    const std::string bytes = in_.bytes(in_.byte() % 64);
    AgreementMessage m;
    try {
      m = AgreementMessage::decode(bytes, layout_.total());
    } catch (const WireError&) {
      return;  // the engine fails the peer
    }
    const int from = pickFrom(m.step);
    deliver(from, std::move(m));
  }

  void builtMessage() {
    AgreementMessage m;
    const int s = in_.byte() % (schedule_.last() + 3);
    if (s <= schedule_.last())
      m.step = static_cast<uint8_t>(s);
    else
      m.step = s == schedule_.last() + 1 ? kPoke : in_.byte();
    const int from = pickFrom(m.step);
    switch (in_.byte() % 5) {
      case 0: m.round = a_.round() - 1; break;
      case 1: m.round = a_.round(); break;
      case 2: m.round = a_.round() + 1; break;
      case 3: m.round = a_.round() + 2; break;
      default: m.round = in_.u64(); break;
    }
    const size_t right = m.step == kPoke ? 0 : layout_.total();
    // Mostly the right count; a wrong one goes through decode (which must
    // refuse it) or, as a peer's bug would reach it past another decoder,
    // straight into receive().
    const uint8_t c = in_.byte();
    const size_t count = c < 0xe0 ? right : c % 8;
    m.words = words(count);
    if (count != right && (c & 1)) {
      deliver(from, std::move(m));
      return;
    }
    const std::string bytes = m.encode();
    try {
      AgreementMessage back = AgreementMessage::decode(bytes, layout_.total());
      FUZZ_CHECK(count == right);
      FUZZ_CHECK(back.round == m.round && back.step == m.step && back.words == m.words);
      deliver(from, std::move(back));
    } catch (const WireError&) {
      FUZZ_CHECK(count != right);
    }
  }

  void deliver(int from, AgreementMessage m) {
    const Seen before(a_);
    const bool right_size = m.words.size() == (m.step == kPoke ? 0 : layout_.total());
    const uint8_t step = m.step;
    const uint64_t round = m.round;
    Status s;
    try {
      s = a_.receive(from, std::move(m));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "receive threw: %s\n", e.what());
      FUZZ_CHECK(false && "receive() threw");
    }
    const Seen after(a_);
    FUZZ_CHECK(after.round == before.round);
    if (!s.ok()) {
      FUZZ_CHECK(after == before);
      std::vector<std::pair<int, AgreementMessage>> out;
      a_.takeSends(out);
      FUZZ_CHECK(out.empty());
      return;
    }
    // Kept, or a late poke ignored: from the rank the schedule names, of the
    // right size, for this round or the next.
    FUZZ_CHECK(right_size);
    FUZZ_CHECK(from >= 0 && from == schedule_.senderOf(rank_, step));
    FUZZ_CHECK(round == before.round + 1 || (round == before.round && before.active) ||
               (step == kPoke && round <= before.round));
    drain(before.active);
  }

  // Takes the sends and holds them to the schedule; `was_active`: a round
  // was under way before the call, so it may have ended.
  void drain(bool was_active) {
    std::vector<std::pair<int, AgreementMessage>> out;
    a_.takeSends(out);
    FUZZ_CHECK(out.empty() || was_active);
    for (const auto& [to, m] : out) {
      FUZZ_CHECK(to >= 0 && to < schedule_.size && to != rank_);
      FUZZ_CHECK(m.round == a_.round());
      if (m.step == kPoke) {
        FUZZ_CHECK(rank_ < schedule_.extras && to == rank_ + schedule_.pow2);
        FUZZ_CHECK(m.words.empty());
        ++pokes_;
        FUZZ_CHECK(pokes_ == 1);
      } else {
        FUZZ_CHECK(m.step <= schedule_.last());
        FUZZ_CHECK(m.words.size() == layout_.total());
        ++sent_;
      }
      FUZZ_CHECK(schedule_.senderOf(to, m.step) == rank_);
      const std::string bytes = m.encode();
      FUZZ_CHECK(bytes.size() == AgreementMessage::encodedBytes(m.words.size()));
      const AgreementMessage back = AgreementMessage::decode(bytes, layout_.total());
      FUZZ_CHECK(back.round == m.round && back.step == m.step && back.words == m.words);
    }
    FUZZ_CHECK(sent_ <= a_.sendsPerRound());
    if (was_active && !a_.active()) finished();
  }

  void finished() {
    FUZZ_CHECK(sent_ == a_.sendsPerRound());
    const std::vector<uint64_t>& r = a_.result();
    FUZZ_CHECK(r.size() == layout_.total());
    if (schedule_.size == 1) FUZZ_CHECK(r == mine_);
    if (rank_ >= schedule_.pow2) return;  // an extra rank takes its partner's result whole
    size_t i = 0;
    for (; i < layout_.and_words; ++i) FUZZ_CHECK((r[i] & ~mine_[i]) == 0);
    for (; i < layout_.and_words + layout_.or_words; ++i) FUZZ_CHECK((mine_[i] & ~r[i]) == 0);
    for (; i < layout_.total(); ++i) FUZZ_CHECK(r[i] >= mine_[i]);
  }

  fuzz::Input& in_;
  const Schedule schedule_;
  const int rank_;
  const AgreementLayout layout_;
  BitAgreement a_;
  std::vector<uint64_t> mine_;  // this rank's vector of the current round
  int sent_ = 0;                // schedule messages sent this round
  int pokes_ = 0;               // pokes sent this round
};

void checkAgreement(fuzz::Input& in) {
  const int size = 1 + in.byte() % kMaxSize;
  const int rank = in.byte() % size;
  AgreementLayout layout;
  layout.and_words = in.byte() % 3;
  layout.or_words = in.byte() % 3;
  layout.max_words = in.byte() % 3;
  Harness(in, size, rank, layout).run();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  if (in.byte() % 2 == 0)
    checkDecode(in);
  else
    checkAgreement(in);
  return 0;
}
