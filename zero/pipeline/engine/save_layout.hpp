// How a pipelined checkpoint was cut into stages (PipelineSaveLayout, include/zero/
// pipeline_engine.hpp): written beside each stage's shards as dir/stage<s>/<tag>/pipeline.json,
// so that a load at another pipeline.stages finds every layer's parameters in whichever stage
// directory holds them (each stage's engine then reads them by name: Engine::load_checkpoint(dirs,
// tag, layers_part(...))).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "zero/pipeline_engine.hpp"

namespace zero::pipeline {

// Where stage `stage`'s tensor-parallel rank `tp_rank` of a run with `tp` ranks per stage saves
// (its engine's save directory, over its data-parallel group): dir/stage<s> at tp 1, else
// dir/stage<s>/tp<r>, so that no two ranks write the same file (Megatron's mp_rank_<tp>_<pp>).
std::string stage_save_dir(const std::string& dir, int stage, int tp, int tp_rank);

// <stage_save_dir>/<tag>/pipeline.json: `layout` as seen by stage `stage`, `partition` the method
// that cut it (for humans; loading reads the bounds). Written atomically by the data-parallel
// rank 0 of each (stage, tensor-parallel rank); throws CheckpointError.
void write_save_layout(const std::string& dir, int stage, int tp_rank,
                       const PipelineSaveLayout& layout, const std::string& partition);

// Layers [first, second) of the list: a stage's chunks, as ranges.
using LayerRanges = std::vector<std::pair<int, int>>;

// The layers stage `stage` of `stages` holds when virtual stage c holds bounds[c] ..
// bounds[c + 1] - 1 and lives on stage c % stages: one range per chunk (one with v = 1).
LayerRanges stage_layer_ranges(const std::vector<int>& bounds, int stages, int stage);

// The save directories of `saved` whose layers overlap those stage `stage` of `stages` holds
// under `bounds` (its chunks', stage_layer_ranges), in stage order (at the same layout, P, v and
// bounds, the stage's own alone: its generator states are restored), each stage's as all its
// tensor-parallel ranks' (saved.tp > 1), this rank's own `tp_rank` first when the save had this
// run's `tp` (its generator states then are restored too). Throws CheckpointError naming what
// the save holds when it cannot be loaded into a model cut by `bounds` (another number of
// layers, or a save from before the layout was recorded at another P or v).
std::vector<std::string> dirs_to_load(const std::string& dir, const PipelineSaveLayout& saved,
                                      const std::vector<int>& bounds, int stages, int stage, int tp,
                                      int tp_rank);

// The parameters of the layers in `ranges`, by the names the stage's engine gives them
// ("<layer index>.<name in the layer>"): a stage's part of a save.
ModelPart layers_part(LayerRanges ranges);
ModelPart layers_part(int lo, int hi);

}  // namespace zero::pipeline
