// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Block layer: one record per request completion, with the queue depth the request met.
 *
 * The in-flight count per device lives in the kernel (devtab) and is updated at
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
struct block_batch _block_batch_type = {};

#define MINORBITS 20
#define MKDEV(ma, mi) (((ma) << MINORBITS) | (mi))

/*
 * Per-device state: the in-flight count, and (with filter_devs) membership in the device
 * filter. A device lives in the slot of devtab its number hashes to (an inlined array
 * lookup), or in the devs hash map when that slot belongs to another device. With
 * filter_devs, user space places the selected devices and a miss means "not traced";
 * without it, entries are claimed on first sight.
 */
const volatile bool filter_devs = false;

struct dev_state {
	__u32 dev;      /* 0: free */
	__u32 inflight; /* requests issued and not yet completed */
	__u32 unacct;   /* of those, requests the disk's own in-flight count leaves out */
	__u32 pad;
};

/*
 * log2 of the sizes of devtab and slots; user space sizes the maps to match (tests set
 * both to 0, one slot each, to drive every other device and request to the hash maps).
 */
const volatile __u32 dev_bits = 10;
const volatile __u32 slot_bits = 15;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1 << 10); /* 1 << dev_bits, set by user space */
	__type(key, __u32);
	__type(value, struct dev_state);
} devtab SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); /* dev */
	__type(value, struct dev_state);
} devs SEC(".maps");

/*
 * What is known about a request between insert/issue and its final completion. The
 * offset and remaining bytes are taken at issue (requests can still merge after insert)
 * and advanced by partial completions, so the completion probe never reads the request.
 */
struct req_state {
	__u64 rq;          /* the struct request * this belongs to; 0 = free slot */
	__u64 insert_ns;
	__u64 issue_ns;    /* 0 until issued (and again after a requeue) */
	__u64 offset;      /* bytes; next byte to complete */
	__u32 remaining;   /* bytes not yet completed */
	__u32 cmd_flags;
	__u32 queue_depth;
	__u32 dev;
	__u32 acct;        /* in the disk's own in-flight count (disk_in_flight) */
	__u32 pid;
	__u32 tid;
	char comm[TRAINIO_COMM_LEN];
};

/*
 * Requests are found by their pointer. The fast path is a slot array indexed by a hash
 * of the pointer, claimed with a compare-and-swap (array lookups are inlined: no hash
 * map update/delete per request, which was ~40% of the probes' time). A request whose
 * slot is taken by another live request goes to the hash map instead.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1 << 15); /* 1 << slot_bits, set by user space */
	__type(key, __u32);
	__type(value, struct req_state);
} slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct req_state);
} overflow SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20); /* resized by user space (--ringbuf-mb) */
} block_events SEC(".maps");

/*
 * Completions waiting to be written, per CPU (trainio.h, struct block_batch). A batch is
 * written when full, when a completion finds its first event older than batch_age_ns,
 * and by tio_block_flush, which user space runs on every CPU a few times a second (so
 * that a CPU gone quiet does not hold events back) and once more after detaching.
 *
 * `busy` guards the batch against the one way two programs can meet on it: the flush
 * program (run from user space with preemption off, or in an IPI) and the completion
 * program (in task, softirq or hardirq context) interrupting each other on one CPU.
 * Each claims the batch with `busy` before touching it; an interrupting run that finds
 * it claimed stays off (the completion writes its event alone, the flush waits for its
 * next turn). A run interrupted before its claim sees the interrupting one finish first,
 * so a plain flag is enough. Two runs of the completion program never meet: the kernel
 * does not nest a tracing program in itself on one CPU.
 */
const volatile __u64 batch_age_ns = 50 * 1000 * 1000;

struct block_pending {
	__u32 busy;
	__u32 pad;
	__u64 first_ns; /* complete_ns of batch.ev[0] */
	struct block_batch batch;
};

/* Exported to Rust (the recorder reads what is left in it at the end). */
struct block_pending _block_pending_type = {};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct block_pending);
} pending SEC(".maps");


/*
 * The verifier forbids arithmetic on the trusted request pointer. Storing it in a map
 * value and loading it back yields a plain number (privileged programs may do this).
 * Each program has a word of its own: the kernel never runs a tracing program inside
 * itself on one CPU, but insert, issue and complete do interrupt each other (a
 * completion in a softirq on the way out of an interrupt that hit the issue probe), and
 * a shared word could be overwritten between one program's store and its load.
 */
