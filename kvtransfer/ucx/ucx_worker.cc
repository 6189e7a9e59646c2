#include "kvtransfer/ucx/ucx_worker.h"

#include "kvtransfer/ucx/ucx_status.h"

namespace pdserve::kvtransfer {

Result<std::unique_ptr<UcxWorker>> UcxWorker::Create(UcxContext* context) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  ucs_status_t status = ucp_worker_create(context->get(), &params, &worker);
  if (status != UCS_OK) return FromUcsStatus(status, "ucp_worker_create");
  int fd = -1;
  status = ucp_worker_get_efd(worker, &fd);
  if (status != UCS_OK) {
    ucp_worker_destroy(worker);
    return FromUcsStatus(status, "ucp_worker_get_efd");
  }
  ucp_address_t* address = nullptr;
  size_t length = 0;
  status = ucp_worker_get_address(worker, &address, &length);
  if (status != UCS_OK) {
    ucp_worker_destroy(worker);
    return FromUcsStatus(status, "ucp_worker_get_address");
  }
  std::string packed(reinterpret_cast<const char*>(address), length);
  ucp_worker_release_address(worker, address);
  return std::unique_ptr<UcxWorker>(new UcxWorker(worker, fd, std::move(packed)));
}

UcxWorker::~UcxWorker() {
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
}

}  // namespace pdserve::kvtransfer
