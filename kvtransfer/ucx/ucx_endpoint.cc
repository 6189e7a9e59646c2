#include "kvtransfer/ucx/ucx_endpoint.h"

#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <string_view>

#include "common/logging.h"
#include "kvtransfer/ucx/ucx_status.h"

namespace pdserve::kvtransfer {

namespace {
bool HasNativeRma(ucp_ep_h ep) {
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return true;
  ucp_ep_print_info(ep, stream);
  std::fclose(stream);
  const bool native = std::string_view(text, size).find("put[") != std::string_view::npos;
  std::free(text);
  return native;
}
}  // namespace

Result<std::unique_ptr<UcxEndpoint>> UcxEndpoint::Create(UcxWorker* worker,
                                                         const std::string& peer_address,
                                                         bool try_peer_mode,
                                                         bool allow_no_error_handling,
                                                         ucp_err_handler_cb_t on_error,
                                                         void* arg) {
  for (bool peer_mode : {true, false}) {
    if (peer_mode && !try_peer_mode) continue;
    if (!peer_mode && !allow_no_error_handling) break;
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.address = reinterpret_cast<const ucp_address_t*>(peer_address.data());
    params.err_mode = peer_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    if (peer_mode) {
      params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
      params.err_handler.cb = on_error;
      params.err_handler.arg = arg;
    }
    ucp_ep_h ep = nullptr;
    ucs_status_t status = ucp_ep_create(worker->get(), &params, &ep);
    if (status == UCS_OK) {
      return std::unique_ptr<UcxEndpoint>(new UcxEndpoint(worker, ep, peer_mode, HasNativeRma(ep)));
    }
    // A failed PEER-mode attempt (shared memory cannot detect peer failure: "unreachable";
    // or the peer already connected to us without error handling: "asymmetric endpoint
    // configuration") falls back to no error handling when allowed.
    if (!peer_mode || !allow_no_error_handling) return FromUcsStatus(status, "ucp_ep_create");
  }
  return Status::Unavailable("ucp_ep_create: peer unreachable with peer error handling "
                             "(and endpoints without it are not allowed)");
}

ucs_status_ptr_t UcxEndpoint::StartClose() {
  if (ep_ == nullptr) return nullptr;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = peer_error_handling_ ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t request = ucp_ep_close_nbx(ep_, &param);
  ep_ = nullptr;
  if (UCS_PTR_IS_ERR(request)) {
    GetLogger("kvtransfer")->debug("ucp_ep_close_nbx: {}",
                                   ucs_status_string(UCS_PTR_STATUS(request)));
    return nullptr;
  }
  return request;
}

UcxEndpoint::~UcxEndpoint() {
  ucs_status_ptr_t request = StartClose();
  if (request == nullptr) return;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (ucp_request_check_status(request) == UCS_INPROGRESS &&
         std::chrono::steady_clock::now() < give_up) {
    ucp_worker_progress(worker_->get());
  }
  if (ucp_request_check_status(request) == UCS_INPROGRESS) {
    // Leaked on purpose: the worker releases it when it is destroyed.
    GetLogger("kvtransfer")->warn("UCX endpoint close did not finish within 1 s");
    return;
  }
  ucp_request_free(request);
}

Result<std::unique_ptr<UcxRemoteKey>> UcxRemoteKey::Unpack(UcxEndpoint* endpoint,
                                                           const std::string& packed_key) {
  ucp_rkey_h rkey = nullptr;
  ucs_status_t status = ucp_ep_rkey_unpack(endpoint->get(), packed_key.data(), &rkey);
  if (status != UCS_OK) return FromUcsStatus(status, "ucp_ep_rkey_unpack");
  return std::unique_ptr<UcxRemoteKey>(new UcxRemoteKey(rkey));
}

UcxRemoteKey::~UcxRemoteKey() { ucp_rkey_destroy(rkey_); }

}  // namespace pdserve::kvtransfer
