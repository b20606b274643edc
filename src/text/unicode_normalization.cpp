#include "text/unicode_normalization.h"

#include <unicode/ucasemap.h>
#include <unicode/unorm2.h>
#include <unicode/uset.h>
#include <unicode/ustring.h>

#include <vector>

#include "base/error.h"

namespace dspark {
namespace {

void check(UErrorCode status, const char* what) {
  if (U_FAILURE(status)) fail("ICU {} failed: {}", what, u_errorName(status));
}

// One filtered normalizer per form, built once and shared (ICU normalizers are thread-safe).
class Normalizers {
 public:
  Normalizers() {
    UErrorCode status = U_ZERO_ERROR;
    // HF tokenizers' normalization tables are those of Unicode 9.0 (checked against its NFC of
    // characters from later versions); "age=9.0" is every code point assigned by 9.0.
    filter_ = uset_openPattern(u"[:age=9.0:]", -1, &status);
    check(status, "uset_openPattern([:age=9.0:])");
    uset_freeze(filter_);
    const UNormalizer2* bases[] = {unorm2_getNFCInstance(&status), unorm2_getNFDInstance(&status),
                                   unorm2_getNFKCInstance(&status),
                                   unorm2_getNFKDInstance(&status)};
    check(status, "unorm2_get*Instance");
    for (int i = 0; i < 4; ++i) {
      filtered_[i] = unorm2_openFiltered(bases[i], filter_, &status);
      check(status, "unorm2_openFiltered");
    }
  }
  ~Normalizers() {
    for (UNormalizer2* normalizer : filtered_) unorm2_close(normalizer);
    uset_close(filter_);
  }
  Normalizers(const Normalizers&) = delete;
  Normalizers& operator=(const Normalizers&) = delete;

  const UNormalizer2* get(NormalizationForm form) const {
    return filtered_[static_cast<int>(form)];
  }

 private:
  USet* filter_ = nullptr;
  UNormalizer2* filtered_[4] = {};
};

const Normalizers& normalizers() {
  static const Normalizers instance;
  return instance;
}

// Text that no form can change: pure ASCII, or for NFC anything below U+0300 (all such characters
// are NFC starters that never compose with what precedes them).
bool unchanged_by(std::string_view text, NormalizationForm form) {
  const unsigned char limit = form == NormalizationForm::kNfc ? 0xCC : 0x80;
  for (const char c : text) {
    if (static_cast<unsigned char>(c) >= limit) return false;
  }
  return true;
}

std::u16string to_utf16(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  int32_t length = 0;
  u_strFromUTF8(nullptr, 0, &length, text.data(), static_cast<int32_t>(text.size()), &status);
  if (status != U_BUFFER_OVERFLOW_ERROR) check(status, "u_strFromUTF8");
  std::u16string out(length, u'\0');
  status = U_ZERO_ERROR;
  u_strFromUTF8(out.data(), length, nullptr, text.data(), static_cast<int32_t>(text.size()),
                &status);
  check(status, "u_strFromUTF8");
  return out;
}

std::string to_utf8(const std::u16string& text) {
  UErrorCode status = U_ZERO_ERROR;
  int32_t length = 0;
  u_strToUTF8(nullptr, 0, &length, text.data(), static_cast<int32_t>(text.size()), &status);
  if (status != U_BUFFER_OVERFLOW_ERROR) check(status, "u_strToUTF8");
  std::string out(length, '\0');
  status = U_ZERO_ERROR;
  u_strToUTF8(out.data(), length, nullptr, text.data(), static_cast<int32_t>(text.size()), &status);
  check(status, "u_strToUTF8");
  return out;
}

}  // namespace

std::string unicode_normalize(std::string_view text, NormalizationForm form) {
  if (unchanged_by(text, form)) return std::string(text);
  const UNormalizer2* normalizer = normalizers().get(form);
  const std::u16string source = to_utf16(text);
  UErrorCode status = U_ZERO_ERROR;
  const auto source_length = static_cast<int32_t>(source.size());
  if (unorm2_isNormalized(normalizer, source.data(), source_length, &status) && U_SUCCESS(status)) {
    return std::string(text);
  }
  status = U_ZERO_ERROR;
  const int32_t length =
      unorm2_normalize(normalizer, source.data(), source_length, nullptr, 0, &status);
  if (status != U_BUFFER_OVERFLOW_ERROR) check(status, "unorm2_normalize");
  std::u16string result(length, u'\0');
  status = U_ZERO_ERROR;
  unorm2_normalize(normalizer, source.data(), source_length, result.data(), length, &status);
  check(status, "unorm2_normalize");
  return to_utf8(result);
}

std::string unicode_lowercase(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  UCaseMap* map = ucasemap_open("", 0, &status);
  check(status, "ucasemap_open");
  std::string out(text.size() + 16, '\0');
  int32_t length = ucasemap_utf8ToLower(map, out.data(), static_cast<int32_t>(out.size()),
                                        text.data(), static_cast<int32_t>(text.size()), &status);
  if (status == U_BUFFER_OVERFLOW_ERROR) {
    status = U_ZERO_ERROR;
    out.assign(length, '\0');
    length = ucasemap_utf8ToLower(map, out.data(), length, text.data(),
                                  static_cast<int32_t>(text.size()), &status);
  }
  ucasemap_close(map);
  check(status, "ucasemap_utf8ToLower");
  out.resize(length);
  return out;
}

}  // namespace dspark
