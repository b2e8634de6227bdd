/* The hosted board's operating system calls on Windows (../hosted/os.h): the standard handles, a file
 * mapping, VirtualAlloc, QueryPerformanceCounter, WaitOnAddress. Windows 8 or later (PrefetchVirtualMemory). */
#define _WIN32_WINNT 0x0602
#define WIN32_LEAN_AND_MEAN
#include <windows.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../hosted/os.h"

/* Why the last Win32 call failed, in words (FormatMessage's text, without its line end). */
static const char *last_error(void) {
    static char text[256];
    DWORD code = GetLastError();
    DWORD n = FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, 0, code, 0, text, sizeof text, 0);
    while (n && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == '.')) text[--n] = 0;
    if (!n) snprintf(text, sizeof text, "Windows error %lu", (unsigned long)code);
    return text;
}

static void fail(const char *what, const char *path) {
    fprintf(stderr, "colibri-hosted: %s %s: %s\n", what, path, last_error());
    exit(2);
}

size_t os_read_stdin(uint8_t *buf, size_t n) {
    DWORD got = 0;
    /* a pipe whose writer closed reports ERROR_BROKEN_PIPE: the end of the stream, like read() returning 0 */
    if (!ReadFile(GetStdHandle(STD_INPUT_HANDLE), buf, n > 0x40000000u ? 0x40000000u : (DWORD)n, &got, 0)) return 0;
    return got;
}

void os_write_stdout(const uint8_t *p, size_t n) {
    HANDLE out = GetStdHandle(STD_OUTPUT_HANDLE);
    while (n) {
        DWORD wrote = 0;
        if (!WriteFile(out, p, n > 0x40000000u ? 0x40000000u : (DWORD)n, &wrote, 0) || !wrote) exit(3); /* host went away */
        p += wrote;
        n -= wrote;
    }
}

/* The file is opened sharing reads only: while the board runs, Windows refuses to open it for writing,
 * and refuses to truncate it at all while it is mapped. */
static HANDLE open_image(const char *path, size_t *size) {
    HANDLE file = CreateFileA(path, GENERIC_READ, FILE_SHARE_READ, 0, OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, 0);
    if (file == INVALID_HANDLE_VALUE) fail("cannot read image", path);
    LARGE_INTEGER bytes;
    if (!GetFileSizeEx(file, &bytes)) fail("cannot read image", path);
    if (bytes.QuadPart <= 0 || (unsigned long long)bytes.QuadPart > (size_t)-1) {
        fprintf(stderr, "colibri-hosted: cannot read image %s: %s\n", path, bytes.QuadPart ? "too large" : "empty file");
        exit(2);
    }
    *size = (size_t)bytes.QuadPart;
    return file;
}

static const uint8_t *view_base;
static size_t view_size;

/* A page of the mapped image that cannot be read (a network file gone, a disk error; under Wine, a file
 * that a Linux process truncated, which Windows itself refuses while it is mapped) raises
 * EXCEPTION_IN_PAGE_ERROR, or under Wine an access violation: nothing can go on. Unlike the Linux board,
 * a fetch that meets it ends the board too (catching it needs SEH, which MinGW's C has not). */
static LONG WINAPI on_image_fault(EXCEPTION_POINTERS *e) {
    const EXCEPTION_RECORD *r = e->ExceptionRecord;
    if ((r->ExceptionCode != EXCEPTION_IN_PAGE_ERROR && r->ExceptionCode != EXCEPTION_ACCESS_VIOLATION) ||
        r->NumberParameters < 2 || r->ExceptionInformation[1] - (ULONG_PTR)view_base >= view_size)
        return EXCEPTION_CONTINUE_SEARCH;
    static const char msg[] = "colibri-hosted: the image file shrank or could not be read while the board was using it\n";
    DWORD wrote;
    WriteFile(GetStdHandle(STD_ERROR_HANDLE), msg, sizeof msg - 1, &wrote, 0);
    ExitProcess(2);
}

