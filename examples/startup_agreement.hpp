// The trainers' start-up checks made collective: a check that fails on one rank only (rank 0's
// output files) must stop every rank, not leave the others waiting at their first collective
// until comm_timeout_s.
#pragma once

#include <c10/core/Device.h>

#include <memory>
#include <string>

#include "zero/group.hpp"

namespace zero::examples {

// `problem`: this rank's failed check ("" = fine). An all-reduce over `world` (every process,
// not one data-parallel group), then ConfigError on every rank when any failed: the failing
// ranks' with their own text, the others' saying another rank refused.
void stop_unless_every_rank_passed(const std::string& problem, const c10::Device& device,
                                   const std::shared_ptr<Group>& world);

}  // namespace zero::examples
