/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The one header shared by the BPF programs and the Rust tracer (which gets these types
 * through the libbpf-cargo skeleton). Every record in a ring buffer starts with a __u32
 * kind tag so that user space can dispatch on it; fields are fixed-width and ordered so
 * that no padding depends on the compiler.
 */
#ifndef TRAINIO_H
#define TRAINIO_H

#define TRAINIO_COMM_LEN 16
#define TRAINIO_PATH_LEN 256

enum trainio_kind {
	TRAINIO_KIND_BLOCK = 1, /* struct block_event */
	TRAINIO_KIND_FILE = 2,  /* struct file_event */
	TRAINIO_KIND_OPEN = 3,  /* struct open_event */
	TRAINIO_KIND_NFS = 4,   /* struct nfs_event */
	TRAINIO_KIND_BLOCK_BATCH = 5, /* struct block_batch: block_events, back to back */
	TRAINIO_KIND_PROC = 6,  /* struct process_event */
	TRAINIO_KIND_IPC = 7,   /* struct ipc_event */
	TRAINIO_KIND_HTTP = 8,  /* struct http_event: an ipc_event on a TCP socket, with its bytes */
	TRAINIO_KIND_TLS = 9,   /* struct http_event: an SSL_read/SSL_write call's plaintext (no ipc row) */
};

/* What a process_event reports (the proc layer's ops; `start` rows come from user space). */
enum trainio_proc_op {
	TRAINIO_PROC_FORK = 1, /* a traced process created a process (not a thread) */
	TRAINIO_PROC_EXEC = 2,
	TRAINIO_PROC_COMM = 3, /* a thread renamed itself or was renamed (not by exec) */
	TRAINIO_PROC_EXIT = 4, /* the process's group leader exited */
};

/* The ipc layer's ops. */
enum trainio_ipc_op {
	TRAINIO_IPC_READ = 1,
	TRAINIO_IPC_WRITE = 2,
	TRAINIO_IPC_WAIT = 3, /* poll/ppoll whose first pollfd is a pipe, FIFO or socket */
};

/* What an ipc_event's file is. */
enum trainio_ipc_type {
	TRAINIO_IPC_PIPE = 1,   /* pipe or FIFO */
	TRAINIO_IPC_SOCKET = 2,
};

enum trainio_nfs_op {
	TRAINIO_NFS_READ = 1,
	TRAINIO_NFS_WRITE = 2,
	TRAINIO_NFS_COMMIT = 3,
};

/* nfs_event.rpc: which RPC fields were joined onto the request. */
enum trainio_rpc_flags {
	TRAINIO_RPC_STATS = 1, /* rpc_xid, rpc_*_us from sunrpc:rpc_stats_latency */
	TRAINIO_RPC_NTRANS = 2, /* rpc_ntrans counted from sunrpc:xprt_transmit */
};

/* Which syscall a file_event came from. */
enum trainio_file_op {
	TRAINIO_FOP_READ = 1,
	TRAINIO_FOP_PREAD64 = 2,
	TRAINIO_FOP_READV = 3,
	TRAINIO_FOP_PREADV = 4,
	TRAINIO_FOP_PREADV2 = 5,
	TRAINIO_FOP_WRITE = 6,
	TRAINIO_FOP_PWRITE64 = 7,
	TRAINIO_FOP_CLOSE = 8,
	TRAINIO_FOP_FSYNC = 9,
	TRAINIO_FOP_FDATASYNC = 10,
	TRAINIO_FOP_SYNC_FILE_RANGE = 11,
	TRAINIO_FOP_URING_READ = 12,  /* an io_uring read request (IORING_OP_READ*) */
	TRAINIO_FOP_URING_WRITE = 13, /* an io_uring write request (IORING_OP_WRITE*) */
	TRAINIO_FOP_WRITEV = 14,
	TRAINIO_FOP_PWRITEV = 15,
	TRAINIO_FOP_PWRITEV2 = 16,
	/* Socket syscalls: ipc rows only (a collective's sends and receives). */
	TRAINIO_FOP_SENDTO = 17,
	TRAINIO_FOP_SENDMSG = 18,
	TRAINIO_FOP_RECVFROM = 19,
	TRAINIO_FOP_RECVMSG = 20,
	/* Reads through memory mappings (file.bpf.c, mmap section): file rows, not syscalls. */
	TRAINIO_FOP_FAULT = 21,     /* a page fault filemap_fault served (mm_filemap_fault): an instant */
	TRAINIO_FOP_MAP_PAGES = 22, /* fault-around over [offset, offset + requested) (mm_filemap_map_pages) */
	TRAINIO_FOP_MMAP = 23,      /* mmap of a storage fd; flags = prot | map flags << 8 */
	TRAINIO_FOP_MADVISE = 24,   /* madvise of a file mapping; flags = advice, fd = -1 */
};

