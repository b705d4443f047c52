/* A request's derived seed in C (`impl.native`): the twin of `impl.interface.effective_seed` for a request without
 * its own seed, which stays the reference and the fallback (`impl.seeds.request_seed` calls this first).
 *
 * derived_seed -- the low 63 bits of the 8-byte BLAKE2b digest (RFC 7693, no key) of the UTF-8 text
 *     "<base_seed>:<req_id>", read as a little-endian integer: what `hashlib.blake2b(..., digest_size=8)` and
 *     `int.from_bytes(digest, "little") & MAX_SEED` give.
 *     derived_seed(base_seed, req_id) -> int, or NotImplemented when ``base_seed`` is not an exact int within
 *     64 bits or ``req_id`` not an exact str (the reference decides those).
 *
 * Here only so that an admission's seed costs no hashlib object, bytes or int conversion on the host's step.
 * Built by setup.py as the extension `runnercheck.impl.native._seeds` (impl/native/__init__.py says when and how).
 * The tests' planted bugs are not switches in this file: each is a patch applied to a copy of it
 * (tests/impl/native_plants.py).
 */
#include "arrays.h"

#include <stdint.h>
#include <string.h>

enum { ROUNDS = 12 };
enum { BLOCK_BYTES = 128, DIGEST_BYTES = 8 };

/* The initial state: SHA-512's initial hash values (RFC 7693, section 2.6). */
static const uint64_t IV[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};

/* The message word schedule of each round (section 2.7); rounds 10 and 11 reuse the first two rows. */
static const uint8_t SIGMA[10][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
};

static inline uint64_t rotate_right(uint64_t x, int bits)
{
    return (x >> bits) | (x << (64 - bits));
}

static inline uint64_t load_le64(const unsigned char *p)
{
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--)
        x = (x << 8) | p[i];
    return x;
}

/* The mixing function G on words a, b, c, d of ``v`` with message words x and y (section 3.1). */
static inline void mix(uint64_t *v, int a, int b, int c, int d, uint64_t x, uint64_t y)
{
    v[a] = v[a] + v[b] + x;
    v[d] = rotate_right(v[d] ^ v[a], 32);
    v[c] = v[c] + v[d];
    v[b] = rotate_right(v[b] ^ v[c], 24);
    v[a] = v[a] + v[b] + y;
    v[d] = rotate_right(v[d] ^ v[a], 16);
    v[c] = v[c] + v[d];
    v[b] = rotate_right(v[b] ^ v[c], 63);
}

/* The compression function F (section 3.2): ``block`` folded into ``h``, ``bytes_so_far`` the offset counter
 * (messages here are far below 2**64 bytes: its high word is 0), ``last`` for the final block. */
static void compress(uint64_t h[8], const unsigned char block[BLOCK_BYTES], uint64_t bytes_so_far, int last)
{
    uint64_t v[16], m[16];
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = IV[i];
    }
    v[12] ^= bytes_so_far;
    if (last)
        v[14] = ~v[14];
    for (int i = 0; i < 16; i++)
        m[i] = load_le64(block + 8 * i);
    for (int round = 0; round < ROUNDS; round++) {
        const uint8_t *s = SIGMA[round % 10];
        mix(v, 0, 4, 8, 12, m[s[0]], m[s[1]]);
        mix(v, 1, 5, 9, 13, m[s[2]], m[s[3]]);
        mix(v, 2, 6, 10, 14, m[s[4]], m[s[5]]);
        mix(v, 3, 7, 11, 15, m[s[6]], m[s[7]]);
        mix(v, 0, 5, 10, 15, m[s[8]], m[s[9]]);
        mix(v, 1, 6, 11, 12, m[s[10]], m[s[11]]);
        mix(v, 2, 7, 8, 13, m[s[12]], m[s[13]]);
        mix(v, 3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++)
        h[i] ^= v[i] ^ v[i + 8];
}

/* The 8-byte unkeyed BLAKE2b digest of the ``first`` bytes then the ``second`` bytes, as a little-endian integer
 * (section 3.3; an 8-byte digest is the low bytes of h[0]). */
static uint64_t blake2b_64(const unsigned char *first, size_t first_len, const unsigned char *second, size_t second_len)
{
    uint64_t h[8];
    memcpy(h, IV, sizeof h);
    h[0] ^= 0x01010000ULL ^ DIGEST_BYTES;  /* parameter block: digest length, no key, fanout and depth 1 */
    unsigned char block[BLOCK_BYTES];
    size_t filled = 0, total = first_len + second_len, taken = 0;
    uint64_t counted = 0;
    /* Every full block but the last is compressed as it fills; the last (possibly partial, zero-padded, and for
     * an empty message one block of zeros) is compressed with the final flag. */
    while (taken < total) {
        if (filled == BLOCK_BYTES) {
            counted += BLOCK_BYTES;
            compress(h, block, counted, 0);
            filled = 0;
        }
        size_t n = BLOCK_BYTES - filled;
        const unsigned char *from;
        if (taken < first_len) {
            from = first + taken;
            n = n < first_len - taken ? n : first_len - taken;
        }
        else {
            from = second + (taken - first_len);
            n = n < total - taken ? n : total - taken;
        }
        memcpy(block + filled, from, n);
        filled += n;
        taken += n;
    }
    memset(block + filled, 0, BLOCK_BYTES - filled);
    compress(h, block, counted + filled, 1);
    return h[0];
}

static PyObject *derived_seed(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "derived_seed takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *base_seed = args[0], *req_id = args[1];
    long long base;
    if (exact_int(base_seed, &base) != EXACT_INT || !PyUnicode_CheckExact(req_id))
        Py_RETURN_NOTIMPLEMENTED;
    Py_ssize_t id_len;
    const char *id = PyUnicode_AsUTF8AndSize(req_id, &id_len);
    if (id == NULL) {  /* not encodable (a lone surrogate): the reference raises the encoder's error */
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    char prefix[32];
    const int prefix_len = snprintf(prefix, sizeof prefix, "%lld:", base);
    const uint64_t digest = blake2b_64((const unsigned char *)prefix, (size_t)prefix_len, (const unsigned char *)id,
                                       (size_t)id_len);
    return PyLong_FromUnsignedLongLong(digest & 0x7fffffffffffffffULL);  /* MAX_SEED = 2**63 - 1 */
}

static PyMethodDef methods[] = {
    {"derived_seed", (PyCFunction)(void (*)(void))derived_seed, METH_FASTCALL, "The seed of a request without its own: BLAKE2b-64 of \"base:id\"."},
    {NULL, NULL, 0, NULL},
};

RUNNERCHECK_MODULE("A request's derived seed (the C twin of impl.interface.effective_seed); see the source's header.")
