// The record each member of a set publishes before the set picks its data
// plane (backends/host_record.h): it reads back whole, switches compare as a
// unit, and a cut record is a WireError; so are the shared-memory peer's
// record (backends/shm/shm_peer.h) and rank 0's control address (core/address.h).
#include "backends/host_record.h"
#include "backends/shm/shm_peer.h"
#include "check.h"
#include "core/address.h"

using namespace hvd;

TEST(a_record_reads_back_whole_with_any_host_name) {
  HostRecord h;
  h.shm = true;
  h.split_gather = true;
  h.host = std::string("node|7\0x", 8);  // the old "110|host" layout split at '|'
  const HostRecord back = HostRecord::decode(h.encode());
  CHECK(back.shm && !back.split_reduce && back.split_gather);
  CHECK_EQ(back.host, h.host);
  CHECK(back.sameSwitches(h));
}

TEST(switches_differ_when_any_one_differs) {
  HostRecord a, b;
  CHECK(a.sameSwitches(b));
  b.split_reduce = true;
  CHECK(!a.sameSwitches(b));
  b = a;
  b.host = "elsewhere";  // the host is not a switch
  CHECK(a.sameSwitches(b));
}

TEST(a_cut_record_is_a_wire_error) {
  HostRecord h;
  h.host = "hostname";
  const std::string bytes = h.encode();
  int errors = 0;
  for (size_t n = 0; n < bytes.size(); ++n) {
    try {
      HostRecord::decode(bytes.substr(0, n));
    } catch (const WireError&) {
      ++errors;
    }
  }
  CHECK_EQ(errors, static_cast<int>(bytes.size()));
}

TEST(trailing_bytes_are_a_wire_error) {
  HostRecord h;
  h.host = "hostname";
  CHECK_THROWS(HostRecord::decode(h.encode() + "x"), WireError);
}

// The other records members read from the store before they connect: the
// shared-memory peer ("identity|pid") and rank 0's control address
// ("host:port"). Before, a record without its separator or with a bad number
// reached std::stoi (std::invalid_argument, out_of_range) or
// std::string::resize(npos) (std::length_error), and a pid of 0 or -1 went
// on to pidfd_open.
TEST(shm_peer_and_control_address_records_read_back_or_are_wire_errors) {
  const ShmPeer peer = ShmPeer::decode(ShmPeer{"boot/ns|ipc", 4242}.encode());
  CHECK_EQ(peer.identity, std::string("boot/ns|ipc"));
  CHECK_EQ(peer.pid, 4242);
  for (const char* bad : {"", "123", "id|", "id|0", "id|-5", "id|+5", "id|012", "id|1x",
                          "id|99999999999", "id| 5"})
    CHECK_THROWS(ShmPeer::decode(bad), WireError);
  const Endpoint e = Endpoint::decode(Endpoint{"::1", 65535}.encode());
  CHECK_EQ(e.host, std::string("::1"));
  CHECK_EQ(e.port, 65535);
  CHECK_EQ(Endpoint::decode("node-1:1").port, 1);
  for (const char* bad : {"", "host", "host:", "host:0", "host:65536", "host:-1", "host:08",
                          "host:80a", "host:123456"})
    CHECK_THROWS(Endpoint::decode(bad), WireError);
}

int main() { return check::runAll(); }
