// optimizer.param_groups: per-parameter lr scale and weight decay by name pattern, checked
// against single-process torch::optim (AdamW and SGD) with the same groups, per parameter, on 2
// gloo ranks at stages 1 and 2; and the errors a wrong group gives.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <filesystem>
#include <mutex>
#include <set>

#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/checkpoint_io.hpp"
#include "zero/engine.hpp"

namespace zero::testing {
namespace {

constexpr int kSteps = 4;
constexpr int64_t kGlobalRows = 24;
constexpr uint64_t kSeed = 5;

// The groups under test, once as the config gives them and once as explicit name lists for the
// reference, so the reference does not share the engine's pattern matching.
struct RefGroup {
  std::set<std::string> names;
  double lr_scale;
  double weight_decay;
};

Config grouped_config(const std::string& type, int stage) {
  Config c = test_config(stage, kGlobalRows / 2, 1, 0.0, /*bucket=*/100);
  c.optimizer.type = type;
  c.optimizer.lr = type == "SGD" ? 0.05 : 1e-2;
  c.optimizer.weight_decay = 0.1;
  if (type == "SGD") c.optimizer.momentum = 0.9;
  c.no_weight_decay = {"bias"};
  // The norm learns 10x slower without decay; the head's weight 3x faster with strong decay
  // (over no_weight_decay's rule, which would not touch it anyway); head.bias is matched too,
  // so the group's own weight_decay overrides no_weight_decay there.
  c.optimizer.param_groups = {{"^norm\\.", 0.1, 0.0}, {"^head\\.", 3.0, 0.5}};
  return c;
}

std::vector<RefGroup> reference_groups(const Config& c) {
  return {{{"norm.weight", "norm.bias"}, 0.1, 0.0},
          {{"head.weight", "head.bias"}, 3.0, 0.5},
          {{"fc1.weight", "fc2.weight"}, 1.0, c.optimizer.weight_decay},
          {{"fc1.bias", "fc2.bias"}, 1.0, 0.0}};
}

// Single-process torch::optim over the whole batch, with one torch param group per RefGroup.
std::vector<std::pair<std::string, at::Tensor>> train_reference_grouped(
    const Config& cfg, const std::vector<RefGroup>& groups) {
  auto net = make_tiny_net(kSeed);
  const auto named = net->named_parameters();
  std::vector<torch::optim::OptimizerParamGroup> tg;
  size_t assigned = 0;
  const auto& o = cfg.optimizer;
  for (const RefGroup& g : groups) {
    std::vector<at::Tensor> params;
    for (const auto& item : named) {
      if (g.names.count(item.key())) params.push_back(item.value());
    }
    assigned += params.size();
    const double lr = o.lr * g.lr_scale;
    if (o.type == "SGD") {
      tg.emplace_back(
          params,
          std::make_unique<torch::optim::SGDOptions>(
              torch::optim::SGDOptions(lr).momentum(o.momentum).weight_decay(g.weight_decay)));
    } else {
      tg.emplace_back(
          params, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(lr)
                                                                   .betas({o.beta1, o.beta2})
                                                                   .eps(o.eps)
                                                                   .weight_decay(g.weight_decay)));
    }
  }
  EXPECT_EQ(assigned, named.size()) << "the reference groups must hold every parameter";
  // torch replaces a group's option that equals the options' constructor default (AdamW's lr
  // 1e-3, which is 0.1 x 1e-2 here) with the optimizer's default: defaults built from the
  // constructor defaults themselves keep every group's own values.
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (o.type == "SGD") {
    opt = std::make_unique<torch::optim::SGD>(std::move(tg), torch::optim::SGDOptions(o.lr));
  } else {
    opt = std::make_unique<torch::optim::AdamW>(std::move(tg), torch::optim::AdamWOptions());
  }
  for (auto& g : opt->param_groups()) {  // guards the reference itself
    const double lr = o.type == "SGD" ? static_cast<torch::optim::SGDOptions&>(g.options()).lr()
                                      : static_cast<torch::optim::AdamWOptions&>(g.options()).lr();
    bool found = false;
    for (const RefGroup& rg : groups) found = found || lr == o.lr * rg.lr_scale;
    EXPECT_TRUE(found) << "a reference group runs at lr " << lr;
  }
  for (int s = 0; s < kSteps; ++s) {
    opt->zero_grad();
    Batch b = global_batch(s, kGlobalRows);
    mse(net->forward(b.x), b.y).backward();
    opt->step();
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : net->named_parameters()) {
    out.emplace_back(item.key(), item.value().detach().clone());
  }
  return out;
}

// Each rank's parameters after kSteps on 2 ranks.
std::vector<at::Tensor> train_engine(const Config& cfg) {
  std::mutex mu;
  std::vector<at::Tensor> finals(2);
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(kSeed);
    auto engine = initialize(net, cfg, group);
    const int r = group->rank();
    for (int s = 0; s < kSteps; ++s) {
      Batch b = rank_micro_batch(global_batch(s, kGlobalRows), r, 2, 0, 1);
      engine.backward(mse(net->forward(b.x), b.y));
      EXPECT_TRUE(engine.step());
    }
    std::lock_guard<std::mutex> lock(mu);
    finals[r] = engine.flat_parameters();
  });
  return finals;
}

