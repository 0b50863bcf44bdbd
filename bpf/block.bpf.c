// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Block layer: one record per request completion, with the queue depth the request met.
 *
 * The in-flight count per device lives in the kernel (inflight map) and is updated at
 * issue and at completion, so the queue depth is exact for every request issued after
 * the probes were attached, whatever the ring buffer does. Requests are keyed by their
 * `struct request *`, which is how insert, issue, requeue and complete find each other;
 * the completing context (often an interrupt or a kworker) is never used for pairing.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "trainio.h"
#include "common.bpf.h"
#include "core_fixes.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Globals only so that the skeleton exports the event types to Rust. */
struct block_event _block_event_type = {};

#define MINORBITS 20
#define MKDEV(ma, mi) (((ma) << MINORBITS) | (mi))

/* Only devices in allowed_devs are traced when filter_devs is set. */
const volatile bool filter_devs = false;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, __u8);
} allowed_devs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); /* dev */
	__type(value, __u32); /* requests in flight */
} inflight SEC(".maps");

struct request_start {
	__u64 insert_ns;
	__u64 issue_ns; /* 0 until issued (and again after a requeue) */
	__u32 queue_depth;
	__u32 pid;
	__u32 tid;
	__u32 dev;
	char comm[TRAINIO_COMM_LEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct request *);
	__type(value, struct request_start);
} started SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20); /* resized by user space (--ringbuf-mb) */
} block_events SEC(".maps");

/* tp_btf arguments are trusted BTF pointers: direct loads, no probe-read helper calls. */
static __always_inline __u32 request_dev(struct request *rq)
{
	struct gendisk *disk = request_disk(rq);

	if (!disk)
		return 0;
	return MKDEV(disk->major, disk->first_minor);
}

static __always_inline bool dev_wanted(__u32 dev)
{
	return !filter_devs || bpf_map_lookup_elem(&allowed_devs, &dev);
}

static __always_inline void note_task(struct request_start *s)
{
	__u64 id = bpf_get_current_pid_tgid();

	s->pid = id >> 32;
	s->tid = (__u32)id;
	bpf_get_current_comm(s->comm, sizeof(s->comm));
}

SEC("tp_btf/block_rq_insert")
int BPF_PROG(tio_rq_insert, struct request *rq)
{
	struct request_start s = {};
	__u32 dev = request_dev(rq);

	if (!dev_wanted(dev))
		return 0;
	s.insert_ns = bpf_ktime_get_ns();
	s.dev = dev;
	note_task(&s);
	if (bpf_map_update_elem(&started, &rq, &s, BPF_ANY))
		count_lost(TRAINIO_LOST_BLOCK_MAP);
	return 0;
}

static __always_inline void leave_flight(__u32 dev)
{
	__u32 *n = bpf_map_lookup_elem(&inflight, &dev);

	if (n)
		__sync_fetch_and_add(n, -1);
}

static __always_inline __u32 enter_flight(__u32 dev)
{
	__u32 zero = 0, *n = bpf_map_lookup_elem(&inflight, &dev);

	if (!n) {
		bpf_map_update_elem(&inflight, &dev, &zero, BPF_NOEXIST);
		n = bpf_map_lookup_elem(&inflight, &dev);
		if (!n)
			return 0;
	}
	return __sync_fetch_and_add(n, 1) + 1;
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(tio_rq_issue, struct request *rq)
{
	struct request_start *s, fresh = {};
	__u32 dev = request_dev(rq);

	if (!dev_wanted(dev))
		return 0;
	s = bpf_map_lookup_elem(&started, &rq);
	if (s) {
		/* Inserted earlier (or requeued): the map entry is updated in place. */
		if (s->issue_ns)
			return 0; /* issued twice without a requeue: keep the first */
		s->queue_depth = enter_flight(dev);
		s->issue_ns = bpf_ktime_get_ns();
		return 0;
	}
	/* Dispatched without passing the scheduler: the issuer is the submitter. */
	fresh.dev = dev;
	note_task(&fresh);
	fresh.queue_depth = enter_flight(dev);
	fresh.issue_ns = bpf_ktime_get_ns();
	if (bpf_map_update_elem(&started, &rq, &fresh, BPF_ANY)) {
		count_lost(TRAINIO_LOST_BLOCK_MAP);
		leave_flight(dev);
	}
	return 0;
}

SEC("tp_btf/block_rq_requeue")
int BPF_PROG(tio_rq_requeue, struct request *rq)
{
	struct request_start *s = bpf_map_lookup_elem(&started, &rq);

	if (s && s->issue_ns) {
		leave_flight(s->dev);
		s->issue_ns = 0;
	}
	return 0;
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(tio_rq_complete, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
	struct request_start *s = bpf_map_lookup_elem(&started, &rq);
	struct block_event *e;
	/* Before the completion is accounted, __data_len is what was still outstanding. */
	/*
	 * Probe reads here: Linux 6.1's verifier does not treat this tracepoint's argument as
	 * a trusted pointer ("invalid mem access 'scalar'"), 6.18's does.
	 */
	bool final = nr_bytes >= BPF_CORE_READ(rq, __data_len);

	if (!s || !s->issue_ns)
		return 0; /* issued before we attached, or on a device we do not trace */

	e = bpf_ringbuf_reserve(&block_events, sizeof(*e), 0);
	if (e) {
		e->kind = TRAINIO_KIND_BLOCK;
		e->dev = s->dev;
		e->insert_ns = s->insert_ns;
		e->issue_ns = s->issue_ns;
		e->complete_ns = bpf_ktime_get_ns();
		e->sector = BPF_CORE_READ(rq, __sector);
		e->bytes = nr_bytes;
		e->cmd_flags = BPF_CORE_READ(rq, cmd_flags);
		e->queue_depth = s->queue_depth;
		e->pid = s->pid;
		e->tid = s->tid;
		e->error = error;
		__builtin_memcpy(e->comm, s->comm, sizeof(e->comm));
		submit_batched(block_events, e);
	} else {
		count_lost(TRAINIO_LOST_BLOCK_RINGBUF);
	}
	if (final) {
		leave_flight(s->dev);
		bpf_map_delete_elem(&started, &rq);
	}
	return 0;
}
