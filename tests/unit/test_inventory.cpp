#include "model/inventory.hpp"

#include "catch_result.hpp"

using namespace toyvm;

TEST_CASE("inventory from the host applies reserved amounts and allocation ratios") {
  HostFacts facts{8, 16384, 100};
  InventoryPolicy policy;  // Nova's defaults
  Inventory inv = inventory_from_host(facts, policy);
  REQUIRE(inv.size() == 3);
  CHECK(inv["VCPU"].total == 8);
  CHECK(inv["VCPU"].allocation_ratio == 4.0);
  CHECK(inv["VCPU"].capacity() == 32);
  CHECK(inv["MEMORY_MB"].reserved == 512);
  CHECK(inv["MEMORY_MB"].capacity() == 16384 - 512);
  CHECK(inv["DISK_GB"].capacity() == 100);
  CHECK(inv["DISK_GB"].max_unit == 100);
}

TEST_CASE("reserved never exceeds total, so Placement accepts the inventory") {
  HostFacts facts{2, 256, 1};
  InventoryPolicy policy;
  policy.reserved_memory_mb = 1024;
  policy.reserved_vcpu = 4;
  Inventory inv = inventory_from_host(facts, policy);
  CHECK(inv["MEMORY_MB"].reserved == 256);
  CHECK(inv["MEMORY_MB"].capacity() == 0);
  CHECK(inv["VCPU"].reserved == 2);
}

TEST_CASE("an explicit inventory is taken as given") {
  Inventory inv = inventory_from_amounts({{"VCPU", 4}, {"DISK_GB", 10}, {"MEMORY_MB", 512}});
  CHECK(capacity_of(inv) == ResourceAmounts{{"VCPU", 4}, {"DISK_GB", 10}, {"MEMORY_MB", 512}});
  CHECK(inv["VCPU"].reserved == 0);
  CHECK(inv["VCPU"].allocation_ratio == 1.0);
}

TEST_CASE("measuring this host finds CPUs, memory and disk") {
  auto facts = measure_host("/");
  REQUIRE(facts);
  CHECK(facts->cpus >= 1);
  CHECK(facts->memory_mb > 0);
  CHECK(facts->disk_gb >= 0);
  CHECK_FALSE(measure_host("/no/such/dir"));
}
