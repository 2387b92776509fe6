#pragma once
// toyvm's commands as a table: each names itself, says what it does, and adds its own options
// to its CLI11 subcommand, returning the entry that runs it once the line is parsed.

#include "core/config.hpp"
#include "services/say.hpp"

#include <CLI/CLI.hpp>

#include <functional>
#include <span>

namespace toyvm {

// What a parsed command runs: the service's entry function with the options it was given.
using CommandEntry = std::function<Outcome(const Config&, Say&)>;

struct Command {
  const char* name;
  const char* help;
  // Adds the command's options (and subcommands) to `command`; the entry it returns reads
  // them, so it is called after parsing.
  CommandEntry (*add_options)(CLI::App& command);
};

std::span<const Command> commands();

}  // namespace toyvm
