#include "tokenizer/utf8.h"

#include <cstdio>
#include <cstring>

namespace pdserve::tokenizer {

namespace {
constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// Allowed range of the second byte for a given lead byte (RFC 3629 table); {0, 0} marks a
// byte that can never start a character.
struct LeadInfo {
  uint8_t length;
  uint8_t lower;
  uint8_t upper;
};

inline LeadInfo Lead(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Number of leading ASCII bytes of [p, p + n), eight at a time.
inline size_t AsciiPrefix(const char* p, size_t n) {
  size_t i = 0;
  while (i + 8 <= n) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    if (w & 0x8080808080808080ULL) break;
    i += 8;
  }
  while (i < n && static_cast<uint8_t>(p[i]) < 0x80) ++i;
  return i;
}
}  // namespace

size_t Utf8CharLength(std::string_view text, size_t pos) {
  if (pos >= text.size()) return 0;
  const LeadInfo info = Lead(static_cast<uint8_t>(text[pos]));
  if (info.length <= 1) return info.length;
  if (pos + info.length > text.size()) return 0;
  const uint8_t second = static_cast<uint8_t>(text[pos + 1]);
  if (second < info.lower || second > info.upper) return 0;
  for (size_t k = 2; k < info.length; ++k) {
    const uint8_t c = static_cast<uint8_t>(text[pos + k]);
    if (c < 0x80 || c > 0xBF) return 0;
  }
  return info.length;
}

Status ValidateUtf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    pos += AsciiPrefix(text.data() + pos, text.size() - pos);
    if (pos >= text.size()) break;
    const size_t len = Utf8CharLength(text, pos);
    if (len == 0) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", static_cast<uint8_t>(text[pos]));
      return Status::InvalidArgument("text is not valid UTF-8: bad byte " + std::string(hex) +
                                     " at offset " + std::to_string(pos));
    }
    pos += len;
  }
  return Status::Ok();
}

char32_t DecodeUtf8Char(std::string_view text, size_t* pos) {
  const uint8_t b0 = static_cast<uint8_t>(text[*pos]);
  if (b0 < 0x80) {
    ++*pos;
    return b0;
  }
  const size_t len = b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4;
  char32_t cp = b0 & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(text[*pos + k]) & 0x3F);
  *pos += len;
  return cp;
}

bool IsEcmaScriptSpace(char32_t c) {
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000: case 0xFEFF:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

void Utf8LossyDecoder::Reset() {
  needed_ = 0;
  lower_ = 0x80;
  upper_ = 0xBF;
  held_len_ = 0;
}

void Utf8LossyDecoder::Feed(std::string_view bytes, std::string* out) {
  size_t i = 0;
  const size_t n = bytes.size();
  while (i < n) {
    if (needed_ == 0) {
      // Copy runs of complete characters straight through; only a sequence cut by the end of
      // `bytes` or an invalid byte needs the byte-at-a-time state machine below.
      const size_t start = i;
      while (i < n) {
        i += AsciiPrefix(bytes.data() + i, n - i);
        if (i >= n) break;
        const size_t len = Utf8CharLength(bytes, i);
        if (len == 0) break;
        i += len;
      }
      out->append(bytes.data() + start, i - start);
      if (i >= n) break;
      const uint8_t b = static_cast<uint8_t>(bytes[i]);
      const LeadInfo info = Lead(b);
      if (info.length == 0) {
        out->append(kReplacement);
        ++i;
        continue;
      }
      needed_ = info.length - 1;
      lower_ = info.lower;
      upper_ = info.upper;
      held_[0] = static_cast<char>(b);
      held_len_ = 1;
      ++i;
      continue;
    }
    const uint8_t b = static_cast<uint8_t>(bytes[i]);
    if (b < lower_ || b > upper_) {
      // The held bytes are a maximal invalid subpart: one U+FFFD, then `b` starts afresh.
      Reset();
      out->append(kReplacement);
      continue;
    }
    held_[held_len_++] = static_cast<char>(b);
    lower_ = 0x80;
    upper_ = 0xBF;
    ++i;
    if (--needed_ == 0) {
      out->append(held_, held_len_);
      held_len_ = 0;
    }
  }
}

void Utf8LossyDecoder::Finish(std::string* out) {
  if (needed_ != 0) out->append(kReplacement);
  Reset();
}

std::string DecodeUtf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  Utf8LossyDecoder decoder;
  decoder.Feed(bytes, &out);
  decoder.Finish(&out);
  return out;
}

}  // namespace pdserve::tokenizer