enum scratch_word { W_INSERT, W_ISSUE, W_REQUEUE, W_COMPLETE, W_STATS, W_PCPU, W_PCPU_BASE, W_NWORDS };

struct cpu_state {
	__u64 scratch[W_NWORDS];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cpu_state);
} cpu SEC(".maps");

static __always_inline struct cpu_state *cpu_state(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&cpu, &zero);
}

static __always_inline __u64 as_number(enum scratch_word word, const void *ptr)
{
	struct cpu_state *c = cpu_state();

	if (!c || word >= W_NWORDS)
		return 0;
	c->scratch[word] = (__u64)ptr;
	return *(volatile __u64 *)&c->scratch[word];
}

static __always_inline __u64 rq_key(enum scratch_word word, struct request *rq)
{
	return as_number(word, rq);
}

static __always_inline __u32 slot_of(__u64 rq)
{
	/* Requests sit in arrays with cache-line aligned strides: hash the line number. */
	__u64 h = (rq >> 6) * 0x9E3779B97F4A7C15ULL;

	return slot_bits ? h >> (64 - slot_bits) : 0;
}

/* The state of a request we are tracking, or NULL. */
static __always_inline struct req_state *find_req(__u64 rq)
{
	__u32 i = slot_of(rq);
	struct req_state *s = bpf_map_lookup_elem(&slots, &i);

	if (s && s->rq == rq)
		return s;
	return bpf_map_lookup_elem(&overflow, &rq);
}

/*
 * The state of a request that is being inserted or issued: its slot when free (claimed
 * with one compare-and-swap, the common case, *fresh set) or already its own (*fresh
 * clear), else an overflow entry, existing or new.
 */
static __always_inline struct req_state *claim_req(__u64 rq, bool *fresh)
{
	__u32 i = slot_of(rq);
	struct req_state *s = bpf_map_lookup_elem(&slots, &i), new = {};
	__u64 owner;

	if (s) {
		owner = __sync_val_compare_and_swap(&s->rq, 0, rq);
		*fresh = owner == 0;
		if (owner == 0 || owner == rq)
			return s;
	}
	s = bpf_map_lookup_elem(&overflow, &rq);
	*fresh = !s;
	if (s)
		return s;
	new.rq = rq;
	if (bpf_map_update_elem(&overflow, &rq, &new, BPF_ANY)) {
		count_lost(TRAINIO_LOST_BLOCK_MAP);
		return NULL;
	}
	return bpf_map_lookup_elem(&overflow, &rq);
}

static __always_inline void release_req(struct req_state *s, __u64 rq)
{
	__u32 i = slot_of(rq);
	struct req_state *slot = bpf_map_lookup_elem(&slots, &i);

	if (slot == s) {
		__sync_fetch_and_and(&s->rq, 0); /* after every read of s: a full barrier */
	} else {
		/*
		 * A hash map refuses a delete (-EBUSY) that interrupts another update of it on
		 * this CPU: the entry then stays, and must not look issued to the request's
		 * next life.
		 */
		s->issue_ns = 0;
		bpf_map_delete_elem(&overflow, &rq);
	}
}

/* tp_btf arguments are trusted BTF pointers: direct loads, no probe-read helper calls. */
static __always_inline __u32 request_dev(struct request *rq)
{
	struct gendisk *disk = request_disk(rq);

	if (!disk)
		return 0;
	return MKDEV(disk->major, disk->first_minor);
}

/* Same function in user space (probes.rs), which places the filtered devices. */
static __always_inline __u32 dev_slot(__u32 dev)
{
	__u32 h = dev * 0x9E3779B1U;

	return dev_bits ? h >> (32 - dev_bits) : 0;
}

static __always_inline struct dev_state *dev_state(__u32 dev)
{
	__u32 i = dev_slot(dev);
	struct dev_state *d = bpf_map_lookup_elem(&devtab, &i), fresh = {.dev = dev};

	if (!d || !dev)
		return NULL;
	if (d->dev == dev)
		return d;
	if (!filter_devs && !d->dev) {
		__u32 owner = __sync_val_compare_and_swap(&d->dev, 0, dev);

		if (owner == 0 || owner == dev)
			return d;
	}
	d = bpf_map_lookup_elem(&devs, &dev);
	if (d || filter_devs)
		return d;
	bpf_map_update_elem(&devs, &dev, &fresh, BPF_NOEXIST);
	return bpf_map_lookup_elem(&devs, &dev);
}

/* The current task, from its task_struct: one helper call rather than three. */
static __always_inline void note_task(struct req_state *s)
{
	struct task_struct *task = bpf_get_current_task_btf();

	s->pid = task->tgid;
	s->tid = task->pid;
	task_comm(s->comm, task);
}

