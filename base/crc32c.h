/* crc32c.h - CRC-32C (Castagnoli), the checksum of weight updates
 * (proto/PROTOCOL.md §10): reflected polynomial 0x82F63B78, initial value and
 * final xor 0xFFFFFFFF; crc32c(0, "123456789", 9) == 0xE3069283.
 *
 * Chaining works like zlib's crc32(): start with 0 and feed the previous
 * result back in, so crc32c(crc32c(0, a, na), b, nb) is the CRC of a || b.
 * On x86-64 CPUs with SSE4.2 the crc32 instruction runs three interleaved
 * streams (many GB/s); elsewhere a slicing-by-8 table (about 1 GB/s). Both
 * give the same values; every function is thread-safe. */
#ifndef RD_CRC32C_H
#define RD_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC-32C of buf[0..n) continuing from crc (0 to start). buf may be NULL
 * when n is 0. */
uint32_t crc32c(uint32_t crc, const void *buf, size_t n);

/* The CRC-32C of A || B from crc1 = CRC of A, crc2 = CRC of B and len2 = B's
 * length in bytes (O(log len2), no data needed). */
uint32_t crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);

/* The portable table path alone (what crc32c uses without SSE4.2). */
uint32_t crc32c_sw(uint32_t crc, const void *buf, size_t n);

/* 1 when crc32c uses the hardware instruction on this CPU. */
int crc32c_hw_available(void);

/* The hardware path alone; only valid when crc32c_hw_available(). */
uint32_t crc32c_hw(uint32_t crc, const void *buf, size_t n);

#endif
