// RegisteredRegion: RAII owner of memory registered with UCX (ucp_mem_map) and of its packed
// remote key (ucp_rkey_pack). With Allocate, UCX also allocates the memory (for shared-memory
// transports peers then map it directly: RMA becomes a memcpy by the writer and needs no
// progress by the owner). The destructor calls ucp_mem_unmap.
//
// Thread-safety: created and destroyed on the UcxTransport I/O thread (it shares the context
// with the worker); data()/size()/packed_key() are immutable and may be read anywhere.
// REQUIRES at destruction: no peer still writes into the memory.
// Errors: kResourceExhausted / kInternal with the UCX reason.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ucp/api/ucp.h>

#include "common/status.h"
#include "kvtransfer/ucx/ucx_context.h"

namespace pdserve::kvtransfer {

class RegisteredRegion {
 public:
  static Result<std::unique_ptr<RegisteredRegion>> Allocate(UcxContext* context, uint64_t bytes);
  static Result<std::unique_ptr<RegisteredRegion>> Register(UcxContext* context, void* data,
                                                            uint64_t bytes);
  ~RegisteredRegion();
  RegisteredRegion(const RegisteredRegion&) = delete;
  RegisteredRegion& operator=(const RegisteredRegion&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& packed_key() const { return packed_key_; }

 private:
  static Result<std::unique_ptr<RegisteredRegion>> Map(UcxContext* context, void* data,
                                                       uint64_t bytes, bool allocate);
  RegisteredRegion(UcxContext* context, ucp_mem_h memh, uint8_t* data, uint64_t size,
                   std::string packed_key)
      : context_(context), memh_(memh), data_(data), size_(size),
        packed_key_(std::move(packed_key)) {}

  UcxContext* const context_;
  ucp_mem_h memh_;
  uint8_t* data_;
  uint64_t size_;
  std::string packed_key_;
};

}  // namespace pdserve::kvtransfer