static __always_inline void leave_flight(struct req_state *s)
{
	struct dev_state *d = dev_state(s->dev);

	if (!d)
		return;
	if (!s->acct)
		__sync_fetch_and_add(&d->unacct, -1);
	__sync_fetch_and_add(&d->inflight, -1);
}

/*
 * The disk's own count of requests in flight, for the queue depth to trust no more than
 * the kernel does. A completion the probe never sees (docs/design/recorder.md) leaves
 * its request in devtab's count until the request is issued again, one round of the
 * device's tags later; the disk's count drops in that same completion, after the
 * tracepoint and after the request's bios end (a reader those wake may issue its next
 * request before the drop, and meet the missed one). It counts a request from its accounting (before issue) to its end
 * (after block_rq_complete), in per-CPU counters of the whole disk's block_device
 * (disk_stats.in_flight): every request devtab counts in flight is in it, except those
 * the disk does not account (passthrough, the flush machinery's own requests, and
 * partitions', counted on the partition), which dev_state.unacct counts.
 *
 * Reading another CPU's counter takes that CPU's per-CPU offset, which this kernel
 * exports to BPF neither as a symbol nor through a per-CPU pointer type. The block layer
 * holds it: a request's software queue (rq->mq_ctx, for CPU mq_ctx->cpu) is an address
 * in the per-CPU area the queue's queue_ctx points to; their difference is that CPU's
 * offset. learn_cpu_offsets() keeps each one met (every CPU of the request's hardware
 * queue, until all are known), and the count is read only once every possible CPU's
 * offset is known (nr_cpus, set by user space): a counter left out could hold any part
 * of the sum.
 *
 * Returns -1 where the count is not known: kernels that count blk-mq requests by walking
 * the tags (no per-CPU count: it stays 0 while this request, accounted, is in flight),
 * before every CPU's offset is known, or on a host with more CPUs than DISK_CPUS.
 */
#define DISK_CPUS 256
#define HCTX_CTXS 64 /* software queues of a hardware queue looked at per issue */
const volatile __u32 nr_cpus = 0;

__u64 cpu_off[DISK_CPUS];
__u32 cpu_off_known[DISK_CPUS];
__u32 cpus_known;

static __always_inline void learn_cpu_offset(__u64 base, struct blk_mq_ctx *ctx)
{
	__u32 at, cpu;

	if (!ctx || bpf_probe_read_kernel(&at, sizeof(at), &ctx->cpu) || at >= DISK_CPUS)
		return;
	/* The compiler reloads the value from the stack, past its check: mask what it uses. */
	cpu = at;
	barrier_var(cpu);
	cpu &= DISK_CPUS - 1;
	if (cpu_off_known[cpu])
		return;
	cpu_off[cpu] = as_number(W_PCPU, ctx) - base;
	if (__sync_val_compare_and_swap(&cpu_off_known[cpu], 0, 1) == 0)
		__sync_fetch_and_add(&cpus_known, 1);
}

static __always_inline void learn_cpu_offsets(struct request *rq)
{
	struct blk_mq_hw_ctx *hctx;
	struct blk_mq_ctx **ctxs, *ctx;
	__u64 base;
	__u16 n;
	int i;

	/* Learnt once: every later issue goes straight to the counters. */
	if (cpus_known >= nr_cpus)
		return;
	hctx = rq->mq_hctx;
	base = as_number(W_PCPU_BASE, rq->q->queue_ctx);
	learn_cpu_offset(base, rq->mq_ctx);
	if (cpus_known >= nr_cpus || !hctx)
		return;
	ctxs = hctx->ctxs;
	n = hctx->nr_ctx;
	for (i = 0; i < HCTX_CTXS && i < n; i++) {
		if (bpf_probe_read_kernel(&ctx, sizeof(ctx), &ctxs[i]))
			return;
		learn_cpu_offset(base, ctx);
	}
}

static __always_inline long disk_in_flight(struct request *rq)
{
	struct block_device *part = rq->part;
	long n = 0, v[2];
	__u64 stats;
	__u32 cpu;

	if (!part || nr_cpus == 0 || nr_cpus > DISK_CPUS)
		return -1;
	learn_cpu_offsets(rq);
	if (cpus_known < nr_cpus)
		return -1;
	stats = as_number(W_STATS, part->bd_stats) + bpf_core_field_offset(struct disk_stats, in_flight);
	for (cpu = 0; cpu < DISK_CPUS && cpu < nr_cpus; cpu++) {
		if (!cpu_off_known[cpu] ||
		    bpf_probe_read_kernel(v, sizeof(v), (void *)(stats + cpu_off[cpu])))
			return -1;
		n += v[0] + v[1];
	}
	return n;
}

