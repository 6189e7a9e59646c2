#include "grammar/utf8_ranges.h"

namespace pdserve::grammar {

namespace {

int EncodedLength(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void Encode(uint32_t cp, uint8_t* b) {
  switch (EncodedLength(cp)) {
    case 1: b[0] = static_cast<uint8_t>(cp); break;
    case 2:
      b[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
      b[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    case 3:
      b[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
      b[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      b[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    default:
      b[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
      b[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
      b[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      b[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
  }
}

void Split(uint32_t lo, uint32_t hi, std::vector<Utf8Sequence>* out) {
  // Different encoded lengths: cut at the length boundaries first.
  static constexpr uint32_t kMaxOfLength[] = {0x7F, 0x7FF, 0xFFFF};
  for (uint32_t boundary : kMaxOfLength) {
    if (lo <= boundary && hi > boundary) {
      Split(lo, boundary, out);
      Split(boundary + 1, hi, out);
      return;
    }
  }
  const int n = EncodedLength(lo);
  // Same length: cut until every continuation byte spans a full or aligned sub-range.
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Split(lo, lo | m, out);
        Split((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Split(lo, (hi & ~m) - 1, out);
        Split(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  Encode(lo, a);
  Encode(hi, b);
  Utf8Sequence seq;
  for (int i = 0; i < n; ++i) seq.push_back({a[i], b[i]});
  out->push_back(std::move(seq));
}

}  // namespace

void AppendUtf8(uint32_t cp, std::string* out) {
  uint8_t b[4];
  Encode(cp, b);
  out->append(reinterpret_cast<const char*>(b), static_cast<size_t>(EncodedLength(cp)));
}

int DecodeUtf8(std::string_view s, uint32_t* cp) {
  if (s.empty()) return 0;
  const uint8_t b0 = static_cast<uint8_t>(s[0]);
  int n;
  uint32_t v;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2, v = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3, v = b0 & 0x0F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4, v = b0 & 0x07;
  } else {
    return 0;
  }
  if (s.size() < static_cast<size_t>(n)) return 0;
  for (int i = 1; i < n; ++i) {
    const uint8_t b = static_cast<uint8_t>(s[static_cast<size_t>(i)]);
    if ((b & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b & 0x3F);
  }
  // Shortest form, no surrogates, in range.
  if ((n == 3 && v < 0x800) || (n == 4 && (v < 0x10000 || v > kMaxCodepoint)) || (v >= 0xD800 && v <= 0xDFFF))
    return 0;
  *cp = v;
  return n;
}

std::vector<Utf8Sequence> Utf8Sequences(CharRange r) {
  std::vector<Utf8Sequence> out;
  Split(r.lo, r.hi, &out);
  return out;
}

}  // namespace pdserve::grammar
