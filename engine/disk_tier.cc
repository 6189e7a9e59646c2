#include "engine/disk_tier.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "common/check.h"
#include "common/logging.h"

namespace pdserve::engine {

// The header is copied as host bytes; the format says little-endian.
static_assert(std::endian::native == std::endian::little, "the disk tier's file format assumes a little-endian host");

namespace {

constexpr char kMagic[8] = {'P', 'D', 'K', 'V', 'T', 'I', 'E', 'R'};
constexpr size_t kChecksumOffset = 96;
constexpr std::string_view kSuffix = ".kvblock";
constexpr std::string_view kTempSuffix = ".kvblock.tmp";

template <typename T>
void Put(uint8_t* header, size_t offset, T v) {
  std::memcpy(header + offset, &v, sizeof(T));
}

template <typename T>
T Get(const uint8_t* header, size_t offset) {
  T v;
  std::memcpy(&v, header + offset, sizeof(T));
  return v;
}

std::string ErrnoText(int err) { return std::error_code(err, std::generic_category()).message(); }

// Writes all of [data, data + n) (write may write less than asked).
Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::Internal("disk tier: write failed: " + ErrnoText(errno), path);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

// Reads exactly n bytes; a file that ends first is DataLoss (truncated).
Status ReadAll(int fd, void* data, size_t n, const std::string& path) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::DataLoss("disk tier: read failed: " + ErrnoText(errno), path);
    }
    if (r == 0) return Status::DataLoss("disk tier: file ends early (truncated)", path);
    p += r;
    n -= static_cast<size_t>(r);
  }
  return Status::Ok();
}

bool IsTierFile(const std::filesystem::path& p) {
  const std::string name = p.filename().string();
  return name.ends_with(kSuffix) || name.ends_with(kTempSuffix);
}

}  // namespace

DiskTier::Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Result<std::unique_ptr<DiskTier>> DiskTier::Create(const DiskTierOptions& options, const KvLayout& layout,
                                                   uint64_t ns) {
  if (options.dir.empty()) return Status::InvalidArgument("disk tier: empty directory");
  PDSERVE_RETURN_IF_ERROR(layout.Validate());
  const int64_t file = static_cast<int64_t>(kHeaderBytes + 4 * layout.tokens_per_block + layout.BlockBytes());
  if (options.max_bytes < file)
    return Status::InvalidArgument(fmt::format("disk tier: max bytes {} below one block file ({} bytes)",
                                               options.max_bytes, file));
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) return Status::Internal("disk tier: cannot create the directory: " + ec.message(), options.dir);
  const std::string lock_path = options.dir + "/LOCK";
  Fd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!lock.valid()) return Status::Internal("disk tier: cannot open " + lock_path + ": " + ErrnoText(errno));
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0)
    return Status::FailedPrecondition("disk tier: the directory is in use by another tier (" + lock_path +
                                      " is locked)", options.dir);
  // Blocks an earlier run left: their index is gone with that process.
  int64_t removed = 0;
  for (std::filesystem::directory_iterator it(options.dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file() && IsTierFile(it->path())) {
      std::error_code rm;
      if (std::filesystem::remove(it->path(), rm)) ++removed;
    }
  }
  if (ec) return Status::Internal("disk tier: cannot list the directory: " + ec.message(), options.dir);
  if (removed > 0) GetLogger("engine")->info("disk tier: deleted {} block files of an earlier run in {}", removed, options.dir);
  return std::unique_ptr<DiskTier>(new DiskTier(options, layout, ns, std::move(lock)));
}

DiskTier::DiskTier(const DiskTierOptions& options, const KvLayout& layout, uint64_t ns, Fd lock)
    : dir_(options.dir),
      max_bytes_(options.max_bytes),
      layout_(layout),
      ns_(ns),
      kv_bytes_(static_cast<int64_t>(layout.BlockBytes())),
      file_bytes_(static_cast<int64_t>(kHeaderBytes + 4 * layout.tokens_per_block + layout.BlockBytes())),
      lock_(std::move(lock)) {}

DiskTier::~DiskTier() {
  for (const auto& [hash, e] : index_) {
    std::error_code ec;
    std::filesystem::remove(PathOf(hash), ec);
  }
}

std::string DiskTier::FileName(uint64_t hash) { return fmt::format("{:016x}{}", hash, kSuffix); }

std::string DiskTier::PathOf(uint64_t hash) const { return dir_ + "/" + FileName(hash); }

void DiskTier::MakeMostRecent(Entry* e) { lru_.splice(lru_.end(), lru_, e->lru); }

