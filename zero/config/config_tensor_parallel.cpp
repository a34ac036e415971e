// tensor_parallel: DeepSpeed's AutoTP training section. DeepSpeed validates it strictly (a
// pydantic model), so an unknown key is an error here too. Its size key is `autotp_size`;
// `size` is the YAML alias. The world-size check needs the world, so it happens where the groups
// are made (tensor_parallel::make_groups), the model-shape checks where the model is built.
#include <algorithm>

#include "zero/config/config_sections.hpp"

namespace zero::config_detail {

void load_tensor_parallel(Loader& l, const Entry& s, Config& c) {
  TensorParallelConfig& t = c.tensor_parallel;
  const auto size = [&](const Entry& e) {
    const int64_t v = l.integer(e);
    l.require(e, v >= 0 && v <= 65536,
              "the number of ranks per tensor-parallel group (1 or 0: no tensor parallelism)");
    t.autotp_size = static_cast<int>(std::max<int64_t>(1, v));
  };
  l.walk(s, {{"autotp_size", size},
             {"size", size},
             {"sequence_parallel", [&](const Entry& e) { t.sequence_parallel = l.boolean(e); }},
             // zero's key (not DeepSpeed's): the column-parallel backward overlap, in
             // Config::extra (zero/comm_overlap.hpp). Megatron's tp_comm_overlap is another
             // thing (Transformer Engine's userbuffers splitting the GEMMs): not borrowed.
             {"overlap_comm",
              [&](const Entry& e) { c.extra[e.path] = l.boolean(e) ? "true" : "false"; }}});
  if (l.seen(s.path + ".autotp_size") && l.seen(s.path + ".size")) {
    l.fail_at_key(*l.seen(s.path + ".size"), "'" + s.path + ".size' is the YAML alias of '" +
                                                 s.path + ".autotp_size'; give one");
  }
}

}  // namespace zero::config_detail
