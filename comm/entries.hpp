// Who entered a collective call, seen through the group's store: the engine's calls that a
// program makes itself (save_checkpoint, load_checkpoint, gather_memory_reports,
// all_reduce_mean) announce themselves here first, so a rank that called one alone (saving on
// rank 0 only, DeepSpeed users' classic mistake) hears within a second or two that a peer went on
// without it, and fails naming that rank and the call, instead of waiting comm_timeout_s inside
// the backend and then naming nothing.
//
// Fast path, every rank entering: one store add on a counter per call name, then a read of it
// until every rank's add is in (the last rank to arrive reads nothing). Only a rank still waiting
// after kPublishAfter writes where it is (which call, which accumulation window) and reads the
// others', to tell a peer that is merely late (keep waiting) from one that cannot come: it went on
// to the next accumulation window (Entries::progress, once per window), its engine was
// destroyed, or it waits in another call. Only the first rank to arrive reads the others'
// positions and leaves what it found for the rest: a slow wait costs the store O(1) requests per
// waiter per poll, not O(N). Every wait ends by comm_timeout_s.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace c10d {
class Store;
}  // namespace c10d

namespace zero::comm {

class Group;
class C10dGroup;

class Entries {
 public:
  // A waiter that has waited this long publishes its position and reads the others'.
  static constexpr std::chrono::milliseconds kPublishAfter{200};
  // How often a waiter reads the call's counter: quickly until kPublishAfter, then slowly (a
  // store request per waiter per poll: at thousands of ranks the store is the bottleneck).
  static constexpr std::chrono::milliseconds kQuickPoll{20};
  static constexpr std::chrono::milliseconds kSlowPoll{100};

  // Over `group`'s store, in a key namespace of its own (one per Entries made over the group:
  // every rank makes them in the same order). Writes this rank's first position, so make it
  // before the first collective that follows (the engine: before its broadcast). A group without
  // a store (size 1, fakes, wrappers) checks nothing.
  explicit Entries(std::shared_ptr<Group> group);
  // Marks this rank gone, so a peer waiting in a call it never enters fails at once.
  ~Entries();
  Entries(const Entries&) = delete;
  Entries& operator=(const Entries&) = delete;

  // Called on entering the collective `call` ("save_checkpoint"): returns once every rank of
  // the group entered its call of that name as often. Throws zero::CommError naming the rank(s)
  // that did not and `call`, with "it is a collective: call it on every rank".
  void enter(const std::string& call);
  // This rank starts accumulation window `window` (1, 2, ...): the engine's first backward of a
  // window, which no rank reaches without the others unless one skipped a call. One store set.
  void progress(int64_t window);

 private:
  struct Position {
    std::string waiting_in;  // "" when not waiting (published on the slow path only)
    int64_t seq = 0;         // which entry of that call
    int64_t window = 0;
    bool gone = false;
  };
  // What the first waiter found of the peers that are not here: `absent`, those that cannot
  // come, with why; `not_here`, those with no word either way (named on timeout).
  struct Verdict {
    std::string absent, not_here;
  };
  void publish();
  Verdict look(const std::string& call, int64_t seq) const;
  void enter_checked(const std::string& call);
  std::string describe_peer(int r) const;

  std::shared_ptr<Group> group_;
  C10dGroup* c10d_ = nullptr;              // group_ as the real group, or null
  c10::intrusive_ptr<c10d::Store> store_;  // null: no checks
  std::string prefix_;
  std::map<std::string, int64_t> entered_;  // per call name: entries so far
  Position me_;
};

}  // namespace zero::comm
