/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Kernel-struct differences across versions, one shim each, named by the change. */
#ifndef TRAINIO_CORE_FIXES_BPF_H
#define TRAINIO_CORE_FIXES_BPF_H

#include <bpf/bpf_core_read.h>

/*
 * Linux 5.17 (commit f3fa33acca9f "block: remove the ->rq_disk field in struct request")
 * moved the disk from request->rq_disk to request->q->disk.
 */
struct request___with_rq_disk {
	struct gendisk *rq_disk;
} __attribute__((preserve_access_index));

static __always_inline struct gendisk *request_disk(struct request *rq)
{
	if (bpf_core_field_exists(((struct request___with_rq_disk *)0)->rq_disk))
		return BPF_CORE_READ((struct request___with_rq_disk *)rq, rq_disk);
	return rq->q->disk; /* a trusted tp_btf pointer: direct loads */
}

#endif
