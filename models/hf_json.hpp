// What the Hugging Face readers and writers of models/ share: JSON files, read as YAML (JSON is
// YAML), and the one error type a bad checkpoint directory gets.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

namespace zero::models {

// Throws zero::CheckpointError(msg).
[[noreturn]] void ckpt_fail(const std::string& msg);
// The JSON file at `path`; a missing file's error says `hint` (what the directory should hold).
YAML::Node load_json(const std::string& path, const std::string& hint);

}  // namespace zero::models
