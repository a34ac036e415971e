// The section readers of the key table (config.cpp) and the value checks they share. Private
// to zero/config/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zero/config.hpp"
#include "zero/config/config_schema.hpp"

namespace zero::config_detail {

using Entry = Loader::Entry;
using Field = Loader::Field;

// Whitespace-separated words of a key list.
std::vector<std::string> words(const char* s);
// A boolean DeepSpeed key whose only value zero implements is `neutral`.
Field only_bool(Loader& l, std::string name, bool neutral, std::string why, bool listed = false);
// A batch-size key: a positive integer, or "auto" (recorded in c.auto_batch_keys; returns 0).
int64_t batch_value(const Loader& l, const Entry& e, Config& c);
double non_negative(const Loader& l, const Entry& e);
double ratio(const Loader& l, const Entry& e);  // in [0, 1]
int64_t count(const Loader& l, const Entry& e, int64_t lo);

// One per top-level section: config_precision.cpp, config_zero.cpp, config_optimizer.cpp.
void load_bf16(Loader& l, const Entry& s, Config& c);
void load_fp16(Loader& l, const Entry& s, Fp16Config& f);
void load_zero(Loader& l, const Entry& s, ZeroOptimizationConfig& z);
void load_activation_checkpointing(Loader& l, const Entry& s, Config& c);
void load_optimizer(Loader& l, const Entry& s, OptimizerConfig& o);
void load_scheduler(Loader& l, const Entry& s, SchedulerConfig& sc);
void load_tensor_parallel(Loader& l, const Entry& s, Config& c);  // config_tensor_parallel.cpp
void load_pipeline(Loader& l, const Entry& s, Config& c);  // config_pipeline.cpp
// Across sections: what a pipeline refuses (ZeRO-2, ...), called after the walk.
void check_pipeline(Loader& l, const Config& c);

}  // namespace zero::config_detail
