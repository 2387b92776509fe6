#include "services/compute/instances.hpp"

#include "core/metrics.hpp"

#include <spdlog/spdlog.h>

namespace toyvm::compute {

Instances::Instances(AgentContext& ctx, InstanceRecorder& recorder, Builder& builder, HostPresence& presence,
                     Mover& mover)
    : ctx_(ctx),
      steps_{ctx, recorder, builder, presence, mover, [this](const std::string& uuid) { table_.erase(uuid); }} {}

Instance& Instances::instance(const std::string& uuid, bool fresh) {
  auto [found, created] = table_.try_emplace(uuid);
  if (created) found->second = std::make_shared<Instance>(steps_, uuid, fresh);
  return *found->second;
}

std::shared_ptr<Instance> Instances::find(const std::string& uuid) const {
  auto found = table_.find(uuid);
  return found == table_.end() ? nullptr : found->second;
}

std::set<std::string> Instances::images_wanted() const {
  std::set<std::string> images;
  for (const auto& [uuid, instance] : table_)
    if (const WorkSpec* work = instance->work()) images.insert(work->image);
  return images;
}

std::optional<std::string> Instances::apply(const WatchEvent& event, bool listed, const DomainStates* domains) {
  auto key = ctx_.keys.parse_work(event.kv.key);
  if (!key || key->host != ctx_.host.provider) {
    spdlog::warn("ignoring key {} under the work prefix", event.kv.key);
    return std::nullopt;
  }
  // Work first seen in a watch event was made after the listing: nothing recorded before it.
  news::WorkPut put{event.kv.mod_revision, event.kv.value, std::nullopt};
  if (domains) {
    auto domain = domains->find(key->instance);
    put.domain = domain == domains->end() ? DomainState::absent : domain->second;
  }
  News news = std::move(put);
  if (event.type == WatchEvent::Type::erase) news = news::WorkGone{event.kv.mod_revision};
  instance(key->instance, !listed).tell(std::move(news));
  return key->instance;
}

awaitable<void> Instances::apply_listing(RangeResult listed) {
  // libvirt's domains first: an instance whose domain is as it should be takes no step.
  auto domains = co_await ctx_.virt(&VirtBackend::list);
  std::set<std::string> seen;
  for (const KeyValue& kv : listed.kvs) {
    WatchEvent event{WatchEvent::Type::put, kv, std::nullopt};
    if (auto uuid = apply(event, true, domains ? &*domains : nullptr)) seen.insert(*uuid);
  }
  // Work that vanished while we were not watching (and did not appear after the listing).
  std::vector<std::shared_ptr<Instance>> vanished;
  for (const auto& [uuid, instance] : table_)
    if (!seen.count(uuid)) vanished.push_back(instance);
  for (const auto& instance : vanished) instance->tell(news::WorkGone{listed.revision});
  // Domains nobody asked for.
  if (!domains) co_return;  // libvirt did not answer: the next resync looks again
  for (const auto& [uuid, state] : *domains)
    if (!seen.count(uuid) && !table_.count(uuid)) instance(uuid, false).tell(news::DomainChanged{});
  steps_.presence.publish(*domains);
  metrics::count("toyvm_work_listings_total");
}

void Instances::apply_move(const WatchEvent& event) {
  auto uuid = ctx_.keys.leaf(event.kv.key, ctx_.keys.moves_prefix());
  if (!uuid) return;
  if (event.type == WatchEvent::Type::erase) {
    if (auto found = find(*uuid)) found->tell(news::MoveGone{event.kv.mod_revision});
    return;
  }
  auto move = decode_move(event.kv.value);
  if (!move) {
    // Whose it is cannot be told; an instance of ours does nothing until it can be read.
    if (auto found = find(*uuid)) found->tell(news::MovePut{event.kv.mod_revision, std::nullopt});
    return;
  }
  const std::string& me = ctx_.host.provider;
  if (move->instance != *uuid || (move->source != me && move->destination != me)) return;
  instance(*uuid, false).tell(news::MovePut{event.kv.mod_revision, std::move(*move)});
}

awaitable<void> Instances::apply_move_listing(RangeResult listed) {
  std::set<std::string> seen;
  for (const KeyValue& kv : listed.kvs) {
    apply_move(WatchEvent{WatchEvent::Type::put, kv, std::nullopt});
    if (auto uuid = ctx_.keys.leaf(kv.key, ctx_.keys.moves_prefix())) seen.insert(*uuid);
  }
  // Each instance knows whether it was moving; one that was not hears nothing new.
  std::vector<std::shared_ptr<Instance>> unlisted;
  for (const auto& [uuid, instance] : table_)
    if (!seen.count(uuid)) unlisted.push_back(instance);
  for (const auto& instance : unlisted) instance->tell(news::MoveGone{listed.revision});
  co_return;
}

void Instances::observe(const std::string& uuid, bool started) {
  // What this host publishes follows its libvirt as the events come: a destination's copy
  // that libvirt dropped with an aborted send has no instance here any more to say so.
  steps_.presence.publish(uuid);
  if (auto found = find(uuid)) found->tell(news::DomainChanged{started});  // others are the resync's business
}

size_t Instances::holding_work() const {
  size_t n = 0;
  for (const auto& [uuid, instance] : table_)
    if (instance->holds_work()) ++n;
  return n;
}

}  // namespace toyvm::compute
