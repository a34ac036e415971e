#include "comm/lent_tensor.hpp"

#include <ATen/ATen.h>

#include <exception>
#include <mutex>
#include <utility>
#include <vector>

namespace zero::comm {
namespace {

void keep_for_process_life(at::Tensor t) {
  static std::mutex mu;
  static std::vector<at::Tensor> kept;
  std::lock_guard<std::mutex> lock(mu);
  kept.push_back(std::move(t));
}

}  // namespace

LentTensor::LentTensor(at::Tensor owner)
    : owner_(std::move(owner)), exceptions_at_start_(std::uncaught_exceptions()) {
  lent_ = owner_.is_cpu() && owner_.is_contiguous()
              ? at::from_blob(owner_.data_ptr(), owner_.sizes(), owner_.options())
              : owner_;
}

LentTensor::~LentTensor() {
  if (std::uncaught_exceptions() > exceptions_at_start_ && lent_.is_cpu()) {
    keep_for_process_life(std::move(owner_));
  }
}

}  // namespace zero::comm
