/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * File layer, the object layer over TLS (included by file.bpf.c after file_ipc.bpf.h).
 * HTTPS bytes are ciphertext at the socket syscalls; the plaintext is at the TLS
 * library's SSL_read/SSL_read_ex (the buffer at the call, filled by its return) and
 * SSL_write/SSL_write_ex (the buffer at the call). User space attaches these uprobes to
 * the libssl the traced processes load (tracer/src/probes.rs).
 *
 * The connection is the socket under the SSL object, learnt without reading OpenSSL's
 * own structs (their layout changes between releases): a send or receive on a TCP socket
 * made while a thread is inside an SSL call is the SSL object's, so its socket (inode,
 * fd, peer) is noted for that SSL object, and the call's plaintext record carries it. A
 * call served from OpenSSL's buffer makes no syscall and takes the socket noted before.
 *
 * The record is an http_event of kind TRAINIO_KIND_TLS: the call's times, its plaintext
 * byte count as ret (-EAGAIN when it moved nothing: a non-blocking socket's "want read"),
 * and its first bytes when they start an HTTP head. The ciphertext syscalls below it are
 * still ipc rows (http_events on the socket); user space keys the plaintext under
 * another connection key, so the ciphertext is never parsed or counted as HTTP.
 */

#define TLS_READ 1
#define TLS_WRITE 2
#define EAGAIN 11

/* The SSL call a thread is in, from entry to return. */
struct tls_call {
	__u64 ssl;
	__u64 buf;
	__u64 num;
	__u64 done; /* _ex: the size_t * the byte count is returned in; 0: the return value is */
	__u64 enter_ns;
	__u32 op;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); /* pid_tgid */
	__type(value, struct tls_call);
} tls_calls SEC(".maps");

struct tls_key {
	__u32 tgid;
	__u32 pad;
	__u64 ssl;
};

/* The socket an SSL object was last seen sending or receiving on. */
struct tls_sock {
	__u64 ino;
	__u8 daddr[16];
	__u16 dport;
	__u16 family;
	__s32 fd;
	__u32 dev;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct tls_key);
	__type(value, struct tls_sock);
} tls_socks SEC(".maps");

/* A TCP send or receive (p filled by its entry): noted as the SSL object's socket when the thread is in an SSL call. */
static __always_inline void tls_note_socket(struct pending_io *p, __u32 tgid)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct tls_call *c = bpf_map_lookup_elem(&tls_calls, &id);
	struct tls_key k = { .tgid = tgid };
	struct tls_sock s = {};

	if (!c)
		return;
	k.ssl = c->ssl;
	s.ino = p->ino;
	__builtin_memcpy(s.daddr, p->daddr, sizeof(s.daddr));
	s.dport = p->dport;
	s.family = p->family;
	s.fd = p->fd;
	s.dev = p->dev;
	bpf_map_update_elem(&tls_socks, &k, &s, BPF_ANY);
}

static __always_inline int tls_enter(__u32 op, __u64 ssl, __u64 buf, __u64 num, __u64 done)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u32 *count = NULL;
	__u64 id = bpf_get_current_pid_tgid();
	struct tls_call c = { .ssl = ssl, .buf = buf, .num = num, .done = done, .op = op };

	if (!is_traced(task->tgid, &count))
		return 0;
	c.enter_ns = bpf_ktime_get_ns();
	bpf_map_update_elem(&tls_calls, &id, &c, BPF_ANY);
	return 0;
}

SEC("uprobe")
int BPF_UPROBE(tio_ssl_read_enter, void *ssl, void *buf, int num)
{
	return tls_enter(TLS_READ, (__u64)ssl, (__u64)buf, num > 0 ? num : 0, 0);
}

SEC("uprobe")
int BPF_UPROBE(tio_ssl_read_ex_enter, void *ssl, void *buf, __u64 num, __u64 *readbytes)
{
	return tls_enter(TLS_READ, (__u64)ssl, (__u64)buf, num, (__u64)readbytes);
}

SEC("uprobe")
int BPF_UPROBE(tio_ssl_write_enter, void *ssl, const void *buf, int num)
{
	return tls_enter(TLS_WRITE, (__u64)ssl, (__u64)buf, num > 0 ? num : 0, 0);
}

SEC("uprobe")
int BPF_UPROBE(tio_ssl_write_ex_enter, void *ssl, const void *buf, __u64 num, __u64 *written)
{
	return tls_enter(TLS_WRITE, (__u64)ssl, (__u64)buf, num, (__u64)written);
}

/* The return of any of the four: the call's plaintext record. */
SEC("uretprobe")
int BPF_URETPROBE(tio_ssl_return, long rc)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 id = bpf_get_current_pid_tgid(), moved = 0;
	struct tls_call *c = bpf_map_lookup_elem(&tls_calls, &id);
	struct tls_key k = { .tgid = task->tgid };
	struct tls_sock *s;
	struct http_event *e;
	__u32 zero = 0, len = 0;
	long ret;
	char first[8];

	if (!c)
		return 0;
	k.ssl = c->ssl;
	s = bpf_map_lookup_elem(&tls_socks, &k);
	e = bpf_map_lookup_elem(&http_scratch, &zero);
	if (!s || !e) {
		/* No socket seen under this SSL object (a memory BIO, as asyncio's): not recorded. */
		bpf_map_delete_elem(&tls_calls, &id);
		return 0;
	}
	if (c->done) {
		/* SSL_*_ex: 1 and the count in *done, or 0 (nothing moved). */
		if ((int)rc == 1 && !bpf_probe_read_user(&moved, sizeof(moved), (void *)c->done))
			ret = moved;
		else
			ret = -EAGAIN;
	} else {
		ret = (int)rc > 0 ? (int)rc : -EAGAIN;
	}
	e->ipc.kind = TRAINIO_KIND_TLS;
	e->ipc.op = c->op == TLS_WRITE ? TRAINIO_IPC_WRITE : TRAINIO_IPC_READ;
	e->ipc.enter_ns = c->enter_ns;
	e->ipc.exit_ns = bpf_ktime_get_ns();
	e->ipc.requested = c->num;
	e->ipc.ret = ret;
	e->ipc.ino = s->ino;
	e->ipc.pid = task->tgid;
	e->ipc.tid = task->pid;
	e->ipc.fd = s->fd;
	e->ipc.dev = s->dev;
	e->ipc.ipc = TRAINIO_IPC_SOCKET;
	e->ipc.pad = 0;
	task_comm(e->ipc.comm, task);
	__builtin_memcpy(e->daddr, s->daddr, sizeof(e->daddr));
	e->dport = s->dport;
	e->family = s->family;
	if (ret >= 5 && c->buf && !bpf_probe_read_user(first, sizeof(first), (void *)c->buf) &&
	    http_head(first, c->op == TLS_WRITE)) {
		len = ret < c->num ? ret : c->num;
		if (len > TRAINIO_HTTP_CAP)
			len = TRAINIO_HTTP_CAP;
		if (bpf_probe_read_user(e->data, len, (void *)c->buf))
			len = 0;
	}
	e->captured = len;
	bpf_map_delete_elem(&tls_calls, &id);
	if (bpf_ringbuf_output(&file_events, e, offsetof(struct http_event, data) + len,
			       wake_flags(&file_events)))
		count_lost(TRAINIO_LOST_IPC_RINGBUF);
	return 0;
}
