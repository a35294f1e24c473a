#include "stall_inspector.h"

#include <sstream>

#include "process_sets.h"

namespace hvd {

StallInspector::Verdict StallInspector::inspect(const std::vector<Coordinator::Waiting>& waiting,
                                                Clock::time_point now) {
  Verdict verdict;
  if (now - last_check_ < std::chrono::seconds(1)) return verdict;
  last_check_ = now;
  std::ostringstream report;  // one line per op, for the warning
  std::ostringstream brief;   // one line in all, for the error
  bool warn = false;
  bool fatal = false;
  for (const auto& w : waiting) {
    if (w.waited < warning_) continue;
    const long secs = std::chrono::duration_cast<std::chrono::seconds>(w.waited).count();
    const std::string what =
        "'" + w.name + "'" +
        (w.process_set ? " (process set " + std::to_string(w.process_set) + ")" : "");
    report << "\n  " << what << " waited " << secs << " s for ranks " << rankList(w.missing_ranks);
    brief << (warn ? "; " : " ") << what << " waited " << secs << " s for ranks "
          << rankList(w.missing_ranks);
    warn = true;
    fatal = fatal || (shutdown_.count() > 0 && w.waited >= shutdown_);
  }
  if (fatal) {
    verdict.fatal =
        "stalled: some ranks submitted collectives that other ranks never submitted, for longer "
        "than HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=" +
        std::to_string(shutdown_.count()) + " s:" + brief.str();
  } else if (warn && now - last_warning_ >= warning_) {
    last_warning_ = now;
    verdict.warning =
        "stall: ranks are waiting for collectives other ranks have not submitted "
        "(HOROVOD_STALL_CHECK_TIME_SECONDS=" +
        std::to_string(warning_.count()) + "):" + report.str();
  }
  return verdict;
}

}  // namespace hvd
