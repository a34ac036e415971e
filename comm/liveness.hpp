// Which ranks are still there, seen through the rendezvous store.
//
// Gloo reports a failed collective with the peer's address:port at best. To name the rank that is
// gone, every rank bumps a heartbeat key in the store from a thread of its own (on a store
// connection of its own, so a long store wait elsewhere never delays it) and reads everyone
// else's. A rank whose heartbeat stopped, and that did not report a failure of its own, is the
// one that died or stalled; when the store itself stops answering, whoever serves it is gone.
// The thread also notices when this process's launcher exits (the parent, or torchrun's agent
// further up).
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <memory>
#include <string>

namespace c10d {
class Store;
}

namespace zero::comm {

class Liveness {
 public:
  // `store` is this rank's own connection (not shared with the process group); `store_owner`
  // names who serves it in messages ("rank 0", "the launcher's agent").
  Liveness(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::string store_owner);
  ~Liveness();
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // Publishes this rank's first heartbeat: it doubles as the rank's arrival key.
  void announce();
  // Whether `peer` has announced itself (one store round trip).
  bool arrived(int peer);
  // From now on peers are watched (every rank has announced itself).
  void watch_peers();

  // Called on a failure this rank saw: tells the peers (so they do not blame this rank) and
  // waits up to `max_wait` for the heartbeats to show who is gone. Returns a sentence such as
  // "rank 2 is gone (no heartbeat for 3.1 s: killed, crashed or stopped)", or "" when nothing
  // could be learned.
  std::string diagnose(std::chrono::milliseconds max_wait);
  // The same sentence about the peers gone now, at once and without reporting a failure of this
  // rank's own: "" while every peer's heartbeat is fresh (or peers are not watched yet).
  std::string gone_now();

  struct State;

 private:
  std::shared_ptr<State> state_;
  int rank_;
  int size_;
};

// The launcher as it was when the first group was set up, and whether it has exited since.
// The launcher is the parent process, or under torchrun the elastic agent however deep it sits
// (a wrapper script between it and this rank: find_launcher). Cheap (one getppid(), and one
// read of /proc/<pid>/stat when the launcher is not the parent); false until
// remember_launcher() was called (a multi-rank group does at its start).
void remember_launcher();
bool launcher_gone();
int launcher_pid();
// The process remember_launcher() records: the nearest ancestor that did not start with this
// process's TORCHELASTIC_RUN_ID (torchrun's agent), else the parent.
int find_launcher();

}  // namespace zero::comm
