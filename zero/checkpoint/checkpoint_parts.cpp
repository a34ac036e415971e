#include "zero/checkpoint/checkpoint_parts.hpp"

#include <c10/util/ArrayRef.h>

#include <algorithm>

namespace zero::ckpt {
namespace {

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) s[d - 1] = s[d] * shape[d];
  return s;
}

bool overlaps(const CheckpointParam& a, const CheckpointParam& b) {
  for (size_t d = 0; d < a.shape.size(); ++d) {
    if (std::max(a.offset[d], b.offset[d]) >=
        std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d])) {
      return false;
    }
  }
  return true;
}

}  // namespace

Source open_source(const std::string& tag_dir, Manifest man) {
  Source s;
  s.tag_dir = tag_dir;
  s.man = std::move(man);
  s.readers.reserve(s.man.files.size());
  for (const auto& f : s.man.files) s.readers.emplace_back(tag_dir + "/" + f.name);
  s.map = build_piece_map(s.man, s.readers, tag_dir);
  return s;
}

PartMap::PartMap(const std::vector<Source>& sources) : sources_(sources) {
  for (size_t si = 0; si < sources.size(); ++si) {
    const Source& src = sources[si];
    ZERO_CKPT_CHECK(src.man.state_names == sources.front().man.state_names, src.tag_dir,
                    ": its optimizer states differ from those of ", sources.front().tag_dir,
                    " (the directories are not the tensor-parallel ranks of one save)");
    for (const CheckpointParam& p : src.man.params) {
      auto& parts = parts_[p.name];
      if (parts.empty()) names_.push_back(p.name);
      bool duplicate = false;
      for (const Part& q : parts) {
        const CheckpointParam& o = *q.param;
        ZERO_CKPT_CHECK(o.global_shape == p.global_shape, src.tag_dir, ": parameter '", p.name,
                        "' is part of a ", c10::IntArrayRef(p.global_shape), " tensor, but in ",
                        sources[q.source].tag_dir, " of a ", c10::IntArrayRef(o.global_shape),
                        " one (the directories are not the tensor-parallel ranks of one save)");
        if (o.offset == p.offset && o.shape == p.shape) {
          duplicate = true;  // replicated: every tensor-parallel rank saved the same block
          break;
        }
        ZERO_CKPT_CHECK(!overlaps(o, p), src.tag_dir, ": parameter '", p.name, "': its block at ",
                        c10::IntArrayRef(p.offset), " overlaps the one at ",
                        c10::IntArrayRef(o.offset), " in ", sources[q.source].tag_dir,
                        " (the directories are not the tensor-parallel ranks of one save)");
      }
      if (!duplicate) parts.push_back({static_cast<int>(si), &p});
    }
  }
}

const std::vector<int64_t>& PartMap::global_shape(const std::string& name) const {
  return parts_.at(name).front().param->global_shape;
}

bool PartMap::split(const std::string& name) const {
  const auto it = parts_.find(name);
  if (it == parts_.end()) return false;
  return std::any_of(it->second.begin(), it->second.end(),
                     [](const Part& p) { return !p.param->whole(); });
}

int64_t PartMap::read(const CheckpointParam& want, int tensor, int64_t lo, int64_t hi,
                      float* dst) const {
  const auto found = parts_.find(want.name);
  if (found == parts_.end() || lo >= hi) return 0;
  const size_t dims = want.shape.size();
  const std::vector<int64_t> wstride = strides_of(want.shape);
  int64_t got = 0;
  for (const Part& part : found->second) {
    const CheckpointParam& s = *part.param;
    const Source& src = sources_[part.source];
    if (s.shape.size() != dims) continue;  // global shapes differ: check_compatible says so
    // The intersection of the two blocks, in global indices.
    std::vector<int64_t> a(dims), b(dims);
    bool empty = false;
    for (size_t d = 0; d < dims; ++d) {
      a[d] = std::max(want.offset[d], s.offset[d]);
      b[d] = std::min(want.offset[d] + want.shape[d], s.offset[d] + s.shape[d]);
      empty = empty || a[d] >= b[d];
    }
    if (empty) continue;
    const std::vector<int64_t> sstride = strides_of(s.shape);
    // Runs contiguous in both blocks: dimension k (partly) and every later one, where the
    // intersection spans both blocks whole. A split along dim 0 is one run; along dim 1 of a
    // matrix, one run per row.
    auto full = [&](size_t d) {
      return a[d] == want.offset[d] && b[d] == want.offset[d] + want.shape[d] &&
             a[d] == s.offset[d] && b[d] == s.offset[d] + s.shape[d];
    };
    size_t k = dims == 0 ? 0 : dims - 1;
    while (k > 0 && full(k)) --k;
    int64_t run = dims == 0 ? 1 : b[k] - a[k];
    for (size_t d = k + 1; d < dims; ++d) run *= want.shape[d];
    std::vector<int64_t> idx = a;  // the run's first element, global; dims < k vary
    const auto& pieces = src.map.at(want.name);
    while (true) {
      int64_t wf = 0, sf = 0;
      for (size_t d = 0; d < dims; ++d) {
        wf += (idx[d] - want.offset[d]) * wstride[d];
        sf += (idx[d] - s.offset[d]) * sstride[d];
      }
      if (wf >= hi) break;  // runs come in increasing order
      const int64_t from = std::max(wf, lo), to = std::min(wf + run, hi);
      if (from < to) {
        const int64_t s_from = sf + (from - wf), s_to = sf + (to - wf);
        got += to - from;
        if (dst) {
          // The saved block's own pieces (its data-parallel ranks'), sorted by offset.
          auto it = std::partition_point(pieces.begin(), pieces.end(), [&](const PieceRef& r) {
            return r.entry->param_offset + r.entry->count <= s_from;
          });
          for (; it != pieces.end() && it->entry->param_offset < s_to; ++it) {
            const int64_t eb = it->entry->param_offset;
            const int64_t x = std::max(s_from, eb), y = std::min(s_to, eb + it->entry->count);
            src.readers[it->file].read(*it->entry, tensor, x - eb, y - x,
                                       dst + (from - lo) + (x - s_from));
          }
        }
      }
      // Next run: the odometer over dimensions 0 .. k-1 of the intersection.
      bool more = false;
      for (size_t d = k; d-- > 0;) {
        if (++idx[d] < b[d]) {
          more = true;
          break;
        }
        idx[d] = a[d];
      }
      if (!more) break;
    }
  }
  return got;
}

}  // namespace zero::ckpt
