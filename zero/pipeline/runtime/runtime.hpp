// Runs one pipeline stage: its instruction list from zero/pipeline/schedule.hpp (GPipe, 1F1B or
// interleaved 1F1B), with each micro-batch's activations sent to the next stage and their
// gradients back over comm::Group send/recv on the pipeline group (rank s = stage s), as
// DeepSpeed's PipelineEngine executes its PipeSchedule.
//
// Interleaved (RuntimeOptions::virtual_stages v > 1, StageLayers cut for the same v): the stage
// runs its v model chunks, virtual stages s, s + P, ..., as Megatron-LM's
// forward_backward_pipelining_with_interleaving does. Chunk c's output goes to stage s + 1's
// chunk c, and the last stage's chunk c's to stage 0's chunk c + 1 (the ring closes); the
// gradients go back the same way. Every buffer (the received input, the output kept for
// backward, the received gradient) is per chunk and micro-batch; the activation's shape is
// known per chunk.
//
//   StageLayers layers(gpt_layers, PartitionMethod::Parameters, pp->size(), pp->rank());
//   PipelineRuntime rt(std::move(layers), loss_fn, pp, std::move(stage_optimizer), opts);
//   at::Tensor loss = rt.train_batch(micro_inputs, micro_targets);  // on every stage's device
//
// A tied weight's copies (embedding and head on the first and last stage) are kept equal: the
// owner (first holder) trains it with the other holders' gradients added in, and sends them the
// result after each step (see Tie).
//
// Sends are posted without waiting, receives are waited on: a schedule whose receives are
// acyclic then cannot deadlock, whatever the transport does with an unmatched send. Every wait
// is bounded by the group's comm_timeout_s, and its error names this stage, the instruction and
// the peer stage and rank.
//
// Receives are posted early (RuntimeOptions::early_receives): each before the compute of the
// schedule step before the one that needs it (zero/pipeline/runtime/early_recvs.hpp), so the
// message travels while this stage computes and the receive's instruction waits only for what is
// still missing; each step's sends and receives are thus all posted before its first wait.
// Megatron-LM's interleaved schedule does the same with overlap_p2p_comm; its 1F1B batches each
// step's send and receive (batch_isend_irecv) and waits at once. Only a receive whose buffer's
// shape is known is posted early: not the first activation of a chunk (its shape arrives with it),
// nor any under dynamic_shape.
//
// Nothing is kept per micro-batch beyond what the schedule has in flight, so 1F1B holds P - s
// micro-batches on stage s however many the step has (Megatron-LM's schedules do the same):
//  - a send (its Work and buffer) is waited on and dropped at the first receive that shows the
//    neighbour had it (delivered_sends in schedule.hpp); the rest at ReduceGrads. A gloo send's
//    Work holds its tensor until destroyed and reports completion only when waited on, so
//    there is no earlier moment to learn of it;
//  - the stage's output keeps its autograd graph but not its data once sent (Megatron's
//    deallocate_output_tensor): the next stage has it, backward needs only the graph. The
//    storage itself goes with the send's buffer (above), which holds it until delivered;
//  - the received gradient goes after its backward, the received activation once its gradient
//    was sent.
//
// Under NCCL the point-to-point operations of one process group between two ranks run in
// order on one stream, and a send does not finish before its receive started: a send of
// micro-batch 1's activation queued before the receive of micro-batch 0's gradient, while the
// next stage sends that gradient first, would block both streams (1F1B does exactly that).
// So messages to later stages (activations, tied weights) travel on `pp` and messages to
// earlier stages (gradients, tied gradients) on a second group split from it: each group then
// carries one direction between two stages, in the same order on both sides (Megatron batches
// each send with its opposite receive instead, batch_isend_irecv; PyTorch warns that eager-init
// NCCL groups serialise their p2p operations and advises separate groups).
// Interleaved, the last stage's activations to stage 0 travel on the second group and stage 0's
// gradients to the last stage on `pp` (by rank, not by virtual stage): each group still carries
// one direction between two stages, and the schedule sends on each ordered pair of stages in the
// order the other side receives (zero/pipeline/simulate.hpp checks every schedule for it).
//
// Batched (RuntimeOptions::batch_p2p, where both groups coalesce: NCCL): each schedule step's
// sends and receives on a group go as one coalesced batch, as Megatron's batch_isend_irecv
// (zero/pipeline/runtime/p2p_batches.hpp says which go together and why that cannot reorder a
// group's messages). Every message of the run is then batched, on the groups' own
// communicators, and only where p2p_batches.hpp's device model finds the schedule free of
// cycles; otherwise (and always on gloo, which has no point-to-point coalescing) each is posted
// alone, as described above. A batch cannot be taken back once posted, nor is it known to have
// gone out whole when posting it threw: after any failed step of a batched run (the batch that
// threw on one rank, the wait that ran out on its neighbours) every later train_batch and
// sync_tied_weights refuses at once, saying why, on every rank. So does a step that failed on a
// device with operations posted and not known complete (receives posted early or waited on in
// vain, sends not known delivered): they would pair with the next step's messages.
//
// Buffers live on the stage's device (its parameters'): an NCCL group moves CUDA tensors only,
// gloo host tensors only. The activation's shape travels once, before the first activation of the
// first step, as a small tensor on that device, read on the host by the receiving stage (its one
// host read); every later activation must have that shape and dtype, as with DeepSpeed's
// PipelineEngine (its first_output_send) and Megatron's fixed tensor_shape. The sender checks
// each activation against what it announced, on the host, and names both shapes when one
// differs (a receive of the wrong size would hang or read garbage). Activations whose shape
// changes (variable sequence lengths) need RuntimeOptions::dynamic_shape: the shape then travels
// before every micro-batch's activation, one host read each (DeepSpeed's dynamic_shape,
// Megatron's variable_seq_lengths).
//
// Nothing else in a step reads the device on the host: train_batch returns the loss as a tensor
// on the stage's device (DeepSpeed's train_batch does the same), to be read when it is printed.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zero/pipeline/runtime/layers.hpp"
#include "zero/pipeline/runtime/stage_optimizer.hpp"
#include "zero/pipeline/schedule.hpp"

