#include "kvtransfer/ucx/ucx_memory.h"

#include <fmt/format.h>

#include "kvtransfer/ucx/ucx_status.h"

namespace pdserve::kvtransfer {

Result<std::unique_ptr<RegisteredRegion>> RegisteredRegion::Allocate(UcxContext* context,
                                                                     uint64_t bytes) {
  return Map(context, nullptr, bytes, true);
}

Result<std::unique_ptr<RegisteredRegion>> RegisteredRegion::Register(UcxContext* context,
                                                                     void* data, uint64_t bytes) {
  if (data == nullptr) return Status::InvalidArgument("cannot register a null region");
  return Map(context, data, bytes, false);
}

Result<std::unique_ptr<RegisteredRegion>> RegisteredRegion::Map(UcxContext* context, void* data,
                                                                uint64_t bytes, bool allocate) {
  if (bytes == 0) return Status::InvalidArgument("cannot register an empty region");
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  params.address = data;
  params.length = bytes;
  params.flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0;
  ucp_mem_h memh = nullptr;
  ucs_status_t status = ucp_mem_map(context->get(), &params, &memh);
  if (status != UCS_OK) {
    return FromUcsStatus(status, fmt::format("ucp_mem_map of {} bytes", bytes));
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  status = ucp_mem_query(memh, &attr);
  if (status != UCS_OK) {
    ucp_mem_unmap(context->get(), memh);
    return FromUcsStatus(status, "ucp_mem_query");
  }
  void* packed = nullptr;
  size_t packed_size = 0;
  status = ucp_rkey_pack(context->get(), memh, &packed, &packed_size);
  if (status != UCS_OK) {
    ucp_mem_unmap(context->get(), memh);
    return FromUcsStatus(status, "ucp_rkey_pack");
  }
  std::string key(static_cast<const char*>(packed), packed_size);
  ucp_rkey_buffer_release(packed);
  // UCX may round an allocation up; expose exactly what was asked for.
  return std::unique_ptr<RegisteredRegion>(new RegisteredRegion(
      context, memh, static_cast<uint8_t*>(attr.address), bytes, std::move(key)));
}

RegisteredRegion::~RegisteredRegion() { ucp_mem_unmap(context_->get(), memh_); }

}  // namespace pdserve::kvtransfer
