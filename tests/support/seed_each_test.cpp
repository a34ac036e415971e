// Every test starts from the same state of torch's global generator. LibTorch seeds it from the
// system's entropy in each process (Python's `import torch` seeds it with a constant; C++ does
// not), so a test that builds a model with the default initialisers would otherwise start from
// other weights in every run, and a tolerance met by most draws fails on some (a flake:
// TpGptTraining's AdamW error ranged 1.3e-6 .. 1.1e-4 from run to run). Seeded here, in the
// main thread, before each test's body; rank threads still draw from their own generators.
#include <ATen/Context.h>
#include <gtest/gtest.h>

namespace {

class SeedEachTest : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo&) override { at::manual_seed(20261205); }
};

const bool kRegistered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new SeedEachTest);
  return true;
}();

}  // namespace
