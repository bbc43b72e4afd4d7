/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF): esp_mmu_vaddr_to_paddr for the
 * EXT_RAM_NOINIT_ATTR section (esp_attr.h), whose "physical address" is the offset in that section. */
#pragma once
#include <stdint.h>
#include "esp_err.h"
#ifdef __cplusplus
extern "C" {
#endif
typedef uint32_t esp_paddr_t;
typedef enum { MMU_TARGET_FLASH0 = 1 << 0, MMU_TARGET_PSRAM0 = 1 << 1 } mmu_target_t; /* ESP-IDF's values */
esp_err_t esp_mmu_vaddr_to_paddr(void *vaddr, esp_paddr_t *out_paddr, mmu_target_t *out_target);
#ifdef __cplusplus
}
#endif
