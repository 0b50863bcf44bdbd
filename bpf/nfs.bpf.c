// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * NFS client: one record per READ/WRITE/COMMIT request a mount sends, with the number
 * of requests outstanding on that mount when it was sent.
 *
 * Classic tracepoints of the nfs module; their fields are read by the offsets of the
 * tracepoint format (stable since 5.x, checked against Debian 12's 6.1 in
 * docs/nfs-guest.md), because the build machine's vmlinux.h may have no NFS types.
 * Completions run in rpciod workers, so requests are paired by (dev, fileid, offset, op),
 * never by pid. The same range can be in flight twice (concurrent O_DIRECT readers):
 * each key holds NFS_SLOTS starts, claimed and released by compare-and-swap on issue_ns,
 * and a completion takes the oldest. Keys are never deleted (a completion could delete
 * an element another CPU is filling); the LRU map ages out the ones no longer used.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "trainio.h"
#include "common.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Globals only so that the skeleton exports the event types to Rust. */
struct nfs_event _nfs_event_type = {};
enum trainio_nfs_op _nfs_op_type = 0;

#define NFS_SLOTS 4

/* Tracepoint records after the 8-byte common header (see the format files). */
struct nfs_initiate_ctx {
	__u64 common;
	__u32 dev;
	__u32 fhandle;
	__u64 fileid;
	__s64 offset;
	__u32 count;
};

struct nfs_readpage_done_ctx {
	__u64 common;
	__u32 dev;
	__u32 fhandle;
	__u64 fileid;
	__s64 offset;
	__u32 arg_count;
	__u32 res_count;
	__u8 eof;
	__u8 pad[3];
	__s32 error; /* bytes on success, -errno on failure */
};

struct nfs_writeback_done_ctx {
	__u64 common;
	__u32 dev;
	__u32 fhandle;
	__u64 fileid;
	__s64 offset;
	__u32 arg_count;
	__u32 res_count;
	__s32 error;
};

struct nfs_commit_done_ctx {
	__u64 common;
	__u32 dev;
	__u32 fhandle;
	__u64 fileid;
	__s64 offset;
	__s32 error;
};

struct nfs_key {
	__u64 fileid;
	__s64 offset;
	__u32 dev;
	__u32 op;
};

struct nfs_slot {
	__u64 issue_ns; /* 0: free */
	__u32 requested;
	__u32 queue_depth;
	__u32 pid;
	__u32 tid;
	char comm[TRAINIO_COMM_LEN];
};

struct nfs_start {
	struct nfs_slot slot[NFS_SLOTS];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct nfs_key);
	__type(value, struct nfs_start);
} nfs_started SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);   /* mount s_dev */
	__type(value, __u32); /* requests outstanding */
} nfs_inflight SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20); /* resized by user space (--ringbuf-mb) */
} nfs_events SEC(".maps");

static const struct nfs_start empty_start = {};

static __always_inline int initiate(__u32 op, struct nfs_initiate_ctx *ctx)
{
	struct nfs_key key = { .fileid = ctx->fileid, .offset = ctx->offset, .dev = ctx->dev, .op = op };
	__u32 dev = ctx->dev, one = 1, *n, qd;
	__u64 id = bpf_get_current_pid_tgid();
	struct nfs_start *st;

	st = bpf_map_lookup_elem(&nfs_started, &key);
	if (!st) {
		bpf_map_update_elem(&nfs_started, &key, &empty_start, BPF_NOEXIST);
		st = bpf_map_lookup_elem(&nfs_started, &key);
		if (!st) {
			count_lost(TRAINIO_LOST_NFS_MAP);
			return 0;
		}
	}
	for (int i = 0; i < NFS_SLOTS; i++) {
		struct nfs_slot *s = &st->slot[i];
		__u64 now = bpf_ktime_get_ns();

		if (__sync_val_compare_and_swap(&s->issue_ns, 0, now) != 0)
			continue; /* taken */
		n = bpf_map_lookup_elem(&nfs_inflight, &dev);
		if (n) {
			qd = __sync_fetch_and_add(n, 1) + 1;
		} else {
			bpf_map_update_elem(&nfs_inflight, &dev, &one, BPF_NOEXIST);
			qd = 1;
		}
		s->requested = ctx->count;
		s->queue_depth = qd;
		s->pid = id >> 32;
		s->tid = (__u32)id;
		current_comm(s->comm);
		return 0;
	}
	count_lost(TRAINIO_LOST_NFS_MAP);
	return 0;
}

