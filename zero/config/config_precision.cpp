// bf16 and fp16: the compute dtype and the fp16 loss scaler.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "zero/config/config_sections.hpp"

namespace zero::config_detail {

void load_bf16(Loader& l, const Entry& s, Config& c) {
  l.walk(s, {
                {"enabled",
                 [&](const Entry& e) {
                   if (Loader::is_auto(e)) {
                     l.note_auto(e, "false", "DeepSpeed's default");
                     c.bf16 = false;
                   } else {
                     c.bf16 = l.boolean(e);
                   }
                 }},
                {"immediate_grad_update",
                 [&](const Entry& e) {
                   // DeepSpeed's default (true) is what zero does: each bf16 gradient joins the
                   // fp32 accumulation as it arrives. false only defers that, same sums.
                   if (!l.boolean(e)) {
                     l.warn(e, "'" + e.path +
                                   "' has no effect here and is ignored: zero adds each bf16 "
                                   "gradient into fp32 as it arrives");
                   }
                 }},
                l.no_effect("check_grad_overflow",
                            "bf16 has fp32's range; zero checks the gradient norm for inf/NaN "
                            "on every step"),
            });
}

void load_fp16(Loader& l, const Entry& s, Fp16Config& f) {
  l.walk(s, {
                {"enabled",
                 [&](const Entry& e) {
                   if (Loader::is_auto(e)) {
                     l.note_auto(e, "false", "DeepSpeed's default");
                     f.enabled = false;
                   } else {
                     f.enabled = l.boolean(e);
                   }
                 }},
                {"loss_scale", [&](const Entry& e) { f.loss_scale = non_negative(l, e); }},
                {"initial_scale_power",
                 [&](const Entry& e) {
                   const int64_t v = l.integer(e);
                   l.require(e, v >= 0 && v <= 64, "an integer in [0, 64]");
                   f.initial_scale_power = static_cast<int>(v);
                 }},
                {"loss_scale_window",
                 [&](const Entry& e) { f.loss_scale_window = static_cast<int>(count(l, e, 1)); }},
                {"hysteresis",
                 [&](const Entry& e) { f.hysteresis = static_cast<int>(count(l, e, 1)); }},
                {"min_loss_scale",
                 [&](const Entry& e) {
                   f.min_loss_scale = l.number(e);
                   l.require(e, f.min_loss_scale > 0, "a number > 0");
                 }},
                {"auto_cast", [&](const Entry& e) { f.auto_cast = l.boolean(e); }},
                only_bool(l, "consecutive_hysteresis", false, "is not supported yet"),
                only_bool(l, "fp16_master_weights_and_grads", false,
                          "keeps master weights in fp16, which zero does not implement (its master "
                          "weights are fp32)"),
            });
}

}  // namespace zero::config_detail