bool DiskTier::Touch(uint64_t hash, uint64_t uid) {
  auto it = index_.find(hash);
  if (it == index_.end() || it->second.uid != uid) return false;
  MakeMostRecent(&it->second);
  return true;
}

std::vector<uint64_t> DiskTier::Hashes() const {
  std::vector<uint64_t> out;
  out.reserve(index_.size());
  for (const auto& [hash, e] : index_) out.push_back(hash);
  return out;
}

void DiskTier::Drop(uint64_t hash) {
  auto it = index_.find(hash);
  if (it == index_.end()) return;
  lru_.erase(it->second.lru);
  index_.erase(it);
  dropped_.push_back(hash);
  std::error_code ec;
  std::filesystem::remove(PathOf(hash), ec);
  --stats_.blocks;
  stats_.bytes -= file_bytes_;
}

void DiskTier::FillHeader(const TierBlockId& id, uint8_t* h) const {
  std::memset(h, 0, kHeaderBytes);
  std::memcpy(h, kMagic, sizeof(kMagic));
  Put<uint32_t>(h, 8, kVersion);
  Put<uint32_t>(h, 12, static_cast<uint32_t>(kHeaderBytes));
  Put<uint64_t>(h, 16, ns_);
  Put<uint64_t>(h, 24, id.hash);
  Put<uint64_t>(h, 32, id.uid);
  Put<uint64_t>(h, 40, id.parent_uid);
  Put<uint32_t>(h, 48, layout_.num_layers);
  Put<uint32_t>(h, 52, layout_.kv_lora_rank);
  Put<uint32_t>(h, 56, layout_.qk_rope_head_dim);
  Put<uint32_t>(h, 60, layout_.index_head_dim);
  Put<uint32_t>(h, 64, layout_.tokens_per_block);
  Put<uint32_t>(h, 68, layout_.latent_scale_group);
  Put<uint8_t>(h, 72, static_cast<uint8_t>(layout_.latent_format));
  Put<uint8_t>(h, 73, static_cast<uint8_t>(layout_.index_format));
  Put<uint32_t>(h, 80, layout_.tokens_per_block);
  Put<uint64_t>(h, 88, static_cast<uint64_t>(kv_bytes_));
}

namespace {

// XXH3-64 of header (checksum field zero) | tokens | kv.
uint64_t Checksum(const uint8_t* header, std::span<const int32_t> tokens, const uint8_t* kv, size_t kv_bytes) {
  XXH3_state_t* st = XXH3_createState();
  PDSERVE_CHECK(st != nullptr, "XXH3_createState");
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, header, DiskTier::kHeaderBytes);
  XXH3_64bits_update(st, tokens.data(), tokens.size_bytes());
  XXH3_64bits_update(st, kv, kv_bytes);
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

}  // namespace

Status DiskTier::WriteFile(const TierBlockId& id, const uint8_t* kv) {
  std::array<uint8_t, kHeaderBytes> header;
  FillHeader(id, header.data());
  Put<uint64_t>(header.data(), kChecksumOffset, Checksum(header.data(), id.tokens, kv, static_cast<size_t>(kv_bytes_)));
  const std::string path = PathOf(id.hash);
  const std::string tmp = path + ".tmp";
  {
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.valid()) return Status::Internal("disk tier: cannot create a file: " + ErrnoText(errno), tmp);
    Status s = WriteAll(fd.get(), header.data(), header.size(), tmp);
    if (s.ok()) s = WriteAll(fd.get(), id.tokens.data(), id.tokens.size_bytes(), tmp);
    if (s.ok()) s = WriteAll(fd.get(), kv, static_cast<size_t>(kv_bytes_), tmp);
    if (!s.ok()) {
      ::unlink(tmp.c_str());
      return s;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return Status::Internal("disk tier: rename failed: " + ErrnoText(err), path);
  }
  return Status::Ok();
}

