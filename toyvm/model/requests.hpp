#pragma once
// What a project's members ask of the scheduler service, and what it answers, through the
// project's own keys (`requests/<project>/<id>`, `replies/<project>/<id>`): a member reaches
// Placement not at all and the cloud's keys only through the service, which acts for the
// project the key names, never for one the value says.

#include "core/error.hpp"
#include "model/query.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace toyvm {

enum class RequestAction { schedule, stop, start, destroy };
std::string_view to_string(RequestAction action) noexcept;

struct ProjectRequest {
  RequestAction action = RequestAction::schedule;
  std::string user;  // who asks, as its client says (the project is the key's)
  // schedule: as `toyvm schedule` takes it, the guest's data read already.
  std::string query;
  int count = 1;
  std::string name;
  std::string image;
  std::string image_sha256;
  std::string image_format;
  std::string availability_zone;
  std::string group;
  std::string group_policy;
  std::string policy;
  std::string user_data;
  std::vector<std::pair<std::string, std::string>> keys;
  bool config_drive = false;
  // stop, start, destroy: the instance.
  std::string instance;
  int64_t asked_at = 0;  // unix milliseconds

  bool operator==(const ProjectRequest&) const = default;
};

struct ProjectReply {
  int exit_code = 0;
  std::vector<std::string> lines;  // what the command says on stdout
  std::string error;               // its error, for stderr; empty: none
  std::vector<std::string> instances;  // schedule: the instances made, to wait for

  bool operator==(const ProjectReply&) const = default;
};

std::string encode(const ProjectRequest& request);
std::string encode(const ProjectReply& reply);
result<ProjectRequest> decode_request(std::string_view json);
result<ProjectReply> decode_reply(std::string_view json);

}  // namespace toyvm
