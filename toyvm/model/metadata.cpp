#include "model/metadata.hpp"

#include "core/base64.hpp"

#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include <array>
#include <charconv>

namespace toyvm {
namespace {

namespace json = boost::json;

// The OpenStack metadata versions cloud-init knows, oldest first.
constexpr std::string_view openstack_versions[] = {
    "2012-08-10", "2013-04-04", "2013-10-17", "2015-10-15", "2016-06-30",
    "2016-10-06", "2017-02-22", "2018-08-27", "latest"};

// EC2 versions from the first with public-keys on (2009-04-04, as required) to the newest
// cloud-init asks for.
constexpr std::string_view ec2_versions[] = {
    "2009-04-04", "2011-01-01", "2012-01-12", "2014-02-25", "2014-11-05",
    "2015-10-20", "2016-04-19", "2016-06-30", "2016-09-02", "2018-09-24",
    "2019-10-01", "2020-10-27", "2021-01-03", "2021-03-23", "2021-07-15",
    "2022-09-24", "latest"};

MetadataResponse text(std::string body) { return {200, "text/plain", std::move(body)}; }
MetadataResponse status(int code, std::string body) { return {code, "text/plain", std::move(body)}; }
MetadataResponse not_found() { return status(404, "Not Found\n"); }

template <size_t N>
bool known(const std::string_view (&list)[N], std::string_view version) {
  for (std::string_view v : list) {
    if (v == version) return true;
  }
  return false;
}

template <size_t N>
std::string lines(const std::string_view (&list)[N]) {
  std::string out;
  for (std::string_view v : list) {
    if (!out.empty()) out += '\n';
    out += v;
  }
  return out;
}

// Splits "/a/b/c/" into {"a","b","c"}; false for empty, "." or ".." segments (no traversal,
// no aliases of other paths).
bool split_path(std::string_view path, std::vector<std::string_view>& parts) {
  if (path.empty() || path.front() != '/') return false;
  path.remove_prefix(1);
  while (!path.empty()) {
    size_t slash = path.find('/');
    std::string_view part = path.substr(0, slash);
    if (part.empty() || part == "." || part == "..") return false;
    parts.push_back(part);
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return true;
}

json::object openstack_meta_data(const GuestView& g) {
  json::object keys;
  json::array key_list;
  for (auto& [name, key] : g.public_keys) {
    keys[name] = key;
    key_list.push_back(json::object{{"name", name}, {"type", "ssh"}, {"data", key}});
  }
  return json::object{{"uuid", g.uuid},
                      {"name", g.name.empty() ? g.hostname : g.name},
                      {"hostname", g.hostname},
                      {"public_keys", keys},
                      {"keys", key_list},
                      {"launch_index", g.launch_index},
                      {"availability_zone", g.availability_zone},
                      {"project_id", g.project},
                      {"meta", json::object{}},
                      {"devices", json::array{}}};
}

// As Nova writes it: a link per NIC, found by the guest through its MAC, and a network on it.
// cloud-init applies exactly this (no NIC here, none configured there), so a guest with a NIC
// must find it: empty lists would leave it down. The address always comes from DHCP, on a
// libvirt network and on a bridge alike.
json::object network_data(const GuestView& g) {
  json::array links, networks, services;
  if (!g.mac.empty()) {
    links.push_back(json::object{{"id", "interface0"},
                                 {"vif_id", g.uuid},
                                 {"type", "phy"},
                                 {"ethernet_mac_address", g.mac},
                                 {"mtu", nullptr}});
    networks.push_back(json::object{{"id", "network0"},
                                    {"link", "interface0"},
                                    {"network_id", "toyvm"},
                                    {"type", "ipv4_dhcp"}});
    for (const std::string& address : g.dns_servers)
      services.push_back(json::object{{"type", "dns"}, {"address", address}});
  }
  return json::object{{"links", links}, {"networks", networks}, {"services", services}};
}

// The EC2 meta-data tree as one JSON object, as config drives carry it.
json::object ec2_meta_data(const GuestView& g) {
  json::object keys;
  for (size_t i = 0; i < g.public_keys.size(); ++i)
    keys[std::to_string(i)] = json::object{{"openssh-key", g.public_keys[i].second + "\n"}};
  json::object meta{{"instance-id", g.uuid},
                    {"hostname", g.hostname},
                    {"local-hostname", g.hostname},
                    {"placement", json::object{{"availability-zone", g.availability_zone}}},
                    {"public-keys", keys}};
  if (!g.ip.empty()) meta["local-ipv4"] = g.ip;
  return meta;
}

MetadataResponse ec2(const std::vector<std::string_view>& p, const GuestView& g) {
  // p[0] is the version.
  if (p.size() == 1) return text(g.user_data.empty() ? "meta-data/" : "meta-data/\nuser-data");
  if (p[1] == "user-data" && p.size() == 2) {
    if (g.user_data.empty()) return not_found();
    return {200, "application/octet-stream", g.user_data};
  }
  if (p[1] != "meta-data") return not_found();
  if (p.size() == 2)
    return text("hostname\ninstance-id\nlocal-hostname\nlocal-ipv4\nplacement/\npublic-keys/");
  std::string_view item = p[2];
  if (p.size() == 3) {
    if (item == "instance-id") return text(g.uuid);
    if (item == "hostname" || item == "local-hostname") return text(g.hostname);
    if (item == "local-ipv4") return text(g.ip);
    if (item == "placement") return text("availability-zone");
  }
  if (item == "placement" && p.size() == 4 && p[3] == "availability-zone") return text(g.availability_zone);
  if (item == "public-keys") {
    if (p.size() == 3) {
      std::string out;
      for (size_t i = 0; i < g.public_keys.size(); ++i)
        out += (i ? "\n" : "") + std::to_string(i) + "=" + g.public_keys[i].first;
      return text(out);
    }
    size_t index = 0;
    auto [ptr, ec] = std::from_chars(p[3].data(), p[3].data() + p[3].size(), index);
    if (ec != std::errc{} || ptr != p[3].data() + p[3].size() || index >= g.public_keys.size())
      return not_found();
    if (p.size() == 4) return text("openssh-key");
    if (p.size() == 5 && p[4] == "openssh-key") return text(g.public_keys[index].second + "\n");
  }
  return not_found();
}

MetadataResponse openstack(const std::vector<std::string_view>& p, const GuestView& g) {
  if (p.size() == 1) return text(lines(openstack_versions));
  if (!known(openstack_versions, p[1])) return not_found();
  if (p.size() == 2)
    return text(g.user_data.empty() ? "meta_data.json\nnetwork_data.json\nvendor_data.json"
                                     : "meta_data.json\nnetwork_data.json\nuser_data\nvendor_data.json");
  if (p.size() != 3) return not_found();
  std::string_view file = p[2];
  if (file == "meta_data.json") return {200, "application/json", json::serialize(openstack_meta_data(g))};
  if (file == "user_data") {
    if (g.user_data.empty()) return not_found();
    return {200, "application/octet-stream", g.user_data};
  }
  if (file == "network_data.json") return {200, "application/json", json::serialize(network_data(g))};
  if (file == "vendor_data.json" || file == "vendor_data2.json") return {200, "application/json", "{}"};
  return not_found();
}

}  // namespace

MetadataResponse route_metadata(std::string_view method, std::string_view target, const GuestView* guest) {
  if (method != "GET" && method != "HEAD") return status(405, "Method Not Allowed\n");
  std::string_view path = target.substr(0, target.find('?'));
  std::vector<std::string_view> parts;
  if (!split_path(path, parts)) return status(400, "Bad Request\n");
  if (!guest) return not_found();  // never another guest's data, not even the version lists
  if (parts.empty()) return text(lines(ec2_versions));
  if (parts[0] == "openstack") return openstack(parts, *guest);
  if (known(ec2_versions, parts[0])) return ec2(parts, *guest);
  return not_found();
}

GuestView guest_view(const WorkSpec& spec, const std::string& ip, const std::string& availability_zone) {
  GuestView view;
  view.uuid = spec.uuid;
  view.name = spec.name;
  view.hostname = hostname_for(spec.name, spec.uuid);
  view.ip = ip;
  view.availability_zone = availability_zone;
  view.user_data = spec.user_data;
  view.public_keys = spec.keys;
  view.project = spec.project;
  return view;
}

std::vector<DriveFile> config_drive_files(const GuestView& guest) {
  std::vector<DriveFile> files{
      {"openstack/latest/meta_data.json", json::serialize(openstack_meta_data(guest))},
      {"openstack/latest/network_data.json", json::serialize(network_data(guest))},
      {"openstack/latest/vendor_data.json", "{}"},
      {"ec2/latest/meta-data.json", json::serialize(ec2_meta_data(guest))},
  };
  if (!guest.user_data.empty()) {
    files.push_back({"openstack/latest/user_data", guest.user_data});
    files.push_back({"ec2/latest/user-data", guest.user_data});
  }
  return files;
}

std::string hostname_for(std::string_view name, std::string_view uuid) {
  std::string out;
  for (char c : name) {
    char lower = (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
    bool ok = (lower >= 'a' && lower <= 'z') || (lower >= '0' && lower <= '9');
    if (ok) {
      out.push_back(lower);
    } else if (!out.empty() && out.back() != '-') {
      out.push_back('-');
    }
    if (out.size() == 63) break;
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  if (out.empty()) out = "instance-" + std::string(uuid.substr(0, 8));
  return out;
}

}  // namespace toyvm
