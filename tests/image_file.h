/* An image file read into memory of exactly its size, 64-byte aligned as the runtime requires (so a sanitizer sees
 * a read one byte past it), for the test programs that run an image through the public API. NULL if the file
 * cannot be read or is empty. Needs _POSIX_C_SOURCE >= 200112L for posix_memalign. */
#ifndef COLIBRI_TESTS_IMAGE_FILE_H
#define COLIBRI_TESTS_IMAGE_FILE_H

#include <stdio.h>
#include <stdlib.h>

static void *read_image_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    void *image = 0;
    long n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n <= 0 || fseek(f, 0, SEEK_SET) != 0 || posix_memalign(&image, 64, (size_t)n) ||
        fread(image, 1, (size_t)n, f) != (size_t)n) {
        free(image);
        image = 0;
    }
    if (f) fclose(f);
    *size = image ? (size_t)n : 0;
    return image;
}

#endif
