// What Engine::save_checkpoint and Engine::load_checkpoint share. Private to zero/.
//
// The rule that keeps failures from hanging: a rank never throws on its own between
// collectives. Each phase runs under attempt(), which turns an exception into a message, and
// agree() then makes every rank throw the same CheckpointError (or none).
#pragma once

#include <string>
#include <vector>

#include "zero/checkpoint/checkpoint_format.hpp"
#include "zero/engine/engine_impl.hpp"

namespace zero::ckpt {

// Runs fn(); returns its exception's message, or "" when it returned.
template <typename Fn>
std::string attempt(Fn&& fn) {
  try {
    fn();
    return "";
  } catch (const std::exception& e) {
    const std::string s = message_of(e);
    return s.empty() ? "unknown error" : s;
  } catch (...) {
    return "unknown non-standard exception";
  }
}

// A collective: throws CheckpointError on every rank when `error` is non-empty on any rank,
// with the message of the lowest such rank. `what` names the operation ("load_checkpoint").
void agree(Engine::Impl& m, const std::string& error, const std::string& what);
// The page-locked host buffer (at least `numel` fp32 elements) that checkpoint pieces of device
// states pass through; made once and kept in `m` (Engine::Impl::checkpoint_staging).
at::Tensor checkpoint_staging(Engine::Impl& m, int64_t numel);
// A collective: `root`'s `text` on every rank.
std::string broadcast_string(Engine::Impl& m, const std::string& text, int root);

// The trainable parameters by name and shape, in named_parameters() order.
std::vector<CheckpointParam> current_params(const Engine::Impl& m);
std::string current_dtype(const Engine::Impl& m);

// The default CPU generator's state and, when `device` is an accelerator (CUDA), that device's
// default generator's too (dropout on the GPU draws from it): one opaque string per rank.
std::string rng_state(c10::Device device);
void set_rng_state(const std::string& bytes, c10::Device device, const std::string& source);

// zero_quantized_gradients' error-feedback residuals (engine_error_feedback.cpp): this rank's
// file in `dir`, written when the run has them; read back on load, or zeroed (with a warning
// from rank 0) when the checkpoint was saved by another world size, without them, or with other
// quantization settings.
std::string error_feedback_file(int rank, int world);
void save_error_feedback(Engine::Impl& m, const std::string& dir);
// A non-empty `drop` zeroes them for that reason (a load that reshards the tensor-parallel
// blocks: the residuals are laid out by the saved blocks' buckets).
void load_error_feedback(Engine::Impl& m, const std::string& tag_dir, int saved_world,
                         const std::string& drop = "");

// Key values of the config, for the manifest (humans read them; loading never does).
std::vector<std::pair<std::string, std::string>> config_values(const Config& c);

}  // namespace zero::ckpt
