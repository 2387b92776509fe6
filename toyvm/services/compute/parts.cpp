#include "services/compute/parts.hpp"

#include "virt/libvirt_backend.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <fstream>
#include <iterator>

namespace toyvm::compute {

namespace fs = std::filesystem;

std::string host_name() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

result<HostSetup> set_up_host(const ComputeConfig& c) {
  HostSetup setup;
  auto uuid = load_or_create_provider_uuid(c.state_dir);
  if (!uuid) return uuid.error();
  HostIdentity& host = setup.host;
  host.provider = *uuid;
  host.name = c.name.empty() ? host_name() : c.name;
  std::error_code ec;
  const fs::path state_dir = fs::absolute(c.state_dir, ec);
  host.instance_dir =
      c.instance_dir.empty() ? (state_dir / "instances").string() : fs::absolute(c.instance_dir, ec).string();
  fs::create_directories(host.instance_dir, ec);
  // QEMU runs as its own user on qemu:///system and must reach instance files and images.
  fs::permissions(host.instance_dir, fs::perms(0755), ec);
  if (!c.inventory.empty()) {
    auto amounts = parse_resource_amounts(c.inventory);
    if (!amounts) return amounts.error().doing("invalid --inventory");
    setup.inventory = inventory_from_amounts(*amounts);
  } else {
    auto facts = measure_host(host.instance_dir);
    if (!facts) return facts.error().doing("cannot measure this host's resources");
    setup.inventory = inventory_from_host(*facts, c.policy);
  }
  std::ifstream cpuinfo("/proc/cpuinfo");
  setup.cpu_traits = cpu_traits(std::string(std::istreambuf_iterator<char>(cpuinfo), std::istreambuf_iterator<char>()));
  ImageStoreOptions& images = setup.images;
  images.image_dir = c.image_dir.empty() ? (state_dir / "images").string() : c.image_dir;
  images.cache_dir = c.image_cache_dir.empty() ? (state_dir / "image-cache").string() : c.image_cache_dir;
  images.cache_max_bytes = uint64_t(c.image_cache_max_gb * double(1 << 30));
  images.max_download_bytes = uint64_t(c.image_max_gb * double(1 << 30));
  images.schemes = c.image_schemes;
  images.ca_file = c.image_ca_file;
  LibvirtOptions libvirt{c.libvirt_uri, c.domain_type, host.instance_dir, c.network, c.bridge, c.nic_model,
                         c.guest_filter, host.provider};
  auto backend = open_libvirt(libvirt);
  if (!backend) return backend.error();
  setup.backend = std::move(*backend);
  // The guests' network first: its bridge is where the metadata address usually goes.
  if (auto network = setup.backend->ensure_network(); !network)
    spdlog::error("libvirt network {}: {}", c.network, network.error().message());
  // Told to guests in their network data; without it they still have what DHCP says.
  if (auto dns = setup.backend->network_dns()) setup.guest_dns = std::move(*dns);
  return setup;
}

AgentParts::AgentParts(AgentContext& ctx, Inventory inventory, std::vector<std::string> cpu_traits,
                       ImageStoreOptions image_options)
    : placer(ctx.placement, *ctx.etcd, ctx.config),
      recorder(ctx),
      registration(ctx, std::move(inventory), std::move(cpu_traits)),
      images(ctx.io.get_executor(), ctx.pool, std::move(image_options)),
      presence(ctx, [this] { return instances.holding_work(); }),
      maintenance(ctx, registration, presence),
      builder(ctx, Builder::Parts{recorder, images, placer, [this] { return instances.images_wanted(); }}),
      mover(ctx, builder, placer),
      instances(ctx, recorder, builder, presence, mover),
      observer(ctx, instances),
      metadata(ctx, instances) {
  presence.set_capacity(capacity_of(registration.inventory()));
}

}  // namespace toyvm::compute
