// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * NFS client: one record per READ/WRITE/COMMIT request a mount sends, with the number
 * of requests outstanding on that mount when it was sent.
 *
 * Classic tracepoints of the nfs module; their fields are read by the offsets of the
 * tracepoint format (stable since 5.x, checked against Debian 12's 6.1 in
 * docs/design/nfs-guest.md), because the build machine's vmlinux.h may have no NFS types.
 * Completions run in rpciod workers, so requests are paired by (dev, fileid, offset, op),
 * never by pid. The same range can be in flight twice (concurrent O_DIRECT readers):
 * each key holds NFS_SLOTS starts, claimed and released by compare-and-swap on issue_ns,
 * and a completion takes the oldest. Keys are never deleted (a completion could delete
 * an element another CPU is filling); the LRU map ages out the ones no longer used.
 *
 * RPC fields. The nfs:*_done tracepoints carry no RPC identity, but they fire inside the
 * RPC task's rpc_exit_task(), on the thread that runs it (an rpciod worker), right after
 * two sunrpc tracepoints of the same task (net/sunrpc/sched.c, since 5.x):
 *
 *   rpc_exit_task(task)
 *     trace_rpc_task_end(task)            -> forget what this thread held
 *     rpc_count_iostats(task)
 *       trace_rpc_stats_latency(task)     -> hold xid, backlog, rtt, execute for this thread
 *     task->tk_ops->rpc_call_done(task)
 *       trace_nfs_{readpage,writeback,commit}_done -> take what this thread holds
 *
 * All three run synchronously on one thread, so the thread id joins them exactly (this is
 * not the issuing process's pid: the request is still paired by dev/fileid/offset/op).
 * A task whose stats were not counted (no request slot) finds nothing, because
 * rpc_task_end cleared the thread's entry first. Transmissions are counted per
 * (client_id, xid) from xprt_transmit (status 0 only) and taken at rpc_stats_latency.
 * The sunrpc fields are read at offsets user space takes from the tracefs format files
 * at load time, because their layout differs between kernels (6.1 vs 6.8+).
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
enum trainio_rpc_flags _rpc_flags_type = 0;

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

/* Offsets of the sunrpc tracepoint fields, from tracefs format files (set at load). */
const volatile __u32 lat_client_off = 12, lat_xid_off = 16;
const volatile __u32 lat_backlog_off = 32, lat_rtt_off = 40, lat_execute_off = 48;
const volatile __u32 lat_time_size = 8; /* sizeof(unsigned long) in the record */
const volatile __u32 xmit_client_off = 12, xmit_xid_off = 16, xmit_status_off = 24;
const volatile bool count_xmits = false; /* xprt_transmit attached */

/* What rpc_stats_latency left for the nfs completion that follows on the same thread. */
struct rpc_held {
	__u32 xid;
	__u32 ntrans;
	__u64 backlog_us;
	__u64 rtt_us;
	__u64 execute_us;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); /* thread id running the RPC task's exit */
	__type(value, struct rpc_held);
} rpc_by_thread SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);   /* client_id << 32 | xid */
	__type(value, __u32); /* successful transmissions */
} rpc_xmits SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20); /* resized by user space (--ringbuf-mb) */
} nfs_events SEC(".maps");

static const struct nfs_start empty_start = {};

static __always_inline __u32 field_u32(const void *ctx, __u32 off)
{
	__u32 v = 0;

	bpf_probe_read_kernel(&v, sizeof(v), ctx + off);
	return v;
}

static __always_inline __u64 field_ulong(const void *ctx, __u32 off)
{
	__u64 v = 0;

	if (lat_time_size == 8)
		bpf_probe_read_kernel(&v, 8, ctx + off);
	else
		bpf_probe_read_kernel(&v, 4, ctx + off);
	return v;
}

static __always_inline __u32 this_thread(void)
{
	return (__u32)bpf_get_current_pid_tgid();
}

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

/* The RPC fields this thread's rpc_stats_latency left for this completion, if any. */
static __always_inline void take_rpc(struct nfs_event *e)
{
	__u32 tid = this_thread();
	struct rpc_held *h = bpf_map_lookup_elem(&rpc_by_thread, &tid);

	e->rpc = 0;
	e->rpc_xid = 0;
	e->rpc_ntrans = 0;
	e->rpc_backlog_us = 0;
	e->rpc_rtt_us = 0;
	e->rpc_execute_us = 0;
	if (!h)
		return;
	e->rpc = TRAINIO_RPC_STATS | (h->ntrans ? TRAINIO_RPC_NTRANS : 0);
	e->rpc_xid = h->xid;
	e->rpc_ntrans = h->ntrans;
	e->rpc_backlog_us = h->backlog_us;
	e->rpc_rtt_us = h->rtt_us;
	e->rpc_execute_us = h->execute_us;
	bpf_map_delete_elem(&rpc_by_thread, &tid);
}