struct Case {
  std::string type;
  int stage;
};

class ParamGroups : public ::testing::TestWithParam<Case> {};

TEST_P(ParamGroups, MatchTorchOptimPerParameter) {
  const Case c = GetParam();
  const Config cfg = grouped_config(c.type, c.stage);
  const auto ref = train_reference_grouped(cfg, reference_groups(cfg));
  // The same training without groups: every group must have changed its parameters' result,
  // or the comparison below would not show that groups are applied.
  const auto plain = train_reference_grouped(
      cfg, {{{"fc1.weight", "norm.weight", "fc2.weight", "head.weight"},
             1.0,
             cfg.optimizer.weight_decay},
            {{"fc1.bias", "norm.bias", "fc2.bias", "head.bias"}, 1.0, 0.0}});
  const auto finals = train_engine(cfg);
  for (int r = 0; r < 2; ++r) {
    int64_t offset = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const auto& [name, want] = ref[i];
      const at::Tensor got = finals[r].narrow(0, offset, want.numel()).view(want.sizes());
      offset += want.numel();
      EXPECT_LT((got - want).abs().max().item<double>(), 2e-5) << "rank " << r << " " << name;
      if (name.rfind("norm.", 0) == 0 || name.rfind("head.", 0) == 0) {
        EXPECT_GT((want - plain[i].second).abs().max().item<double>(), 1e-3)
            << name << ": its group made no difference, so the test shows nothing";
      }
    }
    EXPECT_EQ(offset, finals[r].numel());
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ParamGroups,
                         ::testing::Values(Case{"AdamW", 1}, Case{"AdamW", 2}, Case{"SGD", 1},
                                           Case{"SGD", 2}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.type + "_stage" + std::to_string(info.param.stage);
                         });

// Every rank fails the same way at initialize, so none waits for another.
std::string initialize_error(const Config& cfg) {
  std::mutex mu;
  std::vector<std::string> errors;
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(kSeed);
    try {
      auto engine = initialize(net, cfg, group);
    } catch (const ConfigError& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(e.what());
    }
  });
  EXPECT_EQ(errors.size(), 2u);
  return errors.empty() ? "" : errors[0];
}

TEST(ParamGroupErrors, ParameterInTwoGroups) {
  Config cfg = grouped_config("AdamW", 2);
  cfg.optimizer.param_groups = {{"^head\\.", 2.0, {}}, {"bias$", 1.0, 0.0}};
  const std::string e = initialize_error(cfg);
  EXPECT_NE(e.find("'head.bias' matches both optimizer.param_groups[0]"), std::string::npos) << e;
}

