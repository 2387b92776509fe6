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
