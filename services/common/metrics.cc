#include "services/common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <thread>

#include <prometheus/text_serializer.h>

#include "services/common/net_util.h"

namespace pdserve::services {

Result<std::unique_ptr<MetricsExposer>> MetricsExposer::Start(const std::string& bind_address,
                                                              std::shared_ptr<prometheus::Registry> registry) {
  const size_t colon = bind_address.rfind(':');
  if (colon == std::string::npos) return Status::InvalidArgument("metrics address '" + bind_address + "' is not HOST:PORT");
  std::unique_ptr<MetricsExposer> m(new MetricsExposer());
  m->registry_ = std::move(registry);
  try {
    m->exposer_ = std::make_unique<prometheus::Exposer>(bind_address, 1);
    m->exposer_->RegisterCollectable(m->registry_);
    const auto ports = m->exposer_->GetListeningPorts();
    if (ports.empty()) return Status::Unavailable("metrics exposer on " + bind_address + " is not listening");
    m->port_ = ports.front();
  } catch (const std::exception& e) {
    // civetweb only says it could not bind; find out why.
    int port = 0;
    try {
      port = std::stoi(bind_address.substr(colon + 1));
    } catch (const std::exception&) {
      return Status::InvalidArgument("metrics address '" + bind_address + "' has no numeric port");
    }
    return Status::Unavailable("cannot serve metrics on " + bind_address + ": " +
                               DescribeListenFailure(bind_address.substr(0, colon), port) + " (" + e.what() + ")");
  }
  m->address_ = bind_address.substr(0, colon) + ":" + std::to_string(m->port_);
  return m;
}

MetricsExposer::~MetricsExposer() {
  if (!exposer_) return;
  // civetweb's listener thread polls its sockets with a 2 s timeout and notices the stop flag only
  // when it wakes, so every worker took ~2 s to exit. A connection wakes it at once: knock until
  // the exposer is gone.
  // A wildcard listener is knocked on through this machine's own loopback (a connection to
  // ourselves, not an assumption about where peers are).
  std::string host = address_.substr(0, address_.rfind(':'));
  if (IsWildcardHost(host)) host = "127.0.0.1";
  std::atomic<bool> stopped{false};
  std::thread knock([&] {
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port_));
    if (inet_pton(AF_INET, host.c_str(), &to.sin_addr) != 1) return;
    while (!stopped.load()) {
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd >= 0) {
        connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to));
        close(fd);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  exposer_.reset();
  stopped = true;
  knock.join();
}

std::string SerializeMetrics(prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

prometheus::Histogram::BucketBoundaries RequestLatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
}

prometheus::Histogram::BucketBoundaries TokenLatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};
}

}  // namespace pdserve::services
