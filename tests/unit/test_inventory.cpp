#include "model/inventory.hpp"

#include "catch_result.hpp"

#include <algorithm>

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

TEST_CASE("CPU flags become Placement's standard traits") {
  std::string cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu mmx sse sse2 pni ssse3 sse4_1 "
                        "sse4_2 avx avx2 fma aes bmi1 sha_ni svm\nbugs\t\t: sysret_ss_attrs\n";
  auto traits = cpu_traits(cpuinfo);
  for (const char* t : {"HW_CPU_X86_SSE2", "HW_CPU_X86_SSE3", "HW_CPU_X86_SSE41", "HW_CPU_X86_AVX2", "HW_CPU_X86_FMA3",
                        "HW_CPU_X86_BMI", "HW_CPU_X86_SHA", "HW_CPU_X86_SVM"}) {
    INFO(t);
    CHECK(std::find(traits.begin(), traits.end(), t) != traits.end());
  }
  CHECK(std::find(traits.begin(), traits.end(), "HW_CPU_X86_AVX512F") == traits.end());
  CHECK(std::find(traits.begin(), traits.end(), "HW_CPU_X86_BMI2") == traits.end());  // bmi1 only
  CHECK(cpu_traits("no flags here").empty());
}
