/* ESP-IDF STAND-INS for esp-check's native target (not ESP-IDF): partitions, mmap, otadata and restart
 * on the native board's flash. See ../README.md.
 *
 * The native board (harness/device/protocol_native.py) keeps its flash as one image file, written by
 * its "flash" at the offsets esptool would use, and the app slots' host programs beside it (a host
 * program does not fit a chip's slot). Its boot stand-in reads the partition table and otadata, starts
 * the selected slot's program and tells it, in the environment:
 *   ESP_CHECK_NATIVE_FLASH         the flash image file
 *   ESP_CHECK_NATIVE_TABLE_OFFSET  where the partition table is (CONFIG_PARTITION_TABLE_OFFSET)
 *   ESP_CHECK_NATIVE_APP_OFFSET    the offset of the app slot this program was started from
 *   ESP_CHECK_NATIVE_BOARD_DIR     the board's directory (apps/<offset> programs, the restart marker)
 * Without them (a program run by hand) no partition is found: the firmware reports its model missing. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "esp_ota_ops.h"
#include "esp_partition.h"
#include "esp_system.h"
#include "mbedtls/sha256.h"

#define MAX_PARTITIONS 95 /* ESP-IDF's table: 0xC00 bytes of 32-byte rows */
#define TABLE_BYTES 0xC00
#define MAX_MAPS 8
#define OTA_SECTOR 0x1000

static esp_partition_t g_parts[MAX_PARTITIONS];
static int g_nparts = -1;
static struct {
    void *base;
    size_t len;
} g_maps[MAX_MAPS];

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

static long env_offset(const char *name) {
    const char *v = env(name);
    if (v == NULL) return -1;
    char *end = NULL;
    long off = strtol(v, &end, 0);
    return end != NULL && *end == '\0' && off >= 0 ? off : -1;
}

static int flash_open(int flags) {
    const char *path = env("ESP_CHECK_NATIVE_FLASH");
    return path == NULL ? -1 : open(path, flags);
}

static int flash_pread(int fd, void *dst, size_t size, long offset) {
    size_t done = 0;
    while (done < size) {
        ssize_t n = pread(fd, (uint8_t *)dst + done, size - done, (off_t)(offset + (long)done));
        if (n <= 0) return -1;
        done += (size_t)n;
    }
    return 0;
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* The binary partition table: 32-byte rows starting AA 50, until the first other row. */
static void load_table(void) {
    if (g_nparts >= 0) return;
    g_nparts = 0;
    long off = env_offset("ESP_CHECK_NATIVE_TABLE_OFFSET");
    int fd = flash_open(O_RDONLY);
    if (fd < 0 || off < 0) {
        if (fd >= 0) close(fd);
        return;
    }
    static uint8_t table[TABLE_BYTES];
    if (flash_pread(fd, table, sizeof(table), off) != 0) memset(table, 0xFF, sizeof(table));
    close(fd);
    for (int k = 0; k < MAX_PARTITIONS; ++k) {
        const uint8_t *row = table + 32 * k;
        if (row[0] != 0xAA || row[1] != 0x50) break;
        esp_partition_t *p = &g_parts[g_nparts++];
        memset(p, 0, sizeof(*p));
        p->type = (esp_partition_type_t)row[2];
        p->subtype = (esp_partition_subtype_t)row[3];
        p->address = le32(row + 4);
        p->size = le32(row + 8);
        p->erase_size = 0x1000;
        memcpy(p->label, row + 12, 16);
        p->label[16] = '\0';
    }
}

const esp_partition_t *esp_partition_find_first(esp_partition_type_t type, esp_partition_subtype_t subtype,
                                                const char *label) {
    load_table();
    for (int k = 0; k < g_nparts; ++k) {
        const esp_partition_t *p = &g_parts[k];
        if (type != ESP_PARTITION_TYPE_ANY && p->type != type) continue;
        if (subtype != ESP_PARTITION_SUBTYPE_ANY && p->subtype != subtype) continue;
        if (label != NULL && strncmp(p->label, label, 16) != 0) continue;
        return p;
    }
    return NULL;
}

esp_err_t esp_partition_read(const esp_partition_t *partition, size_t src_offset, void *dst, size_t size) {
    if (partition == NULL || dst == NULL || src_offset > partition->size || size > partition->size - src_offset) {
        return ESP_ERR_INVALID_ARG;
    }
    int fd = flash_open(O_RDONLY);
    if (fd < 0) return ESP_FAIL;
    int r = flash_pread(fd, dst, size, (long)(partition->address + src_offset));
    close(fd);
    return r == 0 ? ESP_OK : ESP_FAIL;
}

esp_err_t esp_partition_mmap(const esp_partition_t *partition, size_t offset, size_t size,
                             esp_partition_mmap_memory_t memory, const void **out_ptr,
                             esp_partition_mmap_handle_t *out_handle) {
    (void)memory;
    if (partition == NULL || out_ptr == NULL || out_handle == NULL || offset > partition->size ||
        size > partition->size - offset) {
        return ESP_ERR_INVALID_ARG;
    }
    int slot = 0;
    while (slot < MAX_MAPS && g_maps[slot].base != NULL) ++slot;
    if (slot == MAX_MAPS) return ESP_ERR_NO_MEM;
    int fd = flash_open(O_RDONLY);
    if (fd < 0) return ESP_FAIL;
    struct stat st;
    const size_t start = partition->address + offset;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < start + size) { /* beyond the chip's flash */
        close(fd);
        return ESP_ERR_INVALID_SIZE;
    }
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t delta = start % page;
    void *base = mmap(NULL, size + delta, PROT_READ, MAP_SHARED, fd, (off_t)(start - delta));
    close(fd);
    if (base == MAP_FAILED) return ESP_ERR_NO_MEM;
    g_maps[slot].base = base;
    g_maps[slot].len = size + delta;
    *out_ptr = (const uint8_t *)base + delta;
    *out_handle = (esp_partition_mmap_handle_t)(slot + 1);
    return ESP_OK;
}

