/* Make an image's checksums match its bytes (the fuzz harness's seal bit and its custom mutator), so a
 * mutated image reaches the checks behind the CRCs. Offsets and sizes come from firmware/src/format.h, the
 * definition the verifier reads. */
#ifndef COLIBRI_FUZZ_RESEAL_H
#define COLIBRI_FUZZ_RESEAL_H

#include <stddef.h>
#include <stdint.h>

/* Rewrite, in this order, every routed expert's CRC in the expert CRC table, the metadata CRC (when there is a metadata section), the payload
 * CRC (the resident part) and the header CRC. A field whose range lies outside the `size` bytes is left as
 * it is; an image shorter than the header is not touched. */
void reseal(uint8_t *img, size_t size);

/* Little-endian field access, as the verifier reads the image. */
uint64_t get_le(const uint8_t *p, int bytes);
void put_le(uint8_t *p, uint64_t v, int bytes);

#endif