namespace zero::comm {
class Group;
class Work;
}  // namespace zero::comm

namespace zero::pipeline {

class P2PQueue;

struct RuntimeOptions {
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int micro_batches = 1;  // gradient_accumulation_steps, as in DeepSpeed's pipeline engine
  // The activation's shape sent before every micro-batch (one host read each on the receiving
  // stage) instead of once.
  bool dynamic_shape = false;
  // Model chunks per stage (Megatron's virtual pipeline size): more than 1 needs the
  // interleaved schedule, P > 1 and micro_batches a multiple of P.
  int virtual_stages = 1;
  // Every stage's list, in place of make_schedule(schedule, ...) (DeepSpeed lets a PipeSchedule
  // subclass do the same): its stages, micro-batches and virtual stages must be the run's, and
  // zero/pipeline/simulate.hpp must find it executable. Tests reorder a built-in schedule so.
  std::shared_ptr<const Schedule> custom_schedule;
  // Post each receive before the compute of the step before it (above); false: at its own
  // instruction, waited on at once (what the runtime did before; for measuring the difference).
  bool early_receives = true;
  // Post each schedule step's sends and receives on a group as one coalesced batch where the
  // groups coalesce (NCCL) and p2p_batches.hpp finds it safe; false: one by one (gloo always).
  bool batch_p2p = true;
  // DeepSpeed's pipeline.pipe_partitioned / grad_partitioned: where every rank of
  // `partition_group` (the stage's tensor-parallel group) holds the same activation (tensor
  // parallelism without sequence parallelism: the blocks end in an all-reduce), each sends the
  // next stage's rank of the same tensor-parallel index only its 1/T part (flattened, the last
  // part zero-padded), and the receiving stage all-gathers the parts over its own group: the
  // pipeline carries 1/T of the bytes per rank, the all-gather runs inside the stage (NVLink on
  // a node). partition_grads does the same for the gradient sent back (the gradient of a
  // replicated input is replicated: its tensor-parallel region all-reduced it). The first
  // activation and gradient of each chunk are checked to be the same on every rank of the group
  // (a checksum all-gathered, one host read), refused naming the key where they differ.
  std::shared_ptr<comm::Group> partition_group;
  bool partition_activations = false;
  bool partition_grads = false;
};

class PipelineRuntime {
 public:
  // pp: the pipeline group, pp->size() == layers.stages() and pp->rank() == layers.stage().
  // dp (optional): this stage's data-parallel group; the reported loss is averaged over it (the
  // gradients are the optimizer's business). Collective over pp: tied weights get their groups.
  PipelineRuntime(StageLayers layers, LossFn loss, std::shared_ptr<comm::Group> pp,
                  std::unique_ptr<StageOptimizer> optimizer, RuntimeOptions opts,
                  std::shared_ptr<comm::Group> dp = nullptr);
  ~PipelineRuntime();

