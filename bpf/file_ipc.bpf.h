/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * File layer, the ipc and object records at a syscall's exit (included by file.bpf.c,
 * before exit_io, which calls them: they share the per-thread syscall state and the ring
 * buffer). A read or write on a pipe, FIFO or socket is an ipc row; with object_layer
 * set, one on a TCP socket is an http_event carrying its peer and the first bytes when
 * they start an HTTP head (tracer/src/object.rs rebuilds the requests).
 */

/* The object layer's record being built, per CPU (too large for the BPF stack). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct http_event);
} http_scratch SEC(".maps");

static __always_inline void fill_ipc(struct ipc_event *e, struct task_struct *task, struct pending_io *p, long ret)
{
	e->op = p->op;
	e->enter_ns = p->enter_ns;
	e->exit_ns = bpf_ktime_get_ns();
	e->requested = p->requested;
	e->ret = ret;
	e->ino = p->ino;
	e->pid = task->tgid;
	e->tid = task->pid;
	e->fd = p->fd;
	e->dev = p->dev;
	e->ipc = p->ipc;
	e->pad = 0;
	task_comm(e->comm, task);
}

/*
 * Whether a send (write) or receive starts with an HTTP/1.x request or response head, by
 * its first bytes: only heads are copied, body bytes are only counted.
 */
static __always_inline bool http_head(const char *b, bool write)
{
	if (!write)
		return b[0] == 'H' && b[1] == 'T' && b[2] == 'T' && b[3] == 'P' && b[4] == '/';
	return (b[0] == 'G' && b[1] == 'E' && b[2] == 'T' && b[3] == ' ') ||
	       (b[0] == 'P' && b[1] == 'U' && b[2] == 'T' && b[3] == ' ') ||
	       (b[0] == 'H' && b[1] == 'E' && b[2] == 'A' && b[3] == 'D') ||
	       (b[0] == 'P' && b[1] == 'O' && b[2] == 'S' && b[3] == 'T') ||
	       (b[0] == 'D' && b[1] == 'E' && b[2] == 'L' && b[3] == 'E');
}

/* The exit of a send or receive on a TCP socket with the object layer on. */
static __always_inline int exit_http(struct task_struct *task, struct pending_io *p, long ret)
{
	__u32 zero = 0, len = 0;
	struct http_event *e = bpf_map_lookup_elem(&http_scratch, &zero);
	char first[8];

	if (!e) {
		p->enter_ns = 0;
		return 0;
	}
	fill_ipc(&e->ipc, task, p, ret);
	e->ipc.kind = TRAINIO_KIND_HTTP;
	__builtin_memcpy(e->daddr, p->daddr, sizeof(e->daddr));
	e->dport = p->dport;
	e->family = p->family;
	if (ret >= 5 && p->buf && p->buf_len >= 5 &&
	    !bpf_probe_read_user(first, sizeof(first), (void *)p->buf) &&
	    http_head(first, p->op == TRAINIO_IPC_WRITE)) {
		len = ret < p->buf_len ? ret : p->buf_len;
		if (len > TRAINIO_HTTP_CAP)
			len = TRAINIO_HTTP_CAP;
		if (bpf_probe_read_user(e->data, len, (void *)p->buf))
			len = 0;
	}
	e->captured = len;
	p->enter_ns = 0;
	if (bpf_ringbuf_output(&file_events, e, offsetof(struct http_event, data) + len,
			       wake_flags(&file_events)))
		count_lost(TRAINIO_LOST_IPC_RINGBUF);
	return 0;
}

/* The exit of an ipc syscall whose entry filled p. */
static __always_inline int exit_ipc(struct task_struct *task, struct pending_io *p, long ret)
{
	struct ipc_event *e;

	if (p->family)
		return exit_http(task, p, ret);
	e = bpf_ringbuf_reserve(&file_events, sizeof(*e), 0);

	if (!e) {
		count_lost(TRAINIO_LOST_IPC_RINGBUF);
		p->enter_ns = 0;
		return 0;
	}
	e->kind = TRAINIO_KIND_IPC;
	fill_ipc(e, task, p, ret);
	p->enter_ns = 0;
	submit_batched(file_events, e);
	return 0;
}
