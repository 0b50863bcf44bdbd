// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * File layer: the read/write/open/close syscalls of the traced processes, one record per
 * syscall exit, with the offset the syscall read at and the process's read concurrency.
 *
 * Which processes are traced (target_mode):
 *   ALL     every process but the tracer itself;
 *   TGIDS   the tgids in `traced`, seeded by user space and followed through fork;
 *   CGROUP  tasks whose cgroup-v2 id is target_cgroup_id.
 * Entry and exit of one syscall are paired by thread id (a thread is in one syscall at a
 * time). For plain read()/write()/readv() the offset is the file position at entry.
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

#define TARGET_ALL 0
#define TARGET_TGIDS 1
#define TARGET_CGROUP 2
#define MAX_IOVECS 16
#define S_IFMT 00170000
#define S_IFBLK 0060000
#define S_IFREG 0100000

const volatile __u32 target_mode = TARGET_ALL;
const volatile __u64 target_cgroup_id = 0;
const volatile __u32 self_tgid = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);  /* tgid */
	__type(value, __u8);
} traced SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);   /* tgid */
	__type(value, __u32); /* read/write syscalls in flight */
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
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32); /* tid */
	__type(value, struct pending_io);
} pending SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20); /* resized by user space (--ringbuf-mb) */
} file_events SEC(".maps");

static __always_inline bool is_traced(__u32 tgid)
{
	if (tgid == self_tgid)
		return false;
	if (target_mode == TARGET_TGIDS)
		return bpf_map_lookup_elem(&traced, &tgid) != NULL;
	if (target_mode == TARGET_CGROUP)
		return bpf_get_current_cgroup_id() == target_cgroup_id;
	return true;
}

static __always_inline struct file *fd_to_file(int fd)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	struct file **files, *f = NULL;

	if (!fdt || fd < 0 || (unsigned int)fd >= BPF_CORE_READ(fdt, max_fds))
		return NULL;
	files = BPF_CORE_READ(fdt, fd);
	bpf_probe_read_kernel(&f, sizeof(f), &files[fd]);
	return f;
}

/* Regular files and block devices: the files a training job reads its data from. */
static __always_inline bool storage_file(struct file *f)
{
	__u32 fmt = BPF_CORE_READ(f, f_inode, i_mode) & S_IFMT;

	return fmt == S_IFREG || fmt == S_IFBLK;
}

/*
 * The file's identity, which user space matches with the paths it saw opened (an fd may
 * have been dup'ed or inherited): (s_dev, inode) for a file, the device for a block node.
 */
static __always_inline void file_identity(struct file *f, __u32 *dev, __u64 *ino)
{
	struct inode *inode = BPF_CORE_READ(f, f_inode);

	if ((BPF_CORE_READ(inode, i_mode) & S_IFMT) == S_IFBLK) {
		*dev = BPF_CORE_READ(inode, i_rdev);
		*ino = 0;
	} else {
		*dev = BPF_CORE_READ(inode, i_sb, s_dev);
		*ino = BPF_CORE_READ(inode, i_ino);
	}
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

/* offset < 0: use the file position at entry. */
static __always_inline int enter_io(__u32 op, int fd, __u64 requested, __s64 offset)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id, one = 1, *n;
	struct pending_io p = {};
	struct file *f;

	if (!is_traced(tgid))
		return 0;
	p.enter_ns = bpf_ktime_get_ns();
	p.op = op;
	p.fd = fd;
	p.requested = requested;
	p.offset = offset;
	f = fd_to_file(fd);
	if (!f || !storage_file(f))
		return 0; /* pipes, sockets, ttys: not storage */
	p.flags = BPF_CORE_READ(f, f_flags);
	file_identity(f, &p.dev, &p.ino);
	if (offset < 0 && op != TRAINIO_FOP_CLOSE)
		p.offset = BPF_CORE_READ(f, f_pos);
	if (op != TRAINIO_FOP_CLOSE) {
		n = bpf_map_lookup_elem(&proc_inflight, &tgid);
		if (n) {
			p.queue_depth = __sync_fetch_and_add(n, 1) + 1;
		} else {
			bpf_map_update_elem(&proc_inflight, &tgid, &one, BPF_NOEXIST);
			p.queue_depth = 1;
		}
	}
	if (bpf_map_update_elem(&pending, &tid, &p, BPF_ANY)) {
		count_lost(TRAINIO_LOST_FILE_MAP);
		if (op != TRAINIO_FOP_CLOSE && (n = bpf_map_lookup_elem(&proc_inflight, &tgid)))
			__sync_fetch_and_add(n, -1);
	}
	return 0;
}

