#include "monitor.hpp"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "file_checks.hpp"
#include "tensorboard_events.hpp"

namespace zero::examples {
namespace {

namespace fs = std::filesystem;

// DeepSpeed joins output_path and job_name (os.path.join: an empty output_path leaves the job
// name relative to the working directory).
std::string monitor_dir(const MonitorConfig& m) {
  return m.output_path.empty() ? m.job_name : (fs::path(m.output_path) / m.job_name).string();
}

// Python's repr of a float (what DeepSpeed's csv.writer writes): the shortest text that reads
// back as the same double.
std::string shortest(double v) {
  char buf[40];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::vector<std::pair<std::string, double>> monitor_scalars(const StepRecord& r) {
  const std::string p = "Train/Samples/";
  std::vector<std::pair<std::string, double>> s = {
      {p + "train_loss", r.loss},  // DeepSpeed's names first
      {p + "lr", r.lr},
      {p + "loss_scale", r.loss_scale},
      {p + "elapsed_time_ms_forward", 1e3 * r.forward_s},
      {p + "elapsed_time_ms_backward", 1e3 * r.backward_s},
      {p + "elapsed_time_ms_step", 1e3 * r.optimizer_s},
      {p + "grad_norm", r.grad_norm},
      {p + "tokens_per_s", r.tokens_per_s},
      {p + "elapsed_time_ms_comm_exposed", 1e3 * r.comm_exposed_s},
      {p + "elapsed_time_ms_data", 1e3 * r.data_s},
      {p + "elapsed_time_ms_total", 1e3 * r.step_s},
      {p + "memory_bytes", static_cast<double>(r.memory_bytes)},
  };
  if (r.mfu >= 0) s.push_back({p + "mfu", r.mfu});
  if (r.utilisation >= 0) s.push_back({p + "utilisation", r.utilisation});
  return s;
}

MonitorConfig monitor_config(const Config& cfg, const std::string& section) {
  MonitorConfig m;
  m.enabled = cfg.extra_bool(section + ".enabled");
  m.output_path = cfg.extra_string(section + ".output_path");
  m.job_name = cfg.extra_string(section + ".job_name");
  return m;
}

MonitorWriter::MonitorWriter(const MonitorConfig& tensorboard, const MonitorConfig& csv,
                             bool enabled) {
  if (!enabled) return;
  if (tensorboard.enabled) {
    const std::string dir = monitor_dir(tensorboard);
    require_writable_dir(dir, "tensorboard.output_path/job_name");
    tb_ = std::make_unique<EventFileWriter>(dir);
  }
  if (csv.enabled) {
    csv_dir_ = monitor_dir(csv);
    require_writable_dir(csv_dir_, "csv_monitor.output_path/job_name");
  }
  if (this->enabled()) worker_ = std::thread([this] { run(); });
}

MonitorWriter::~MonitorWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::string MonitorWriter::describe() const {
  std::string s;
  if (tb_) s += "tensorboard " + tb_->path();
  if (!csv_dir_.empty()) s += std::string(s.empty() ? "" : ", ") + "csv_monitor " + csv_dir_;
  return s;
}

void MonitorWriter::write(const StepRecord& r, int64_t samples) {
  if (!enabled()) return;
  const auto t = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) throw std::runtime_error(error_);
    queue_.push_back({r, samples, wall_now()});
  }
  cv_.notify_one();
  ++records_;
  enqueue_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

void MonitorWriter::run() {
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopped and drained
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      write_now(item);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_.empty()) error_ = e.what();
    }
  }
}

void MonitorWriter::write_now(const Item& item) {
  const auto scalars = monitor_scalars(item.record);
  if (tb_) tb_->write_scalars(item.samples, item.wall_time, scalars);
  if (csv_dir_.empty()) return;
  for (const auto& [tag, value] : scalars) {
    // DeepSpeed's csvMonitor: the file is the tag with '/' and ' ' as '_', the header's second
    // column the tag's last part, rows appended, csv.writer's "\r\n" line ends.
    std::string file = tag;
    for (char& ch : file) {
      if (ch == '/' || ch == ' ') ch = '_';
    }
    const std::string path = (fs::path(csv_dir_) / (file + ".csv")).string();
    std::ofstream out(path, std::ios::app);
    if (!csv_started_[file]) {
      csv_started_[file] = true;
      out << "step," << tag.substr(tag.rfind('/') + 1) << "\r\n";
    }
    out << item.samples << "," << shortest(value) << "\r\n";
    if (!out) throw std::runtime_error("csv_monitor: cannot write '" + path + "'");
  }
}

}  // namespace zero::examples
