/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF, not mbedTLS): the one-shot mbedtls_sha256() with
 * mbedTLS's signature, implemented in src/sha256.c (SHA-256 only: is224 != 0 is refused). */
#pragma once
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif
#define MBEDTLS_ERR_SHA256_BAD_INPUT_DATA -0x0074
int mbedtls_sha256(const unsigned char *input, size_t ilen, unsigned char *output, int is224);
#ifdef __cplusplus
}
#endif