/* Index of the lost-event counters (a per-CPU array in each object). */
enum trainio_lost {
	TRAINIO_LOST_BLOCK_RINGBUF = 0, /* block_rq_complete: ring buffer full */
	TRAINIO_LOST_BLOCK_MAP = 1,     /* block_rq_issue: in-flight map full */
	TRAINIO_LOST_FILE_RINGBUF = 2,  /* sys_exit_*: ring buffer full */
	TRAINIO_LOST_FILE_MAP = 3,      /* sys_enter_*: no per-thread syscall state (allocation failed) */
	TRAINIO_LOST_OPEN_RINGBUF = 4,  /* sys_exit_openat: ring buffer full */
	TRAINIO_LOST_PROC_MAP = 5,      /* sched_process_fork: traced-process map full */
	TRAINIO_LOST_NFS_RINGBUF = 6,   /* nfs_*_done: ring buffer full */
	TRAINIO_LOST_NFS_MAP = 7,       /* nfs_initiate_*: in-flight map or slots full */
	TRAINIO_LOST_RPC_MAP = 8,       /* xprt_transmit / rpc_stats_latency: RPC map full */
	TRAINIO_LOST_PROC_RINGBUF = 9,  /* sched_process_* / task_rename: ring buffer full */
	TRAINIO_LOST_IPC_RINGBUF = 10,  /* sys_exit_* of an ipc syscall: ring buffer full */
	TRAINIO_LOST_BLOCK_UNSEEN = 11, /* block_rq_insert/issue: an earlier life's completion unseen */
	TRAINIO_LOST_URING_MAP = 12,    /* io_uring_submit_req: in-flight request map full */
	TRAINIO_LOST_MAX = 13,
};

struct block_event {
	__u32 kind;        /* TRAINIO_KIND_BLOCK */
	__u32 dev;         /* kernel dev_t of the disk: major << 20 | minor */
	__u64 insert_ns;   /* 0: never passed through the scheduler */
	__u64 issue_ns;
	__u64 complete_ns;
	__u64 sector;      /* ~0ULL for a flush */
	__u32 bytes;       /* bytes completed by this completion */
	__u32 cmd_flags;   /* op in the low 8 bits, REQ_* flags above */
	__u32 queue_depth; /* requests in flight on dev at issue, including this one */
	__u32 pid;         /* tgid of the task that inserted or issued it */
	__u32 tid;
	__s32 error;       /* blk_status_t as the kernel passed it */
	char comm[TRAINIO_COMM_LEN];
};

/*
 * Block completions are gathered per CPU and written to the ring buffer TRAINIO_BLOCK_BATCH
 * at a time (one reserve and commit per batch rather than per request: the ring buffer
 * was a third of the tracing cost at 250k IOPS). A record holds `count` events, and is
 * written with only those: its length is 8 + count * sizeof(struct block_event).
 */
#define TRAINIO_BLOCK_BATCH 32

struct block_batch {
	__u32 kind;  /* TRAINIO_KIND_BLOCK_BATCH */
	__u32 count; /* events in ev[], 1..TRAINIO_BLOCK_BATCH */
	struct block_event ev[TRAINIO_BLOCK_BATCH];
};

struct file_event {
	__u32 kind; /* TRAINIO_KIND_FILE */
	__u32 op;   /* enum trainio_file_op */
	__u64 enter_ns;
	__u64 exit_ns;
	__s64 offset;    /* -1: no offset (close, fsync, fdatasync) */
	__u64 requested; /* count asked for (iovec lengths summed) */
	__s64 ret;       /* the syscall's return value */
	__u64 ino;       /* the file's inode number; 0 for a block device (dev names it) */
	__u32 pid;
	__u32 tid;
	__s32 fd;
	__u32 queue_depth; /* read/write syscalls in flight in this tgid, including this one */
	__u32 dev;         /* kernel dev_t of the file (i_rdev for a block device node) */
	__u32 flags;       /* f_flags of the open file */
	char comm[TRAINIO_COMM_LEN];
};

