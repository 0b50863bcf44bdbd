// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * File layer: the read/write/open/close syscalls of the traced processes, one record per
 * syscall exit, with the offset the syscall read at and the process's read concurrency.
 * Recorded with it, in the same ring buffer:
 *   proc  the traced processes' forks (of processes, not threads), execs, renames and
 *         exits (struct process_event);
 *   ipc   their reads and writes on pipes, FIFOs and sockets, and their poll/ppoll calls
 *         whose first pollfd is one (struct ipc_event). These do not count in the file
 *         layer's read concurrency.
 *   object with object_layer set, a send or receive on a TCP socket is a struct http_event
 *         (the ipc row, the peer, and the first bytes when they start an HTTP head),
 *         from which user space rebuilds the HTTP object requests (tracer/src/object.rs).
 *         Off, it costs the one load of object_layer per socket syscall.
 *
 * Where each lives: this file holds the traced-process filter, the per-thread syscall
 * state and the read/write/close/sync and poll probes; file_ipc.bpf.h the ipc and object
 * records, file_mmap.bpf.h reads through mmap, file_open.bpf.h opens and their paths,
 * file_proc.bpf.h the proc layer, file_uring.bpf.h io_uring. They are headers of one
 * object, not objects of their own, because every concern uses the same maps: `traced`
 * (the filter, which the proc layer's fork and exit also change), `pending` (the thread's
 * syscall under way) and the ring buffer `file_events`.
 *
 * Which processes are traced (target_mode):
 *   ALL     every process but the tracer itself;
 *   TGIDS   the tgids in `traced`, seeded by user space and followed through fork;
 *   CGROUP  tasks in the cgroup-v2 target_cgroup_id or below it (its ancestor at
 *           target_cgroup_level is it), e.g. every pod under kubepods.slice.
 * Entry and exit of one syscall are paired through the thread's own storage (a thread is
 * in one syscall at a time). For plain read()/write()/readv() the offset is the file
 * position at entry.
 *
 * These are classic syscall tracepoints, one per syscall: the kernel builds a perf record
 * of the arguments before running the program (~500 ns of the ~1.1 us a traced read costs
 * here, make bench-file), and closing each link waits out an RCU grace period (~1.4 s at
 * the end of a recording). One BTF program on raw_syscalls sys_enter/sys_exit, dispatching
 * on the syscall number, avoids both, but runs on every syscall of every task: it costs
 * ~75 ns per untraced syscall and 5 points of bench-tracer's 4 KiB io_uring IOPS (fio
 * makes one io_uring_enter per I/O), so the probes are per-syscall (docs/design/recorder.md).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "trainio.h"
#include "common.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Globals only so that the skeleton exports the event types to Rust. */
struct file_event _file_event_type = {};
struct open_event _open_event_type = {};
enum trainio_kind _kind_type = 0;
enum trainio_file_op _file_op_type = 0;
struct process_event _proc_event_type = {};
struct ipc_event _ipc_event_type = {};
enum trainio_proc_op _proc_op_type = 0;
enum trainio_ipc_op _ipc_op_type = 0;
enum trainio_ipc_type _ipc_type_type = 0;
struct http_event _http_event_type = {};

#define TARGET_ALL 0
#define TARGET_TGIDS 1
#define TARGET_CGROUP 2
#define MAX_IOVECS 16
#define S_IFMT 00170000
#define S_IFIFO 0010000
#define S_IFBLK 0060000
#define S_IFREG 0100000
#define S_IFSOCK 0140000

const volatile __u32 target_mode = TARGET_ALL;
const volatile __u64 target_cgroup_id = 0;
const volatile __u32 target_cgroup_level = 0;
const volatile __u32 self_tgid = 0;
/* The object layer: sends and receives on TCP sockets become http_events (see trainio.h). */
const volatile __u32 object_layer = 0;

#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_TCP 6

