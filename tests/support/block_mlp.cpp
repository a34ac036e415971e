#include "support/block_mlp.hpp"

#include <string>

namespace zero::testing {

BlockMlp::BlockMlp(int blocks, int64_t width, double dropout) {
  for (int i = 0; i < blocks; ++i) {
    const std::string n = std::to_string(i);
    fc_.push_back(register_module("fc" + n, torch::nn::Linear(width, width)));
    act_.push_back(register_module("act" + n, torch::nn::GELU()));
    drop_.push_back(register_module("drop" + n, torch::nn::Dropout(dropout)));
    norm_.push_back(
        register_module("norm" + n, torch::nn::LayerNorm(torch::nn::LayerNormOptions({width}))));
  }
}

at::Tensor BlockMlp::block(size_t i, const at::Tensor& x) {
  return norm_[i](drop_[i](act_[i](fc_[i](x))));
}

at::Tensor BlockMlp::forward(const at::Tensor& x, const CheckpointOptions* ckpt) {
  at::Tensor h = x;
  for (size_t i = 0; i < fc_.size(); ++i) {
    if (ckpt != nullptr) {
      h = checkpoint([this, i](const at::Tensor& t) { return block(i, t); }, h, *ckpt);
    } else {
      h = block(i, h);
    }
  }
  return h;
}

}  // namespace zero::testing
