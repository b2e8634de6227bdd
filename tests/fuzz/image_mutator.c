/* Structure-aware mutation for fuzz_image.c. Half the time libFuzzer's own byte-level mutation
 * (LLVMFuzzerMutate, with the dictionary); otherwise one to three edits of the image's structure -- a header
 * dimension, a float parameter, an offset, a layer record's option bit or field or a layer's kind, a field of a
 * tensor table entry (role, dtype, layer, dims, offsets, sizes), a whole entry emptied or given another's shape and place, or
 * the harness's mode bits -- after which the image is
 * resealed, so the edit meets the per-family checks (read_dims, the table's specs, the bounds) instead of
 * a CRC. The fields and their offsets come from firmware/src/format.h (written from format/schema.toml). */
#include <math.h> /* INFINITY, NAN: constants, no libm */
#include <stdint.h>
#include <string.h>

#include "format.h"
#include "reseal.h"

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

/* splitmix64: libFuzzer passes a seed per call, so a run is repeatable with -seed */
static uint64_t next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint32_t below(uint64_t *state, uint32_t n) { return (uint32_t)(next(state) % n); }

typedef struct { uint16_t offset; uint8_t bytes; } field;
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* the header's integers but its CRCs (left to reseal), its floats, a table entry's and a layer record's fields */
#define FIELD(offset, bytes) { offset, bytes },
static const field header_ints[] = { IMG_HEADER_INTEGERS(FIELD) };
static const field header_floats[] = { IMG_HEADER_FLOATS(FIELD) };
static const field entry_fields[] = { IMG_ENTRY_FIELDS(FIELD) };
static const field layer_fields[] = { IMG_LAYER_FIELDS(FIELD) };

/* A value near the edges the checks draw: small counts, off by one or by an alignment, doubled or halved,
 * another field's value (dimensions that must or must not agree), the format's limits. */
static uint64_t interesting(uint64_t *rng, uint64_t old, uint64_t other) {
    switch (below(rng, 12)) {
    case 0: return 0;
    case 1: return 1 + below(rng, 8);
    case 2: return old + 1;
    case 3: return old - 1;
    case 4: return old * 2;
    case 5: return old / 2;
    case 6: return old + IMG_ALIGN;
    case 7: return old - IMG_ALIGN;
    case 8: return other;
    case 9: return IMG_MAX_DIM + below(rng, 2) - 1; /* the largest allowed dimension, and one past it */
    case 10: return UINT64_MAX;
    default: return next(rng) & 0xFFFF;
    }
}

static void put_float(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    put_le(p, u, 4);
}

/* A float near the checks' edges: zero, negative, tiny, huge, infinite, NaN, or the old value scaled. */
static void mutate_float(uint64_t *rng, uint8_t *p) {
    static const float values[] = { 0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 1e-30f, 3.1e38f, INFINITY, NAN };
    uint32_t u = (uint32_t)get_le(p, 4);
    float old;
    memcpy(&old, &u, sizeof old);
    const uint32_t pick = below(rng, COUNT(values) + 2);
    put_float(p, pick < COUNT(values) ? values[pick] : pick == COUNT(values) ? old * 2.0f : old / 2.0f);
}

/* Field f of the header or entry at `base` set to an interesting value; `other`: another field's value */
static void mutate_field(uint64_t *rng, uint8_t *base, field f, uint64_t other) {
    put_le(base + f.offset, interesting(rng, get_le(base + f.offset, f.bytes), other), f.bytes);
}

/* One edit of img (the image, `size` bytes, at least a header) or of the harness's mode byte. */
static void mutate_structure(uint64_t *rng, uint8_t *mode, uint8_t *img, size_t size) {
    const uint64_t table = get_le(img + H_TABLE_OFFSET, 8);
    uint64_t entries = get_le(img + H_N_TENSORS, 4);
    if (table > size) entries = 0;
    else if (entries > (size - table) / IMG_ENTRY_BYTES) entries = (size - table) / IMG_ENTRY_BYTES;
    switch (below(rng, 9)) {
    case 0: case 1: { /* a header integer, perhaps set to another's value */
        const field f = header_ints[below(rng, COUNT(header_ints))], g = header_ints[below(rng, COUNT(header_ints))];
        mutate_field(rng, img, f, get_le(img + g.offset, g.bytes));
        break;
    }
    case 2: mutate_float(rng, img + header_floats[below(rng, COUNT(header_floats))].offset); break;
    case 3: { /* an option bit of one of the first kinds' records: the known ones and the first unknown one */
        uint8_t *options = img + H_KINDS + below(rng, 3) * IMG_LAYER_BYTES + R_OPTIONS;
        put_le(options, (uint32_t)get_le(options, 4) ^ (1u << below(rng, LAYER_OPTION_COUNT + 1)), 4);
        break;
    }
    case 4: { /* a field of one of the first kinds' records, perhaps set to another kind's; or layer 0..3's kind */
        const uint32_t k = below(rng, 3), j = below(rng, 3);
        const field f = layer_fields[below(rng, COUNT(layer_fields))];
        if (below(rng, 4) == 0) {
            img[H_LAYER_KIND + below(rng, 4)] = (uint8_t)below(rng, 3);
            put_le(img + H_LAYER_KINDS, 1 + below(rng, 3), 4);
        } else {
            mutate_field(rng, img + H_KINDS + k * IMG_LAYER_BYTES, f,
                         get_le(img + H_KINDS + j * IMG_LAYER_BYTES + f.offset, f.bytes));
        }
        break;
    }
    case 5: case 6: { /* a table entry's field, perhaps set to another entry's */
        if (!entries) break;
        uint8_t *e = img + table + below(rng, (uint32_t)entries) * IMG_ENTRY_BYTES;
        const uint8_t *other = img + table + below(rng, (uint32_t)entries) * IMG_ENTRY_BYTES;
        const field f = entry_fields[below(rng, COUNT(entry_fields))];
        if (f.offset == E_DTYPE && below(rng, 2)) put_le(e + E_DTYPE, below(rng, DTYPE_COUNT + 1), 2);
        else mutate_field(rng, e, f, get_le(other + f.offset, f.bytes));
        break;
    }
    case 7: { /* a whole entry: emptied (a tensor the records may no longer want), or another's shape and place */
        if (!entries) break;
        uint8_t *e = img + table + below(rng, (uint32_t)entries) * IMG_ENTRY_BYTES;
        const uint8_t *other = img + table + below(rng, (uint32_t)entries) * IMG_ENTRY_BYTES;
        const int empty = below(rng, 2); /* the entry keeps its slot: role, layer, expert */
        if (empty) {
            memset(e + E_DTYPE, 0, 2);
            memset(e + E_NDIMS, 0, IMG_ENTRY_BYTES - E_NDIMS);
        } else {
            memmove(e + E_DTYPE, other + E_DTYPE, 2);
            memmove(e + E_NDIMS, other + E_NDIMS, IMG_ENTRY_BYTES - E_NDIMS);
        }
        break;
    }
    default: *mode ^= (uint8_t)(2u << below(rng, 2)); break; /* streamed or batched */
    }
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    uint64_t rng = seed;
    if (size < 1 + IMG_HEADER_BYTES || below(&rng, 2)) return LLVMFuzzerMutate(data, size, max_size);
    for (uint32_t edits = 1 + below(&rng, 3); edits--;) mutate_structure(&rng, data, data + 1, size - 1);
    reseal(data + 1, size - 1);
    return size;
}
