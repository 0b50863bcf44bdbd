/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * File layer, io_uring reads and writes (included by file.bpf.c: it shares the
 * traced-process filter and the ring buffer).
 */

/*
 * io_uring (opt-in: user space loads these only with `record --io-uring`). A process that
 * reads through io_uring makes no read syscalls; its requests are read at submission
 * (io_uring_submit_req: the submitting thread, after the request's prep has set its file
 * position and length) and emitted at completion (io_uring_complete, from whatever
 * context completes it) as file-layer reads and writes: fd, offset and bytes asked at
 * submission, the file and bytes done at completion. Requests in flight are kept by the
 * request's address. Other opcodes (and multishot reads, which have no offset) are left
 * out.
 */
struct uring_pending {
	__u64 submit_ns;
	__s64 offset;
	__u64 requested;
	__u32 pid;
	__u32 tid;
	__s32 fd; /* -1: a registered (fixed) file, whose index is no fd */
	__u32 op;
	__u32 queue_depth;
	char comm[TRAINIO_COMM_LEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); /* struct io_kiocb * */
	__type(value, struct uring_pending);
} uring_inflight SEC(".maps");

SEC("tp_btf/io_uring_submit_req")
int BPF_PROG(tio_uring_submit, struct io_kiocb *req)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u32 tgid = task->tgid, *count = NULL, op, len;
	struct uring_pending p = {};
	__u8 opcode = req->opcode;
	__u64 key = (__u64)req, addr;
	/* The request's command data is a struct io_rw for reads and writes (io_kiocb_to_cmd). */
	struct io_rw *rw = (void *)req;

	switch (opcode) {
	case IORING_OP_READ:
	case IORING_OP_READV:
	case IORING_OP_READ_FIXED:
	case IORING_OP_READV_FIXED:
		op = TRAINIO_FOP_URING_READ;
		break;
	case IORING_OP_WRITE:
	case IORING_OP_WRITEV:
	case IORING_OP_WRITE_FIXED:
	case IORING_OP_WRITEV_FIXED:
		op = TRAINIO_FOP_URING_WRITE;
		break;
	default:
		return 0;
	}
	if (!is_traced(tgid, &count))
		return 0;
	p.offset = BPF_CORE_READ(rw, kiocb.ki_pos);
	len = BPF_CORE_READ(rw, len);
	addr = BPF_CORE_READ(rw, addr);
	if (opcode == IORING_OP_READV || opcode == IORING_OP_WRITEV || opcode == IORING_OP_READV_FIXED ||
	    opcode == IORING_OP_WRITEV_FIXED)
		p.requested = iovec_bytes((const struct iovec *)addr, len); /* len: iovecs */
	else
		p.requested = len;
	p.fd = req->flags & (1ULL << REQ_F_FIXED_FILE_BIT) ? -1 : req->cqe.fd;
	p.op = op;
	p.pid = tgid;
	p.tid = task->pid;
	task_comm(p.comm, task);
	p.queue_depth = enter_flight(tgid, count);
	p.submit_ns = bpf_ktime_get_ns();
	if (bpf_map_update_elem(&uring_inflight, &key, &p, BPF_ANY)) {
		leave_flight(tgid);
		count_lost(TRAINIO_LOST_URING_MAP);
	}
	return 0;
}

SEC("tp_btf/io_uring_complete")
int BPF_PROG(tio_uring_complete, struct io_ring_ctx *ring, void *req, struct io_uring_cqe *cqe)
{
	__u64 key = (__u64)req;
	struct uring_pending *found = bpf_map_lookup_elem(&uring_inflight, &key), p;
	struct file_bits fb = {};
	struct file_event *e;
	struct file *f;

	if (!found)
		return 0;
	/* Taken out of the map at once: every path below is done with it. */
	p = *found;
	bpf_map_delete_elem(&uring_inflight, &key);
	leave_flight(p.pid);
	f = BPF_CORE_READ((struct io_kiocb *)req, file);
	if (f) {
		read_file_bits(f, &fb);
		if (!storage(read_identity(&fb)))
			return 0;
	}
	e = bpf_ringbuf_reserve(&file_events, sizeof(*e), 0);
	if (!e) {
		count_lost(TRAINIO_LOST_FILE_RINGBUF);
		return 0;
	}
	e->kind = TRAINIO_KIND_FILE;
	e->op = p.op;
	e->enter_ns = p.submit_ns;
	e->exit_ns = bpf_ktime_get_ns();
	e->offset = p.offset;
	e->requested = p.requested;
	e->ret = BPF_CORE_READ(cqe, res);
	e->ino = fb.ino;
	e->pid = p.pid;
	e->tid = p.tid;
	e->fd = p.fd;
	e->queue_depth = p.queue_depth;
	e->dev = fb.dev;
	e->flags = fb.flags;
	__builtin_memcpy(e->comm, p.comm, sizeof(e->comm));
	submit_batched(file_events, e);
	return 0;
}