/*
 * A process's read/write syscalls in flight (its read concurrency): the value of its
 * `traced` entry with TGIDS, so that one lookup both admits the process and finds its
 * count; its proc_inflight entry otherwise.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);   /* tgid */
	__type(value, __u32); /* in flight; user space and fork add entries at 0 */
} traced SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);   /* tgid */
	__type(value, __u32); /* in flight */
} proc_inflight SEC(".maps");

struct pending_io {
	__u64 enter_ns;
	__s64 offset;
	__u64 requested;
	__u64 user_ptr; /* openat: the path, read again at exit */
	__u64 ino;
	__u32 op;
	__s32 fd;
	__u32 queue_depth;
	__u32 dev;
	__u32 flags;
	__u32 ipc; /* enum trainio_ipc_type of an ipc syscall (op is then a trainio_ipc_op); 0: file layer */
	/* Object layer, on a TCP socket (family != 0): the peer, and the syscall's buffer. */
	__u64 buf;     /* user address of the data (the first iovec's with readv/writev/msg) */
	__u64 buf_len; /* its length */
	__u8 daddr[16];
	__u16 dport;
	__u16 family; /* 0: not an object-layer syscall */
	__u32 pad;
};

/*
 * The syscall a thread is in, from entry to exit: task-local storage, found through the
 * task itself (no hash of the thread id, no update and delete per syscall: those were
 * ~40% of the entry probe's time), and gone with the thread. enter_ns = 0: none.
 */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct pending_io);
} pending SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20); /* resized by user space (--ringbuf-mb) */
} file_events SEC(".maps");

/*
 * Whether the process is traced; with TGIDS, *count is also set to its in-flight count
 * (its `traced` entry), which the caller then need not look up again.
 */
static __always_inline bool is_traced(__u32 tgid, __u32 **count)
{
	if (tgid == self_tgid)
		return false;
	if (target_mode == TARGET_TGIDS)
		return (*count = bpf_map_lookup_elem(&traced, &tgid)) != NULL;
	if (target_mode == TARGET_CGROUP)
		return bpf_get_current_ancestor_cgroup_id(target_cgroup_level) == target_cgroup_id;
	return true;
}

/*
 * The file behind fd. The task's fd table is reached by direct loads (BTF pointers, no
 * helper calls); the table's slot takes one probe read, and what it holds is a plain
 * address to the verifier, so the file and its inode are read with probe reads.
 */
static __always_inline struct file *fd_to_file(struct task_struct *task, int fd)
{
	struct files_struct *files = task->files;
	struct fdtable *fdt;
	struct file **fds, *f = NULL;

	if (!files || fd < 0)
		return NULL;
	fdt = files->fdt;
	if (!fdt || (unsigned int)fd >= fdt->max_fds)
		return NULL;
	fds = fdt->fd;
	bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]);
	return f;
}

/*
 * The members of a struct file and its inode that a record needs, each struct read with
 * one probe read of SPAN bytes from its first wanted member, at offsets the CO-RE
 * relocations fix at load time (one helper call each instead of one per member: the
 * entry probe's largest cost). A kernel whose members lie further apart falls back to
 * one read per member.
 */
#define SPAN 128
#define MIN3(a, b, c) ((a) < (b) ? ((a) < (c) ? (a) : (c)) : ((b) < (c) ? (b) : (c)))
#define AT(buf, off, type) (*(type *)((buf) + (off)))

struct file_bits {
	struct inode *inode;
	__s64 pos;
	__u32 flags;
	__u32 dev; /* s_dev of a file, i_rdev of a block node */
	__u64 ino;
};

static __always_inline void read_file_bits(struct file *f, struct file_bits *b)
{
	__u32 oi = bpf_core_field_offset(struct file, f_inode);
	__u32 of = bpf_core_field_offset(struct file, f_flags);
	__u32 op = bpf_core_field_offset(struct file, f_pos);
	__u32 lo = MIN3(oi, of, op);
	char buf[SPAN];

	if (oi - lo <= SPAN - 8 && of - lo <= SPAN - 4 && op - lo <= SPAN - 8 &&
	    !bpf_probe_read_kernel(buf, SPAN, (void *)f + lo)) {
		b->inode = AT(buf, oi - lo, struct inode *);
		b->flags = AT(buf, of - lo, __u32);
		b->pos = AT(buf, op - lo, __s64);
	} else {
		b->inode = BPF_CORE_READ(f, f_inode);
		b->flags = BPF_CORE_READ(f, f_flags);
		b->pos = BPF_CORE_READ(f, f_pos);
	}
}

