/* The DeltaNet's scalar functions (blocks/deltanet.c: silu_f, ln_f, softplus_f, static in model.c's unit) on the
 * values of a file of f32s, for tests/test_runtime_api.py to hold against colibri/arith.py bit for bit: the reference must
 * compute what the runtime computes on every input, the rare branches (1 + e rounding to 1, x past 20) included.
 * usage: math_check IN OUT (OUT: silu, ln, softplus of each input, f32, input by input) */
#include <stdio.h>

#include "internal.h"
#include "model.c" /* its unit, where blocks/deltanet.c is included */

int main(int argc, char **argv) {
    FILE *in = argc == 3 ? fopen(argv[1], "rb") : 0, *out = argc == 3 ? fopen(argv[2], "wb") : 0;
    if (!in || !out) {
        fprintf(stderr, "usage: math_check IN OUT\n");
        return 2;
    }
    float x;
    while (fread(&x, sizeof x, 1, in) == 1) {
        /* ln_f's domain is x >= 1, softplus's 1 + e: outside it the value is not compared */
        const float y[3] = { silu_f(x), x >= 1.0f ? ln_f(x) : 0.0f, softplus_f(x) };
        if (fwrite(y, sizeof y, 1, out) != 1) return 1;
    }
    return fclose(out) != 0;
}