/* In the disk's own in-flight count: accounted (RQF_IO_STAT), on the whole disk. */
static __always_inline bool disk_accounts(struct request *rq)
{
	struct gendisk *disk = request_disk(rq);

	if (!bpf_core_enum_value_exists(enum rqf_flags, __RQF_IO_STAT) || !disk)
		return false;
	return (rq->rq_flags & (1U << bpf_core_enum_value(enum rqf_flags, __RQF_IO_STAT))) &&
	       rq->part == disk->part0;
}

/*
 * The queue depth request rq meets at issue: devtab's count, bounded by the disk's own
 * count plus the requests it leaves out.
 */
static __always_inline __u32 depth_at_issue(struct request *rq, struct dev_state *d, __u32 qd, bool acct)
{
	long disk, bound;

	if (qd <= 1 || !acct)
		return qd;
	disk = disk_in_flight(rq);
	if (disk < 1)
		return qd; /* rq is in it: 0 means the count is not kept */
	bound = disk + (long)d->unacct;
	return bound < qd ? bound : qd;
}

/*
 * A state still marked issued when its request is inserted or issued anew belongs to an
 * earlier life of the request whose completion the probe never saw: take it out of
 * flight (or every later request would meet one more in flight) and count the
 * completion as lost. docs/design/recorder.md says when the kernel skips the probe.
 */
static __always_inline void drop_unseen(struct req_state *s)
{
	leave_flight(s);
	s->issue_ns = 0;
	count_lost(TRAINIO_LOST_BLOCK_UNSEEN);
}

static __always_inline void on_insert(struct request *rq, __u64 key)
{
	__u32 dev = request_dev(rq);
	struct req_state *s;
	bool fresh;

	if (!dev_state(dev))
		return;
	s = claim_req(key, &fresh);
	if (!s)
		return;
	if (!fresh && s->issue_ns)
		drop_unseen(s); /* a requeue clears issue_ns before the request comes back */
	s->insert_ns = bpf_ktime_get_ns();
	s->issue_ns = 0;
	s->dev = dev;
	note_task(s);
}

static __always_inline void on_issue(struct request *rq, __u64 key)
{
	__u32 dev = request_dev(rq);
	struct dev_state *d = dev_state(dev);
	struct req_state *s;
	bool fresh;

	if (!d)
		return;
	/* Claim first: most requests are issued without an insert, into a free slot. */
	s = claim_req(key, &fresh);
	if (!s)
		return;
	if (!fresh) {
		if (s->issue_ns) {
			/* Issued twice without a requeue: keep the first. */
			if (!rq->start_time_ns || s->issue_ns >= rq->start_time_ns)
				return;
			drop_unseen(s); /* issued before this request was allocated */
		}
		/*
		 * Not inserted (a requeue of a directly issued request), or an entry left by an
		 * earlier life of this request (inserted, then merged away and freed without
		 * completing), which predates the request's allocation: start afresh.
		 */
		fresh = !s->insert_ns || s->insert_ns < rq->start_time_ns;
	}
	if (fresh) {
		/* Dispatched without passing the scheduler: the issuer is the submitter. */
		s->insert_ns = 0;
		s->dev = dev;
		note_task(s);
	}
	s->offset = rq->__sector << 9;
	s->remaining = rq->__data_len;
	s->cmd_flags = rq->cmd_flags;
	s->acct = disk_accounts(rq);
	if (!s->acct)
		__sync_fetch_and_add(&d->unacct, 1);
	s->queue_depth = depth_at_issue(rq, d, __sync_fetch_and_add(&d->inflight, 1) + 1, s->acct);
	s->issue_ns = bpf_ktime_get_ns();
}

