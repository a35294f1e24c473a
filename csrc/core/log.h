// Engine log lines, filtered by HOROVOD_LOG_LEVEL as in Horovod.
//
//   HVD_LOG(kWarning) << "stall: " << report;
//
// prints one line to stderr, Horovod's format:
//   [2024-05-01 12:00:00.123456: W engine.cc:675] stall: ...
// or, with HOROVOD_LOG_HIDE_TIME=1, `[W engine.cc:675] stall: ...`.
// Levels: trace, debug, info, warning (the default), error, fatal (case-insensitive;
// an unknown value means warning; hvd_torch.init() refuses it before the engine starts).
// A message below the level costs one relaxed atomic load: its stream expression is
// not evaluated.
//
// Threading: any thread may log. configureLogging() re-reads the environment (the
// Python layer calls it at every init(), so a re-init sees a changed level); a line
// being written while the level changes is written or not, never torn: each line is
// one fprintf.
#pragma once

#include <sstream>
#include <string>

namespace hvd {

enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarning, kError, kFatal };

// Reads HOROVOD_LOG_LEVEL and HOROVOD_LOG_HIDE_TIME.
void configureLogging();
// Parses a level name; returns false (and leaves *level) when it is none of them.
bool parseLogLevel(const std::string& text, LogLevel* level);
bool logEnabled(LogLevel level);
// Writes one formatted line to stderr, whatever the level (HVD_LOG checks it).
void writeLogLine(LogLevel level, const char* file, int line, const std::string& message);

// Collects one message and writes it when destroyed (at the end of the statement).
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line) : level_(level), file_(file), line_(line) {}
  ~LogMessage() { writeLogLine(level_, file_, line_, stream_.str()); }
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostringstream& stream() { return stream_; }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

// Turns `stream << ...` into a void expression so HVD_LOG can sit in a ternary.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace hvd

// A ternary, not an `if`, so `if (x) HVD_LOG(kInfo) << ...; else ...` binds as written.
#define HVD_LOG(level)                                                         \
  !::hvd::logEnabled(::hvd::LogLevel::level)                                   \
      ? (void)0                                                                \
      : ::hvd::LogVoidify() &                                                  \
            ::hvd::LogMessage(::hvd::LogLevel::level, __FILE__, __LINE__).stream()
