/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * File layer, opens (included by file.bpf.c: it shares the traced-process filter, the
 * per-thread syscall state and the ring buffer): openat/openat2 recorded at exit with
 * the file's absolute path, a relative path resolved from the opened file's dentries.
 */

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
	struct task_struct *task = bpf_get_current_task_btf();
	struct pending_io *p;
	__u32 *count;

	if (!is_traced(task->tgid, &count))
		return 0;
	p = pending_of(task);
	if (!p)
		return 0;
	p->op = 0; /* an open */
	p->ipc = 0;
	p->fd = dirfd;
	p->user_ptr = path_ptr;
	p->flags = flags;
	p->enter_ns = bpf_ktime_get_ns();
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
	struct task_struct *task = bpf_get_current_task_btf();
	struct pending_io *p = bpf_task_storage_get(&pending, task, 0, 0);
	struct open_event *e;

	if (!p || !p->enter_ns || p->op) /* op is 0 only for an openat entry */
		return 0;
	e = bpf_ringbuf_reserve(&file_events, sizeof(*e), 0);
	if (!e) {
		count_lost(TRAINIO_LOST_OPEN_RINGBUF);
		p->enter_ns = 0;
		return 0;
	}
	e->kind = TRAINIO_KIND_OPEN;
	e->pid = task->tgid;
	e->tid = task->pid;
	e->enter_ns = p->enter_ns;
	e->exit_ns = bpf_ktime_get_ns();
	e->ret = ret;
	e->flags = p->flags;
	e->dirfd = p->fd;
	task_comm(e->comm, task);
	if (bpf_probe_read_user_str(e->path, sizeof(e->path), (void *)p->user_ptr) < 0)
		e->path[0] = 0;
	e->ino = 0;
	e->dev = 0;
	p->enter_ns = 0;
	if (ret >= 0) {
		struct file *f = fd_to_file(task, ret);

		if (f) {
			struct file_bits fb = {};

			read_file_bits(f, &fb);
			read_identity(&fb);
			e->dev = fb.dev;
			e->ino = fb.ino;
			if (e->path[0] != '/')
				file_path(f, e->path);
		}
	}
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
