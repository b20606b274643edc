#include "hub/checksum.h"

#include <openssl/evp.h>

#include "base/error.h"

namespace dspark {

struct Digest::State {
  EVP_MD_CTX* context = nullptr;
};

Digest::Digest(Kind kind, int64_t content_size)
    : kind_(kind), content_size_(content_size), state_(std::make_unique<State>()) {
  state_->context = EVP_MD_CTX_new();
  if (state_->context == nullptr) fail("OpenSSL: cannot allocate a digest context");
  reset();
}

Digest::~Digest() {
  EVP_MD_CTX_free(state_->context);
}

void Digest::reset() {
  const EVP_MD* algorithm = kind_ == Kind::kSha256 ? EVP_sha256() : EVP_sha1();
  if (EVP_DigestInit_ex(state_->context, algorithm, nullptr) != 1) {
    fail("OpenSSL: cannot start a digest");
  }
  if (kind_ == Kind::kGitBlobSha1) {
    const std::string header = "blob " + std::to_string(content_size_);
    update(header.c_str(), header.size() + 1);  // the header ends with its '\0'
  }
}

void Digest::update(const void* data, size_t size) {
  if (EVP_DigestUpdate(state_->context, data, size) != 1) fail("OpenSSL: digest update failed");
}

std::string Digest::hex() {
  unsigned char bytes[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(state_->context, bytes, &length) != 1) {
    fail("OpenSSL: digest finish failed");
  }
  static const char* kHex = "0123456789abcdef";
  std::string text;
  for (unsigned int i = 0; i < length; ++i) {
    text += kHex[bytes[i] >> 4];
    text += kHex[bytes[i] & 15];
  }
  return text;
}

std::string Digest::sha256_hex(const std::string& data) {
  Digest digest(Kind::kSha256);
  digest.update(data.data(), data.size());
  return digest.hex();
}

}  // namespace dspark
