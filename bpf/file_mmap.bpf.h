/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * File layer, reads through memory mappings (included by file.bpf.c: it shares the
 * traced-process filter, the per-thread syscall state and the ring buffer). A process
 * that reads a file through mmap (pyarrow.memory_map under HF datasets, numpy.memmap)
 * makes no read syscalls: its reads are page faults. Recorded, for traced processes only,
 * as file rows of a storage file (regular file or block device):
 *   fault      mm_filemap_fault: a fault that filemap_fault served, i.e. a page that
 *              fault-around did not find in the page cache: the page at the faulting
 *              address (filemap_fault reads it, and its read-around, before returning);
 *   map_pages  mm_filemap_map_pages: a fault-around, the range of pages around a
 *              faulting address that the kernel maps when they are already cached (it
 *              issues no I/O; pages not cached are left to the fault);
 *   mmap       the mmap syscall of an fd of such a file (prot and flags kept);
 *   madvise    madvise on a range mapping such a file (pyarrow asks MADV_WILLNEED of
 *              each range it reads, which starts the readahead of that range).
 * The two tracepoints run in the faulting task (a fault taken by get_user_pages on behalf
 * of a syscall too) and say nothing of the fault's end: their rows are instants.
 */

/* The identity of a page-cache owner's inode: as read_identity() gives for an fd. */
static __always_inline bool mapping_identity(struct address_space *mapping, __u64 *ino, __u32 *dev)
{
	struct inode *inode = mapping->host;
	__u32 mode;

	if (!inode)
		return false;
	mode = inode->i_mode & S_IFMT;
	if (mode == S_IFBLK) {
		*dev = inode->i_rdev;
		*ino = 0;
		return true;
	}
	if (mode != S_IFREG)
		return false;
	*ino = inode->i_ino;
	*dev = inode->i_sb->s_dev;
	return true;
}

/* One instant row of a mapping's pages [first, last] (page indexes) read by `task`. */
static __always_inline void emit_mapped(struct task_struct *task, __u32 op, struct address_space *mapping,
					__u64 first, __u64 last)
{
	__u32 *count = NULL, dev;
	struct file_event *e;
	__u64 ino, now;

	if (!is_traced(task->tgid, &count) || !mapping_identity(mapping, &ino, &dev))
		return;
	e = bpf_ringbuf_reserve(&file_events, sizeof(*e), 0);
	if (!e) {
		count_lost(TRAINIO_LOST_FILE_RINGBUF);
		return;
	}
	now = bpf_ktime_get_ns();
	e->kind = TRAINIO_KIND_FILE;
	e->op = op;
	e->enter_ns = now;
	e->exit_ns = now;
	e->offset = first << 12;
	e->requested = (last - first + 1) << 12;
	e->ret = e->requested;
	e->ino = ino;
	e->pid = task->tgid;
	e->tid = task->pid;
	e->fd = -1;
	e->queue_depth = 0;
	e->dev = dev;
	e->flags = 0;
	task_comm(e->comm, task);
	submit_batched(file_events, e);
}

SEC("tp_btf/mm_filemap_fault")
int BPF_PROG(tio_filemap_fault, struct address_space *mapping, unsigned long index)
{
	emit_mapped(bpf_get_current_task_btf(), TRAINIO_FOP_FAULT, mapping, index, index);
	return 0;
}

SEC("tp_btf/mm_filemap_map_pages")
int BPF_PROG(tio_filemap_map_pages, struct address_space *mapping, unsigned long first, unsigned long last)
{
	if (last >= first)
		emit_mapped(bpf_get_current_task_btf(), TRAINIO_FOP_MAP_PAGES, mapping, first, last);
	return 0;
}

/* mmap(addr, len, prot, flags, fd, off): the row's offset is off, its flags prot | flags << 8. */
SEC("tracepoint/syscalls/sys_enter_mmap")
int tio_mmap_enter(struct trace_event_raw_sys_enter *ctx)
{
	__u64 flags = (ARG(2) & 0xff) | (ARG(3) << 8);

	if ((int)ARG(4) < 0)
		return 0; /* anonymous */
	return enter_io_flags(TRAINIO_FOP_MMAP, ARG(4), ARG(1), ARG(5), flags & 0xffffffff);
}

EXIT_PROG(tio_mmap_exit, mmap)

struct vma_file {
	struct file *file;
	__u64 start;  /* vm_start */
	__u64 pgoff;  /* vm_pgoff: the file page mapped at vm_start */
};

static long vma_file_of(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	struct vma_file *v = data;

	v->file = vma->vm_file;
	v->start = vma->vm_start;
	v->pgoff = vma->vm_pgoff;
	return 0;
}

/*
 * madvise(start, len, advice) whose start lies in a mapping of a storage file: the file
 * offset of start, len and the advice (ranges of anonymous memory, e.g. the allocator's
 * MADV_DONTNEED, are not recorded). A range that spans mappings is named by its first.
 */
SEC("tracepoint/syscalls/sys_enter_madvise")
int tio_madvise_enter(struct trace_event_raw_sys_enter *ctx)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 start = ARG(0);
	struct vma_file v = {};
	struct pending_io *p;
	struct file_bits fb = {};
	__u32 *count = NULL;

	if (!is_traced(task->tgid, &count))
		return 0;
	if (bpf_find_vma(task, start, vma_file_of, &v, 0) || !v.file)
		return 0;
	read_file_bits(v.file, &fb);
	if (!storage(read_identity(&fb)))
		return 0;
	p = pending_of(task);
	if (!p)
		return 0;
	p->ipc = 0;
	p->op = TRAINIO_FOP_MADVISE;
	p->fd = -1;
	p->requested = ARG(1);
	p->dev = fb.dev;
	p->ino = fb.ino;
	p->flags = ARG(2);
	p->offset = (__s64)(start - v.start + (v.pgoff << 12));
	p->queue_depth = 0;
	p->enter_ns = bpf_ktime_get_ns();
	return 0;
}

EXIT_PROG(tio_madvise_exit, madvise)
