/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Helpers shared by every probe family: batched ring-buffer wakeups and drop counters. */
#ifndef TRAINIO_COMMON_BPF_H
#define TRAINIO_COMMON_BPF_H

#include "trainio.h"

/*
 * Wake user space only when this much is queued; user space also polls every 10 ms.
 * Waking on every event halved fio's IOPS on a 2-core machine (REFERENCE.md §4).
 */
const volatile __u64 wakeup_bytes = 1 << 20;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TRAINIO_LOST_MAX);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

static __always_inline void count_lost_n(__u32 which, __u32 events)
{
	__u64 *n = bpf_map_lookup_elem(&lost, &which);

	if (n)
		*n += events; /* per-CPU slot: no atomics needed */
}

static __always_inline void count_lost(__u32 which)
{
	count_lost_n(which, 1);
}

/*
 * The current task's comm, read straight from its task_struct (two 8-byte loads) rather
 * than through bpf_get_current_comm(), which cost ~85 ns per call here: a third of the
 * block issue probe. A rename racing with the read can tear the name; nothing else can.
 */
static __always_inline void task_comm(char dst[TRAINIO_COMM_LEN], struct task_struct *task)
{
	__builtin_memcpy(dst, task->comm, TRAINIO_COMM_LEN);
}

static __always_inline void current_comm(char dst[TRAINIO_COMM_LEN])
{
	task_comm(dst, bpf_get_current_task_btf());
}

/* Submit flags: wake the reader only once wakeup_bytes are waiting in the ring. */
#define wake_flags(ringbuf)                                                             \
	(bpf_ringbuf_query(ringbuf, BPF_RB_AVAIL_DATA) >= wakeup_bytes ? BPF_RB_FORCE_WAKEUP \
								       : BPF_RB_NO_WAKEUP)

#define submit_batched(ringbuf, ev) bpf_ringbuf_submit(ev, wake_flags(&(ringbuf)))

#endif
