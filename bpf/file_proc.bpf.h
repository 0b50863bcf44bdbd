/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Proc layer (included by file.bpf.c: it shares the traced-process filter, which fork
 * extends in TGIDS mode and exit shrinks, and the ring buffer): forks of processes, execs,
 * renames and exits of the traced processes.
 */

/* The parent's tgid (the reaper's once the parent has died). */
static __always_inline __u32 parent_tgid(struct task_struct *task)
{
	return BPF_CORE_READ(task, real_parent, tgid);
}

/*
 * A proc record of `task`: comm is the task's own unless `comm` (a kernel string: the
 * new name of a rename) is given; `file` (a kernel string) is the program an exec ran.
 */
static __always_inline void emit_proc(__u32 op, struct task_struct *task, __u32 ppid, __s32 code,
				      const char *comm, const char *file)
{
	struct process_event *e = bpf_ringbuf_reserve(&file_events, sizeof(*e), 0);

	if (!e) {
		count_lost(TRAINIO_LOST_PROC_RINGBUF);
		return;
	}
	e->kind = TRAINIO_KIND_PROC;
	e->op = op;
	e->ns = bpf_ktime_get_ns();
	e->pid = task->tgid;
	e->tid = task->pid;
	e->ppid = ppid;
	e->exit_code = code;
	if (!comm || bpf_probe_read_kernel_str(e->comm, sizeof(e->comm), comm) < 0)
		task_comm(e->comm, task);
	e->file[0] = 0;
	if (file && bpf_probe_read_kernel_str(e->file, sizeof(e->file), file) < 0)
		e->file[0] = 0;
	submit_batched(file_events, e);
}

/*
 * Follow the traced processes' children (a new process, not a thread) and record the
 * fork. Runs in the parent, so the cgroup test of is_traced() is the parent's.
 */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(tio_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptgid = parent->tgid, ctgid = child->tgid, none = 0, *count = NULL;

	if (ptgid == ctgid || !is_traced(ptgid, &count))
		return 0;
	if (target_mode == TARGET_TGIDS && bpf_map_update_elem(&traced, &ctgid, &none, BPF_ANY))
		count_lost(TRAINIO_LOST_PROC_MAP);
	emit_proc(TRAINIO_PROC_FORK, child, ptgid, 0, NULL, NULL);
	return 0;
}

/* Runs in the task after the new program is loaded: comm is already the new one. */
SEC("tp_btf/sched_process_exec")
int BPF_PROG(tio_exec, struct task_struct *task, pid_t old_pid, struct linux_binprm *bprm)
{
	__u32 *count = NULL;

	if (!is_traced(task->tgid, &count))
		return 0;
	emit_proc(TRAINIO_PROC_EXEC, task, parent_tgid(task), 0, NULL, BPF_CORE_READ(bprm, filename));
	return 0;
}

/*
 * A thread's rename (prctl(PR_SET_NAME), /proc/.../comm, pthread_setname_np), before the
 * new name is stored. exec renames too, with in_execve set: its exec record has the name.
 */
SEC("tp_btf/task_rename")
int BPF_PROG(tio_rename, struct task_struct *task, const char *comm)
{
	struct task_struct *cur = bpf_get_current_task_btf();
	__u32 *count = NULL;

	if (!is_traced(task->tgid, &count))
		return 0;
	if (bpf_core_field_exists(struct task_struct, in_execve) && task == cur &&
	    BPF_CORE_READ_BITFIELD_PROBED(cur, in_execve))
		return 0;
	emit_proc(TRAINIO_PROC_COMM, task, parent_tgid(task), 0, comm, NULL);
	return 0;
}

/* Records a traced process's end (its group leader's exit) and forgets the process. */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(tio_exit, struct task_struct *task)
{
	__u32 tgid = task->tgid, *count = NULL;
	__u64 id = ((__u64)tgid << 32) | (__u32)task->pid;

	/* A thread that ends inside an SSL call (a loader worker killed in SSL_read) never
	 * returns from it: its tls_calls entry goes with it, or a recorder left on would fill
	 * the map. */
	bpf_map_delete_elem(&tls_calls, &id);
	if (task->pid != tgid)
		return 0;
	if (is_traced(tgid, &count))
		emit_proc(TRAINIO_PROC_EXIT, task, parent_tgid(task), task->exit_code, NULL, NULL);
	bpf_map_delete_elem(&proc_inflight, &tgid);
	if (target_mode == TARGET_TGIDS)
		bpf_map_delete_elem(&traced, &tgid);
	return 0;
}
