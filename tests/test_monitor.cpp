// DeepSpeed's monitors in the example trainer: the config keys (tensorboard, csv_monitor,
// wandb/comet warnings), DeepSpeed's CSV layout, and the TFRecord framing of the event file
// (CRC-32C against its published check value; every record's length and checksums). The event
// contents are read back by TensorBoard's own reader in tests/e2e/monitors.sh.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "monitor.hpp"
#include "tensorboard_events.hpp"
#include "zero/config.hpp"

namespace zero::examples {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path = fs::temp_directory_path() /
                  ("zero_mon_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  static inline int counter = 0;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

StepRecord record(int64_t step, double loss) {
  StepRecord r;
  r.step = step, r.loss = loss, r.lr = 1e-3, r.grad_norm = 0.5, r.loss_scale = 1;
  r.tokens_per_s = 1000, r.step_s = 0.1, r.forward_s = 0.03, r.backward_s = 0.05;
  r.optimizer_s = 0.02, r.memory_bytes = 1 << 20, r.mfu = 0.25;
  return r;
}

TEST(Monitor, ConfigKeysFollowDeepSpeed) {
  const Config c = Config::from_string(
      "tensorboard: {enabled: true, output_path: logs/, job_name: run1}\n"
      "csv_monitor: {enabled: true}\n"
      "wandb: {enabled: true, project: p}\n",
      "m.yaml");
  const MonitorConfig tb = monitor_config(c, "tensorboard");
  EXPECT_TRUE(tb.enabled);
  EXPECT_EQ(tb.output_path, "logs/");
  EXPECT_EQ(tb.job_name, "run1");
  const MonitorConfig csv = monitor_config(c, "csv_monitor");
  EXPECT_TRUE(csv.enabled);
  EXPECT_EQ(csv.output_path, "");
  EXPECT_EQ(csv.job_name, "DeepSpeedJobName");  // DeepSpeed's default
  EXPECT_FALSE(monitor_config(Config::from_string("{}", "m.yaml"), "tensorboard").enabled);
  bool warned = false;
  for (const auto& w : c.warnings)
    warned |= w.find("wandb is not available in C++; use tensorboard") != std::string::npos;
  EXPECT_TRUE(warned);
  // DeepSpeed's TensorBoardConfig forbids other keys.
  try {
    Config::from_string("tensorboard: {enabled: true, outptu_path: x}\n", "m.yaml");
    ADD_FAILURE() << "accepted a misspelt key";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("outptu_path"), std::string::npos) << e.what();
  }
}

TEST(Monitor, Crc32cMatchesItsCheckValue) {
  // The CRC-32C check value of "123456789" (RFC 3720, B.4).
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(Monitor, CsvFilesHaveDeepSpeedsLayout) {
  TempDir dir;
  MonitorConfig tb, csv;
  csv.enabled = true, csv.output_path = dir.path.string(), csv.job_name = "job";
  {
    MonitorWriter m(tb, csv, true);
    m.write(record(1, 2.5), 16);
    m.write(record(2, 0.0), 32);  // zero is written too
  }
  const fs::path job = dir.path / "job";
  EXPECT_EQ(slurp(job / "Train_Samples_train_loss.csv"), "step,train_loss\r\n16,2.5\r\n32,0\r\n");
  EXPECT_EQ(slurp(job / "Train_Samples_lr.csv"), "step,lr\r\n16,0.001\r\n32,0.001\r\n");
  EXPECT_TRUE(fs::exists(job / "Train_Samples_elapsed_time_ms_forward.csv"));
  EXPECT_TRUE(fs::exists(job / "Train_Samples_mfu.csv"));
}

TEST(Monitor, EventFileRecordsAreFramedAndChecksummed) {
  if (!tensorboard_available()) GTEST_SKIP() << "built without protobuf";
  TempDir dir;
  MonitorConfig tb, csv;
  tb.enabled = true, tb.output_path = dir.path.string(), tb.job_name = "job";
  std::string path;
  {
    MonitorWriter m(tb, csv, true);
    EXPECT_NE(m.describe().find("events.out.tfevents."), std::string::npos) << m.describe();
    for (int i = 1; i <= 3; ++i) m.write(record(i, 1.0 / i), 8 * i);
  }
  for (const auto& f : fs::directory_iterator(dir.path / "job")) path = f.path().string();
  const std::string bytes = slurp(path);
  size_t at = 0;
  int records = 0;
  while (at < bytes.size()) {
    ASSERT_LE(at + 12, bytes.size());
    uint64_t len;
    uint32_t len_crc, data_crc;
    std::memcpy(&len, bytes.data() + at, 8);
    std::memcpy(&len_crc, bytes.data() + at + 8, 4);
    EXPECT_EQ(len_crc, masked_crc32c(bytes.data() + at, 8));
    ASSERT_LE(at + 12 + len + 4, bytes.size());
    std::memcpy(&data_crc, bytes.data() + at + 12 + len, 4);
    EXPECT_EQ(data_crc, masked_crc32c(bytes.data() + at + 12, len));
    // Every step's record names DeepSpeed's loss tag.
    if (records > 0) {
      EXPECT_NE(bytes.substr(at + 12, len).find("Train/Samples/train_loss"), std::string::npos);
    } else {
      EXPECT_NE(bytes.substr(at + 12, len).find("brain.Event:2"), std::string::npos);
    }
    at += 12 + len + 4;
    ++records;
  }
  EXPECT_EQ(records, 4);  // the file version, then one per step
}

TEST(Monitor, AnUnwritableDirectoryFailsNamingTheKey) {
  TempDir dir;
  std::ofstream(dir.path / "file") << "x";
  MonitorConfig tb, csv;
  csv.enabled = true, csv.output_path = (dir.path / "file").string();
  try {
    MonitorWriter m(tb, csv, true);
    ADD_FAILURE() << "wrote under a file";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("csv_monitor"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zero::examples