/*
 * The file's identity, which user space matches with the paths it saw opened (an fd may
 * have been dup'ed or inherited): (s_dev, inode) for a file, the device for a block node.
 * Returns the inode's type (S_IFMT bits; 0 without an inode). Only regular files and
 * block devices are storage, the files a training job reads its data from (storage());
 * pipes, FIFOs and sockets are the ipc layer's (ipc_type()); ttys and the rest are not
 * recorded.
 */
static __always_inline __u32 read_identity(struct file_bits *b)
{
	struct inode *inode = b->inode;
	__u32 om = bpf_core_field_offset(struct inode, i_mode);
	__u32 os = bpf_core_field_offset(struct inode, i_sb);
	__u32 on = bpf_core_field_offset(struct inode, i_ino);
	__u32 orr = bpf_core_field_offset(struct inode, i_rdev);
	__u32 lo = MIN3(om, os, on), mode, rdev;
	struct super_block *sb;
	char buf[SPAN];

	if (!inode) {
		/* Set, so that no caller reads them unset (the verifier refuses such a read). */
		b->dev = 0;
		b->ino = 0;
		return 0;
	}
	if (orr < lo)
		lo = orr;
	if (om - lo <= SPAN - 2 && os - lo <= SPAN - 8 && on - lo <= SPAN - 8 &&
	    orr - lo <= SPAN - 4 && !bpf_probe_read_kernel(buf, SPAN, (void *)inode + lo)) {
		mode = AT(buf, om - lo, __u16);
		sb = AT(buf, os - lo, struct super_block *);
		b->ino = AT(buf, on - lo, __u64);
		rdev = AT(buf, orr - lo, __u32);
	} else {
		mode = BPF_CORE_READ(inode, i_mode);
		sb = BPF_CORE_READ(inode, i_sb);
		b->ino = BPF_CORE_READ(inode, i_ino);
		rdev = BPF_CORE_READ(inode, i_rdev);
	}
	mode &= S_IFMT;
	if (mode == S_IFBLK) {
		b->dev = rdev;
		b->ino = 0;
		return mode;
	}
	b->dev = BPF_CORE_READ(sb, s_dev);
	return mode;
}

static __always_inline bool storage(__u32 mode)
{
	return mode == S_IFREG || mode == S_IFBLK;
}

/* enum trainio_ipc_type of an inode type; 0: not ipc. */
static __always_inline __u32 ipc_type(__u32 mode)
{
	if (mode == S_IFIFO)
		return TRAINIO_IPC_PIPE;
	if (mode == S_IFSOCK)
		return TRAINIO_IPC_SOCKET;
	return 0;
}

static __always_inline __u64 iovec_bytes(const struct iovec *iov, __u64 count)
{
	__u64 total = 0;

	for (int i = 0; i < MAX_IOVECS; i++) {
		struct iovec v;

		if (i >= count)
			break;
		if (bpf_probe_read_user(&v, sizeof(v), &iov[i]))
			break;
		total += v.iov_len;
	}
	return total;
}

/* Counts a read or write into its process's in-flight count; returns the count with it. */
static __always_inline __u32 enter_flight(__u32 tgid, __u32 *traced_count)
{
	__u32 one = 1, *n = traced_count;

	if (!n)
		n = bpf_map_lookup_elem(&proc_inflight, &tgid);
	if (n)
		return __sync_fetch_and_add(n, 1) + 1;
	bpf_map_update_elem(&proc_inflight, &tgid, &one, BPF_NOEXIST);
	return 1;
}

