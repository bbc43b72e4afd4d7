// Standalone reproduction of an esp-check sweep finding (generated; see report.md).
// Calls esp-nn's C API directly: no esp-check, no TFLM. Build from the directory holding esp-nn/:
//   BUILD_LINE
// Exit status: 0 when both variants give the expected values, 1 when one does not.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "esp_nn_generic_opt.h" /* what esp-nn calls on ESP32/C3/C6 with CONFIG_NN_OPTIMIZED */

#if defined(__SANITIZE_ADDRESS__)
#define GUARD 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GUARD 0
#endif
#endif
#ifndef GUARD
#define GUARD 256 /* inputs are followed by 0x5A bytes: an out-of-bounds read is deterministic */
#endif

static void *input_copy(const void *src, size_t bytes) {
  char *p = (char *)malloc(bytes + GUARD > 0 ? bytes + GUARD : 1);
  memcpy(p, src, bytes);
  memset(p + bytes, 0x5A, GUARD);
  return p;
}

static int8_t *output(size_t n, int pattern) {
  int8_t *p = (int8_t *)malloc(n > 0 ? n : 1);
  memset(p, pattern, n > 0 ? n : 1);
  return p;
}

static int check(const char *name, const int8_t *got, const int8_t *want, int n, const char *what) {
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    if (got[i] != want[i]) {
      if (bad < ROWS) printf("  %-9s [%5d] %s: got %4d, expected %4d\n", name, i, what, got[i], want[i]);
      ++bad;
    }
  }
  printf("%s: %d of %d values differ from %s\n", name, bad, n, what);
  return bad != 0;
}