static __always_inline int exit_io(long ret)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id, *n;
	struct pending_io *p = bpf_map_lookup_elem(&pending, &tid);
	struct file_event *e;

	if (!p || !p->op) /* no entry seen, or an openat's: not ours */
		return 0;
	if (p->op != TRAINIO_FOP_CLOSE && (n = bpf_map_lookup_elem(&proc_inflight, &tgid)))
		__sync_fetch_and_add(n, -1);
	e = bpf_ringbuf_reserve(&file_events, sizeof(*e), 0);
	if (!e) {
		count_lost(TRAINIO_LOST_FILE_RINGBUF);
		bpf_map_delete_elem(&pending, &tid);
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
	e->tid = tid;
	e->fd = p->fd;
	e->queue_depth = p->queue_depth;
	e->dev = p->dev;
	e->flags = p->flags;
	current_comm(e->comm);
	bpf_map_delete_elem(&pending, &tid);
	submit_batched(file_events, e);
	return 0;
}

#define ARG(n) (ctx->args[n])

SEC("tracepoint/syscalls/sys_enter_read")
int tio_read_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_io(TRAINIO_FOP_READ, ARG(0), ARG(2), -1);
}

SEC("tracepoint/syscalls/sys_enter_pread64")
int tio_pread_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_io(TRAINIO_FOP_PREAD64, ARG(0), ARG(2), ARG(3));
}

SEC("tracepoint/syscalls/sys_enter_readv")
int tio_readv_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_io(TRAINIO_FOP_READV, ARG(0), iovec_bytes((void *)ARG(1), ARG(2)), -1);
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
	return enter_io(TRAINIO_FOP_WRITE, ARG(0), ARG(2), -1);
}

SEC("tracepoint/syscalls/sys_enter_pwrite64")
int tio_pwrite_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_io(TRAINIO_FOP_PWRITE64, ARG(0), ARG(2), ARG(3));
}

SEC("tracepoint/syscalls/sys_enter_close")
int tio_close_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_io(TRAINIO_FOP_CLOSE, ARG(0), 0, -1);
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
EXIT_PROG(tio_close_exit, close)

/*
 * Absolute path of an open file, walking its dentries up to the root and crossing mounts
 * (what d_path does; bpf_d_path is not available to tracepoints). Used for relative
 * opens, so the path does not depend on the process still being alive to ask its cwd.
 * Components are written backwards from the end of a per-CPU scratch buffer.
 */
#define PATH_DEPTH 64
#define SCRATCH_HALF 512
#define SCRATCH_MASK (SCRATCH_HALF - 1)

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, char[SCRATCH_HALF + 256]);
} path_scratch SEC(".maps");

struct path_walk {
	struct dentry *d;
	struct mount *m;
	char *buf;
	__u32 pos;
	bool overflow;
};

/* One bpf_loop() step: prepend d's name, or cross to the parent mount. 1 stops the loop. */
static long path_step(__u64 index, void *data)
{
	struct path_walk *w = data;
	/* Locals: inside BPF_CORE_READ every member access is relocated, ours included. */
	struct dentry *d = w->d;
	struct mount *m = w->m;
	char *buf = w->buf;
	struct dentry *parent = BPF_CORE_READ(d, d_parent);
	struct dentry *mnt_root = BPF_CORE_READ(m, mnt.mnt_root);
	__u32 len, pos = w->pos;

	if (d == mnt_root || d == parent) {
		struct mount *up = BPF_CORE_READ(m, mnt_parent);

		if (up == m || !up)
			return 1; /* the root of the namespace */
		w->d = BPF_CORE_READ(m, mnt_mountpoint);
		w->m = up;
		return 0;
	}
	len = BPF_CORE_READ(d, d_name.len) & 255;
	if (len + 1 >= pos || pos > SCRATCH_HALF) {
		w->overflow = true;
		return 1;
	}
	pos -= len;
	bpf_probe_read_kernel(buf + (pos & SCRATCH_MASK), len, BPF_CORE_READ(d, d_name.name));
	pos -= 1;
	buf[pos & SCRATCH_MASK] = '/';
	w->pos = pos;
	w->d = parent;
	return 0;
}

