// The timeline writer (csrc/core/timeline.h): Horovod's layout (a process row
// per name, metadata first), complete JSON between writes and after stop(),
// nothing recorded while stopped.
#include <chrono>
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

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(rows_phases_and_a_closed_array) {
  const std::string path = "build/timeline_unit.json";
  Timeline t;
  t.begin("ignored", "NEGOTIATE_ALLREDUCE");  // stopped: not recorded
  CHECK(t.start(path, true).empty());
  t.begin("grad \"w\"", timelinePhase(OpType::kAllreduce, "NEGOTIATE_"));
  t.tick("grad \"w\"", "1");
  t.end("grad \"w\"", "\"last_rank\": 1");
  t.marker("CYCLE_START");
  t.begin(timelineRow(2, "b"), timelinePhase(OpType::kBroadcast));
  t.end(timelineRow(2, "b"));
  // The writer flushes a few times a second: mid-run the file is complete.
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
  CHECK(text.find("\"name\": \"b (process set 2)\"") != std::string::npos);
  CHECK(text.find("\"name\": \"NEGOTIATE_ALLREDUCE\"") != std::string::npos);
  CHECK(text.find("\"name\": \"BROADCAST\"") != std::string::npos);
  CHECK(text.find("\"ph\": \"X\", \"name\": \"1\", \"dur\": 0") != std::string::npos);
  CHECK(text.find("\"args\": {\"last_rank\": 1}") != std::string::npos);
  CHECK(text.find("\"name\": \"CYCLE_START\", \"ph\": \"i\", \"s\": \"g\"") != std::string::npos);
  CHECK(text.find("ignored") == std::string::npos);
  CHECK(text.find("late") == std::string::npos);
}

TEST(an_unwritable_path_is_an_error) {
  Timeline t;
  const std::string error = t.start("/nonexistent/dir/t.json", false);
  CHECK(error.find("/nonexistent/dir/t.json") != std::string::npos);
  CHECK(!t.active());
}

int main() { return check::runAll(); }
