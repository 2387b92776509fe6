// How a command ends: what it says through Say, and the exit code its outcome is at the edge.
#include "services/say.hpp"
#include "services/services.hpp"

#include "catch_result.hpp"

#include <string>
#include <vector>

using namespace toyvm;

namespace {

struct Recorded final : Say {
  std::vector<std::string> lines, notes;
  void line(std::string_view text) override { lines.emplace_back(text); }
  void note(std::string_view text) override { notes.emplace_back(text); }
  void raw(std::string_view bytes) override { lines.emplace_back(bytes); }
};

}  // namespace

TEST_CASE("an error's category is its exit code, documented in README") {
  CHECK(exit_code_for(make_error_code(errc::invalid_argument)) == ExitCode::usage);
  CHECK(exit_code_for(make_error_code(errc::not_found)) == ExitCode::not_found);
  CHECK(exit_code_for(make_error_code(errc::etcd_unavailable)) == ExitCode::unavailable);
  CHECK(exit_code_for(make_error_code(errc::no_address)) == ExitCode::no_address);
  CHECK(exit_code_for(make_error_code(errc::over_quota)) == ExitCode::over_quota);
  CHECK(exit_code_for(make_error_code(errc::not_reached)) == ExitCode::failed);
  CHECK(exit_code_for(make_error_code(errc::changed)) == ExitCode::failed);
}

TEST_CASE("a command refuses a bad uuid before it asks any server, saying nothing itself") {
  Recorded say;
  Config config;
  config.etcd.endpoints = {"http://127.0.0.1:1"};  // never reached
  MigrateOptions migrate;
  migrate.uuid = "x";
  for (auto outcome : {run_destroy(config, DestroyOptions{{"not-a-uuid"}}, say),
                       run_power(config, PowerOptions{"7387cdc8-291c-4b02-87ce"}, say),
                       run_migrate(config, migrate, say)}) {
    REQUIRE_FALSE(outcome);
    CHECK(outcome.error() == errc::invalid_argument);
    CHECK_THAT(outcome.error().message(), Catch::Contains("is not an instance uuid"));
  }
  CHECK(say.lines.empty());
  CHECK(say.notes.empty());
}