static __always_inline bool file_path(struct file *f, char *out)
{
	__u32 zero = 0;
	struct vfsmount *vfs = BPF_CORE_READ(f, f_path.mnt);
	char *buf = bpf_map_lookup_elem(&path_scratch, &zero);
	struct path_walk w = {};

	if (!buf)
		return false;
	w.d = BPF_CORE_READ(f, f_path.dentry);
	w.m = container_of(vfs, struct mount, mnt);
	w.buf = buf;
	w.pos = SCRATCH_HALF - 1;
	buf[SCRATCH_HALF - 1] = 0;
	bpf_loop(PATH_DEPTH, path_step, &w, 0);
	if (w.overflow)
		return false;
	if (w.pos == SCRATCH_HALF - 1)
		buf[--w.pos & SCRATCH_MASK] = '/';
	bpf_probe_read_kernel(out, TRAINIO_PATH_LEN, buf + (w.pos & SCRATCH_MASK));
	out[TRAINIO_PATH_LEN - 1] = 0;
	return true;
}

/* openat/openat2: the path is read at exit, from the caller's buffer the kernel just used. */
static __always_inline int enter_open(int dirfd, __u64 path_ptr, __u32 flags)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct pending_io p = {};

	if (!is_traced(id >> 32))
		return 0;
	p.enter_ns = bpf_ktime_get_ns();
	p.fd = dirfd;
	p.user_ptr = path_ptr;
	p.flags = flags;
	if (bpf_map_update_elem(&pending, &tid, &p, BPF_ANY))
		count_lost(TRAINIO_LOST_FILE_MAP);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_openat")
int tio_openat_enter(struct trace_event_raw_sys_enter *ctx)
{
	return enter_open(ARG(0), ARG(1), ARG(2));
}

SEC("tracepoint/syscalls/sys_enter_openat2")
int tio_openat2_enter(struct trace_event_raw_sys_enter *ctx)
{
	struct open_how how = {};

	bpf_probe_read_user(&how, sizeof(how), (void *)ARG(2));
	return enter_open(ARG(0), ARG(1), how.flags);
}

static __always_inline int exit_open(long ret)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct pending_io *p = bpf_map_lookup_elem(&pending, &tid);
	struct open_event *e;

	if (!p || p->op) /* op is 0 only for an openat entry */
		return 0;
	e = bpf_ringbuf_reserve(&file_events, sizeof(*e), 0);
	if (!e) {
		count_lost(TRAINIO_LOST_OPEN_RINGBUF);
		bpf_map_delete_elem(&pending, &tid);
		return 0;
	}
	e->kind = TRAINIO_KIND_OPEN;
	e->pid = id >> 32;
	e->tid = tid;
	e->enter_ns = p->enter_ns;
	e->exit_ns = bpf_ktime_get_ns();
	e->ret = ret;
	e->flags = p->flags;
	e->dirfd = p->fd;
	current_comm(e->comm);
	if (bpf_probe_read_user_str(e->path, sizeof(e->path), (void *)p->user_ptr) < 0)
		e->path[0] = 0;
	e->ino = 0;
	e->dev = 0;
	if (ret >= 0) {
		struct file *f = fd_to_file(ret);

		if (f) {
			file_identity(f, &e->dev, &e->ino);
			if (e->path[0] != '/')
				file_path(f, e->path);
		}
	}
	bpf_map_delete_elem(&pending, &tid);
	submit_batched(file_events, e);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_openat")
int tio_openat_exit(struct trace_event_raw_sys_exit *ctx)
{
	return exit_open(ctx->ret);
}

SEC("tracepoint/syscalls/sys_exit_openat2")
int tio_openat2_exit(struct trace_event_raw_sys_exit *ctx)
{
	return exit_open(ctx->ret);
}

/* Follow the traced processes' children; forget a process when its leader exits. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(tio_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptgid = parent->tgid, ctgid = child->tgid;
	__u8 one = 1;

	if (target_mode != TARGET_TGIDS || ptgid == ctgid)
		return 0;
	if (bpf_map_lookup_elem(&traced, &ptgid) &&
	    bpf_map_update_elem(&traced, &ctgid, &one, BPF_ANY))
		count_lost(TRAINIO_LOST_PROC_MAP);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(tio_exit, struct task_struct *task)
{
	__u32 tgid = task->tgid;

	if (task->pid != tgid)
		return 0;
	bpf_map_delete_elem(&proc_inflight, &tgid);
	if (target_mode == TARGET_TGIDS)
		bpf_map_delete_elem(&traced, &tgid);
	return 0;
}
