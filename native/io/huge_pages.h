/* huge_pages.h: memory in 2 MiB pages for data that decode reads start to end once per token
 * (the model file read by model.c, the classifier decoded by kernels.c). On 4 KiB pages the
 * hardware prefetchers stop at every page boundary and each page costs a TLB entry; in 2 MiB
 * pages (transparent huge pages, which Linux in its "madvise" mode gives only to regions
 * marked MADV_HUGEPAGE) they run on (docs/RUNTIME.md "Loading"). An includer defines
 * _DEFAULT_SOURCE before its first include, for madvise.
 */
#ifndef DITTO_HUGE_PAGES_H
#define DITTO_HUGE_PAGES_H

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HUGE_PAGE ((size_t)2 << 20)

/* bytes rounded up to a multiple of 2 MiB, on a 2 MiB boundary, marked MADV_HUGEPAGE where the
 * system has it (advice only: without it, 4 KiB pages); free() it. NULL when it cannot be
 * allocated. */
static inline void *huge_pages_alloc(size_t bytes) {
    void *p = NULL;
    if (bytes > SIZE_MAX - HUGE_PAGE) return NULL;
    size_t whole = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    if (posix_memalign(&p, HUGE_PAGE, whole) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, whole, MADV_HUGEPAGE);
#endif
    return p;
}

#endif
