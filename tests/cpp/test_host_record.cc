// The record each member of a set publishes before the set picks its data
// plane (backends/host_record.h): it reads back whole, switches compare as a
// unit, and a cut record is a WireError.
#include "backends/host_record.h"
#include "check.h"

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

int main() { return check::runAll(); }
