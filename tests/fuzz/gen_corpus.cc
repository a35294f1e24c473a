// Writes the seed corpora (tests/fuzz/corpus/<target>/) with the project's
// own encoders: a handful of small valid inputs per target, each one a shape
// the engine really sends, so a fuzzer starts from the decoders' deep paths.
// The store client's seeds are replies, written by store_replies.py with the
// server's encoders. `make -C tests/fuzz corpus` reruns both; the files are
// committed.
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "backends/host_record.h"
#include "backends/shm/shm_peer.h"
#include "core/address.h"
#include "core/bit_agreement.h"
#include "core/control_frames.h"

using namespace hvd;

namespace {

std::string root;

void write(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string dir = root + "/" + target;
  ::mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
}

std::string byte(int v) { return std::string(1, static_cast<char>(v)); }

template <typename T>
std::string encoded(const T& value) {
  Writer w;
  value.encode(w);
  return w.buffer();
}

std::vector<Request> requests() {
  Request plain;
  plain.name = "grad.w";
  plain.shape = {4, 3};
  Request bundle;
  bundle.name = "grads";
  bundle.shape = {7};
  bundle.bundle_shapes = {{3}, {2, 2}};
  bundle.group = "grads";
  bundle.group_size = 1;
  Request gather;
  gather.type = OpType::kAllgather;
  gather.dtype = DataType::kInt64;
  gather.name = "ids";
  gather.shape = {2, 5};
  gather.device = 0;
  gather.plane = Plane::kDevice;
  Request scatter;
  scatter.type = OpType::kAlltoall;
  scatter.dtype = DataType::kBFloat16;
  scatter.name = "tokens";
  scatter.shape = {6};
  scatter.send_splits = {1, 2, 3};
  scatter.single_use = true;
  Request add;
  add.type = OpType::kAddProcessSet;
  add.name = "add";
  add.set_ranks = {0, 2};
  Request remove;
  remove.type = OpType::kRemoveProcessSet;
  remove.name = "remove";
  remove.set_id = 1;
  Request cast;
  cast.type = OpType::kBroadcast;
  cast.reduce_op = ReduceOp::kSum;
  cast.root_rank = 1;
  cast.process_set = 1;
  cast.prescale = 0.5;
  cast.postscale = 2.0;
  cast.name = "params";
  cast.shape = {3};
  return {plain, bundle, gather, scatter, add, remove, cast};
}

std::vector<Response> responses() {
  Response run;
  run.names = {"a", "b"};
  run.cache_ids = {0, 1};
  Response gather;
  gather.type = OpType::kAllgather;
  gather.names = {"ids"};
  gather.rank_first_dims = {{2, 3}};
  gather.cache_ids = {-1};
  Response scatter;
  scatter.type = OpType::kAlltoall;
  scatter.names = {"tokens"};
  scatter.alltoall_splits = {{1, 2, 3, 4}};
  Response error;
  error.kind = Response::kError;
  error.names = {"x"};
  error.error_code = Status::kRefused;
  error.error = "mismatched shapes";
  Response inline_result;
  inline_result.kind = Response::kInline;
  inline_result.names = {"small"};
  inline_result.inline_result = std::string("\x00\x00\x80\x3f", 4);
  inline_result.contributors = 1;
  inline_result.templates = {requests()[0]};
  Response join;
  join.kind = Response::kDone;
  join.type = OpType::kJoin;
  join.names = {"join"};
  join.last_joined_rank = 1;
  Response add;
  add.kind = Response::kDone;
  add.type = OpType::kAddProcessSet;
  add.names = {"add"};
  add.new_set_id = 2;
  return {run, gather, scatter, error, inline_result, join, add};
}

void message() {
  int i = 0;
  for (const auto& q : requests()) write("message", "request" + std::to_string(i++), byte(0) + encoded(q));
  i = 0;
  for (const auto& p : responses()) write("message", "response" + std::to_string(i++), byte(1) + encoded(p));
  write("message", "shapes", byte(2) + encoded(ShapeList{{2, 3}, {}, {5}}));
}

void controlFrames() {
  std::vector<Arrival> arrivals(3);
  arrivals[0].request = requests()[0];
  arrivals[1].cache_id = 4;
  arrivals[2].request = requests()[2];
  arrivals[2].has_inline = true;
  arrivals[2].inline_data = "12345678";
  write("control_frames", "arrivals", byte(0) + byte(1) + encodeArrivals(arrivals));
  write("control_frames", "bye", byte(0) + byte(2) + encodeBye());
  write("control_frames", "responses", byte(1) + byte(0) + encodeResponses(responses()));
  write("control_frames", "abort", byte(1) + byte(0) + encodeAbort(Status::peerFailure("rank 2 died")));
  write("control_frames", "welcome", byte(1) + byte(0) + encodeWelcome());
  write("control_frames", "tunables", byte(1) + byte(0) + encodeTunables(Tunables{}));
  Hello hello;
  hello.rank = 3;
  hello.nonce = std::string(32, 'n');
  write("control_frames", "hello", byte(2) + byte(0) + encodeHello(hello));
  Challenge challenge;
  challenge.nonce = std::string(32, 's');
  challenge.proof = std::string(32, 'p');
  write("control_frames", "challenge", byte(3) + byte(0) + encodeChallenge(challenge));
  write("control_frames", "proof", byte(4) + byte(0) + encodeProof(std::string(32, 'p')));
  // A host leader's, in a job of 8 ranks: its ranks' frames (one closed, one
  // empty, one bare bye), and the roster it sends first.
  std::vector<Relayed> relayed(4);
  relayed[0].rank = 1;
  relayed[0].frame = encodeArrivals(arrivals);
  relayed[1].rank = 2;
  relayed[1].closed = true;
  relayed[2].rank = 3;
  relayed[3].rank = 7;
  relayed[3].frame = encodeBye();
  write("control_frames", "relay", byte(5) + byte(8) + encodeRelay(relayed));
  write("control_frames", "roster", byte(6) + byte(8) + encodeRoster({1, 2, 3, 7}));
}

void hostRecord() {
  HostRecord a;
  a.shm = true;
  a.host = "node-1";
  HostRecord b;
  b.split_reduce = b.split_gather = true;
  b.host = std::string("h\0st|:", 6);
  write("host_record", "shm", a.encode());
  write("host_record", "split", b.encode());
}

// A frame as FrameSocket::send writes it.
std::string framed(const std::string& payload) {
  const uint32_t n = static_cast<uint32_t>(payload.size());
  return std::string(reinterpret_cast<const char*>(&n), 4) + payload;
}

// The fuzz target's list of pieces: a length byte, then the bytes.
std::string pieces(const std::vector<std::string>& list) {
  std::string out;
  for (const auto& p : list) out += byte(static_cast<int>(p.size())) + p;
  return out;
}

void frameSocket() {
  Hello first;
  first.rank = 1;
  first.nonce = std::string(32, 'n');
  const std::string hello = encodeHello(first);
  const std::string stream = framed(hello) + framed(encodeWelcome()) + framed(encodeBye());
  // Raw: no limit, the stream cut in three pieces, one inside a header.
  write("frame_socket", "raw", byte(0) + byte(0) +
                                   pieces({stream.substr(0, 2), stream.substr(2, 15), stream.substr(17)}));
  // Raw with a frame limit of 16 bytes: the hello passes, then a long frame.
  write("frame_socket", "raw_limit",
        byte(0) + byte(1) + std::string("\x10\x00\x00\x00", 4) +
            pieces({framed("short"), framed(std::string(40, 'x'))}));
  const std::vector<std::string> payloads = {encodeWelcome(), "", encodeArrivals({}), std::string(70, 'p')};
  write("frame_socket", "sockets", byte(1) + pieces(payloads));
  write("frame_socket", "rings", byte(2) + byte(16) + pieces(payloads));
}

void byteRing() {
  // Capacity 8: write 5, read, write 7 (it wraps), wait, read, sleep,
  // write 3, read. Then capacity 4: write 9 (4 fit), wait (full), read, sleep.
  write("byte_ring", "wrap", byte(7) + byte(0) + byte(5) + "abcde" + byte(1) + byte(0) + byte(7) +
                                 "fghijkl" + byte(3) + byte(1) + byte(2) + byte(0) + byte(3) + "mno" +
                                 byte(1));
  write("byte_ring", "full", byte(3) + byte(0) + byte(9) + "123456789" + byte(3) + byte(1) + byte(2));
}

void shmPeer() {
  write("shm_peer", "peer", ShmPeer{"4f1c0e2a-boot/pid:[4026531836]/ipc:[4026531839]", 4242}.encode());
  write("shm_peer", "bars", ShmPeer{"a|b", 1}.encode());
}

void endpoint() {
  write("endpoint", "loopback", Endpoint{"127.0.0.1", 45123}.encode());
  write("endpoint", "name", Endpoint{"node-7.cluster", 1}.encode());
  write("endpoint", "v6", Endpoint{"::1", 65535}.encode());
}

std::string u64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

std::string u64s(const std::vector<uint64_t>& words) {
  std::string out;
  for (uint64_t w : words) out += u64(w);
  return out;
}

// fuzz_agreement's ops on a BitAgreement (see that file's grammar).
constexpr int kSchedules = 0x80;  // a sender byte: the one the schedule names
constexpr int kThisRound = 1, kNextRound = 2, kTwoOn = 3;  // a round byte
std::string agreementOf(int size, int rank, int and_words, int or_words, int max_words) {
  return byte(1) + byte(size - 1) + byte(rank) + byte(and_words) + byte(or_words) + byte(max_words);
}
std::string startOp(const std::vector<uint64_t>& mine) { return byte(0) + u64s(mine); }
std::string rawOp(const std::string& bytes, int from) {
  return byte(1) + byte(static_cast<int>(bytes.size())) + bytes + byte(from);
}
// `step`: the step, or log2(P) + 2 for a poke; `count` 0: the right one.
std::string builtOp(int step, int from, int round, const std::vector<uint64_t>& words, int count = 0) {
  return byte(2) + byte(step) + byte(from) + byte(round) + byte(count) + u64s(words);
}

void agreement() {
  const AgreementMessage step{7, 1, {~0ull, 0x5a5a, 3}};
  const AgreementMessage poke{7, AgreementMessage::kPokeStep, {}};
  // Decode: a byte picks the word count (3 is 3, 2 is 2), then the message.
  write("agreement", "step", byte(0) + byte(3) + step.encode());
  write("agreement", "poke", byte(0) + byte(3) + poke.encode());
  write("agreement", "cut", byte(0) + byte(3) + step.encode().substr(0, 20));
  write("agreement", "wrong_count", byte(0) + byte(2) + step.encode());
  // Two ranks, rank 0: a round with rank 1, whose next round's message comes
  // early (through the encoder) and ends the next round at its start.
  write("agreement", "two_ranks",
        agreementOf(2, 0, 1, 0, 0) + startOp({~0ull}) + builtOp(1, kSchedules, kThisRound, {0xf0f0}) +
            rawOp(AgreementMessage{2, 1, {5}}.encode(), kSchedules) + startOp({~0ull}));
  // Three ranks, rank 2 (the extra one): poked, starts, hands over, gets the result.
  write("agreement", "extra_rank",
        agreementOf(3, 2, 1, 1, 1) + builtOp(3, kSchedules, kNextRound, {}) + startOp({1, 2, 3}) +
            builtOp(2, kSchedules, kThisRound, {4, 5, 6}));
  // Five ranks, rank 0: pokes rank 4, hears it at step 0, then ranks 1 and 2;
  // then a message from rank 2 at step 1 two rounds on, and one of 3 words
  // (count byte 0xe3, odd) straight into receive().
  std::string five = agreementOf(5, 0, 1, 0, 1) + startOp({~0ull, 9});
  for (int s = 0; s <= 2; ++s) five += builtOp(s, kSchedules, kThisRound, {~0ull - s, uint64_t(s)});
  five += builtOp(1, 3, kTwoOn, {0, 0});
  five += builtOp(1, kSchedules, kNextRound, {1, 2, 3}, 0xe3);
  write("agreement", "five_ranks", five);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: gen_corpus CORPUS_DIR\n");
    return 2;
  }
  root = argv[1];
  ::mkdir(root.c_str(), 0755);
  message();
  controlFrames();
  hostRecord();
  frameSocket();
  byteRing();
  shmPeer();
  endpoint();
  agreement();
  return 0;
}