static __always_inline void leave_flight(__u32 tgid)
{
	__u32 *n;

	if (target_mode == TARGET_TGIDS)
		n = bpf_map_lookup_elem(&traced, &tgid);
	else
		n = bpf_map_lookup_elem(&proc_inflight, &tgid);
	if (n)
		__sync_fetch_and_add(n, -1);
}

/* The calling thread's syscall state, created on first use; counted as lost if it cannot be. */
static __always_inline struct pending_io *pending_of(struct task_struct *task)
{
	struct pending_io *p = bpf_task_storage_get(&pending, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);

	if (!p)
		count_lost(TRAINIO_LOST_FILE_MAP);
	return p;
}

/* An ipc syscall's entry (a read, write or wait on a pipe or socket): no offset, no depth. */
static __always_inline void begin_ipc(struct pending_io *p, __u32 ipc, __u32 op, int fd, __u64 requested,
				      struct file_bits *fb)
{
	p->ipc = ipc;
	p->family = 0;
	p->op = op;
	p->fd = fd;
	p->requested = requested;
	p->dev = fb->dev;
	p->ino = fb->ino;
	p->enter_ns = bpf_ktime_get_ns();
}

/* A socket's send or receive: recorded on sockets only, as ipc rows. */
static __always_inline bool socket_op(__u32 op)
{
	return op >= TRAINIO_FOP_SENDTO && op <= TRAINIO_FOP_RECVMSG;
}

/* A read or write: it moves data, has a file position and counts in the read concurrency. */
static __always_inline bool data_op(__u32 op)
{
	return (op >= TRAINIO_FOP_READ && op <= TRAINIO_FOP_PWRITE64) ||
	       (op >= TRAINIO_FOP_WRITEV && op <= TRAINIO_FOP_PWRITEV2) || socket_op(op);
}

static __always_inline bool write_op(__u32 op)
{
	return op == TRAINIO_FOP_WRITE || op == TRAINIO_FOP_PWRITE64 ||
	       (op >= TRAINIO_FOP_WRITEV && op <= TRAINIO_FOP_SENDMSG);
}

/*
 * offset < 0: a data op uses the file position at entry; other ops have no offset.
 * flags < 0: the row's flags are the file's f_flags; else these (mmap's prot and flags).
 */
/*
 * The peer of a TCP socket's file into p (family, address, port); p->family = 0 when the
 * socket is not TCP over IPv4/IPv6.
 */
static __always_inline void socket_peer(struct file *f, struct pending_io *p)
{
	struct socket *sock = (struct socket *)BPF_CORE_READ(f, private_data);
	struct sock *sk = sock ? BPF_CORE_READ(sock, sk) : NULL;
	__u16 family;

	p->family = 0;
	if (!sk || BPF_CORE_READ(sk, sk_protocol) != IPPROTO_TCP)
		return;
	family = BPF_CORE_READ(sk, __sk_common.skc_family);
	if (family == AF_INET) {
		__builtin_memset(p->daddr, 0, sizeof(p->daddr));
		bpf_core_read(p->daddr, 4, &sk->__sk_common.skc_daddr);
	} else if (family == AF_INET6) {
		bpf_core_read(p->daddr, 16, &sk->__sk_common.skc_v6_daddr);
	} else {
		return;
	}
	p->dport = BPF_CORE_READ(sk, __sk_common.skc_dport);
	p->family = family;
}

/*
 * The user buffer of a socket syscall (arg1: its second argument): a plain buffer for
 * read/write/sendto/recvfrom, an iovec array for readv/writev, a msghdr for sendmsg and
 * recvmsg, whose first iovec is taken (HTTP clients send and receive a head from one
 * buffer).
 */