TEST(ParamGroupErrors, PatternMatchingNothing) {
  Config cfg = grouped_config("SGD", 1);
  cfg.optimizer.param_groups = {{"^norm\\.", 0.1, {}}, {"^decoder\\.", 1.0, {}}};
  const std::string e = initialize_error(cfg);
  EXPECT_NE(e.find("optimizer.param_groups[1].params '^decoder\\.' matches no trainable"),
            std::string::npos)
      << e;
}

std::string config_error(const std::string& yaml) {
  try {
    Config::from_string(yaml, "groups.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ParamGroupErrors, ConfigKeysAndTypes) {
  const std::string head = "optimizer:\n  type: AdamW\n  param_groups:\n";
  std::string e = config_error(head + "    - {params: bias, lr_scal: 0.1}\n");
  EXPECT_NE(e.find("unknown key 'optimizer.param_groups[0].lr_scal'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'optimizer.param_groups[0].lr_scale'"), std::string::npos) << e;
  e = config_error(head + "    - {params: bias, lr_scale: fast}\n");
  EXPECT_NE(e.find("optimizer.param_groups[0].lr_scale"), std::string::npos) << e;
  e = config_error(head + "    - {params: bias, weight_decay: -1}\n");
  EXPECT_NE(e.find("optimizer.param_groups[0].weight_decay"), std::string::npos) << e;
  e = config_error(head + "    - {lr_scale: 0.5}\n");
  EXPECT_NE(e.find("'optimizer.param_groups[0]' needs 'params'"), std::string::npos) << e;
  e = config_error(head + "    - {params: \"(bias\"}\n");
  EXPECT_NE(e.find("'optimizer.param_groups[0].params' is not a valid regular expression"),
            std::string::npos)
      << e;
  e = config_error("optimizer:\n  type: SGD\n  param_groups: {params: bias}\n");
  EXPECT_NE(e.find("'optimizer.param_groups' must be a list of groups"), std::string::npos) << e;
  // DeepSpeed JSON takes the same place.
  const Config ok = Config::from_string(
      R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.001},
          "param_groups": [{"params": "bias$", "lr_scale": 0.5, "weight_decay": 0.0}]}})",
      "ds.json");
  ASSERT_EQ(ok.optimizer.param_groups.size(), 1u);
  EXPECT_EQ(ok.optimizer.param_groups[0].params, "bias$");
  EXPECT_EQ(ok.optimizer.param_groups[0].lr_scale, 0.5);
  EXPECT_EQ(ok.optimizer.param_groups[0].weight_decay, 0.0);
}

TEST(ParamGroupCheckpoint, ResumeWithOtherGroupsIsRefused) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / "zero_test_param_groups_ckpt").string();
  std::filesystem::remove_all(dir);
  const Config saved = grouped_config("AdamW", 2);
  Config other = saved;
  other.optimizer.param_groups[0].lr_scale = 0.5;
  std::mutex mu;
  std::vector<std::string> errors;
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(kSeed);
    auto engine = initialize(net, saved, group);
    Batch b = rank_micro_batch(global_batch(0, kGlobalRows), group->rank(), 2, 0, 1);
    engine.backward(mse(net->forward(b.x), b.y));
    engine.step();
    engine.save_checkpoint(dir, "a");

    auto net2 = make_tiny_net(kSeed + 1);
    auto same = initialize(net2, saved, group);
    same.load_checkpoint(dir, "a");  // the same groups resume
    EXPECT_TRUE(at::equal(same.flat_parameters(), engine.flat_parameters()));

    auto net3 = make_tiny_net(kSeed);
    auto changed = initialize(net3, other, group);
    try {
      changed.load_checkpoint(dir, "a");
    } catch (const CheckpointError& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(e.what());
    }
  });
  std::filesystem::remove_all(dir);
  ASSERT_EQ(errors.size(), 2u) << "every rank must refuse the resume";
  EXPECT_NE(errors[0].find("saved with optimizer.param_groups [{params: ^norm\\., lr_scale: 0.1"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[0].find("lr_scale: 0.5"), std::string::npos) << errors[0];
}

}  // namespace
}  // namespace zero::testing
