#include "pp_summary.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <stdexcept>

#include "json_text.hpp"
#include "zero/pipeline_engine.hpp"

namespace zero::examples {

ParamStats pipeline_model_stats(const pipeline::PipelineEngine& pipe,
                                const std::shared_ptr<Group>& tp) {
  const ParamStats mine = whole_model_stats(*pipe.engine().module(), tp);
  const auto per_stage = pipe.gather_over_stages({mine.checksum, mine.norm * mine.norm});
  ParamStats out;
  double norm_sq = 0;
  for (const auto& s : per_stage) {
    out.checksum += s[0];
    norm_sq += s[1];
  }
  out.norm = std::sqrt(norm_sq);
  return out;
}

void PipelineSummary::add_stage_times(const std::vector<std::vector<double>>& times) {
  if (first_.empty()) {
    first_ = times;
    rest_.assign(times.size(), std::vector<double>(times.empty() ? 0 : times[0].size()));
    return;
  }
  for (size_t s = 0; s < times.size(); ++s)
    for (size_t i = 0; i < times[s].size(); ++i) rest_[s][i] += times[s][i];
  ++rest_steps_;
}

std::vector<std::vector<double>> PipelineSummary::mean_stage_times() const {
  if (rest_steps_ == 0) return first_;
  auto out = rest_;
  for (auto& s : out)
    for (double& v : s) v /= static_cast<double>(rest_steps_);
  return out;
}

void PipelineSummary::write_json(const std::string& path) const {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write the --summary-json file '" + path + "'");
  const size_t from = records.size() > 1 ? 1 : 0;
  auto mean = [&](double StepRecord::*field) {
    double s = 0;
    for (size_t i = from; i < records.size(); ++i) s += records[i].*field;
    return s / static_cast<double>(std::max<size_t>(1, records.size() - from));
  };
  std::vector<double> steps;
  for (size_t i = from; i < records.size(); ++i) steps.push_back(records[i].step_s);
  std::sort(steps.begin(), steps.end());
  const double median = steps.empty() ? NAN : steps[steps.size() / 2];
  out.precision(17);
  out << "{\n  \"world_size\": " << world_size << ",\n  \"grid\": " << quoted(grid)
      << ",\n  \"pipeline_stages\": " << stages.size() << ",\n  \"schedule\": " << quoted(schedule)
      << ",\n  \"micro_batches\": " << micro_batches << ",\n  \"stage\": " << zero_stage
      << ",\n  \"steps\": " << records.size() << ",\n  \"model\": " << quoted(model)
      << ",\n  \"num_params\": " << num_params << ",\n  \"data\": " << quoted(data)
      << ",\n  \"first_loss\": " << Num{records.empty() ? NAN : records.front().loss}
      << ",\n  \"final_loss\": " << Num{records.empty() ? NAN : records.back().loss}
      << ",\n  \"param_checksum\": " << Num{param_checksum}
      << ",\n  \"param_norm\": " << Num{param_norm}
      << ",\n  \"step_seconds_median\": " << Num{median}
      << ",\n  \"forward_s_mean\": " << Num{mean(&StepRecord::forward_s)}
      << ",\n  \"backward_s_mean\": " << Num{mean(&StepRecord::backward_s)}
      << ",\n  \"comm_exposed_s_mean\": " << Num{mean(&StepRecord::comm_exposed_s)}
      << ",\n  \"optimizer_s_mean\": " << Num{mean(&StepRecord::optimizer_s)}
      << ",\n  \"data_s_mean\": " << Num{mean(&StepRecord::data_s)}
      << ",\n  \"tokens_per_s_mean\": " << Num{mean(&StepRecord::tokens_per_s)}
      << ",\n  \"skipped_steps\": " << skipped_steps << ",\n  \"seq_len\": " << seq_len
      << ",\n  \"train_batch_size\": " << train_batch_size << memory.json_fields()
      << ",\n  \"stages\": [";
  const auto times = mean_stage_times();
  for (size_t s = 0; s < stages.size(); ++s) {
    const auto& r = stages[s];
    const std::vector<double> t = s < times.size() ? times[s] : std::vector<double>(4, NAN);
    out << (s ? ",\n" : "\n") << "    {\"stage\": " << s << ", \"layers\": [" << r.first_layer
        << ", " << r.last_layer << "], \"forward_s_mean\": " << Num{t[0]}
        << ", \"backward_s_mean\": " << Num{t[1]} << ", \"optimizer_s_mean\": " << Num{t[2]}
        << ", \"pipeline_comm_s_mean\": " << Num{t[3]}
        << ", \"model_states_bytes\": " << r.model_states_bytes
        << ", \"peak_rss_bytes\": " << r.peak_rss_bytes << "}";
  }
  out << "\n  ]\n}\n";
}

}  // namespace zero::examples