static __always_inline void socket_buffer(struct pending_io *p, __u32 op, __u64 arg1, __u64 requested)
{
	struct user_msghdr h;
	struct iovec v;

	p->buf = arg1;
	p->buf_len = requested;
	if (op == TRAINIO_FOP_SENDMSG || op == TRAINIO_FOP_RECVMSG) {
		if (bpf_probe_read_user(&h, sizeof(h), (void *)arg1) || !h.msg_iovlen)
			goto none;
		arg1 = (__u64)h.msg_iov;
	} else if (op != TRAINIO_FOP_READV && op != TRAINIO_FOP_WRITEV) {
		return;
	}
	if (bpf_probe_read_user(&v, sizeof(v), (void *)arg1))
		goto none;
	p->buf = (__u64)v.iov_base;
	p->buf_len = v.iov_len;
	return;
none:
	p->buf = 0;
	p->buf_len = 0;
}

/* file_tls.bpf.h: the socket under the SSL call the thread is in, if any. */
static __always_inline void tls_note_socket(struct pending_io *p, __u32 tgid);

static __always_inline int enter_io_buf(__u32 op, int fd, __u64 requested, __s64 offset, __s64 flags, __u64 arg1)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u32 tgid = task->tgid, *count = NULL;
	struct pending_io *p;
	struct file_bits fb;
	struct file *f;
	__u32 mode, ipc = 0;

	if (!is_traced(tgid, &count))
		return 0;
	f = fd_to_file(task, fd);
	if (!f)
		return 0;
	read_file_bits(f, &fb);
	mode = read_identity(&fb);
	if (!storage(mode)) {
		ipc = data_op(op) ? ipc_type(mode) : 0;
		if (!ipc)
			return 0; /* neither storage nor ipc */
	} else if (socket_op(op)) {
		return 0;
	}
	p = pending_of(task);
	if (!p)
		return 0;
	if (ipc) {
		/* Not counted in the process's read concurrency. */
		begin_ipc(p, ipc, write_op(op) ? TRAINIO_IPC_WRITE : TRAINIO_IPC_READ, fd, requested, &fb);
		if (object_layer && ipc == TRAINIO_IPC_SOCKET) {
			socket_peer(f, p);
			if (p->family) {
				socket_buffer(p, op, arg1, requested);
				tls_note_socket(p, tgid);
			}
		}
		return 0;
	}
	p->ipc = 0;
	p->op = op;
	p->fd = fd;
	p->requested = requested;
	p->dev = fb.dev;
	p->ino = fb.ino;
	p->flags = flags < 0 ? fb.flags : flags;
	p->offset = offset < 0 && data_op(op) ? fb.pos : offset;
	p->queue_depth = data_op(op) ? enter_flight(tgid, count) : 0;
	p->enter_ns = bpf_ktime_get_ns();
	return 0;
}

static __always_inline int enter_io_flags(__u32 op, int fd, __u64 requested, __s64 offset, __s64 flags)
{
	return enter_io_buf(op, fd, requested, offset, flags, 0);
}

static __always_inline int enter_io(__u32 op, int fd, __u64 requested, __s64 offset)
{
	return enter_io_flags(op, fd, requested, offset, -1);
}

/* A syscall that can move data on a socket: its buffer is kept for the object layer. */
static __always_inline int enter_sock_io(__u32 op, int fd, __u64 requested, __u64 arg1)
{
	return enter_io_buf(op, fd, requested, -1, -1, arg1);
}

#include "file_ipc.bpf.h"
#include "file_tls.bpf.h"

static __always_inline int exit_io(long ret)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u32 tgid = task->tgid;
	struct pending_io *p = bpf_task_storage_get(&pending, task, 0, 0);
	struct file_event *e;

	if (!p || !p->enter_ns || !p->op) /* no entry seen, or an openat's: not ours */
		return 0;
	if (p->ipc)
		return exit_ipc(task, p, ret);
	if (data_op(p->op))
		leave_flight(tgid);
	e = bpf_ringbuf_reserve(&file_events, sizeof(*e), 0);
	if (!e) {
		count_lost(TRAINIO_LOST_FILE_RINGBUF);
		p->enter_ns = 0;
		return 0;
	}
	e->kind = TRAINIO_KIND_FILE;
	e->op = p->op;
	e->enter_ns = p->enter_ns;
	e->exit_ns = bpf_ktime_get_ns();
	e->offset = p->offset;
	e->requested = p->requested;
	e->ret = ret;
	e->ino = p->ino;
	e->pid = tgid;
	e->tid = task->pid;
	e->fd = p->fd;
	e->queue_depth = p->queue_depth;
	e->dev = p->dev;
	e->flags = p->flags;
	task_comm(e->comm, task);
	p->enter_ns = 0;
	submit_batched(file_events, e);
	return 0;
}

