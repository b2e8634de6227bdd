/* The fuzz harness's reseal: see reseal.h. */
#include "reseal.h"

#include "colibri.h"
#include "format.h"

uint64_t get_le(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void put_le(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* [offset, offset + bytes) lies inside an image of `size` bytes */
static int inside(uint64_t offset, uint64_t bytes, size_t size) { return offset <= size && bytes <= size - offset; }

static void put_crc(uint8_t *img, size_t size, uint64_t field, uint64_t offset, uint64_t bytes) {
    if (inside(offset, bytes, size)) put_le(img + field, colibri_crc32(0, img + offset, (size_t)bytes), 4);
}

/* A routed expert's block runs from its gate's values to the end of its down matrix (its scales, when
 * quantized): the range the verifier and the fetch path check against the expert CRC table. */
static void seal_experts(uint8_t *img, size_t size) {
    const uint64_t table = get_le(img + H_TABLE_OFFSET, 8), n_tensors = get_le(img + H_N_TENSORS, 4);
    const uint64_t crc_table = get_le(img + H_EXPERT_CRC_OFFSET, 8), n_experts = get_le(img + H_EXPERTS, 4);
    if (!inside(table, n_tensors * IMG_ENTRY_BYTES, size)) return; /* n_tensors < 2^32: no overflow */
    for (uint64_t i = 0; i + 2 < n_tensors; i++) {
        const uint8_t *gate = img + table + i * IMG_ENTRY_BYTES, *down = gate + 2 * IMG_ENTRY_BYTES;
        if (get_le(gate + E_ROLE, 2) != ROLE_EXPERT_GATE || get_le(down + E_ROLE, 2) != ROLE_EXPERT_DOWN) continue;
        const uint64_t layer = get_le(gate + E_LAYER, 4), expert = get_le(gate + E_EXPERT, 4);
        const uint64_t start = get_le(gate + E_OFFSET, 8);
        const uint64_t scales = get_le(down + E_SCALES_BYTES, 8);
        const uint64_t from = scales ? get_le(down + E_SCALES_OFFSET, 8) : get_le(down + E_OFFSET, 8);
        const uint64_t bytes = scales ? scales : get_le(down + E_BYTES, 8);
        if (layer >= IMG_MAX_DIM || expert >= n_experts || !inside(from, bytes, size) || from + bytes < start) continue;
        const uint64_t slot = crc_table + 4 * (layer * n_experts + expert); /* < 2^58 added: slot may only wrap */
        if (slot >= crc_table && inside(slot, 4, size)) put_crc(img, size, slot, start, from + bytes - start);
    }
}

void reseal(uint8_t *img, size_t size) {
    if (size < IMG_HEADER_BYTES) return;
    seal_experts(img, size); /* before the payload CRC: the expert CRC table is in the resident part */
    const uint64_t meta_bytes = get_le(img + H_META_BYTES, 8); /* none: its CRC field must stay 0, sealed or not */
    if (meta_bytes) put_crc(img, size, H_META_CRC, get_le(img + H_META_OFFSET, 8), meta_bytes);
    uint64_t resident = get_le(img + H_EXPERT_OFFSET, 8); /* the payload CRC covers the resident part */
    if (resident < IMG_HEADER_BYTES || resident > size) resident = size;
    put_crc(img, size, H_PAYLOAD_CRC, IMG_HEADER_BYTES, resident - IMG_HEADER_BYTES);
    put_le(img + H_HEADER_CRC, 0, 4); /* the header CRC is summed with its own field zero */
    put_crc(img, size, H_HEADER_CRC, 0, IMG_HEADER_BYTES);
}