/* Ask the memory manager to read [p, p + n) in ahead of use, in large I/Os. */
static void prefetch(const void *p, size_t n) {
    WIN32_MEMORY_RANGE_ENTRY range = { (void *)p, n };
    PrefetchVirtualMemory(GetCurrentProcess(), 1, &range, 0);
}

static HANDLE image_file, image_mapping;

const uint8_t *os_map_image(const char *path, size_t *size, int populate) {
    image_file = open_image(path, size);
    image_mapping = CreateFileMappingA(image_file, 0, PAGE_READONLY, 0, 0, 0);
    if (!image_mapping) fail("cannot map image", path);
    const uint8_t *view = MapViewOfFile(image_mapping, FILE_MAP_READ, 0, 0, 0);
    if (!view) fail("cannot map image", path);
    view_base = view;
    view_size = *size;
    AddVectoredExceptionHandler(1, on_image_fault);
    if (populate) prefetch(view, *size);
    return view;
}

void os_unmap_image(const uint8_t *image, size_t size) {
    (void)size;
    UnmapViewOfFile(image);
    view_size = 0;
    CloseHandle(image_mapping);
    CloseHandle(image_file);
}

void *os_alloc(size_t n) {
    void *p = VirtualAlloc(0, n ? n : 1, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
    if (!p) {
        fprintf(stderr, "colibri-hosted: cannot allocate %llu bytes: %s\n", (unsigned long long)n, last_error());
        exit(2);
    }
    return p;
}

const uint8_t *os_read_image(const char *path, size_t n) {
    size_t size;
    HANDLE file = open_image(path, &size);
    uint8_t *p = os_alloc(n);
    for (size_t done = 0; done < n;) {
        DWORD got = 0, want = n - done > 0x40000000u ? 0x40000000u : (DWORD)(n - done);
        if (!ReadFile(file, p + done, want, &got, 0)) fail("cannot read image", path);
        if (!got) {
            fprintf(stderr, "colibri-hosted: cannot read image %s: file shrank\n", path);
            exit(2);
        }
        done += got;
    }
    CloseHandle(file);
    DWORD old;
    VirtualProtect(p, n ? n : 1, PAGE_READONLY, &old);
    return p;
}

int os_copy_from_image(void *dst, const uint8_t *src, size_t n) {
    memcpy(dst, src, n); /* a mapped file cannot shrink on Windows; an unreadable page ends the board (on_image_fault) */
    return 0;
}

/* WILLNEED is PrefetchVirtualMemory; DONTNEED is VirtualUnlock on pages that were never locked, which
 * Windows documents as taking them out of the working set (it then reports ERROR_NOT_LOCKED). */
void os_advise(const uint8_t *p, size_t n, int willneed) {
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    const uintptr_t page = si.dwPageSize;
    uintptr_t lo = (uintptr_t)p, hi = lo + n;
    if (willneed) {
        prefetch(p, n);
        return;
    }
    lo = (lo + page - 1) & ~(page - 1);
    hi &= ~(page - 1);
    if (hi > lo) VirtualUnlock((void *)lo, hi - lo);
}

uint64_t os_clock(void *user) {
    (void)user;
    LARGE_INTEGER t;
    QueryPerformanceCounter(&t);
    return (uint64_t)t.QuadPart;
}

uint64_t os_clock_hz(void) {
    LARGE_INTEGER f;
    QueryPerformanceFrequency(&f);
    return (uint64_t)f.QuadPart;
}

static DWORD WINAPI thread_main(void *fn) {
    ((void (*)(void))fn)();
    return 0;
}

int os_thread_start(void (*fn)(void)) {
    HANDLE t = CreateThread(0, 0, thread_main, (void *)fn, 0, 0);
    if (!t) return -1;
    CloseHandle(t);
    return 0;
}

void os_wait(_Atomic uint32_t *word, uint32_t seen) { WaitOnAddress((volatile void *)word, &seen, sizeof seen, INFINITE); }

void os_wake_all(_Atomic uint32_t *word) { WakeByAddressAll((void *)word); }

void os_relax(void) { YieldProcessor(); }
