#include "core/log.hpp"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>

namespace toyvm {
namespace {

class SyslogPriorityFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    static constexpr char priorities[] = {'7', '7', '6', '4', '3', '2', '6'};
    const char text[] = {'<', priorities[msg.level], '>'};
    dest.append(text, text + 3);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<SyslogPriorityFlag>();
  }
};

}  // namespace

void init_logging(bool verbose) {
  auto logger = std::make_shared<spdlog::logger>(
      "toyvm", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  if (std::getenv("JOURNAL_STREAM")) {
    formatter->add_flag<SyslogPriorityFlag>('*').set_pattern("%*%v");
  } else {
    formatter->set_pattern(verbose ? "%Y-%m-%dT%H:%M:%S.%f %l %v" : "%Y-%m-%dT%H:%M:%S.%e %l %v");
  }
  logger->set_formatter(std::move(formatter));
  logger->set_level(verbose ? spdlog::level::debug : spdlog::level::info);
  logger->flush_on(spdlog::level::debug);
  spdlog::set_default_logger(std::move(logger));
}

}  // namespace toyvm
