// What the planner needs from a pipeline schedule, without running a model: the bubble and the
// activations each stage holds at its peak, found by simulating the schedule with equal stages.
#pragma once

#include <vector>

#include "zero/pipeline/schedule.hpp"

namespace zero::pipeline {

struct PipelineFigures {
  // Idle share of the step on every stage (equal stages, free links): the step takes
  // m·(t_f + t_b) / (1 - bubble_fraction).
  double bubble_fraction = 0;
  // The closed form the simulation should meet: (P-1)/(v·m + P-1) (GPipe and 1F1B: v = 1).
  double textbook_bubble_fraction = 0;
  // Per stage: the most (micro-batch, chunk) activations held at once ...
  std::vector<int> peak_in_flight;
  // ... and the same in whole micro-batches of the stage's activations (a chunk holds 1/v).
  std::vector<double> peak_activation_micro_batches;
};

// backward_over_forward: t_b / t_f (2 without activation checkpointing, about 3 with it).
PipelineFigures pipeline_figures(ScheduleKind kind, int stages, int micro_batches,
                                 int virtual_stages = 1, double backward_over_forward = 2.0);

}  // namespace zero::pipeline
