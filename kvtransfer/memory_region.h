// Memory regions seen by a Transport: a LocalRegion is memory this process registered (peers
// may write into it); a RemoteRegionDesc is what a peer needs to address such a region (base
// address, length and the packed remote key). RangeWithin is the one overflow-safe bounds
// check every write path uses before touching remote memory.
//
// Thread-safety: RemoteRegionDesc is a value type. LocalRegion accessors are const and may be
// called from any thread; destroying a LocalRegion unregisters it (see Transport for when
// that is allowed).
#pragma once

#include <cstdint>
#include <string>

namespace pdserve::kvtransfer {

// Where a peer's registered memory is, and the key to write into it.
struct RemoteRegionDesc {
  uint64_t base_address = 0;
  uint64_t length = 0;
  std::string packed_key;  // opaque to everything but the transport backend

  bool operator==(const RemoteRegionDesc&) const = default;
};

// True when [address, address + length) lies inside [base, base + region_length), computed
// without overflow (a range that wraps around 2^64 is never inside). Empty ranges are inside
// when address lies in [base, base + region_length].
constexpr bool RangeWithin(uint64_t address, uint64_t length, uint64_t base,
                           uint64_t region_length) {
  if (address < base) return false;
  const uint64_t offset = address - base;
  if (offset > region_length) return false;
  return length <= region_length - offset;
}

// Memory registered with a transport. Move-only owner: the destructor unregisters it.
// REQUIRES: no peer may still be writing into it when it is destroyed (flush or close the
// endpoints first; KvReceiver guarantees this for its blocks).
class LocalRegion {
 public:
  virtual ~LocalRegion() = default;
  LocalRegion() = default;
  LocalRegion(const LocalRegion&) = delete;
  LocalRegion& operator=(const LocalRegion&) = delete;

  virtual uint8_t* data() const = 0;
  virtual uint64_t size() const = 0;
  // Handed to peers (inside a KvDescriptor) so they can write into this region.
  virtual const RemoteRegionDesc& remote_desc() const = 0;
};

}  // namespace pdserve::kvtransfer
