#include "comm/entries.hpp"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <sstream>
#include <thread>
#include <vector>

#include "comm/c10d_group.hpp"
#include "zero/errors.hpp"

namespace zero::comm {

namespace {

using Clock = std::chrono::steady_clock;

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// "<window> <gone> <seq> <waiting_in>"; the call name last, as it may hold anything.
std::string encode(int64_t window, bool gone, int64_t seq, const std::string& waiting_in) {
  return std::to_string(window) + " " + (gone ? "1" : "0") + " " + std::to_string(seq) + " " +
         waiting_in;
}

struct Parsed {
  int64_t window = 0, seq = 0;
  bool gone = false;
  std::string waiting_in;
};

Parsed decode(const std::vector<uint8_t>& b) {
  const std::string s(b.begin(), b.end());
  std::istringstream in(s);
  Parsed p;
  int gone = 0;
  in >> p.window >> gone >> p.seq;
  p.gone = gone != 0;
  std::getline(in, p.waiting_in);
  if (!p.waiting_in.empty() && p.waiting_in.front() == ' ') p.waiting_in.erase(0, 1);
  return p;
}

}  // namespace

Entries::Entries(std::shared_ptr<Group> group) : group_(std::move(group)) {
  if (!group_ || group_->size() < 2) return;
  c10d_ = dynamic_cast<C10dGroup*>(group_.get());
  if (!c10d_ || !c10d_->store()) return;
  store_ = c10d_->store();
  prefix_ = "zero-entries/" + std::to_string(c10d_->next_instance()) + "/";
  publish();
}

Entries::~Entries() {
  if (!store_) return;
  me_.gone = true;  // waiting_in stays: the call it failed in, if it failed in one
  try {
    publish();
  } catch (...) {
    // The store is gone with the run: nobody is left to tell.
  }
}

void Entries::publish() {
  store_->set(prefix_ + "pos/" + std::to_string(group_->rank()),
              bytes(encode(me_.window, me_.gone, me_.seq, me_.waiting_in)));
}

void Entries::progress(int64_t window) {
  if (!store_ || window == me_.window) return;
  me_.window = window;
  try {
    publish();
  } catch (const c10::Error&) {
    store_.reset();  // see enter()
  }
}

std::string Entries::describe_peer(int r) const {
  if (group_->name() == "world") return "rank " + std::to_string(r);
  return "rank " + std::to_string(r) + " of group " + group_->name() + " (global rank " +
         std::to_string(group_->global_rank(r)) + ")";
}

void Entries::enter(const std::string& call) {
  if (!store_) return;
  try {
    enter_checked(call);
  } catch (const c10::Error&) {
    // The store stopped answering: under torchrun it lives in the launcher, which may have died
    // (the ranks then agree to stop and save, which must still work). The check is a courtesy:
    // the collective that follows has its own timeout and names a dead rank, so go on unchecked.
    store_.reset();
  }
}

void Entries::enter_checked(const std::string& call) {
  const int64_t seq = ++entered_[call];
  const int me = group_->rank(), size = group_->size();
  const int64_t want = seq * size;
  const std::string key = prefix_ + "enter/" + call;
  const int64_t arrived = store_->add(key, 1);
  if (arrived >= want) return;  // the last to arrive waits for nobody
  // Reading every peer's position is a look at N keys: done by every waiter it would cost the
  // store O(N^2) per look at thousands of ranks. The first to arrive looks for all of them and
  // leaves what it found under a key of this call; the others read that key.
  const bool looker = arrived == want - size + 1;
  const std::string verdict_key = key + "/" + std::to_string(seq) + "/verdict";

  const auto start = Clock::now();
  const auto timeout = group_->options().timeout;
  auto pause = std::chrono::microseconds(20);
  bool published = false;
  auto last_look = start;
  for (;;) {
    std::this_thread::sleep_for(pause);
    // Quick at first (most waits are short); a wait past kPublishAfter polls at kSlowPoll.
    pause = std::min<std::chrono::microseconds>(pause * 2, published ? kSlowPoll : kQuickPoll);
    if (store_->add(key, 0) >= want) break;
    const auto now = Clock::now();
    if (!published && now - start >= kPublishAfter) {
      // Late peers are normal (one rank logging, evaluating); only now say where this rank is.
      me_.waiting_in = call;
      me_.seq = seq;
      publish();
      published = true;
      last_look = now;
      continue;
    }
    const bool timed_out = now - start >= timeout;
    if (!published || (!timed_out && now - last_look < kPublishAfter)) continue;
    last_look = now;
    // A peer killed before it could say anything: the heartbeat knows (real launches).
    const std::string gone = c10d_->gone_peers();
    if (!gone.empty())
      throw CommError("zero: rank " + std::to_string(me) + " of " + std::to_string(size) +
                      (group_->name() == "world" ? "" : " in group " + group_->name()) + ": " +
                      call + " failed: " + gone);
    Verdict v;
    if (looker || timed_out) {
      v = look(call, seq);
      if (looker && !v.absent.empty()) store_->set(verdict_key, bytes(v.absent));
    } else if (store_->check({verdict_key})) {
      const auto b = store_->get(verdict_key);
      v.absent.assign(b.begin(), b.end());
    }
    if (v.absent.empty() && !timed_out) continue;
    std::string text = "zero: " + describe_peer(me) + " waits in " + call + ", but ";
    if (v.absent.empty()) {
      text += v.not_here + " did not call " + call + " within comm_timeout_s = " +
              std::to_string(std::chrono::duration_cast<std::chrono::seconds>(timeout).count()) +
              " s";
    } else {
      text += v.absent;
    }
    // This rank's position keeps the call it failed in: a peer stuck in another call names it.
    throw CommError(text + ". " + call +
                    " is a collective: call it on every rank (not inside `if rank == 0`)");
  }
  if (published) {
    me_.waiting_in.clear();
    publish();
  }
}

// Who cannot come: a peer that went on to its next accumulation window, whose engine is gone,
// or that waits in another call (each a call the program skipped on some rank).
Entries::Verdict Entries::look(const std::string& call, int64_t seq) const {
  const int me = group_->rank(), size = group_->size();
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r)
    if (r != me) keys.push_back(prefix_ + "pos/" + std::to_string(r));
  const auto values = store_->multiGet(keys);
  Verdict v;
  for (size_t i = 0; i < keys.size(); ++i) {
    const int r = static_cast<int>(i) < me ? static_cast<int>(i) : static_cast<int>(i) + 1;
    const Parsed p = decode(values[i]);
    if (p.waiting_in == call && p.seq == seq) continue;  // here, waiting too
    const std::string who = describe_peer(r);
    // A record of a wait that has completed since (the peer has not cleared it yet) says
    // nothing: that call's counter tells.
    const bool elsewhere = !p.waiting_in.empty() && (p.waiting_in != call || p.seq != seq) &&
                           store_->add(prefix_ + "enter/" + p.waiting_in, 0) < p.seq * size;
    std::string why;
    if (elsewhere) {
      // Waiting there now, or failed there (a rank keeps the call it failed in).
      why =
          who + " did not call " + call + " (it called " + p.waiting_in +
          (p.waiting_in == call ? " for the " + std::to_string(p.seq) + "th time" : std::string()) +
          " instead)";
    } else if (p.gone) {
      why = who + " did not call " + call + " (its engine was destroyed: it ended " +
            "or went on without it)";
    } else if (p.window > me_.window) {
      why = who + " did not call " + call + " (it went on to training: its " +
            "accumulation window " + std::to_string(p.window) + ", " + describe_peer(me) + "'s " +
            std::to_string(me_.window) + ")";
    } else {
      v.not_here += (v.not_here.empty() ? "" : ", ") + who;  // no word either way
      continue;
    }
    v.absent += (v.absent.empty() ? "" : "; ") + why;
  }
  return v;
}

}  // namespace zero::comm
