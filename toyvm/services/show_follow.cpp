// toyvm show --console and --watch: what follows etcd until interrupted (or until the
// console is shown once), riding over etcd going away and coming back.

#include "clients/etcd.hpp"
#include "model/console.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"
#include "services/common.hpp"
#include "services/instance_lookup.hpp"
#include "services/show.hpp"

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include <ctime>
#include <functional>
#include <map>
#include <set>

namespace toyvm {
namespace {

namespace json = boost::json;

void say_console(std::string_view text, bool raw, Say& say) {
  say.raw(raw ? std::string(text) : printable_console(text));
}

// While a console is followed: renews the request's lease every 3 s, and puts the request
// again under a new lease if etcd dropped that one (away for longer than its TTL). etcd not
// answering meanwhile is waited out. Runs until cancelled.
awaitable<void> keep_asking(EtcdClient& etcd, std::string request_key, int64_t lease) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  std::unique_ptr<EtcdLeaseKeeper> keeper;
  while (true) {
    timer.expires_after(std::chrono::seconds(3));
    co_await timer.async_wait(use_awaitable);
    if (!keeper) keeper = etcd.keep_alive(lease);
    auto ttl = co_await keeper->ping();
    if (ttl && *ttl > 0) continue;
    keeper.reset();  // a broken stream, or a lease that is gone
    if (!ttl) continue;
    auto renewed = co_await etcd.lease_grant(10);
    if (renewed && co_await etcd.put(request_key, "", *renewed)) lease = *renewed;
  }
}

// What a watcher of instances is told about: a change of state, address or error. A record
// rewritten with the same (a timestamp, a retry's attempt) is no news.
bool same_news(const InstanceRecord& a, const InstanceRecord& b) {
  return a.state == b.state && a.ip == b.ip && a.host == b.host && a.error_code == b.error_code &&
         a.no_address == b.no_address;
}

std::string utc_time(int64_t unix_ms) {
  std::time_t seconds = std::time_t(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03d}Z", text, int(unix_ms % 1000));
}

void say_event(const InstanceRecord& r, bool deleted, bool as_json, Say& say) {
  const int64_t at = deleted || r.updated_at == 0 ? unix_millis() : r.updated_at;
  if (as_json) {
    json::object o = instance_json(r);
    if (deleted) o["state"] = "DELETED";
    o["time"] = utc_time(at);
    say.line(json::serialize(o));
  } else {
    std::string line = fmt::format("{}  {}  {:<8}  host {}", utc_time(at), r.uuid,
                                   deleted ? "DELETED" : to_string(r.state), r.host.empty() ? "-" : r.host);
    if (!deleted && !r.ip.empty()) line += "  ip " + r.ip;
    if (!deleted && !r.error_code.empty())
      line += fmt::format("  error {}: {}", printable_line(r.error_code), printable_line(r.error_message));
    say.line(line);
  }
}

}  // namespace

