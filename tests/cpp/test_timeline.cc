// The timeline writer (csrc/core/timeline.h): Horovod's layout (a process row
// per name, metadata first), complete JSON between writes and after stop(),
// nothing recorded while stopped.
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "check.h"
#include "core/timeline.h"

using namespace hvd;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A file of its own in a fresh folder, removed with it: the plain, ASan and
// TSan builds of this test may run at once, and must not share one.
struct FreshFile {
  explicit FreshFile(const std::string& name) {
    char made[] = "/tmp/hvd_test_timeline_XXXXXX";
    folder = ::mkdtemp(made) != nullptr ? made : "build";
    path = folder + "/" + name;
  }
  ~FreshFile() {
    std::remove(path.c_str());
    if (folder != "build") ::rmdir(folder.c_str());
  }
  std::string folder, path;
};

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(rows_phases_and_a_closed_array) {
  const FreshFile file("timeline_unit.json");
  const std::string& path = file.path;
  Timeline t;
  t.begin("ignored", "NEGOTIATE_ALLREDUCE");  // stopped: not recorded
  CHECK(t.start(path, true).empty());
  t.begin("grad \"w\"", timelinePhase(OpType::kAllreduce, "NEGOTIATE_"));
  t.tick("grad \"w\"", "1");
  t.end("grad \"w\"", "\"last_rank\": 1");
  t.marker("CYCLE_START");
  t.begin(timelineRow(2, OpType::kBroadcast, "b"), timelinePhase(OpType::kBroadcast));
  t.end(timelineRow(2, OpType::kBroadcast, "b"));
  // Mid-run, after a flush, the file is complete JSON.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::string mid = slurp(path);
  CHECK_EQ(mid.substr(0, 2), std::string("[\n"));
  CHECK_EQ(mid.back(), ']');
  t.stop();
  t.begin("late", "ALLREDUCE");  // stopped again: not recorded
  const std::string text = slurp(path);
  CHECK_EQ(text.substr(text.size() - 2), std::string("]\n"));
  CHECK_EQ(count(text, "\"process_name\""), size_t{3});  // pid 0 and two rows
  CHECK(text.find("\"name\": \"grad \\\"w\\\"\"") != std::string::npos);
  CHECK(text.find("\"name\": \"broadcast.b (process set 2)\"") != std::string::npos);
  CHECK(text.find("\"name\": \"NEGOTIATE_ALLREDUCE\"") != std::string::npos);
  CHECK(text.find("\"name\": \"BROADCAST\"") != std::string::npos);
  CHECK(text.find("\"ph\": \"X\", \"name\": \"1\", \"dur\": 0") != std::string::npos);
  CHECK(text.find("\"args\": {\"last_rank\": 1}") != std::string::npos);
  CHECK(text.find("\"name\": \"CYCLE_START\", \"ph\": \"i\", \"s\": \"g\"") != std::string::npos);
  CHECK(text.find("ignored") == std::string::npos);
  CHECK(text.find("late") == std::string::npos);
}

TEST(rows_are_horovods_op_dot_name) {
  CHECK_EQ(timelineRow(0, OpType::kAllreduce, "grad"), std::string("allreduce.grad"));
  // Names our Python helpers and unnamed ops already give in Horovod's form.
  CHECK_EQ(timelineRow(0, OpType::kAllreduce, "allreduce.fc.weight"),
           std::string("allreduce.fc.weight"));
  CHECK_EQ(timelineRow(0, OpType::kBroadcast, "broadcast.noname.3"),
           std::string("broadcast.noname.3"));
  CHECK_EQ(timelineRow(0, OpType::kJoin, "join"), std::string("join"));
  CHECK_EQ(timelineRow(0, OpType::kAllreduce, "grouped_allreduce.noname.2"),
           std::string("grouped_allreduce.noname.2"));
  // Another op's prefix, or a longer word, is part of the name.
  CHECK_EQ(timelineRow(0, OpType::kAllgather, "allreduce.x"),
           std::string("allgather.allreduce.x"));
  CHECK_EQ(timelineRow(0, OpType::kAllreduce, "allreducex"), std::string("allreduce.allreducex"));
  CHECK_EQ(timelineRow(3, OpType::kAlltoall, "a"), std::string("alltoall.a (process set 3)"));
}

TEST(an_event_reaches_the_file_while_the_writer_runs) {
  const FreshFile file("timeline_latency.json");
  const std::string& path = file.path;
  Timeline t;
  CHECK(t.start(path, false).empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the writer is idle
  for (int i = 0; i < 5; ++i) {
    const std::string row = "allreduce.step" + std::to_string(i);
    const auto recorded = std::chrono::steady_clock::now();
    t.begin(row, "ALLREDUCE");
    t.end(row);
    // Poll as a reader would. The writer flushes kFlushDelay (20 ms) after an
    // event, on its own: no event follows until the row is seen. A loaded
    // machine may run it later, so the wait is for the row, with a deadline that
    // only a writer that never flushes misses.
    bool seen = false;
    while (!seen && std::chrono::steady_clock::now() - recorded < std::chrono::seconds(20)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      const std::string text = slurp(path);
      seen = text.find(row) != std::string::npos && !text.empty() && text.back() == ']';
    }
    CHECK(seen);
  }
  t.stop();
}

TEST(an_unwritable_path_is_an_error) {
  Timeline t;
  const std::string error = t.start("/nonexistent/dir/t.json", false);
  CHECK(error.find("/nonexistent/dir/t.json") != std::string::npos);
  CHECK(!t.active());
}

int main() { return check::runAll(); }
