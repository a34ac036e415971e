#include "zero/config/config_schema.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <set>

namespace zero::config_detail {
namespace {

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string child_path(const std::string& parent, const std::string& name) {
  return parent.empty() ? name : parent + "." + name;
}

bool matches(const std::string& pattern, const std::string& name) {
  if (!pattern.empty() && pattern.back() == '*') {
    return name.compare(0, pattern.size() - 1, pattern, 0, pattern.size() - 1) == 0;
  }
  return pattern == name;
}

// Key-level messages point at the key, except for the root, which has none.
const YAML::Node& anchor(const Loader::Entry& e) {
  return e.key.IsDefined() && !e.key.Mark().is_null() ? e.key : e.value;
}

}  // namespace

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::optional<int64_t> parse_int(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc() && p == s.data() + s.size() && !s.empty()) return v;
  const auto d = parse_float(s);
  // 2^63 itself is not representable as int64, hence the strict upper bound.
  if (!d || *d != std::trunc(*d) || *d < -9.2233720368547758e18 || *d >= 9.2233720368547758e18) {
    return std::nullopt;
  }
  return static_cast<int64_t>(*d);
}

std::optional<uint64_t> parse_uint(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc() && p == s.data() + s.size() && !s.empty()) return v;
  const auto i = parse_int(s);
  if (!i || *i < 0) return std::nullopt;
  return static_cast<uint64_t>(*i);
}

std::optional<double> parse_float(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty() || !std::isfinite(v)) {
    return std::nullopt;
  }
  return v;
}

