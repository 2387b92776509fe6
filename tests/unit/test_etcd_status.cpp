#include "clients/etcd_grpc.hpp"

#include <catch2/catch.hpp>

using namespace toyvm;

TEST_CASE("etcd's answers that pass are told apart from those that do not") {
  using grpc::Status;
  using grpc::StatusCode;
  // Away, late, or its applies far behind its commits: asked again by whoever can wait.
  CHECK(etcd_grpc::from_status(Status(StatusCode::UNAVAILABLE, "connection refused")) == errc::etcd_unavailable);
  CHECK(etcd_grpc::from_status(Status(StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded")) == errc::etcd_unavailable);
  CHECK(etcd_grpc::from_status(Status(StatusCode::RESOURCE_EXHAUSTED, "etcdserver: too many requests")) ==
        errc::etcd_unavailable);
  // A database over its quota stays so until an operator acts.
  CHECK(etcd_grpc::from_status(Status(StatusCode::RESOURCE_EXHAUSTED, "etcdserver: mvcc: database space exceeded")) ==
        errc::etcd_error);
  CHECK(etcd_grpc::from_status(Status(StatusCode::PERMISSION_DENIED, "etcdserver: permission denied")) ==
        errc::permission_denied);
}

TEST_CASE("a lease is renewed as seldom as leaves time to notice a stalled member and renew elsewhere") {
  using std::chrono::milliseconds;
  using std::chrono::seconds;
  // 16 s to notice a stall (a ping every 10 s, 5 s for its answer) and renew through another member.
  CHECK(lease_renewal_interval(seconds(30)) == seconds(14));
  CHECK(lease_renewal_interval(seconds(40)) == seconds(20));  // half: the most
  CHECK(lease_renewal_interval(seconds(60)) == seconds(30));
  // A short TTL cannot outlast a stall: a third of it, as before.
  CHECK(lease_renewal_interval(seconds(10)) == milliseconds(3333));
  CHECK(lease_renewal_interval(seconds(24)) == seconds(8));
  CHECK(lease_renewal_interval(seconds(2)) == milliseconds(666));
  for (int ttl = 2; ttl <= 600; ++ttl) {
    const milliseconds interval = lease_renewal_interval(seconds(ttl));
    CHECK(interval * 3 >= seconds(ttl) - milliseconds(2));
    CHECK(interval * 2 <= seconds(ttl));
    // Where it is more than a third, a stall noticed late still leaves the renewal in time.
    if (interval * 3 > seconds(ttl)) CHECK(interval + etcd_ping_interval + etcd_ping_timeout < seconds(ttl));
  }
}
