/* crc32c.c - see crc32c.h.
 *
 * Three pieces: the software path (slicing-by-8 tables, portable), the
 * hardware path (SSE4.2 crc32 over three interleaved streams, after Mark
 * Adler's crc32c.c), and the GF(2) arithmetic behind both the stream merging
 * and crc32c_combine: shifting a CRC register past n zero bytes multiplies it
 * by x^(8n) modulo the polynomial.
 *
 * All arithmetic is on the reflected representation: bit 31 of a register is
 * the coefficient of x^0, bit 0 that of x^31. */
#include "base/crc32c.h"

#include <pthread.h>
#include <string.h>

/* -DCRC32C_NO_HW builds the portable path alone (to test it on x86). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(CRC32C_NO_HW)
#define CRC32C_X86 1
#include <nmmintrin.h>
#endif

#define POLY 0x82F63B78u        /* reflected 0x1EDC6F41 */

/* ---- GF(2) polynomials modulo P ---- */

/* a * b mod P (reflected). */
static uint32_t multmodp(uint32_t a, uint32_t b)
{
    uint32_t m = 1u << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0)
                break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ POLY : b >> 1;
    }
    return p;
}

/* x2n[k] = x^(2^k) mod P; k up to 3 + 63 covers x^(8n) for any 64-bit n. */
#define X2N_COUNT 67
static uint32_t x2n[X2N_COUNT];

/* x^(n * 2^k) mod P. */
static uint32_t x2nmodp(uint64_t n, unsigned k)
{
    uint32_t p = 1u << 31;      /* x^0 */
    while (n) {
        if (n & 1)
            p = multmodp(x2n[k], p);
        n >>= 1;
        k++;
    }
    return p;
}

/* ---- tables, built once ---- */

static uint32_t table[8][256];  /* slicing-by-8: table[k][b] = CRC register of byte b followed by k zero bytes */

#ifdef CRC32C_X86
#define LONG_BLOCK 8192         /* bytes per stream in a long interleaved block */
#define SHORT_BLOCK 256         /* ... in a short one */
static uint32_t shift_long[4][256];     /* multiply by x^(8 LONG_BLOCK), byte by byte */
static uint32_t shift_short[4][256];
static int have_hw;

static void shift_table(uint32_t t[4][256], size_t bytes)
{
    uint32_t op = x2nmodp(bytes, 3);
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++)
            t[k][b] = multmodp(op, b << (8 * k));
}
#endif

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void init(void)
{
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int i = 0; i < 8; i++)
            c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; b++)
        for (int k = 1; k < 8; k++)
            table[k][b] = (table[k - 1][b] >> 8) ^ table[0][table[k - 1][b] & 0xFF];
    uint32_t p = 1u << 30;      /* x^1 */
    x2n[0] = p;
    for (int k = 1; k < X2N_COUNT; k++)
        x2n[k] = p = multmodp(p, p);
#ifdef CRC32C_X86
    shift_table(shift_long, LONG_BLOCK);
    shift_table(shift_short, SHORT_BLOCK);
    __builtin_cpu_init();
    have_hw = __builtin_cpu_supports("sse4.2") != 0;
#endif
}

/* ---- software ---- */

static uint32_t ld32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

uint32_t crc32c_sw(uint32_t crc, const void *buf, size_t n)
{
    pthread_once(&init_once, init);
    const uint8_t *p = buf;
    uint32_t c = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        c = (c >> 8) ^ table[0][(c ^ *p++) & 0xFF];
        n--;
    }
    while (n >= 8) {
        uint32_t lo = c ^ ld32(p), hi = ld32(p + 4);
        c = table[7][lo & 0xFF] ^ table[6][(lo >> 8) & 0xFF] ^ table[5][(lo >> 16) & 0xFF] ^ table[4][lo >> 24] ^
            table[3][hi & 0xFF] ^ table[2][(hi >> 8) & 0xFF] ^ table[1][(hi >> 16) & 0xFF] ^ table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = (c >> 8) ^ table[0][(c ^ *p++) & 0xFF];
    return ~c;
}

/* ---- hardware ---- */

#ifdef CRC32C_X86
static uint32_t shift(const uint32_t t[4][256], uint32_t c)
{
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][c >> 24];
}

static inline uint64_t ld64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);           /* x86 is little-endian; one unaligned load */
    return v;
}

/* Three streams of `block` bytes each run side by side (the instruction has a
 * latency of 3 cycles and a throughput of 1), then the second and third
 * registers are merged into the first by shifting it past their bytes. */
#define INTERLEAVED(block, t)                                                          \
    while (n >= 3 * (size_t)(block)) {                                                 \
        uint64_t c1 = 0, c2 = 0;                                                       \
        const uint8_t *end = p + (block);                                              \
        do {                                                                           \
            c0 = _mm_crc32_u64(c0, ld64(p));                                           \
            c1 = _mm_crc32_u64(c1, ld64(p + (block)));                                 \
            c2 = _mm_crc32_u64(c2, ld64(p + 2 * (block)));                             \
            p += 8;                                                                    \
        } while (p < end);                                                             \
        c0 = shift((t), (uint32_t)c0) ^ (uint32_t)c1;                                  \
        c0 = shift((t), (uint32_t)c0) ^ (uint32_t)c2;                                  \
        p += 2 * (size_t)(block);                                                      \
        n -= 3 * (size_t)(block);                                                      \
    }

__attribute__((target("sse4.2"))) static uint32_t hw(uint32_t crc, const uint8_t *p, size_t n)
{
    uint64_t c0 = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        n--;
    }
    INTERLEAVED(LONG_BLOCK, shift_long)
    INTERLEAVED(SHORT_BLOCK, shift_short)
    while (n >= 8) {
        c0 = _mm_crc32_u64(c0, ld64(p));
        p += 8;
        n -= 8;
    }
    while (n--)
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return ~(uint32_t)c0;
}

int crc32c_hw_available(void)
{
    pthread_once(&init_once, init);
    return have_hw;
}

uint32_t crc32c_hw(uint32_t crc, const void *buf, size_t n)
{
    pthread_once(&init_once, init);
    return hw(crc, buf, n);
}

uint32_t crc32c(uint32_t crc, const void *buf, size_t n)
{
    pthread_once(&init_once, init);
    return have_hw ? hw(crc, buf, n) : crc32c_sw(crc, buf, n);
}
#else
int crc32c_hw_available(void) { return 0; }

uint32_t crc32c_hw(uint32_t crc, const void *buf, size_t n) { return crc32c_sw(crc, buf, n); }

uint32_t crc32c(uint32_t crc, const void *buf, size_t n) { return crc32c_sw(crc, buf, n); }
#endif

/* ---- combine ---- */

uint32_t crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2)
{
    pthread_once(&init_once, init);
    /* crc(A || B) = crc(A) x^(8 len2) + crc(B): the initial and final xors cancel */
    return multmodp(x2nmodp(len2, 3), crc1) ^ crc2;
}
