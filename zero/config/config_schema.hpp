// Machinery behind Config::from_string: walking a YAML tree against a table of known keys,
// typed readers, and messages that point at the file position (or the --set override) that
// a value came from. The key table itself lives in config.cpp.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zero/config.hpp"

namespace zero::config_detail {

// Strict scalar parsing, shared with Config::extra_*. Integers also accept a float that is an
// exact integer ("5e8"), because DeepSpeed JSON configs routinely write bucket sizes so.
std::optional<int64_t> parse_int(std::string_view s);
std::optional<uint64_t> parse_uint(std::string_view s);
std::optional<double> parse_float(std::string_view s);  // finite values only
std::optional<bool> parse_bool(std::string_view s);     // YAML 1.1 spellings, any case

std::string lower(std::string_view s);
size_t edit_distance(std::string_view a, std::string_view b);  // case-insensitive
// The candidate closest to `key` when it is close enough to be a plausible typo, else "".
std::string nearest(const std::string& key, const std::vector<std::string>& candidates);

class Loader {
 public:
  struct Entry {
    std::string path;  // dotted, "zero_optimization.stage"; "" for the document root
    YAML::Node key;    // positions "unknown key" style messages
    YAML::Node value;  // positions "bad value" style messages
  };
  using Handler = std::function<void(const Entry&)>;
  struct Field {
    std::string name;  // a trailing '*' matches any suffix ("stage3_*")
    Handler handle;
    // Unlisted fields (unsupported DeepSpeed keys, keys accepted only at their neutral value)
    // are recognised but neither suggested for typos nor offered under "Allowed here".
    bool listed = true;
  };

  Loader(std::string source, std::vector<std::string>* warnings)
      : source_(std::move(source)), warnings_(warnings) {}

  // Applies one "dotted.key=value" override to `root` so that it is validated like file keys,
  // and remembers it so that messages about that key point at the override.
  void apply_override(YAML::Node& root, const std::string& text);

  // What an unknown key of a section is. DeepSpeed reads some sections key by key and ignores
  // what it does not know (the top level, activation_checkpointing, data_types, the outer level
  // of optimizer and scheduler): there such a key is kIgnore, collected and named in one
  // warning, unless it is a near miss of a known key (a typo would silently change training).
  // Sections DeepSpeed validates strictly (pydantic models with extra=forbid: zero_optimization,
  // fp16, bf16, ...; optimizer/scheduler params, which become constructor arguments) are kError.
  enum class Unknown { kError, kIgnore };

  // Calls the handler of every key of the section `s` (a map; null counts as empty). Duplicate
  // keys are errors; unknown ones as `unknown` says. An error a key's handler throws is
  // collected and the walk goes on with the next key, so that one error names every problem.
  void walk(const Entry& s, const std::vector<Field>& fields, Unknown unknown = Unknown::kError);

  // Collects an error for the single ConfigError finish() throws.
  void add_error(const std::string& msg) { errors_.push_back(msg); }
  // Errors collected so far: a section skips its cross-key checks when its own keys failed (a
  // check on a value that failed to load would only add a misleading second error).
  size_t error_count() const { return errors_.size(); }
  // Ends the load: adds the one warning that names every ignored key, then throws every
  // collected error as one ConfigError (one line per problem).
  void finish();

  // The entry for `path` if the walk met it: cross-key checks need its position.
  const Entry* seen(const std::string& path) const;

  // "file:3:5", "file:3" or "--set a.b=1".
  std::string where(const std::string& path, const YAML::Node& at, bool column = true) const;
  [[noreturn]] void fail(const Entry& e, const std::string& msg) const;
  [[noreturn]] void fail_at_key(const Entry& e, const std::string& msg) const;
  void warn(const Entry& e, const std::string& msg) const;

  // Typed readers: a mismatch throws "'path' must be an integer, got 'two'".
  int64_t integer(const Entry& e) const;
  uint64_t unsigned_integer(const Entry& e) const;
  double number(const Entry& e) const;
  bool boolean(const Entry& e) const;
  std::string string(const Entry& e) const;
  std::vector<std::string> strings(const Entry& e) const;
  std::vector<double> numbers(const Entry& e) const;
  Dtype dtype(const Entry& e) const;
  // HF's DeepSpeed integration writes "auto" for values its Trainer fills in; without it the
  // nearest meaning is "not set".
  static bool is_auto(const Entry& e);
  static bool is_null(const Entry& e) { return e.value.IsNull(); }

  // Throws "'path' must be <allowed>, got <value>" unless `ok`.
  void require(const Entry& e, bool ok, const std::string& allowed) const;

  // The key policy, in one place. Every DeepSpeed key zero recognises is one of:
  //  - honoured: a handler that applies it (the key table in config.cpp);
  //  - no effect in this setting (for DeepSpeed too): no_effect(), a warning naming the key and
  //    why, unless the value is the neutral one (false, {enabled: false}, "none");
  //  - not honoured by zero: unsupported(), an error naming the key and the fix.
  // A DeepSpeed key zero does not implement: an error, since ignoring it would change training.
  // `fix` says what to do instead; the default asks to remove the key.
  Field unsupported(std::string name, std::string fix = "");
  // A key that has no effect in this setting, `why` says why. Neutral values pass silently.
  Field no_effect(std::string name, std::string why);
  // A DeepSpeed key that only affects its diagnostics: a warning unless it is switched off.
  Field diagnostic(std::string name);
  // "'path' is \"auto\": using <value> (<why>)", once per key, printed by the engine.
  void note_auto(const Entry& e, const std::string& value, const std::string& why) const;
  // False, {enabled: false}, "none", {device: none}: values that ask for nothing.
  static bool is_neutral(const YAML::Node& v);

  const std::string& source() const { return source_; }

 private:
  [[noreturn]] void mismatch(const Entry& e, const std::string& expected) const;

  std::string source_;
  std::vector<std::string>* warnings_;
  std::vector<std::pair<std::string, std::string>> overrides_;  // dotted path, override text
  std::map<std::string, Entry> seen_;
  std::vector<std::string> errors_;
  std::vector<Entry> ignored_;  // unknown keys of lenient sections, in file order
};

// "'3'", "a list", "a map", "nothing": what a value was, for messages.
std::string describe(const YAML::Node& n);

// Reads the whole tree into `c` (the key table, config.cpp).
void load(Loader& l, const YAML::Node& root, const Config::Extension* ext, Config& c);

}  // namespace zero::config_detail