#define ARG(n) (ctx->args[n])

SEC("tracepoint/syscalls/sys_enter_read")
int tio_read_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_sock_io(TRAINIO_FOP_READ, ARG(0), ARG(2), ARG(1));
}

SEC("tracepoint/syscalls/sys_enter_pread64")
int tio_pread_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_io(TRAINIO_FOP_PREAD64, ARG(0), ARG(2), ARG(3));
}

SEC("tracepoint/syscalls/sys_enter_readv")
int tio_readv_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_sock_io(TRAINIO_FOP_READV, ARG(0), iovec_bytes((void *)ARG(1), ARG(2)), ARG(1));
}

/* On 64-bit the position is pos_l (args[3]); pos_h is shifted out by the kernel. */
SEC("tracepoint/syscalls/sys_enter_preadv")
int tio_preadv_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_io(TRAINIO_FOP_PREADV, ARG(0), iovec_bytes((void *)ARG(1), ARG(2)), ARG(3));
}

/* preadv2 with pos == -1 reads at the file position, as read() does. */
SEC("tracepoint/syscalls/sys_enter_preadv2")
int tio_preadv2_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_io(TRAINIO_FOP_PREADV2, ARG(0), iovec_bytes((void *)ARG(1), ARG(2)), ARG(3));
}

SEC("tracepoint/syscalls/sys_enter_write")
int tio_write_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_sock_io(TRAINIO_FOP_WRITE, ARG(0), ARG(2), ARG(1));
}

SEC("tracepoint/syscalls/sys_enter_pwrite64")
int tio_pwrite_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_io(TRAINIO_FOP_PWRITE64, ARG(0), ARG(2), ARG(3));
}

SEC("tracepoint/syscalls/sys_enter_writev")
int tio_writev_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_sock_io(TRAINIO_FOP_WRITEV, ARG(0), iovec_bytes((void *)ARG(1), ARG(2)), ARG(1));
}

SEC("tracepoint/syscalls/sys_enter_pwritev")
int tio_pwritev_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_io(TRAINIO_FOP_PWRITEV, ARG(0), iovec_bytes((void *)ARG(1), ARG(2)), ARG(3));
}

/* pwritev2 with pos == -1 writes at the file position, as write() does. */
SEC("tracepoint/syscalls/sys_enter_pwritev2")
int tio_pwritev2_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_io(TRAINIO_FOP_PWRITEV2, ARG(0), iovec_bytes((void *)ARG(1), ARG(2)), ARG(3));
}

/* sendto/recvfrom(fd, buf, len, ...); sendmsg/recvmsg(fd, msghdr, flags): its iovecs' bytes. */
static __always_inline __u64 msghdr_bytes(const struct user_msghdr *m)
{
	struct user_msghdr h;

	if (bpf_probe_read_user(&h, sizeof(h), m))
		return 0;
	return iovec_bytes(h.msg_iov, h.msg_iovlen);
}

SEC("tracepoint/syscalls/sys_enter_sendto")
int tio_sendto_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_sock_io(TRAINIO_FOP_SENDTO, ARG(0), ARG(2), ARG(1));
}

SEC("tracepoint/syscalls/sys_enter_sendmsg")
int tio_sendmsg_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_sock_io(TRAINIO_FOP_SENDMSG, ARG(0), msghdr_bytes((void *)ARG(1)), ARG(1));
}

SEC("tracepoint/syscalls/sys_enter_recvfrom")
int tio_recvfrom_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_sock_io(TRAINIO_FOP_RECVFROM, ARG(0), ARG(2), ARG(1));
}

