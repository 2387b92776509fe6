#pragma once
// The metadata service's answers, as cloud-init reads them: EC2-style paths
// (/latest/meta-data/...) and OpenStack paths (/openstack/latest/meta_data.json). Pure: a
// request path and what is known of the asking guest in, a response out.

#include "model/records.hpp"

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace toyvm {

struct GuestView {
  std::string uuid;
  std::string name;
  std::string hostname;
  std::string ip;
  std::string availability_zone = "nova";
  std::string project = "default";  // the instance's project, its meta_data's project_id
  std::string user_data;  // raw bytes; empty: none
  std::vector<std::pair<std::string, std::string>> public_keys;  // name, OpenSSH public key
  int launch_index = 0;
  // The guest's NIC, which takes its address by DHCP; empty: the guest has no NIC.
  std::string mac;
  std::vector<std::string> dns_servers;  // what the NIC's network offers; empty: what DHCP says
};

struct MetadataResponse {
  int status = 200;
  std::string content_type = "text/plain";
  std::string body;
};

// What the guest of `spec`, at `ip`, is told.
GuestView guest_view(const WorkSpec& spec, const std::string& ip, const std::string& availability_zone);

// One file of a config drive: its path on the volume (openstack/latest/meta_data.json, ...).
struct DriveFile {
  std::string path;
  std::string content;
};

// `guest` is null when the source address belongs to no known instance.
MetadataResponse route_metadata(std::string_view method, std::string_view target, const GuestView* guest);

// The files of a config drive (label config-2) for `guest`: what the metadata service would
// answer, as Nova lays them out, so that cloud-init reads the same data either way.
std::vector<DriveFile> config_drive_files(const GuestView& guest);

// A hostname cloud-init accepts: the name reduced to [a-z0-9-], or one made from the uuid.
std::string hostname_for(std::string_view name, std::string_view uuid);

}  // namespace toyvm
