/* The TRACE records boards/common/link.c's trace hook writes (docs/PROTOCOL.md), for layers up to the verifier's
 * 2^24 - 1 and each count of routed experts up to two: the hook itself (link.c is included for its static
 * functions), its buffer printed in hex for tests/test_trace.py to parse with colibri/protocol.py. */
#include <stdio.h>

#include "link.c"

static link_state l; /* static: its buffers are kilobytes */

int main(void) {
    static const uint32_t layers[] = { 0, 255, 65535, 65536, 70001, (1u << 24) - 1 };
    const uint32_t experts[2] = { 3, 1 };
    const float weights[2] = { 0.75f, 0.25f };
    const uint64_t cycles[2] = { 11, 1ull << 40 };
    start_trace(&l, 7);
    for (uint32_t i = 0; i < sizeof layers / sizeof layers[0]; i++) {
        const colibri_layer_trace t = { .pos = 7, .layer = layers[i], .n_routed = i % 3, .experts = experts,
                                        .weights = weights, .cycles_expert = cycles, .cycles_attention = 100 + i,
                                        .cycles_router = 200 + i, .cycles_ffn = 300 + i,
                                        .crc_attention = 0xDEADBEEFu - i, .crc_output = 0x80000000u + i };
        trace_layer(&l, &t);
    }
    for (uint32_t i = 0; i < l.trace_len; i++) printf("%02x", l.trace[i]);
    printf("\n");
    return 0;
}