std::optional<bool> parse_bool(std::string_view s) {
  const std::string l = lower(s);
  if (l == "true" || l == "yes" || l == "on") return true;
  if (l == "false" || l == "no" || l == "off") return false;
  return std::nullopt;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  const std::string x = lower(a), y = lower(b);
  std::vector<size_t> row(y.size() + 1);
  for (size_t j = 0; j <= y.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= x.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= y.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (x[i - 1] == y[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[y.size()];
}

std::string nearest(const std::string& key, const std::vector<std::string>& candidates) {
  const size_t limit = std::max<size_t>(2, key.size() / 3);
  std::string best;
  size_t best_d = limit + 1;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(key, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Scalar:
      return "'" + n.Scalar() + "'";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    default:
      return "nothing";
  }
}

void Loader::apply_override(YAML::Node& root, const std::string& text) {
  const auto bad_form = [&](const std::string& why) {
    throw ConfigError("zero: override '" + text + "' " + why +
                      "; the form is KEY=VALUE with a dotted key, e.g. --set "
                      "zero_optimization.stage=2");
  };
  const size_t eq = text.find('=');
  if (eq == std::string::npos) bad_form("has no '='");
  const std::string path = text.substr(0, eq);
  std::vector<std::string> segs;
  for (size_t b = 0;;) {
    const size_t e = path.find('.', b);
    segs.push_back(path.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  for (const auto& s : segs) {
    if (s.empty()) bad_form("has an empty key segment");
  }
  YAML::Node value;
  try {
    value = YAML::Load(text.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw ConfigError("zero: --set " + text + ": the value is not valid YAML: " + e.msg);
  }
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) {
    throw ConfigError("zero: --set " + text + ": " + source_ + " is not a map of keys");
  }
  // yaml-cpp's Node::operator= writes through to the referenced node, so walking down the
  // tree has to rebind with reset() instead.
  YAML::Node cur;
  cur.reset(root);
  std::string done;
  for (size_t i = 0; i + 1 < segs.size(); ++i) {
    done = child_path(done, segs[i]);
    YAML::Node next = cur[segs[i]];
    if (!next.IsMap()) {
      if (next.IsDefined() && !next.IsNull()) {
        throw ConfigError("zero: --set " + text + ": '" + done + "' is " + describe(next) + " in " +
                          source_ + ", not a section");
      }
      next = YAML::Node(YAML::NodeType::Map);
    }
    cur.reset(next);
  }
  cur[segs.back()] = value;
  overrides_.emplace_back(path, text);
}

std::string Loader::where(const std::string& path, const YAML::Node& at, bool column) const {
  const std::pair<std::string, std::string>* best = nullptr;
  for (const auto& o : overrides_) {
    const bool covers = path == o.first || (path.size() > o.first.size() &&
                                            path.compare(0, o.first.size(), o.first) == 0 &&
                                            path[o.first.size()] == '.');
    // Later overrides win over earlier ones for the same key, as they do in the tree.
    if (covers && (!best || o.first.size() >= best->first.size())) best = &o;
  }
  if (best) return "--set " + best->second;
  const YAML::Mark m = at.IsDefined() ? at.Mark() : YAML::Mark::null_mark();
  if (m.is_null()) {
    // Only sections an override created lack a position; blame the override.
    for (const auto& o : overrides_) {
      if (o.first.compare(0, path.size() + 1, path + ".") == 0) return "--set " + o.second;
    }
    return source_;
  }
  std::string s = source_ + ":" + std::to_string(m.line + 1);
  if (column) s += ":" + std::to_string(m.column + 1);
  return s;
}

void Loader::fail(const Entry& e, const std::string& msg) const {
  throw ConfigError("zero: " + where(e.path, e.value) + ": " + msg);
}

void Loader::fail_at_key(const Entry& e, const std::string& msg) const {
  throw ConfigError("zero: " + where(e.path, anchor(e)) + ": " + msg);
}

void Loader::warn(const Entry& e, const std::string& msg) const {
  warnings_->push_back("zero: " + where(e.path, anchor(e), false) + ": " + msg);
}

void Loader::walk(const Entry& s, const std::vector<Field>& fields, Unknown unknown) {
  if (s.value.IsNull()) return;
  if (!s.value.IsMap()) {
    if (s.path.empty()) fail(s, "the config must be a map of keys, got " + describe(s.value));
    fail(s, "'" + s.path + "' must be a section (a map of keys), got " + describe(s.value));
  }
  std::vector<std::string> listed;
  for (const auto& f : fields) {
    if (f.listed) listed.push_back(f.name);
  }
  std::map<std::string, YAML::Node> keys_seen;
  for (auto it = s.value.begin(); it != s.value.end(); ++it) {
    // One key's problem must not hide the next key's: collect, and finish() reports them all.
    try {
      Entry e{"", it->first, it->second};
      if (!it->first.IsScalar()) {
        e.path = s.path;
        fail_at_key(e, "keys must be names, got " + describe(it->first) +
                           (s.path.empty() ? "" : " in '" + s.path + "'"));
      }
      const std::string name = it->first.Scalar();
      e.path = child_path(s.path, name);
      if (auto prev = keys_seen.find(name); prev != keys_seen.end()) {
        fail_at_key(e, "duplicate key '" + e.path + "' (first given at " +
                           where(e.path, prev->second) + ")");
      }
      keys_seen.emplace(name, it->first);
      auto f = std::find_if(fields.begin(), fields.end(),
                            [&](const Field& f) { return matches(f.name, name); });
      if (f == fields.end()) {
        const std::string near = nearest(name, listed);
        if (unknown == Unknown::kIgnore && near.empty()) {
          ignored_.push_back(e);
          continue;
        }
        std::string msg = "unknown key '" + e.path + "'";
        if (!near.empty()) {
          msg += "; did you mean '" + child_path(s.path, near) + "'? ";
        } else {
          msg += "; ";
        }
        fail_at_key(e, msg + "Allowed here: " + join(listed));
      }
      seen_[e.path] = e;
      f->handle(e);
    } catch (const ConfigError& x) {
      errors_.push_back(x.what());
    }
  }
}

void Loader::finish() {
  if (!ignored_.empty()) {
    std::string names;
    for (const auto& e : ignored_) {
      names +=
          (names.empty() ? "'" : ", '") + e.path + "' (" + where(e.path, anchor(e), false) + ")";
    }
    warnings_->push_back("zero: " + source_ + ": ignoring " + names + ": DeepSpeed does not read " +
                         (ignored_.size() > 1 ? "these keys" : "this key") + " either");
  }
  if (errors_.empty()) return;
  if (errors_.size() == 1) throw ConfigError(errors_.front());
  std::string m = "zero: " + std::to_string(errors_.size()) + " problems in " + source_ + ":";
  for (const auto& x : errors_) m += "\n  " + (x.rfind("zero: ", 0) == 0 ? x.substr(6) : x);
  throw ConfigError(m);
}

const Loader::Entry* Loader::seen(const std::string& path) const {
  auto it = seen_.find(path);
  return it == seen_.end() ? nullptr : &it->second;
}

void Loader::mismatch(const Entry& e, const std::string& expected) const {
  fail(e, "'" + e.path + "' must be " + expected + ", got " + describe(e.value));
}

int64_t Loader::integer(const Entry& e) const {
  if (e.value.IsScalar()) {
    if (auto v = parse_int(e.value.Scalar())) return *v;
  }
  mismatch(e, "an integer");
}

uint64_t Loader::unsigned_integer(const Entry& e) const {
  if (e.value.IsScalar()) {
    if (auto v = parse_uint(e.value.Scalar())) return *v;
  }
  mismatch(e, "a non-negative integer");
}

double Loader::number(const Entry& e) const {
  if (e.value.IsScalar()) {
    if (auto v = parse_float(e.value.Scalar())) return *v;
  }
  mismatch(e, "a number");
}

bool Loader::boolean(const Entry& e) const {
  if (e.value.IsScalar()) {
    if (auto v = parse_bool(e.value.Scalar())) return *v;
  }
  mismatch(e, "true or false");
}

std::string Loader::string(const Entry& e) const {
  if (!e.value.IsScalar()) mismatch(e, "a string");
  return e.value.Scalar();
}

std::vector<std::string> Loader::strings(const Entry& e) const {
  if (!e.value.IsSequence()) mismatch(e, "a list of strings");
  std::vector<std::string> out;
  for (const auto& item : e.value) {
    if (!item.IsScalar()) mismatch(e, "a list of strings");
    out.push_back(item.Scalar());
  }
  return out;
}

std::vector<double> Loader::numbers(const Entry& e) const {
  if (!e.value.IsSequence()) mismatch(e, "a list of numbers");
  std::vector<double> out;
  for (const auto& item : e.value) {
    const auto v = item.IsScalar() ? parse_float(item.Scalar()) : std::nullopt;
    if (!v) {
      fail(e, "'" + e.path + "' must be a list of numbers, got " + describe(item) + " in the list");
    }
    out.push_back(*v);
  }
  return out;
}

Dtype Loader::dtype(const Entry& e) const {
  if (e.value.IsScalar()) {
    const std::string s = lower(e.value.Scalar());
    if (s == "fp32" || s == "float32" || s == "float") return Dtype::kFloat32;
    if (s == "bf16" || s == "bfloat16") return Dtype::kBFloat16;
    if (s == "fp16" || s == "float16" || s == "half") return Dtype::kFloat16;
  }
  mismatch(e, "one of fp32, bf16, fp16");
}

bool Loader::is_auto(const Entry& e) {
  return e.value.IsScalar() && lower(e.value.Scalar()) == "auto";
}

void Loader::require(const Entry& e, bool ok, const std::string& allowed) const {
  if (!ok) mismatch(e, allowed);
}

Loader::Field Loader::unsupported(std::string name, std::string fix) {
  return {std::move(name),
          [this, fix = std::move(fix)](const Entry& e) {
            // Switched off (false, {enabled: false}, device none) asks for what zero does.
            if (is_neutral(e.value)) return;
            fail_at_key(e, "'" + e.path + "' is a DeepSpeed option zero does not implement; " +
                               (fix.empty() ? std::string("remove it") : fix));
          },
          false};
}

bool Loader::is_neutral(const YAML::Node& v) {
  if (v.IsNull()) return true;
  if (v.IsScalar()) return parse_bool(v.Scalar()) == false || lower(v.Scalar()) == "none";
  if (!v.IsMap()) return false;
  for (const char* k : {"enabled", "device"}) {
    if (v[k] && v[k].IsScalar() && is_neutral(v[k])) return true;
  }
  return false;
}

Loader::Field Loader::no_effect(std::string name, std::string why) {
  return {std::move(name),
          [this, why = std::move(why)](const Entry& e) {
            if (is_neutral(e.value)) return;
            warn(e, "'" + e.path + "' has no effect here and is ignored: " + why);
          },
          true};
}

Loader::Field Loader::diagnostic(std::string name) {
  return no_effect(std::move(name), "it only affects DeepSpeed's diagnostics");
}

void Loader::note_auto(const Entry& e, const std::string& value, const std::string& why) const {
  warnings_->push_back("zero: " + where(e.path, anchor(e), false) + ": '" + e.path +
                       "' is \"auto\": using " + value + " (" + why + ")");
}

}  // namespace zero::config_detail
