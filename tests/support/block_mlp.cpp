#include "support/block_mlp.hpp"

#include <string>

#include "zero/sharding.hpp"

namespace zero::testing {

MlpBlockImpl::MlpBlockImpl(int64_t width, double dropout) {
  fc = register_module("fc", torch::nn::Linear(width, width));
  act = register_module("act", torch::nn::GELU());
  drop = register_module("drop", torch::nn::Dropout(dropout));
  norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
}

at::Tensor MlpBlockImpl::forward(const at::Tensor& x) { return norm(drop(act(fc(x)))); }

BlockMlp::BlockMlp(int blocks, int64_t width, double dropout) {
  for (int i = 0; i < blocks; ++i) {
    blocks_.push_back(register_module("block" + std::to_string(i), MlpBlock(width, dropout)));
  }
}

at::Tensor BlockMlp::block(size_t i, const at::Tensor& x) {
  MlpBlockImpl* b = blocks_.at(i).get();
  return zero::run_unit(
      *b, [b](const at::Tensor& t) { return b->forward(t); }, x);
}

at::Tensor BlockMlp::forward(const at::Tensor& x, const CheckpointOptions* ckpt) {
  at::Tensor h = x;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    if (ckpt != nullptr) {
      h = checkpoint([this, i](const at::Tensor& t) { return block(i, t); }, h, *ckpt);
    } else {
      h = block(i, h);
    }
  }
  return h;
}

}  // namespace zero::testing