Status DiskTier::Store(const TierBlockId& id, const uint8_t* kv) {
  PDSERVE_CHECK(id.tokens.size() == layout_.tokens_per_block, "disk tier: storing a block that is not full");
  if (Touch(id.hash, id.uid)) return Status::Ok();
  Drop(id.hash);  // another content under this name (a collision, or an orphan): replaced
  while (!lru_.empty() && stats_.bytes + file_bytes_ > max_bytes_) {
    Drop(lru_.front());
    ++stats_.evictions;
  }
  if (Status s = WriteFile(id, kv); !s.ok()) {
    // A full or broken disk fails every store: warn at the 1st, 2nd, 4th, 8th... failure.
    const int64_t n = ++stats_.write_errors;
    if ((n & (n - 1)) == 0)
      GetLogger("engine")->warn("disk tier: block {:016x} not stored ({} failed stores so far): {}", id.hash, n,
                                s.ToString());
    return s;
  }
  Entry e;
  e.uid = id.uid;
  e.parent_uid = id.parent_uid;
  e.tokens.assign(id.tokens.begin(), id.tokens.end());
  e.lru = lru_.insert(lru_.end(), id.hash);
  index_.emplace(id.hash, std::move(e));
  ++stats_.blocks;
  stats_.bytes += file_bytes_;
  ++stats_.stored_blocks;
  stats_.stored_bytes += file_bytes_;
  return Status::Ok();
}

std::optional<uint64_t> DiskTier::Find(uint64_t hash, uint64_t parent_uid, std::span<const int32_t> tokens) {
  auto it = index_.find(hash);
  if (it == index_.end()) return std::nullopt;
  Entry& e = it->second;
  if (e.parent_uid != parent_uid || !std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin(), tokens.end()))
    return std::nullopt;
  MakeMostRecent(&e);
  return e.uid;
}

Status DiskTier::ReadAndCheck(uint64_t hash, const Entry& e, uint8_t* kv) const {
  const std::string path = PathOf(hash);
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::DataLoss("disk tier: cannot open the file: " + ErrnoText(errno), path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::DataLoss("disk tier: fstat failed: " + ErrnoText(errno), path);
  if (st.st_size != file_bytes_)
    return Status::DataLoss(fmt::format("disk tier: file has {} bytes, a block file has {}", st.st_size, file_bytes_),
                            path);
  std::array<uint8_t, kHeaderBytes> header;
  PDSERVE_RETURN_IF_ERROR(ReadAll(fd.get(), header.data(), header.size(), path));
  const uint64_t stored_sum = Get<uint64_t>(header.data(), kChecksumOffset);
  Put<uint64_t>(header.data(), kChecksumOffset, 0);
  // Every header field must be what this tier writes for this entry: the namespace and the
  // layout (another engine's file), the name and the chain (another block's file).
  std::array<uint8_t, kHeaderBytes> expected;
  FillHeader(TierBlockId{hash, e.uid, e.parent_uid, e.tokens}, expected.data());
  if (header != expected) {
    const char* what = std::memcmp(header.data(), kMagic, sizeof(kMagic)) != 0 ? "not a block file (magic)"
                       : Get<uint64_t>(header.data(), 16) != ns_         ? "another namespace"
                       : std::memcmp(header.data() + 48, expected.data() + 48, 48) != 0 ? "another KV layout"
                       : std::memcmp(header.data() + 24, expected.data() + 24, 24) != 0 ? "another block (hash, uid or parent)"
                                                                                        : "a bad header";
    return Status::DataLoss(std::string("disk tier: the file holds ") + what, path);
  }
  std::vector<int32_t> tokens(layout_.tokens_per_block);
  PDSERVE_RETURN_IF_ERROR(ReadAll(fd.get(), tokens.data(), tokens.size() * sizeof(int32_t), path));
  if (tokens != e.tokens) return Status::DataLoss("disk tier: the file holds other tokens", path);
  PDSERVE_RETURN_IF_ERROR(ReadAll(fd.get(), kv, static_cast<size_t>(kv_bytes_), path));
  const uint64_t sum = Checksum(header.data(), tokens, kv, static_cast<size_t>(kv_bytes_));
  if (sum != stored_sum)
    return Status::DataLoss(fmt::format("disk tier: checksum {:016x}, the file says {:016x}", sum, stored_sum), path);
  return Status::Ok();
}

Status DiskTier::Load(uint64_t hash, uint64_t uid, uint8_t* kv) {
  auto it = index_.find(hash);
  if (it == index_.end() || it->second.uid != uid)
    return Status::NotFound(fmt::format("disk tier: block {:016x} uid {} not held", hash, uid));
  if (Status s = ReadAndCheck(hash, it->second, kv); !s.ok()) {
    ++stats_.corrupt;
    GetLogger("engine")->warn("disk tier: dropping block {:016x}: {} (the prefix is computed from here)", hash,
                              s.ToString());
    Drop(hash);
    return s;
  }
  MakeMostRecent(&it->second);
  ++stats_.restored_blocks;
  return Status::Ok();
}

}  // namespace pdserve::engine
