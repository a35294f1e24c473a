#include "timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

namespace hvd {

std::string jsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

std::string timelineRow(int32_t process_set, OpType type, const std::string& name) {
  const std::string op = opTypeName(type);
  auto startsWithWord = [&name](const std::string& word) {
    return name.compare(0, word.size(), word) == 0 &&
           (name.size() == word.size() || name[word.size()] == '.');
  };
  const bool prefixed = startsWithWord(op) || startsWithWord("grouped_" + op);
  std::string row = prefixed ? name : op + "." + name;
  if (process_set != 0) row += " (process set " + std::to_string(process_set) + ")";
  return row;
}

std::string timelinePhase(OpType type, const char* prefix) {
  std::string out = prefix;
  for (const char* c = opTypeName(type); *c; ++c) out += static_cast<char>(std::toupper(*c));
  return out;
}

std::string Timeline::start(const std::string& path, bool mark_cycles) {
  std::lock_guard<std::mutex> control(control_mu_);
  if (writer_.joinable()) {
    active_.store(false);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_one();
    writer_.join();
  }
  // O_NOFOLLOW: a link planted at the path (a shared folder) must not make the
  // job overwrite the file it points to.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  std::FILE* f = fd < 0 ? nullptr : ::fdopen(fd, "w");
  if (f == nullptr) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    return "cannot open timeline file " + path + ": " +
           (error == ELOOP ? std::string("it is a symbolic link") : std::strerror(error));
  }
  file_ = f;
  first_write_ = true;
  pids_.clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.clear();
    dropped_ = 0;
    stopping_ = false;
    origin_ = std::chrono::steady_clock::now();
    // pid 0 holds the file's own metadata, as in Horovod: when the trace
    // started in wall-clock time, so it can be lined up with other logs.
    const int64_t epoch_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
    pending_.push_back(Record{'M', "process_name", "", "", "\"name\": \"hvd_torch\", "
                              "\"start_time_since_epoch_in_micros\": " + std::to_string(epoch_us), 0});
  }
  mark_cycles_.store(mark_cycles);
  writer_ = std::thread([this] { writerLoop(); });
  active_.store(true);
  return "";
}

void Timeline::stop() {
  std::lock_guard<std::mutex> control(control_mu_);
  if (!writer_.joinable()) return;
  active_.store(false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_one();
  writer_.join();
}

void Timeline::record(Record r) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stopping_) return;
  if (pending_.size() >= kMaxPending) {
    ++dropped_;
    return;
  }
  r.ts_us = std::chrono::duration_cast<std::chrono::microseconds>(
                std::chrono::steady_clock::now() - origin_)
                .count();
  const bool first = pending_.empty();
  pending_.push_back(std::move(r));
  lock.unlock();
  // The first record of a batch wakes the writer; it gathers the rest.
  if (first) wake_.notify_one();
}

void Timeline::begin(const std::string& row, std::string phase, std::string args) {
  if (!active()) return;
  record(Record{'B', std::move(phase), row, "", std::move(args), 0});
}

void Timeline::end(const std::string& row, std::string args) {
  if (!active()) return;
  record(Record{'E', "", row, "", std::move(args), 0});
}

void Timeline::tick(const std::string& row, const std::string& label) {
  if (!active()) return;
  record(Record{'X', "", row, label, "", 0});
}

void Timeline::marker(std::string label) {
  if (!active()) return;
  record(Record{'i', std::move(label), "", "", "", 0});
}

void Timeline::writerLoop() {
  std::vector<Record> batch;
  while (true) {
    bool last;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Asleep until there is something to write, then kFlushDelay for the
      // rest of the burst (a stop cuts it short): the header's latency bound.
      wake_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
      wake_.wait_for(lock, kFlushDelay, [this] { return stopping_; });
      batch.swap(pending_);
      last = stopping_;
      if (last && dropped_ > 0) {
        batch.push_back(Record{'M', "process_name", "", "", "\"name\": \"hvd_torch\", "
                               "\"dropped_events\": " + std::to_string(dropped_), 0});
      }
    }
    writeBatch(batch);
    batch.clear();
    if (last) break;
  }
  if (first_write_) std::fputs("[\n]", file_);
  std::fputc('\n', file_);
  std::fclose(file_);
  file_ = nullptr;
}

int Timeline::rowPid(const std::string& row) {
  auto [it, fresh] = pids_.emplace(row, static_cast<int>(pids_.size()) + 1);
  return fresh ? -it->second : it->second;  // negative: new, write its metadata first
}

void Timeline::writeBatch(const std::vector<Record>& batch) {
  if (batch.empty()) return;
  std::string out;
  out.reserve(batch.size() * 96);
  auto sep = [&] {
    if (first_write_) {
      out += "[\n";
      first_write_ = false;
    } else {
      out += ",\n";
    }
  };
  for (const Record& r : batch) {
    if (r.ph == 'M') {  // pid 0's metadata
      sep();
      out += "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {" + r.args + "}}";
      continue;
    }
    if (r.ph == 'i') {
      sep();
      out += "{\"name\": \"" + r.phase + "\", \"ph\": \"i\", \"s\": \"g\", \"ts\": " +
             std::to_string(r.ts_us) + ", \"pid\": 0, \"tid\": 0}";
      continue;
    }
    int pid = rowPid(r.row);
    if (pid < 0) {
      pid = -pid;
      const std::string p = std::to_string(pid);
      sep();
      out += "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + p +
             ", \"args\": {\"name\": \"" + jsonEscape(r.row) + "\"}},\n";
      out += "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": " + p +
             ", \"args\": {\"sort_index\": " + p + "}}";
    }
    sep();
    out += "{\"ph\": \"";
    out += r.ph;
    out += "\"";
    if (r.ph == 'B') out += ", \"name\": \"" + r.phase + "\"";
    if (r.ph == 'X') out += ", \"name\": \"" + jsonEscape(r.label) + "\", \"dur\": 0";
    out += ", \"ts\": " + std::to_string(r.ts_us) + ", \"pid\": " + std::to_string(pid) +
           ", \"tid\": 0";
    if (!r.args.empty()) out += ", \"args\": {" + r.args + "}";
    out += "}";
  }
  // Overwrite the previous write's closing bracket, then close again: the
  // file is complete JSON between writes.
  if (std::ftell(file_) > 0) std::fseek(file_, -1, SEEK_END);
  out += "\n]";
  std::fwrite(out.data(), 1, out.size(), file_);
  std::fflush(file_);
}

}  // namespace hvd
