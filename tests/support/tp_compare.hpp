// Comparing a tensor-parallel run with its single-process reference: the relative error of a
// tensor as one number (max |a - b| / max |b|), checked against a tolerance and printed, so a
// test's log shows how close it came.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace zero::testing {

double max_rel_err(const at::Tensor& actual, const at::Tensor& expected);

// EXPECTs actual within `tol` of expected (same shape too); prints the error when `print`.
void expect_rel_close(const at::Tensor& actual, const at::Tensor& expected, double tol,
                      const std::string& what, bool print = false);

}  // namespace zero::testing