SEC("tracepoint/syscalls/sys_enter_recvmsg")
int tio_recvmsg_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_sock_io(TRAINIO_FOP_RECVMSG, ARG(0), msghdr_bytes((void *)ARG(1)), ARG(1));
}

SEC("tracepoint/syscalls/sys_enter_close")
int tio_close_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_io(TRAINIO_FOP_CLOSE, ARG(0), 0, -1);
}

/* The syncs a checkpoint ends with: what a replay must repeat for its writes to be durable. */
SEC("tracepoint/syscalls/sys_enter_fsync")
int tio_fsync_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_io(TRAINIO_FOP_FSYNC, ARG(0), 0, -1);
}

SEC("tracepoint/syscalls/sys_enter_fdatasync")
int tio_fdatasync_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_io(TRAINIO_FOP_FDATASYNC, ARG(0), 0, -1);
}

/* sync_file_range(fd, offset, nbytes, flags): the range's start and length. */
SEC("tracepoint/syscalls/sys_enter_sync_file_range")
int tio_sync_file_range_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_io(TRAINIO_FOP_SYNC_FILE_RANGE, ARG(0), ARG(2), ARG(1));
}

#define EXIT_PROG(name, syscall)                                                         \
	SEC("tracepoint/syscalls/sys_exit_" #syscall)                                    \
	int name(struct trace_event_raw_sys_exit *ctx)                                   \
	{                                                                                \
		return exit_io(ctx->ret);                                                \
	}

EXIT_PROG(tio_read_exit, read)
EXIT_PROG(tio_pread_exit, pread64)
EXIT_PROG(tio_readv_exit, readv)
EXIT_PROG(tio_preadv_exit, preadv)
EXIT_PROG(tio_preadv2_exit, preadv2)
EXIT_PROG(tio_write_exit, write)
EXIT_PROG(tio_pwrite_exit, pwrite64)
EXIT_PROG(tio_writev_exit, writev)
EXIT_PROG(tio_pwritev_exit, pwritev)
EXIT_PROG(tio_pwritev2_exit, pwritev2)
EXIT_PROG(tio_sendto_exit, sendto)
EXIT_PROG(tio_sendmsg_exit, sendmsg)
EXIT_PROG(tio_recvfrom_exit, recvfrom)
EXIT_PROG(tio_recvmsg_exit, recvmsg)
EXIT_PROG(tio_close_exit, close)
EXIT_PROG(tio_fsync_exit, fsync)
EXIT_PROG(tio_fdatasync_exit, fdatasync)
EXIT_PROG(tio_sync_file_range_exit, sync_file_range)

#include "file_mmap.bpf.h"

/*
 * poll/ppoll: a wait on a pipe, FIFO or socket when the first pollfd is one (a data
 * loader's rank polls its workers' pipes), from entry to exit. Other polls are not
 * recorded.
 */
static __always_inline int enter_wait(__u64 ufds, __u64 nfds)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u32 *count = NULL, ipc;
	struct pending_io *p;
	struct file_bits fb;
	struct pollfd pfd;
	struct file *f;

	if (!nfds || !is_traced(task->tgid, &count))
		return 0;
	if (bpf_probe_read_user(&pfd, sizeof(pfd), (void *)ufds))
		return 0;
	f = fd_to_file(task, pfd.fd);
	if (!f)
		return 0;
	read_file_bits(f, &fb);
	ipc = ipc_type(read_identity(&fb));
	if (!ipc)
		return 0;
	p = pending_of(task);
	if (p)
		begin_ipc(p, ipc, TRAINIO_IPC_WAIT, pfd.fd, nfds, &fb);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_poll")
int tio_poll_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_wait(ARG(0), ARG(1));
}

SEC("tracepoint/syscalls/sys_enter_ppoll")
int tio_ppoll_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_wait(ARG(0), ARG(1));
}

EXIT_PROG(tio_poll_exit, poll)
EXIT_PROG(tio_ppoll_exit, ppoll)

#include "file_open.bpf.h"

#include "file_proc.bpf.h"

#include "file_uring.bpf.h"