awaitable<Outcome> show_console(EtcdClient& etcd, const KeyLayout& keys, std::string member_project,
                                const ShowOptions& options, Say& say) {
  // The admin asks the instance's host; a member asks through its project's keys (the
  // scheduler service passes it on), for an instance its project's view knows.
  std::string project = member_project, host;
  if (member_project.empty()) {
    auto found = co_await find_instance(etcd, keys, options.uuid);
    if (!found) co_return found.error();
    project = found->record.project;
    host = found->record.host;
  } else {
    auto view = co_await etcd.range(keys.project_instance(member_project, options.uuid));
    if (!view) co_return etcd_error(etcd, view.error());
    if (view->kvs.empty()) co_return Error(errc::not_found, fmt::format("no instance {}", options.uuid));
  }
  auto lease = co_await etcd.lease_grant(10);
  if (!lease) co_return etcd_error(etcd, lease.error());
  const std::string asker = fmt::format("{:x}", *lease);
  const std::string request_key = member_project.empty() ? keys.console_request(host, options.uuid, asker)
                                                         : keys.project_console_request(project, options.uuid, asker);
  const std::string console_key = keys.console(project, options.uuid, asker);
  // The admin's request says the project the host publishes under; the service writes it for a member.
  std::string request_value = member_project.empty() ? project : std::string();
  auto asked = co_await etcd.put(request_key, std::move(request_value), *lease);
  if (!asked) co_return etcd_error(etcd, asked.error());

  int64_t revision = *asked;
  std::string shown;
  bool answered = false;
  std::function<bool(const WatchEvent&)> published = [&](const WatchEvent& event) {
    if (event.type != WatchEvent::Type::put) return false;
    const std::string& tail = event.kv.value;
    if (!answered && tail.empty()) say.note(fmt::format("instance {} has no console output yet", options.uuid));
    say_console(console_growth(shown, tail), options.raw, say);
    shown = tail;
    revision = event.kv.mod_revision;
    return !std::exchange(answered, true) || !options.follow;
  };
  // The host has the timeout to answer.
  auto first = co_await follow_key(etcd, console_key, revision + 1,
                                   options.timeout, published);
  if (!first) co_return etcd_error(etcd, first.error());
  if (!*first)
    co_return Error(errc::not_reached, fmt::format("the host of instance {} did not publish its console within {} s; "
                                                   "it may be down",
                                                   options.uuid, in_seconds(options.timeout)));
  if (options.follow) {
    using namespace asio::experimental::awaitable_operators;
    // Until interrupted: follow_key rides over etcd going away, keep_asking keeps the request.
    co_await (follow_key(etcd, console_key, revision + 1, std::chrono::hours(24 * 365), published) ||
              keep_asking(etcd, request_key, *lease));
  }
  if (!shown.empty() && shown.back() != '\n') say.raw("\n");
  co_await etcd.lease_revoke(*lease);  // the request and the console go with it
  co_return ExitCode::ok;
}

awaitable<Outcome> show_watch(EtcdClient& etcd, const RecordsShown& shown, const ShowOptions& options, Say& say) {
  const bool one = !options.uuid.empty();
  const std::string key = one ? shown.prefix + options.uuid : shown.prefix;
  const std::string range_end = one ? std::string() : prefix_range_end(key);
  auto first = co_await etcd.range(key, range_end);
  if (!first) co_return etcd_error(etcd, first.error());
  if (one && first->kvs.empty()) co_return Error(errc::not_found, fmt::format("no instance {}", options.uuid));
  std::map<std::string, InstanceRecord> known;  // by key
  bool gone = false;
  auto changed = [&](const KeyValue& kv, bool erased) {
    auto was = known.find(kv.key);
    if (erased) {
      if (was == known.end()) return;
      say_event(was->second, true, options.json, say);
      known.erase(was);
      gone = one;
      return;
    }
    auto record = decode_instance(kv.value);
    if (!record) return;  // a corrupt record is `toyvm audit`'s business
    if (was == known.end() || !same_news(was->second, *record)) say_event(*record, false, options.json, say);
    known[kv.key] = std::move(*record);
  };
  for (const KeyValue& kv : first->kvs)
    if (auto record = decode_instance(kv.value)) known[kv.key] = std::move(*record);
  bool listed_once = false;
  co_await follow_range(
      etcd, key, range_end,
      [&](const RangeResult& listing) {
        if (!std::exchange(listed_once, true)) return;  // the first listing is the one just read
        std::set<std::string> present;
        for (const KeyValue& kv : listing.kvs) {
          present.insert(kv.key);
          changed(kv, false);
        }
        for (auto it = known.begin(); it != known.end();) {
          auto next = std::next(it);
          if (!present.count(it->first)) changed(KeyValue{it->first, {}, 0, 0, 0, 0}, true);
          it = next;
        }
      },
      [&](const WatchEvent& event) { changed(event.kv, event.type == WatchEvent::Type::erase); },
      [&] { return gone; });
  co_return ExitCode::ok;
}

}  // namespace toyvm
