#include "comm/mpi_datatype.h"

#include <climits>
#include <utility>

#include <fmt/format.h>

#include "comm/mpi_status.h"

namespace pdserve::comm {

MpiDatatype::~MpiDatatype() { Reset(); }

MpiDatatype::MpiDatatype(MpiDatatype&& other) noexcept
    : type_(std::exchange(other.type_, MPI_DATATYPE_NULL)),
      bytes_(std::exchange(other.bytes_, 0)) {}

MpiDatatype& MpiDatatype::operator=(MpiDatatype&& other) noexcept {
  if (this != &other) {
    Reset();
    type_ = std::exchange(other.type_, MPI_DATATYPE_NULL);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void MpiDatatype::Reset() {
  if (type_ == MPI_DATATYPE_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Type_free(&type_);
  type_ = MPI_DATATYPE_NULL;
  bytes_ = 0;
}

Result<MpiDatatype> MpiDatatype::Bytes(size_t bytes) {
  if (bytes == 0 || bytes > static_cast<size_t>(INT_MAX)) {
    return Status::InvalidArgument(fmt::format("MPI record size {} B out of range", bytes));
  }
  MpiDatatype out;
  PDSERVE_MPI_RETURN_IF_ERROR(MPI_Type_contiguous(static_cast<int>(bytes), MPI_BYTE, &out.type_),
                              "MPI_Type_contiguous");
  out.bytes_ = bytes;
  PDSERVE_MPI_RETURN_IF_ERROR(MPI_Type_commit(&out.type_), "MPI_Type_commit");
  return out;
}

}  // namespace pdserve::comm
