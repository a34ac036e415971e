#include "zero/pipeline/figures.hpp"

#include <stdexcept>
#include <string>

#include "zero/pipeline/simulate.hpp"

namespace zero::pipeline {

PipelineFigures pipeline_figures(ScheduleKind kind, int stages, int micro_batches,
                                 int virtual_stages, double backward_over_forward) {
  if (!(backward_over_forward >= 0))
    throw std::invalid_argument("pipeline: backward / forward time ratio is " +
                                std::to_string(backward_over_forward) + "; it must be >= 0");
  Schedule sched = make_schedule(kind, stages, micro_batches, virtual_stages);
  // A chunk is 1/v of its stage: its forward and backward take 1/v of the stage's.
  OpTimes times;
  times.forward = 1.0 / virtual_stages;
  times.backward = backward_over_forward / virtual_stages;
  SimulationResult sim = simulate(sched, times);
  PipelineFigures out;
  out.bubble_fraction = sim.bubble_fraction;
  out.textbook_bubble_fraction =
      double(stages - 1) / (double(virtual_stages) * micro_batches + stages - 1);
  for (const auto& st : sim.stages) {
    out.peak_in_flight.push_back(st.peak_in_flight);
    out.peak_activation_micro_batches.push_back(double(st.peak_in_flight) / virtual_stages);
  }
  return out;
}

}  // namespace zero::pipeline
