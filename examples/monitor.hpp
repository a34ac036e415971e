// DeepSpeed's monitors for the example trainer (config keys tensorboard and csv_monitor, each
// {enabled, output_path, job_name}): rank 0 writes every step's scalars under
// output_path/job_name, as DeepSpeed does, with DeepSpeed's names where it has them
// (Train/Samples/train_loss, lr, loss_scale, elapsed_time_ms_forward, ...) and its x axis, the
// samples seen, so a zero run plots next to a DeepSpeed one. TensorBoard gets event files
// (tensorboard_events.hpp); csv_monitor one CSV per scalar, Train_Samples_<name>.csv with the
// header "step,<name>", as DeepSpeed's csvMonitor. A worker thread does the file I/O: the
// training step only hands over the record (enqueue_seconds measures that).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "metrics.hpp"
#include "zero/config.hpp"

namespace zero::examples {

class EventFileWriter;

// One monitor's keys: {enabled, output_path, job_name}, as DeepSpeed's TensorBoardConfig and
// CSVConfig (zero/config keeps them in Config::extra as "tensorboard.enabled", ...).
struct MonitorConfig {
  bool enabled = false;
  std::string output_path;  // "": job_name is relative to the working directory
  std::string job_name = "DeepSpeedJobName";
};
// `section`: "tensorboard" or "csv_monitor".
MonitorConfig monitor_config(const Config& cfg, const std::string& section);

// The scalars of one step with their DeepSpeed-style tags.
std::vector<std::pair<std::string, double>> monitor_scalars(const StepRecord& r);

class MonitorWriter {
 public:
  // Opens the enabled monitors' directories (rank 0 only; other ranks pass enabled = false).
  // Throws std::runtime_error naming the key and path when one cannot be written.
  MonitorWriter(const MonitorConfig& tensorboard, const MonitorConfig& csv, bool enabled);
  ~MonitorWriter();  // writes what is queued, then stops
  MonitorWriter(const MonitorWriter&) = delete;
  MonitorWriter& operator=(const MonitorWriter&) = delete;

  bool enabled() const { return tb_ != nullptr || !csv_dir_.empty(); }
  // Where the monitors write (for the start-up line).
  std::string describe() const;
  // Queues the step for writing at x = `samples`.
  void write(const StepRecord& r, int64_t samples);
  double enqueue_seconds() const { return enqueue_seconds_; }
  int64_t records() const { return records_; }

 private:
  struct Item {
    StepRecord record;
    int64_t samples;
    double wall_time;
  };
  void run();
  void write_now(const Item& item);

  std::unique_ptr<EventFileWriter> tb_;
  std::string csv_dir_;
  std::map<std::string, bool> csv_started_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  std::string error_;  // the worker's first failure, reported by the next write()
  double enqueue_seconds_ = 0;
  int64_t records_ = 0;
  std::thread worker_;
};

}  // namespace zero::examples