/*
 * Frees a slot taken at issue_ns and leaves the mount's flight. False when another
 * completion took the slot first: this completion is then not counted twice.
 */
static __always_inline bool release_slot(struct nfs_slot *s, __u64 issue_ns, __u32 dev)
{
	__u32 *n;

	if (__sync_val_compare_and_swap(&s->issue_ns, issue_ns, 0) != issue_ns)
		return false;
	n = bpf_map_lookup_elem(&nfs_inflight, &dev);
	if (n)
		__sync_fetch_and_add(n, -1);
	return true;
}

static __always_inline int done(__u32 op, __u32 dev, __u64 fileid, __s64 offset, __u32 returned,
				__s32 error)
{
	struct nfs_key key = { .fileid = fileid, .offset = offset, .dev = dev, .op = op };
	struct nfs_start *st = bpf_map_lookup_elem(&nfs_started, &key);
	struct nfs_slot *oldest = NULL;
	struct nfs_event *e;
	__u64 issue_ns;

	if (!st)
		return 0; /* initiated before we attached */
	for (int i = 0; i < NFS_SLOTS; i++) {
		struct nfs_slot *s = &st->slot[i];

		if (s->issue_ns && (!oldest || s->issue_ns < oldest->issue_ns))
			oldest = s;
	}
	if (!oldest)
		return 0;
	issue_ns = oldest->issue_ns;
	e = bpf_ringbuf_reserve(&nfs_events, sizeof(*e), 0);
	if (!e) {
		if (release_slot(oldest, issue_ns, dev))
			count_lost(TRAINIO_LOST_NFS_RINGBUF);
		return 0;
	}
	e->kind = TRAINIO_KIND_NFS;
	e->op = op;
	e->issue_ns = issue_ns;
	e->complete_ns = bpf_ktime_get_ns();
	e->offset = offset;
	e->fileid = fileid;
	e->dev = dev;
	e->requested = oldest->requested;
	e->returned = returned;
	e->queue_depth = oldest->queue_depth;
	e->pid = oldest->pid;
	e->tid = oldest->tid;
	e->error = error < 0 ? error : 0;
	__builtin_memcpy(e->comm, oldest->comm, sizeof(e->comm));
	if (release_slot(oldest, issue_ns, dev))
		submit_batched(nfs_events, e);
	else
		bpf_ringbuf_discard(e, 0);
	return 0;
}

SEC("tracepoint/nfs/nfs_initiate_read")
int tio_nfs_read_init(struct nfs_initiate_ctx *ctx)
{
	return initiate(TRAINIO_NFS_READ, ctx);
}

SEC("tracepoint/nfs/nfs_readpage_done")
int tio_nfs_read_done(struct nfs_readpage_done_ctx *ctx)
{
	return done(TRAINIO_NFS_READ, ctx->dev, ctx->fileid, ctx->offset, ctx->res_count, ctx->error);
}

SEC("tracepoint/nfs/nfs_initiate_write")
int tio_nfs_write_init(struct nfs_initiate_ctx *ctx)
{
	return initiate(TRAINIO_NFS_WRITE, ctx);
}

SEC("tracepoint/nfs/nfs_writeback_done")
int tio_nfs_write_done(struct nfs_writeback_done_ctx *ctx)
{
	return done(TRAINIO_NFS_WRITE, ctx->dev, ctx->fileid, ctx->offset, ctx->res_count, ctx->error);
}

SEC("tracepoint/nfs/nfs_initiate_commit")
int tio_nfs_commit_init(struct nfs_initiate_ctx *ctx)
{
	return initiate(TRAINIO_NFS_COMMIT, ctx);
}

SEC("tracepoint/nfs/nfs_commit_done")
int tio_nfs_commit_done(struct nfs_commit_done_ctx *ctx)
{
	return done(TRAINIO_NFS_COMMIT, ctx->dev, ctx->fileid, ctx->offset, 0, ctx->error);
}