  // One optimizer step over opts.micro_batches micro-batches: `inputs` is read on the first
  // stage, `targets` on the last (other stages may pass empty lists). Each micro-batch's loss is
  // divided by their number, so the gradients are those of the mean loss over the whole batch.
  // Returns that mean loss (averaged over data-parallel replicas too) on every stage, as a
  // one-element fp32 tensor on device(), not read on the host (a GPU run reads it when printing).
  at::Tensor train_batch(const std::vector<at::Tensor>& inputs,
                         const std::vector<at::Tensor>& targets);

  // Sends the tied weights' owners' values to the copies again (every stage calls it): after the
  // owner's weight changed outside a step, e.g. loaded from a checkpoint.
  void sync_tied_weights();

  const StageLayers& layers() const { return layers_; }
  StageOptimizer& optimizer() { return *optimizer_; }
  const std::vector<Instruction>& instructions() const { return instructions_; }
  // Where this stage's received activations, gradients and the loss live.
  c10::Device device() const { return device_; }
  // The last train_batch's time by kind of instruction (include/zero/pipeline.hpp).
  const StepTimes& last_times() const { return times_; }
  // Whether this run's point-to-point operations go in coalesced batches (batch_p2p above).
  bool batches_p2p() const;

 private:
  // A weight tied across stages (DeepSpeed's TiedLayerSpec). The first stage holding it owns it:
  // only its optimizer (engine) trains it, so the optimizer state and the gradient norm see it
  // once. The other holders keep a copy: they send its gradient, summed over their
  // micro-batches, to the owner after their last backward, where the owner's link takes it
  // (zero/pipeline/tied_grads.hpp: derived from the schedule, refused when nothing fits); the
  // owner adds them in its own last backward (the weight as one more root), and sends the
  // updated weight back after the step.
  struct Tie {
    std::string key;
    int owner = 0;                    // the first stage holding it
    std::vector<int> others;          // the later stages holding a copy
    std::vector<at::Tensor> weights;  // this stage's copies (once each)
    int send_after = -1;  // a copy's gradient is posted after this instruction (tied_grads.hpp)
  };
  struct Pending;
  struct Posted;