void esp_partition_munmap(esp_partition_mmap_handle_t handle) {
    if (handle == 0 || handle > MAX_MAPS || g_maps[handle - 1].base == NULL) return;
    munmap(g_maps[handle - 1].base, g_maps[handle - 1].len);
    g_maps[handle - 1].base = NULL;
}

const esp_partition_t *esp_ota_get_running_partition(void) {
    load_table();
    long off = env_offset("ESP_CHECK_NATIVE_APP_OFFSET");
    for (int k = 0; k < g_nparts; ++k) {
        if (g_parts[k].type == ESP_PARTITION_TYPE_APP && (long)g_parts[k].address == off) return &g_parts[k];
    }
    return NULL;
}

/* As ESP-IDF: the next OTA app slot after start_from (NULL: the running one), round robin; never start_from. */
const esp_partition_t *esp_ota_get_next_update_partition(const esp_partition_t *start_from) {
    load_table();
    if (start_from == NULL) start_from = esp_ota_get_running_partition();
    int at = -1, first = -1;
    for (int k = 0; k < g_nparts; ++k) {
        const esp_partition_t *p = &g_parts[k];
        if (p->type != ESP_PARTITION_TYPE_APP || p->subtype < ESP_PARTITION_SUBTYPE_APP_OTA_MIN ||
            p->subtype > ESP_PARTITION_SUBTYPE_APP_OTA_MAX) {
            continue;
        }
        if (first < 0) first = k;
        if (start_from != NULL && p->address == start_from->address) {
            at = k;
        } else if (at >= 0) {
            return p; /* the next OTA slot after the running one */
        }
    }
    if (first < 0 || (start_from != NULL && g_parts[first].address == start_from->address)) return NULL;
    return &g_parts[first];
}

/* SHA-256 of a whole file (at most 256 MB), 0 on success. */
static int file_sha256(const char *path, uint8_t out[32]) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= 0 || st.st_size > (off_t)(256L << 20)) {
        close(fd);
        return -1;
    }
    uint8_t *buf = (uint8_t *)malloc((size_t)st.st_size);
    int r = buf == NULL ? -1 : flash_pread(fd, buf, (size_t)st.st_size, 0);
    close(fd);
    if (r == 0) r = mbedtls_sha256(buf, (size_t)st.st_size, out, 0) == 0 ? 0 : -1;
    free(buf);
    return r;
}

/* As ESP-IDF's esp_partition_get_sha256: for an app slot what ESP-IDF reports for an image (its appended
 * SHA-256) is here the SHA-256 of the host program the slot holds (apps/0x<offset>), ESP_ERR_IMAGE_INVALID
 * when it holds none; any other partition: the SHA-256 of all its bytes. */
esp_err_t esp_partition_get_sha256(const esp_partition_t *partition, uint8_t *sha_256) {
    if (partition == NULL || sha_256 == NULL || partition->size == 0) return ESP_ERR_INVALID_ARG;
    if (partition->type == ESP_PARTITION_TYPE_APP) {
        const char *dir = env("ESP_CHECK_NATIVE_BOARD_DIR");
        char path[4096];
        if (dir == NULL || snprintf(path, sizeof(path), "%s/apps/0x%x", dir, (unsigned)partition->address) >= (int)sizeof(path)) {
            return ESP_ERR_IMAGE_INVALID;
        }
        return file_sha256(path, sha_256) == 0 ? ESP_OK : ESP_ERR_IMAGE_INVALID;
    }
    uint8_t *buf = (uint8_t *)malloc(partition->size);
    esp_err_t err = buf == NULL ? ESP_ERR_NO_MEM : esp_partition_read(partition, 0, buf, partition->size);
    if (err == ESP_OK && mbedtls_sha256(buf, partition->size, sha_256, 0) != 0) err = ESP_FAIL;
    free(buf);
    return err;
}

