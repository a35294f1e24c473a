#include "log.h"

#include <sys/time.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace hvd {
namespace {

// Read from the environment on first use, so a message logged before init()
// (none today) still honours the variables.
struct Settings {
  std::atomic<int> level{static_cast<int>(LogLevel::kWarning)};
  std::atomic<bool> hide_time{false};
  Settings() { load(); }
  void load() {
    LogLevel parsed = LogLevel::kWarning;
    const char* text = std::getenv("HOROVOD_LOG_LEVEL");
    if (text != nullptr) parseLogLevel(text, &parsed);
    level.store(static_cast<int>(parsed), std::memory_order_relaxed);
    const char* hide = std::getenv("HOROVOD_LOG_HIDE_TIME");
    hide_time.store(hide != nullptr && *hide != '\0' && std::strcmp(hide, "0") != 0,
                    std::memory_order_relaxed);
  }
};

Settings& settings() {
  static Settings s;
  return s;
}

const char kLetters[] = "TDIWEF";

}  // namespace

void configureLogging() { settings().load(); }

bool parseLogLevel(const std::string& text, LogLevel* level) {
  static const char* const kNames[] = {"trace", "debug", "info", "warning", "error", "fatal"};
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (int i = 0; i < 6; ++i) {
    if (lower == kNames[i]) {
      *level = static_cast<LogLevel>(i);
      return true;
    }
  }
  return false;
}

bool logEnabled(LogLevel level) {
  return static_cast<int>(level) >= settings().level.load(std::memory_order_relaxed);
}

void writeLogLine(LogLevel level, const char* file, int line, const std::string& message) {
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  const char letter = kLetters[static_cast<int>(level)];
  // One fprintf per line: stdio locks the stream, so lines from the engine
  // thread and a caller's thread never interleave mid-line.
  if (settings().hide_time.load(std::memory_order_relaxed)) {
    std::fprintf(stderr, "[%c %s:%d] %s\n", letter, base, line, message.c_str());
    return;
  }
  timeval tv;
  gettimeofday(&tv, nullptr);
  tm local;
  localtime_r(&tv.tv_sec, &local);
  char when[32];
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &local);
  std::fprintf(stderr, "[%s.%06ld: %c %s:%d] %s\n", when, static_cast<long>(tv.tv_usec), letter,
               base, line, message.c_str());
}

}  // namespace hvd