struct open_event {
	__u32 kind; /* TRAINIO_KIND_OPEN */
	__u32 pid;
	__u64 enter_ns;
	__u64 exit_ns;
	__u64 ino;  /* the opened file's identity, as in file_event (0: block device) */
	__u32 dev;
	__u32 tid;
	__s32 ret; /* new fd, or -errno */
	__u32 flags;
	__s32 dirfd;
	char comm[TRAINIO_COMM_LEN];
	char path[TRAINIO_PATH_LEN];
};

struct nfs_event {
	__u32 kind; /* TRAINIO_KIND_NFS */
	__u32 op;   /* enum trainio_nfs_op */
	__u64 issue_ns;
	__u64 complete_ns;
	__s64 offset;
	__u64 fileid;      /* the file's inode number on the server */
	__u32 dev;         /* the mount's s_dev */
	__u32 requested;   /* bytes the request asked for */
	__u32 returned;    /* bytes the server returned or accepted */
	__u32 queue_depth; /* READ/WRITE/COMMIT requests outstanding on dev, including this */
	__u32 pid;         /* task that initiated the request */
	__u32 tid;
	__s32 error;       /* 0 or -errno */
	__u32 rpc;         /* enum trainio_rpc_flags: which rpc_* fields are valid */
	char comm[TRAINIO_COMM_LEN];
	/* The RPC that carried the request (the last one, if the request was restarted). */
	__u32 rpc_xid;
	__u32 rpc_ntrans;      /* transmissions of that xid: 1 + retransmits */
	__u64 rpc_backlog_us;  /* as rpc_stats_latency reports them: microseconds */
	__u64 rpc_rtt_us;
	__u64 rpc_execute_us;
};

struct process_event {
	__u32 kind; /* TRAINIO_KIND_PROC */
	__u32 op;   /* enum trainio_proc_op */
	__u64 ns;
	__u32 pid;  /* tgid (fork: the child's) */
	__u32 tid;
	__u32 ppid; /* the parent's tgid (fork: the forking process) */
	__s32 exit_code; /* exit: the wait status; 0 otherwise */
	char comm[TRAINIO_COMM_LEN]; /* comm: the new name; exec: the new program's */
	char file[TRAINIO_PATH_LEN]; /* exec: the filename executed; empty otherwise */
};

struct ipc_event {
	__u32 kind; /* TRAINIO_KIND_IPC */
	__u32 op;   /* enum trainio_ipc_op */
	__u64 enter_ns;
	__u64 exit_ns;
	__u64 requested; /* count asked for; wait: nfds */
	__s64 ret;       /* the syscall's return value (wait: ready fds) */
	__u64 ino;       /* i_ino of the pipe, FIFO or socket */
	__u32 pid;
	__u32 tid;
	__s32 fd;
	__u32 dev;       /* s_dev of that inode */
	__u32 ipc;       /* enum trainio_ipc_type */
	__u32 pad;
	char comm[TRAINIO_COMM_LEN];
};

/*
 * The object layer (file.bpf.c, with object_layer set): a send or receive of a traced
 * process on a TCP socket is this record instead of an ipc_event. It carries the ipc row
 * (ipc.kind = TRAINIO_KIND_HTTP), the socket's peer, and the first bytes the syscall moved
 * when they start an HTTP/1.x request or response head ("GET ", "PUT ", ..., "HTTP/"):
 * user space parses the heads (tracer/src/object.rs) and counts the other sends and
 * receives as body bytes. A record is written with only its captured bytes: its length
 * is offsetof(data) + captured.
 */
#define TRAINIO_HTTP_CAP 2048

struct http_event {
	struct ipc_event ipc;
	__u8 daddr[16];  /* the peer's address: IPv4 in the first 4 bytes, or IPv6 */
	__u16 dport;     /* the peer's port, network byte order */
	__u16 family;    /* AF_INET or AF_INET6 */
	__u32 captured;  /* bytes of data[]: the syscall's first bytes, ≤ TRAINIO_HTTP_CAP */
	char data[TRAINIO_HTTP_CAP];
};

#endif /* TRAINIO_H */
