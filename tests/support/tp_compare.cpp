#include "support/tp_compare.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>

namespace zero::testing {

double max_rel_err(const at::Tensor& actual, const at::Tensor& expected) {
  const at::Tensor a = actual.detach().to(at::kDouble);
  const at::Tensor e = expected.detach().to(at::kDouble);
  const double scale = e.abs().max().item<double>();
  const double diff = (a - e).abs().max().item<double>();
  return scale > 0 ? diff / scale : diff;
}

void expect_rel_close(const at::Tensor& actual, const at::Tensor& expected, double tol,
                      const std::string& what, bool print) {
  ASSERT_TRUE(actual.defined()) << what << ": no tensor";
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double err = max_rel_err(actual, expected);
  EXPECT_LE(err, tol) << what << ": max relative error " << err << " over the tolerance " << tol;
  if (print) std::printf("  %-48s max rel err %.3g (tol %.0e)\n", what.c_str(), err, tol);
}

}  // namespace zero::testing
