// What an active domain's libvirt state and reason mean to the model.

#include "virt/libvirt_backend.hpp"

#include <catch2/catch.hpp>

using namespace toyvm;
using toyvm::libvirt_impl::domain_state;

TEST_CASE("a domain paused by a migration, or still starting up as one's destination, is paused", "[virt]") {
  CHECK(domain_state(VIR_DOMAIN_PAUSED, VIR_DOMAIN_PAUSED_MIGRATION) == DomainState::paused);
  CHECK(domain_state(VIR_DOMAIN_PAUSED, VIR_DOMAIN_PAUSED_POSTCOPY_FAILED) == DomainState::paused);
  CHECK(domain_state(VIR_DOMAIN_PAUSED, VIR_DOMAIN_PAUSED_UNKNOWN) == DomainState::paused);
  // An incoming copy that libvirt kills once its source goes away: it never ran, and a
  // destination that took it for a running guest would switch the work to nothing.
  CHECK(domain_state(VIR_DOMAIN_PAUSED, VIR_DOMAIN_PAUSED_STARTING_UP) == DomainState::paused);
}

TEST_CASE("a domain running, or paused by someone else, runs", "[virt]") {
  CHECK(domain_state(VIR_DOMAIN_RUNNING, VIR_DOMAIN_RUNNING_MIGRATED) == DomainState::running);
  CHECK(domain_state(VIR_DOMAIN_BLOCKED, 0) == DomainState::running);
  CHECK(domain_state(VIR_DOMAIN_PAUSED, VIR_DOMAIN_PAUSED_USER) == DomainState::running);
  CHECK(domain_state(VIR_DOMAIN_PAUSED, VIR_DOMAIN_PAUSED_IOERROR) == DomainState::running);
}
