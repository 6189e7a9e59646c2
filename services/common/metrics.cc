#include "services/common/metrics.h"

#include <exception>

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
