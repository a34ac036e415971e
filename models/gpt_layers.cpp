#include "zero/models/gpt_layers.hpp"

#include <ATen/ATen.h>

#include <cctype>

namespace zero::models {

GptHeadImpl::GptHeadImpl(RMSNorm n, torch::nn::Linear h, at::Tensor tied) {
  norm = register_module("norm", std::move(n));
  if (h) {
    head = register_module("head", std::move(h));
  } else {
    // Registered here as well as on the embedding, so that the last stage's optimizer and the
    // partition's parameter count see it.
    tied_weight = register_parameter("tied_weight", std::move(tied));
  }
}

at::Tensor GptHeadImpl::forward(const at::Tensor& x) {
  auto h = norm->forward(x);
  return head ? head->forward(h) : at::linear(h, tied_weight);
}

std::vector<zero::pipeline::Layer> gpt_pipeline_layers(const Gpt& model, int64_t seq_len) {
  return rope_gpt_layers<BlockImpl>(
      model->embed, model->blocks,
      GptHead(model->norm, model->head, model->cfg.tied ? model->embed->weight : at::Tensor()),
      model->cfg.tied, model->rope_cos, model->rope_sin, model->cfg.max_seq,
      seq_len > 0 ? seq_len : model->cfg.max_seq, 1);
}

std::string gpt_name_of_layer_param(const std::string& name, int layers) {
  const size_t dot = name.find('.');
  if (dot == 0 || dot == std::string::npos || dot > 9) return "";
  for (size_t i = 0; i < dot; ++i)
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return "";
  const int layer = std::stoi(name.substr(0, dot));
  const std::string rest = name.substr(dot + 1);
  // As gpt_pipeline_layers builds them: the embedding, the blocks, then the head (the model's
  // final norm and its head Linear; a tied head's weight is the embedding's, saved as layer 0's).
  if (layer == 0) return rest == "weight" ? "embed.weight" : "";
  if (layer < layers - 1) return "blocks." + std::to_string(layer - 1) + "." + rest;
  if (layer == layers - 1 && (rest.rfind("norm.", 0) == 0 || rest.rfind("head.", 0) == 0))
    return rest;
  return "";
}

at::Tensor gpt_loss(const at::Tensor& logits, const at::Tensor& targets) {
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat),
                                targets.reshape({-1}));
}

}  // namespace zero::models