  std::string where(const std::string& what) const;
  // train_batch's instructions and the loss (train_step.cpp), once the step was found runnable.
  at::Tensor run_instructions(const std::vector<at::Tensor>& inputs,
                              const std::vector<at::Tensor>& targets);
  // After `during` threw: sets broken_ where the pipeline's channels may no longer pair up (a
  // batched run, or operations left posted on a device).
  void note_failure(const std::string& during);
  at::Tensor recv_activation(int mb, int chunk);
  // The receives early_receives() places before instruction `idx` whose buffers' shapes are
  // known, posted now (kept in posted_ until their instruction).
  void post_early(size_t idx);
  // Instruction `idx`'s receive, if it was posted early: waited on, its buffer; else undefined.
  at::Tensor take_posted(size_t idx);
  std::string recv_activation_what(int mb, int chunk) const;
  // pipe_partitioned / grad_partitioned (RuntimeOptions): whether they apply, this rank's part
  // of a tensor to send, the buffer a received part (or the whole tensor) lands in, and the
  // whole tensor from a received part (all-gathered over the partition group).
  bool split_activations() const;
  bool split_grads() const;
  at::Tensor part_of(const at::Tensor& whole) const;
  at::Tensor wire_buffer(c10::IntArrayRef sizes, c10::ScalarType dtype, bool split) const;
  at::Tensor whole_of(const at::Tensor& received, c10::IntArrayRef sizes, bool split,
                      const std::string& what);
  // Throws, on every rank of the partition group alike, where `t` differs between them.
  void check_replicated(const at::Tensor& t, const std::string& what, const char* key);
  std::string recv_grad_what(int mb, int chunk) const;
  void send_activation(int mb, int chunk, const at::Tensor& y);
  // The stages before and after this one on the ring of virtual stages.
  int prev_stage() const { return (stage_ + stages_ - 1) % stages_; }
  int next_stage() const { return (stage_ + 1) % stages_; }
  // `ins`: the schedule's send this belongs to (settle finds it by it); none for tied weights.
  void post_send(at::Tensor t, int dst, const std::string& what,
                 std::optional<Instruction> ins = std::nullopt);
  void recv(at::Tensor& t, int src, const std::string& what);
  // Posts a send or receive into *out now (unbatched), or queues it for flush() (batched).
  void issue(comm::Group& g, bool send, const at::Tensor& t, int peer, const std::string& what,
             comm::Work* out);
  // Posts what is queued, one batch per group, before anything waits or computes.
  void flush();
  // Whether p2p_batches.hpp's model finds batching this schedule safe.
  bool batching_safe(const Schedule& all) const;
  // The group that carries a message from stage `from` to stage `to` (see above).
  comm::Group& channel(int from, int to) const;
  void connect_pairs();
  void send_tied_grads(int idx);
  std::vector<at::Tensor> recv_tied_grads();
  void exchange_tied_weights();
  // Waits on and drops the posted sends (schedule_only: those of the schedule's instructions,
  // not the tied weights' and their gradients').
  void wait_sends(bool schedule_only = false);
  // Waits on and drops the posted sends of these instructions (delivered, see above).
  void settle(const std::vector<Instruction>& sent);

  StageLayers layers_;
  LossFn loss_;
  std::shared_ptr<comm::Group> pp_, dp_;
  std::shared_ptr<comm::Group> down_;  // messages to earlier stages; split from pp_
  std::unique_ptr<StageOptimizer> optimizer_;
  RuntimeOptions opts_;
  int stage_, stages_;
  std::vector<Instruction> instructions_;
  std::vector<Tie> ties_;
  int last_backward_ = -1;  // index in instructions_ of this stage's last Backward
  std::vector<std::unique_ptr<Pending>> sends_;  // posted, not yet known delivered
  // delivered_sends(...) of this stage's list: the sends to settle after each receive.
  std::vector<std::vector<Instruction>> delivered_;
  // early_receives(...) of this stage's list, and the receives posted ahead of their instruction.
  std::vector<std::vector<int>> early_;
  std::map<size_t, std::unique_ptr<Posted>> posted_;
  size_t failed_recvs_ = 0;          // this step's receives waited on at once whose wait threw
  size_t issued_ = 0;  // this step's point-to-point operations posted (sends and receives)
  std::unique_ptr<P2PQueue> queue_;  // how sends and receives are posted (p2p_queue.hpp)
  // Set when a step failed in a batched run (review 2026-12-07b L1, L2) or with operations
  // posted on a device's pair communicators (review 2026-12-07a L5): why no step may run any more.
  std::string broken_;
  // Per chunk, the activation's shape and dtype: received from the previous stage (known once
  // known), and sent to the next one (once known).
  struct Shape {
    std::vector<int64_t> sizes;
    c10::ScalarType dtype = c10::ScalarType::Float;
    bool known = false;
  };
  std::vector<Shape> recv_shape_, sent_shape_;
  std::vector<bool> grad_checked_;  // per chunk: its sent gradient checked replicated
  int64_t steps_ = 0;  // train_batch calls begun (for the error naming the step)
  c10::Device device_{c10::kCPU};  // the stage's: every buffer sent or received lives there
  StepTimes times_;
};

}  // namespace zero::pipeline