/* The slot of the oldest start under this key that is still held, or NULL. */
static __always_inline struct nfs_slot *oldest_slot(struct nfs_start *st)
{
	struct nfs_slot *oldest = NULL;

	for (int i = 0; i < NFS_SLOTS; i++) {
		struct nfs_slot *s = &st->slot[i];

		if (s->issue_ns && (!oldest || s->issue_ns < oldest->issue_ns))
			oldest = s;
	}
	return oldest;
}

/*
 * A completion takes the oldest start under its key: copies it to *out and frees its slot.
 * Two completions of one range on two CPUs (concurrent O_DIRECT readers) can both pick
 * the same slot: the one whose release fails takes the next oldest, so each of them gets
 * a start. False when no start could be taken.
 */
static __always_inline bool take_oldest(struct nfs_start *st, __u32 dev, struct nfs_slot *out)
{
	for (int attempt = 0; attempt < NFS_SLOTS; attempt++) {
		struct nfs_slot *s = oldest_slot(st);

		if (!s)
			return false;
		/* The fields are read before the release: after it, an initiate may reuse the slot. */
		__builtin_memcpy(out, s, sizeof(*out));
		if (out->issue_ns && release_slot(s, out->issue_ns, dev))
			return true;
	}
	return false;
}

static __always_inline int done(__u32 op, __u32 dev, __u64 fileid, __s64 offset, __u32 returned,
				__s32 error)
{
	struct nfs_key key = { .fileid = fileid, .offset = offset, .dev = dev, .op = op };
	struct nfs_start *st = bpf_map_lookup_elem(&nfs_started, &key);
	struct nfs_slot start;
	struct nfs_event *e;

	if (!st)
		return 0; /* initiated before we attached */
	if (!take_oldest(st, dev, &start))
		return 0;
	e = bpf_ringbuf_reserve(&nfs_events, sizeof(*e), 0);
	if (!e) {
		count_lost(TRAINIO_LOST_NFS_RINGBUF);
		return 0;
	}
	e->kind = TRAINIO_KIND_NFS;
	e->op = op;
	e->issue_ns = start.issue_ns;
	e->complete_ns = bpf_ktime_get_ns();
	e->offset = offset;
	e->fileid = fileid;
	e->dev = dev;
	e->requested = start.requested;
	e->returned = returned;
	e->queue_depth = start.queue_depth;
	e->pid = start.pid;
	e->tid = start.tid;
	e->error = error < 0 ? error : 0;
	__builtin_memcpy(e->comm, start.comm, sizeof(e->comm));
	take_rpc(e);
	submit_batched(nfs_events, e);
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

SEC("tracepoint/sunrpc/rpc_task_end")
int tio_rpc_task_end(void *ctx)
{
	__u32 tid = this_thread();

	bpf_map_delete_elem(&rpc_by_thread, &tid);
	return 0;
}

SEC("tracepoint/sunrpc/xprt_transmit")
int tio_rpc_transmit(void *ctx)
{
	__u64 key;
	__u32 one = 1, *n;

	if ((__s32)field_u32(ctx, xmit_status_off) != 0)
		return 0; /* not sent */
	key = (__u64)field_u32(ctx, xmit_client_off) << 32 | field_u32(ctx, xmit_xid_off);
	n = bpf_map_lookup_elem(&rpc_xmits, &key);
	if (n) {
		__sync_fetch_and_add(n, 1);
		return 0;
	}
	if (bpf_map_update_elem(&rpc_xmits, &key, &one, BPF_NOEXIST) == 0)
		return 0;
	n = bpf_map_lookup_elem(&rpc_xmits, &key); /* another CPU inserted it first */
	if (n)
		__sync_fetch_and_add(n, 1);
	else
		count_lost(TRAINIO_LOST_RPC_MAP);
	return 0;
}

SEC("tracepoint/sunrpc/rpc_stats_latency")
int tio_rpc_latency(void *ctx)
{
	__u32 tid = this_thread();
	struct rpc_held h = {};
	__u64 key;
	__u32 *n;

	h.xid = field_u32(ctx, lat_xid_off);
	h.backlog_us = field_ulong(ctx, lat_backlog_off);
	h.rtt_us = field_ulong(ctx, lat_rtt_off);
	h.execute_us = field_ulong(ctx, lat_execute_off);
	if (count_xmits) {
		key = (__u64)field_u32(ctx, lat_client_off) << 32 | h.xid;
		n = bpf_map_lookup_elem(&rpc_xmits, &key);
		if (n) {
			h.ntrans = *n;
			bpf_map_delete_elem(&rpc_xmits, &key);
		}
	}
	if (bpf_map_update_elem(&rpc_by_thread, &tid, &h, BPF_ANY) != 0)
		count_lost(TRAINIO_LOST_RPC_MAP);
	return 0;
}
