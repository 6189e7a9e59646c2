// MpiDatatype: an owned, committed MPI datatype of fixed-size opaque records (a contiguous run
// of bytes), freed in the destructor; move-only.
//
// comm/ counts messages in records rather than bytes: MPI counts and displacements are `int`,
// and a byte count of a large all-to-all (tokens x hidden x 4 B) would overflow long before a
// record count does.
//
// Threading: immutable after creation. REQUIRES: destroyed before MPI_Finalize.
#pragma once

#include <mpi.h>

#include <cstddef>

#include "common/status.h"

namespace pdserve::comm {

class MpiDatatype {
 public:
  MpiDatatype() = default;
  ~MpiDatatype();
  MpiDatatype(MpiDatatype&& other) noexcept;
  MpiDatatype& operator=(MpiDatatype&& other) noexcept;
  MpiDatatype(const MpiDatatype&) = delete;
  MpiDatatype& operator=(const MpiDatatype&) = delete;

  // A record of `bytes` bytes. Errors: kInvalidArgument if bytes is 0 or above INT_MAX.
  static Result<MpiDatatype> Bytes(size_t bytes);

  MPI_Datatype get() const { return type_; }
  size_t record_bytes() const { return bytes_; }

 private:
  void Reset();
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  size_t bytes_ = 0;
};

}  // namespace pdserve::comm
