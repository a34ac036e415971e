#include "zero/tensor_parallel/sequence_parallel_check.hpp"

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "zero/tensor_parallel/embedding.hpp"
#include "zero/tensor_parallel/linear.hpp"

namespace zero::tensor_parallel {
namespace {

// How the layer was built, where it splits anything; nullopt for any other module (a layer of the
// user's own cannot say; one over a group of one rank splits nothing).
std::optional<bool> built_with(const torch::nn::Module& m) {
  auto over = [](const auto* l) -> std::optional<bool> {
    if (l->group()->size() < 2) return std::nullopt;
    return l->options().sequence_parallel();
  };
  if (const auto* c = dynamic_cast<const ColumnParallelLinearImpl*>(&m)) return over(c);
  if (const auto* r = dynamic_cast<const RowParallelLinearImpl*>(&m)) return over(r);
  if (const auto* e = dynamic_cast<const VocabParallelEmbeddingImpl*>(&m)) return over(e);
  return std::nullopt;
}

}  // namespace

void check_sequence_parallel(const torch::nn::Module& model, bool sequence_parallel) {
  std::vector<std::string> other;
  for (const auto& item : model.named_modules()) {
    const std::optional<bool> sp = built_with(*item.value());
    if (sp && *sp != sequence_parallel)
      other.push_back(item.key().empty() ? "the model itself" : "'" + item.key() + "'");
  }
  if (other.empty()) return;
  std::string names;
  for (size_t i = 0; i < other.size() && i < 4; ++i) names += (i ? ", " : "") + other[i];
  if (other.size() > 4) names += " and " + std::to_string(other.size() - 4) + " more";
  const bool many = other.size() > 1;
  const std::string layers = (many ? "layers " : "layer ") + names + (many ? " were" : " was"),
                    their = many ? " (their" : " (its";
  if (sequence_parallel)
    throw std::invalid_argument(
        "tensor_parallel.sequence_parallel is true, but the model's tensor-parallel " + layers +
        " built without sequence parallelism" + their +
        " options' sequence_parallel is false): "
        "every rank keeps the whole sequence, so the engine would sum over the tensor-parallel "
        "group the gradients of the norms and biases its marks call partial, though they are "
        "whole (training them with the group's size times their gradient). Build the model's "
        "tensor-parallel layers with sequence_parallel(true) (zero::models::TpGpt: its "
        "sequence_parallel argument), or set tensor_parallel.sequence_parallel: false");
  throw std::invalid_argument(
      "tensor_parallel.sequence_parallel is false, but the model's tensor-parallel " + layers +
      " built with sequence parallelism" + their +
      " options' sequence_parallel is true): between "
      "the parallel regions each rank holds its part of the sequence, so the gradients of the "
      "norms and biases acting there are partial sums that the engine would not add over the "
      "tensor-parallel group. Set tensor_parallel.sequence_parallel: true, or build the layers "
      "with sequence_parallel(false)");
}

}  // namespace zero::tensor_parallel