/* ESP-IDF's otadata CRC: esp_rom_crc32_le(UINT32_MAX, &seq, 4). */
static uint32_t ota_crc(uint32_t seq) {
    uint32_t crc = 0; /* ~UINT32_MAX */
    for (int b = 0; b < 4; ++b) {
        crc ^= (seq >> (8 * b)) & 0xFFu;
        for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

static int app_present(uint32_t address) {
    const char *dir = env("ESP_CHECK_NATIVE_BOARD_DIR");
    if (dir == NULL) return 0;
    char path[4096];
    if (snprintf(path, sizeof(path), "%s/apps/0x%x", dir, (unsigned)address) >= (int)sizeof(path)) return 0;
    return access(path, X_OK) == 0;
}

/* As ESP-IDF: validate the image in the slot, then write a new otadata entry (the next sequence number
 * that selects this slot) into the sector that does not hold the active entry. */
esp_err_t esp_ota_set_boot_partition(const esp_partition_t *partition) {
    if (partition == NULL || partition->type != ESP_PARTITION_TYPE_APP) return ESP_ERR_INVALID_ARG;
    if (!app_present(partition->address)) return ESP_ERR_OTA_VALIDATE_FAILED;
    const esp_partition_t *ota = esp_partition_find_first(ESP_PARTITION_TYPE_DATA, ESP_PARTITION_SUBTYPE_DATA_OTA, NULL);
    if (partition->subtype < ESP_PARTITION_SUBTYPE_APP_OTA_MIN || partition->subtype > ESP_PARTITION_SUBTYPE_APP_OTA_MAX) {
        return ota == NULL ? ESP_OK : ESP_ERR_INVALID_ARG; /* factory: ESP-IDF erases otadata; not needed here */
    }
    if (ota == NULL || ota->size < 2 * OTA_SECTOR) return ESP_ERR_NOT_FOUND;
    uint32_t n_apps = 0;
    for (int k = 0; k < g_nparts; ++k) {
        if (g_parts[k].type == ESP_PARTITION_TYPE_APP && g_parts[k].subtype >= ESP_PARTITION_SUBTYPE_APP_OTA_MIN &&
            g_parts[k].subtype <= ESP_PARTITION_SUBTYPE_APP_OTA_MAX) {
            ++n_apps;
        }
    }
    const uint32_t slot = (uint32_t)partition->subtype - ESP_PARTITION_SUBTYPE_APP_OTA_MIN;
    if (n_apps != 0 && slot >= n_apps) return ESP_ERR_INVALID_ARG; /* as ESP-IDF: no sequence number selects it */
    int fd = flash_open(O_RDWR);
    if (fd < 0 || n_apps == 0) {
        if (fd >= 0) close(fd);
        return ESP_FAIL;
    }
    uint32_t top = 0;
    int active = -1;
    for (int s = 0; s < 2; ++s) {
        uint8_t e[32];
        if (flash_pread(fd, e, sizeof(e), (long)(ota->address + s * OTA_SECTOR)) != 0) continue;
        const uint32_t seq = le32(e), state = le32(e + 24), crc = le32(e + 28);
        if (seq == 0 || seq == 0xFFFFFFFFu || crc != ota_crc(seq) || state == 3 || state == 4) continue;
        if (seq > top) {
            top = seq;
            active = s;
        }
    }
    uint32_t seq = top + 1;
    while ((seq - 1) % n_apps != slot) ++seq;
    const int sector = active == 0 ? 1 : 0;
    static uint8_t erased[OTA_SECTOR];
    memset(erased, 0xFF, sizeof(erased));
    uint8_t entry[32];
    memset(entry, 0xFF, sizeof(entry));
    const uint32_t words[3] = {seq, 2u /* ESP_OTA_IMG_VALID */, ota_crc(seq)};
    const int at[3] = {0, 24, 28};
    for (int w = 0; w < 3; ++w) {
        for (int b = 0; b < 4; ++b) entry[at[w] + b] = (uint8_t)(words[w] >> (8 * b));
    }
    memcpy(erased, entry, sizeof(entry));
    const off_t where = (off_t)(ota->address + (uint32_t)sector * OTA_SECTOR);
    const ssize_t n = pwrite(fd, erased, sizeof(erased), where);
    close(fd);
    return n == (ssize_t)sizeof(erased) ? ESP_OK : ESP_FAIL;
}

/* A software reset: tell the native board (a marker file in its directory) and end the program; the
 * board then runs its boot stand-in again, which honours otadata, as the chip's bootloader does. */
void esp_check_noinit_save(void);

void esp_restart(void) {
    fflush(stdout);
    esp_check_noinit_save(); /* PSRAM keeps its contents across a software restart */
    const char *dir = env("ESP_CHECK_NATIVE_BOARD_DIR");
    char path[4096];
    if (dir != NULL && snprintf(path, sizeof(path), "%s/sw_reset", dir) < (int)sizeof(path)) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) close(fd);
    }
    _exit(0);
}
