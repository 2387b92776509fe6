#pragma once
// The steps of moving a guest between two hosts (or resizing it on its own) once its asker has
// moved the books and claimed the destination (Placer::relocate), each inputs in and outcome
// out: the destination's files made, the guest sent while it runs or its disk copied while it
// is off, its work and record switched over to the destination, and the move settled or
// unwound. Both agents run them (the source and the destination of one move); the instance
// strings them together (instance_moves.cpp). Every write of the move record is guarded by the
// revision read, so of two agents (or an agent and a restart of itself) one wins and the other
// reads what it did.

#include "model/moves.hpp"
#include "services/compute/builder.hpp"
#include "services/compute/context.hpp"
#include "services/placer.hpp"

#include <optional>
#include <string>

namespace toyvm::compute {

class Mover {
 public:
  Mover(AgentContext& ctx, Builder& builder, Placer& placer) : ctx_(ctx), builder_(builder), placer_(placer) {}

  // `next` over the record as read at `revision`: its revision once made; nothing when the
  // record changed meanwhile (the watch brings what it is now).
  awaitable<result<std::optional<int64_t>>> write(MoveRecord next, int64_t revision);
  // Gone, while it is as read, with `also` in the same transaction; false when it changed.
  awaitable<result<bool>> erase(const MoveRecord& move, int64_t revision, std::vector<EtcdOp> also = {});

  // Destination: the instance's files made here (its image fetched if need be) from its work
  // and record as etcd has them; `move` filled in with how to reach this host and the guest.
  awaitable<result<MoveRecord>> prepare(MoveRecord move);
  // Source: the guest sent to the destination while it runs, aborted when not done in time.
  awaitable<result<MigrationStats>> send(const MoveRecord& move, std::chrono::milliseconds completion_timeout);
  // Source, cold: the disk of the guest, off, copied into the one the destination prepared.
  awaitable<result<void>> copy(const MoveRecord& move);
  // Destination, cold: the copied disk made this host's and the guest defined here, off.
  awaitable<result<void>> receive(const MoveRecord& move);
  // A resize on its own host: the guest, off, given its new size.
  awaitable<result<void>> resize_here(const MoveRecord& move);
  // Either: the instance's work and record (its address kept, its host the destination) move
  // to the destination with the record saying switched, in one transaction guarded by the
  // source's work and the move as read, `also` with them. The revision of that write; nothing
  // when refused.
  awaitable<result<std::optional<int64_t>>> switch_over(MoveRecord move, int64_t revision,
                                                        std::vector<EtcdOp> also = {});
  // Source, after the switch: the migration consumer's share given back.
  awaitable<result<void>> settle(const MoveRecord& move);
  // Source, when the move does not happen: the books swapped back.
  awaitable<result<void>> unwind(const MoveRecord& move);

 private:
  // Its work as the move leaves it: read at the source, resized as the move says.
  awaitable<result<WorkSpec>> moving_work(const MoveRecord& move);
  // The guest as this host defines it: from that work (read when not given) and its record's
  // address.
  awaitable<result<DomainSpec>> incoming_spec(const MoveRecord& move, std::optional<WorkSpec> work = std::nullopt);
  // `ops` in one transaction, only while the move record of `instance` is as read at `revision`.
  awaitable<result<std::optional<int64_t>>> guarded(const std::string& instance, int64_t revision,
                                                    std::vector<EtcdOp> ops);

  AgentContext& ctx_;
  Builder& builder_;
  Placer& placer_;
};

}  // namespace toyvm::compute
