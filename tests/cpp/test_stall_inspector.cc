// Rank 0's stall check (stall_inspector.h) on a clock the test moves: when it
// warns, what the warning and the error name, when it fails the job.
#include "check.h"
#include "core/stall_inspector.h"

using namespace hvd;
using std::chrono::seconds;

namespace {

Coordinator::Waiting waitingFor(const char* name, int set, std::vector<int> missing, int secs) {
  return {name, set, std::move(missing), seconds(secs)};
}

const StallInspector::Clock::time_point t0 = StallInspector::Clock::time_point() + seconds(1000);

}  // namespace

TEST(nothing_to_say_before_the_warning_time) {
  StallInspector s(seconds(60), seconds(900));
  auto v = s.inspect({waitingFor("grad", 0, {1}, 59)}, t0);
  CHECK(v.warning.empty());
  CHECK(v.fatal.empty());
}

TEST(a_warning_names_each_op_its_set_and_the_missing_ranks) {
  StallInspector s(seconds(60), seconds(900));
  auto v = s.inspect({waitingFor("grad", 0, {1, 2}, 61), waitingFor("x", 3, {0}, 75),
                      waitingFor("young", 0, {2}, 5)},
                     t0);
  CHECK(v.fatal.empty());
  CHECK(v.warning.find("HOROVOD_STALL_CHECK_TIME_SECONDS=60") != std::string::npos);
  CHECK(v.warning.find("'grad' waited 61 s for ranks [1, 2]") != std::string::npos);
  CHECK(v.warning.find("'x' (process set 3) waited 75 s for ranks [0]") != std::string::npos);
  CHECK(v.warning.find("young") == std::string::npos);
}

TEST(warnings_repeat_once_per_warning_time_and_checks_once_a_second) {
  StallInspector s(seconds(10), seconds(0));
  const std::vector<Coordinator::Waiting> w{waitingFor("grad", 0, {1}, 11)};
  CHECK(!s.inspect(w, t0).warning.empty());
  CHECK(s.inspect(w, t0 + std::chrono::milliseconds(500)).warning.empty());  // < 1 s
  CHECK(s.inspect(w, t0 + seconds(5)).warning.empty());                      // < 10 s
  CHECK(!s.inspect(w, t0 + seconds(10)).warning.empty());
}

TEST(the_job_fails_after_the_shutdown_time_naming_every_stalled_op) {
  StallInspector s(seconds(60), seconds(900));
  auto v = s.inspect({waitingFor("grad", 0, {1}, 900), waitingFor("b", 0, {2}, 100)}, t0);
  CHECK(v.warning.empty());
  CHECK(v.fatal.find("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=900") != std::string::npos);
  CHECK(v.fatal.find("'grad' waited 900 s for ranks [1]; 'b' waited 100 s for ranks [2]") !=
        std::string::npos);
}

TEST(a_zero_shutdown_time_never_fails) {
  StallInspector s(seconds(60), seconds(0));
  auto v = s.inspect({waitingFor("grad", 0, {1}, 100000)}, t0);
  CHECK(v.fatal.empty());
  CHECK(!v.warning.empty());
}

int main() { return check::runAll(); }