SEC("tp_btf/block_rq_insert")
int BPF_PROG(tio_rq_insert, struct request *rq)
{
	on_insert(rq, rq_key(W_INSERT, rq));
	return 0;
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(tio_rq_issue, struct request *rq)
{
	on_issue(rq, rq_key(W_ISSUE, rq));
	return 0;
}

SEC("tp_btf/block_rq_requeue")
int BPF_PROG(tio_rq_requeue, struct request *rq)
{
	struct req_state *s = find_req(rq_key(W_REQUEUE, rq));

	if (s && s->issue_ns) {
		leave_flight(s);
		s->issue_ns = 0;
	}
	return 0;
}

static __always_inline void fill_event(struct block_event *e, struct req_state *s, __u64 now,
				       unsigned int nr_bytes, blk_status_t error)
{
	e->kind = TRAINIO_KIND_BLOCK;
	e->dev = s->dev;
	e->insert_ns = s->insert_ns;
	e->issue_ns = s->issue_ns;
	e->complete_ns = now;
	e->sector = s->offset >> 9;
	e->bytes = nr_bytes;
	e->cmd_flags = s->cmd_flags;
	e->queue_depth = s->queue_depth;
	e->pid = s->pid;
	e->tid = s->tid;
	e->error = error;
	__builtin_memcpy(e->comm, s->comm, sizeof(e->comm));
}

/* Writes the batch (the caller holds p->busy) and empties it. */
static __always_inline void flush_pending(struct block_pending *p)
{
	__u32 n = p->batch.count;
	__u64 len;

	if (n == 0 || n > TRAINIO_BLOCK_BATCH) /* n > BATCH cannot happen: bounds len */
		return;
	/*
	 * The empty asm hides that len's low bits are zero, or the compiler adds the header
	 * with an OR, whose bounds the verifier widens past the map value.
	 */
	len = n * sizeof(struct block_event);
	__asm__ __volatile__("" : "+r"(len));
	len += __builtin_offsetof(struct block_batch, ev);
	p->batch.kind = TRAINIO_KIND_BLOCK_BATCH;
	if (bpf_ringbuf_output(&block_events, &p->batch, len, wake_flags(&block_events)))
		count_lost_n(TRAINIO_LOST_BLOCK_RINGBUF, n);
	p->batch.count = 0;
}

/* Adds one completion to this CPU's batch, or writes it alone when a flush holds the batch. */
static __always_inline void emit(struct req_state *s, __u64 now, unsigned int nr_bytes, blk_status_t error)
{
	__u32 zero = 0, n;
	struct block_pending *p = bpf_map_lookup_elem(&pending, &zero);
	struct block_event *e;

	if (p && !p->busy) {
		p->busy = 1;
		barrier();
		n = p->batch.count & (TRAINIO_BLOCK_BATCH - 1); /* always < BATCH: full ones are flushed */
		fill_event(&p->batch.ev[n], s, now, nr_bytes, error);
		if (n == 0)
			p->first_ns = now;
		p->batch.count = n + 1;
		if (n + 1 == TRAINIO_BLOCK_BATCH || now - p->first_ns >= batch_age_ns)
			flush_pending(p);
		barrier();
		p->busy = 0;
		return;
	}
	e = bpf_ringbuf_reserve(&block_events, sizeof(*e), 0);
	if (!e) {
		count_lost(TRAINIO_LOST_BLOCK_RINGBUF);
		return;
	}
	fill_event(e, s, now, nr_bytes, error);
	submit_batched(block_events, e);
}

/*
 * The request is only used as a key here: Linux 6.1's verifier does not treat this
 * tracepoint's argument as a trusted pointer, and everything needed was kept at issue.
 */
static __always_inline void on_complete(__u64 key, blk_status_t error, unsigned int nr_bytes)
{
	struct req_state *s = find_req(key);

	if (!s || !s->issue_ns)
		return; /* issued before we attached, or on a device we do not trace */
	emit(s, bpf_ktime_get_ns(), nr_bytes, error);
	if (nr_bytes >= s->remaining) {
		leave_flight(s);
		release_req(s, key);
	} else {
		s->offset += nr_bytes;
		s->remaining -= nr_bytes;
	}
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(tio_rq_complete, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
	on_complete(rq_key(W_COMPLETE, rq), error, nr_bytes);
	return 0;
}

/*
 * Writes this CPU's batch if its first event is batch_age_ns old, or whatever its age
 * when args[0] is non-zero. Never attached: user space runs it on each CPU
 * (BPF_PROG_TEST_RUN with BPF_F_TEST_RUN_ON_CPU).
 */
SEC("raw_tp")
int tio_block_flush(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 zero = 0;
	struct block_pending *p = bpf_map_lookup_elem(&pending, &zero);

	if (!p || p->busy || !p->batch.count)
		return 0;
	if (!ctx->args[0] && bpf_ktime_get_ns() - p->first_ns < batch_age_ns)
		return 0;
	p->busy = 1;
	barrier();
	flush_pending(p);
	barrier();
	p->busy = 0;
	return 0;
}
