/*
 * Copyright (c) warmstart developers
 * GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
 * SPDX-License-Identifier: GPL-3.0-or-later
 *
 * A fake libcuda.so.1 for the unit tests of plugins/module_utils/accel/_cudabackends.py (DriverBackend).
 *
 * It exports the six CUDA checkpoint entry points with the driver's ABI (the
 * 64-byte argument structs of CUDA 13.0, checked below), plus cuInit,
 * cuGetErrorName and cuDriverGetVersion. It never touches a GPU:
 *
 *   FAKE_CUDA_STATE  file of per-PID state, one line per CUDA process:
 *                        <pid> <running|locked|checkpointed|failed> [busy] [gpus=<hex32>,<hex32>...]
 *                    a pid that is not listed is not a CUDA process (result 1).
 *                    Read and rewritten under flock on every call, so the state
 *                    is shared by every process that loads the library.
 *   FAKE_CUDA_LOG    every call is appended as one line of key=value pairs:
 *                    call, pid, the decoded arguments (timeoutMs, pairs,
 *                    pairN=<old hex>:<new hex>), raw=<the 64 bytes of the args
 *                    struct in hex, or null>, result.
 *   FAKE_CUDA_FAIL   "call:pid=code,..." (call: lock, checkpoint, restore,
 *                    unlock, get_state, get_restore_tid; pid may be *): that
 *                    call returns that code and changes nothing.
 *   FAKE_CUDA_DRIVER_VERSION   what cuDriverGetVersion reports (default 13000).
 *   FAKE_CUDA_ADOPT  "<text>=<state>": a pid that is not listed but whose
 *                    /proc/<pid>/cmdline (NULs read as spaces) contains <text>
 *                    is a CUDA process in <state>; it is listed from its first
 *                    state change on (integration tests: a restored copy's new pid).
 *   FAKE_CUDA_DEVICE the device file cuMemExportToShareableHandle opens (default /dev/nvidiactl).
 *   FAKE_CUDA_REQUIRE_INIT=1   checkpoint calls return 3 (NOT_INITIALIZED)
 *                    until cuInit(0) was called in this process.
 *
 * Legal transitions: lock RUNNING->LOCKED, checkpoint LOCKED->CHECKPOINTED,
 * restore CHECKPOINTED->LOCKED, unlock LOCKED->RUNNING; anything else is 401.
 * Lock on a "busy" process with a timeout returns 600 (NOT_READY) and leaves
 * it RUNNING; without a timeout it waits for the work and locks. A restore
 * with GPU pairs must name every GPU listed for the pid as an old UUID (1).
 *
 * Build: gcc -shared -fPIC -o libcuda.so.1 fake_libcuda.c
 *   -DFAKE_WITHOUT_CHECKPOINT_API  a driver older than r570: no cuCheckpoint* symbols
 *   -DFAKE_WITHOUT_ERROR_NAME      no cuGetErrorName
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUprocessState;

typedef struct {
	char bytes[16];
} CUuuid;

typedef struct {
	unsigned int timeoutMs;
	unsigned int reserved0;
	uint64_t reserved1[7];
} CUcheckpointLockArgs;

typedef struct {
	uint64_t reserved[8];
} CUcheckpointCheckpointArgs;

typedef struct {
	uint64_t reserved[8];
} CUcheckpointUnlockArgs;

typedef struct {
	CUuuid oldUuid;
	CUuuid newUuid;
} CUcheckpointGpuPair;

typedef struct {
	CUcheckpointGpuPair *gpuPairs;
	unsigned int gpuPairsCount;
	char reserved[52 - sizeof(CUcheckpointGpuPair *)];
	uint64_t reserved1;
} CUcheckpointRestoreArgs;

_Static_assert(sizeof(CUcheckpointLockArgs) == 64, "CUcheckpointLockArgs is 64 bytes");
_Static_assert(sizeof(CUcheckpointCheckpointArgs) == 64, "CUcheckpointCheckpointArgs is 64 bytes");
_Static_assert(sizeof(CUcheckpointUnlockArgs) == 64, "CUcheckpointUnlockArgs is 64 bytes");
_Static_assert(sizeof(CUcheckpointRestoreArgs) == 64, "CUcheckpointRestoreArgs is 64 bytes");
_Static_assert(sizeof(CUcheckpointGpuPair) == 32, "CUcheckpointGpuPair is 32 bytes");

enum { RUNNING = 0, LOCKED = 1, CHECKPOINTED = 2, FAILED = 3 };
enum {
	SUCCESS = 0,
	INVALID_VALUE = 1,
	NOT_INITIALIZED = 3,
	ILLEGAL_STATE = 401,
	NOT_READY = 600,
	NOT_SUPPORTED = 801,
};

#define MAX_PROCS 64
#define MAX_GPUS 16
#define LINE 4096

struct proc {
	int pid;
	int state;
	int busy;
	int ngpus;
	unsigned char gpus[MAX_GPUS][16];
};

static const char *state_names[] = { "running", "locked", "checkpointed", "failed" };
static int initialized;

static void hex(char *out, const void *data, size_t len)
{
	const unsigned char *p = data;
	size_t i;

	for (i = 0; i < len; i++)
		sprintf(out + 2 * i, "%02x", p[i]);
	out[2 * len] = '\0';
}

static int unhex16(const char *text, unsigned char *out)
{
	int i;

	for (i = 0; i < 16; i++) {
		unsigned int byte;

		if (sscanf(text + 2 * i, "%2x", &byte) != 1)
			return -1;
		out[i] = (unsigned char)byte;
	}
	return 0;
}

static void log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void log_line(const char *fmt, ...)
{
	const char *path = getenv("FAKE_CUDA_LOG");
	va_list ap;
	FILE *f;

	if (!path || !*path)
		return;
	f = fopen(path, "a");
	if (!f)
		return;
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fputc('\n', f);
	fclose(f);
}

/* The code FAKE_CUDA_FAIL asks this call on this pid to fail with, or 0. */
static int injected(const char *call, int pid)
{
	const char *spec = getenv("FAKE_CUDA_FAIL");
	char buf[LINE], *save = NULL, *item;

	if (!spec || !*spec)
		return 0;
	snprintf(buf, sizeof(buf), "%s", spec);
	for (item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
		char name[64], who[32];
		int code;

		if (sscanf(item, " %63[^:]:%31[^=]=%d", name, who, &code) != 3)
			continue;
		if (strcmp(name, call) != 0)
			continue;
		if (strcmp(who, "*") == 0 || atoi(who) == pid)
			return code;
	}
	return 0;
}

static int lock_state(void)
{
	const char *path = getenv("FAKE_CUDA_STATE");
	char lock[LINE];
	int fd;

	if (!path || !*path)
		return -1;
	snprintf(lock, sizeof(lock), "%s.lock", path);
	fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd >= 0)
		flock(fd, LOCK_EX);
	return fd;
}

static void unlock_state(int fd)
{
	if (fd >= 0) {
		flock(fd, LOCK_UN);
		close(fd);
	}
}

static int load(struct proc *procs)
{
	const char *path = getenv("FAKE_CUDA_STATE");
	char line[LINE];
	int n = 0;
	FILE *f;

	if (!path || !(f = fopen(path, "r")))
		return 0;
	while (n < MAX_PROCS && fgets(line, sizeof(line), f)) {
		struct proc *p = &procs[n];
		char state[32], *tok, *save = NULL;
		int i;

		memset(p, 0, sizeof(*p));
		if (sscanf(line, "%d %31s", &p->pid, state) != 2)
			continue;
		p->state = -1;
		for (i = 0; i < 4; i++)
			if (strcmp(state, state_names[i]) == 0)
				p->state = i;
		if (p->state < 0)
			continue;
		tok = strtok_r(line, " \t\n", &save); /* pid */
		tok = strtok_r(NULL, " \t\n", &save); /* state */
		while ((tok = strtok_r(NULL, " \t\n", &save))) {
			if (strcmp(tok, "busy") == 0) {
				p->busy = 1;
			} else if (strncmp(tok, "gpus=", 5) == 0) {
				char *g, *gsave = NULL;

				for (g = strtok_r(tok + 5, ",", &gsave); g && p->ngpus < MAX_GPUS;
				     g = strtok_r(NULL, ",", &gsave))
					if (unhex16(g, p->gpus[p->ngpus]) == 0)
						p->ngpus++;
			}
		}
		n++;
	}
	fclose(f);
	return n;
}

static void save(const struct proc *procs, int n)
{
	const char *path = getenv("FAKE_CUDA_STATE");
	char tmp[LINE], h[33];
	FILE *f;
	int i, g;

	snprintf(tmp, sizeof(tmp), "%s.tmp-%d", path, (int)getpid());
	f = fopen(tmp, "w");
	if (!f)
		return;
	for (i = 0; i < n; i++) {
		fprintf(f, "%d %s", procs[i].pid, state_names[procs[i].state]);
		if (procs[i].busy)
			fprintf(f, " busy");
		for (g = 0; g < procs[i].ngpus; g++) {
			hex(h, procs[i].gpus[g], 16);
			fprintf(f, "%s%s", g ? "," : " gpus=", h);
		}
		fputc('\n', f);
	}
	fclose(f);
	rename(tmp, path);
}

/* FAKE_CUDA_ADOPT: is this unlisted pid a CUDA process (its command line), and in which state? */
static int adopt_state(int pid)
{
	const char *spec = getenv("FAKE_CUDA_ADOPT");
	char path[64], cmd[LINE], want[LINE], *eq;
	size_t len, i;
	FILE *f;
	int s;

	if (!spec || !*spec || strlen(spec) >= sizeof(want))
		return -1;
	strcpy(want, spec);
	eq = strrchr(want, '=');
	if (!eq)
		return -1;
	*eq = '\0';
	snprintf(path, sizeof(path), "/proc/%d/cmdline", pid);
	if (!(f = fopen(path, "r")))
		return -1;
	len = fread(cmd, 1, sizeof(cmd) - 1, f);
	fclose(f);
	for (i = 0; i < len; i++)
		if (cmd[i] == '\0')
			cmd[i] = ' ';
	cmd[len] = '\0';
	if (!strstr(cmd, want))
		return -1;
	for (s = 0; s < 4; s++)
		if (strcmp(eq + 1, state_names[s]) == 0)
			return s;
	return -1;
}

static struct proc *find(struct proc *procs, int *n, int pid)
{
	int i, state;

	for (i = 0; i < *n; i++)
		if (procs[i].pid == pid)
			return &procs[i];
	state = adopt_state(pid);
	if (state < 0 || *n >= MAX_PROCS)
		return NULL;
	memset(&procs[*n], 0, sizeof(procs[*n]));
	procs[*n].pid = pid;
	procs[*n].state = state;
	return &procs[(*n)++];
}

static int need_init(void)
{
	const char *req = getenv("FAKE_CUDA_REQUIRE_INIT");

	return req && strcmp(req, "1") == 0 && !initialized;
}

/*
 * One state transition: the common path of lock/checkpoint/restore/unlock.
 * "from" is the legal state, "to" the state after success.
 */
static __attribute__((unused)) CUresult transition(const char *call, int pid, int from, int to, const void *raw, size_t rawlen,
			   const char *decoded, const CUcheckpointRestoreArgs *restore, unsigned int timeout)
{
	struct proc procs[MAX_PROCS], *p;
	char rawhex[2 * 64 + 1];
	int n, fd, code;
	CUresult result = SUCCESS;
	const char *note = "";

	if (raw)
		hex(rawhex, raw, rawlen);
	else
		strcpy(rawhex, "null");

	fd = lock_state();
	n = load(procs);
	p = find(procs, &n, pid);
	if (need_init()) {
		result = NOT_INITIALIZED;
	} else if ((code = injected(call, pid)) != 0) {
		result = code;
		note = " injected=1";
	} else if (!p) {
		result = INVALID_VALUE;
	} else if (p->state != from) {
		result = ILLEGAL_STATE;
	} else if (strcmp(call, "lock") == 0 && p->busy && timeout > 0) {
		result = NOT_READY; /* timed out waiting for in-flight work: still RUNNING */
	} else {
		if (restore && restore->gpuPairsCount > 0) {
			int g;
			unsigned int k;

			if (!restore->gpuPairs)
				result = INVALID_VALUE;
			for (g = 0; result == SUCCESS && g < p->ngpus; g++) {
				int listed = 0;

				for (k = 0; k < restore->gpuPairsCount; k++)
					if (memcmp(restore->gpuPairs[k].oldUuid.bytes, p->gpus[g], 16) == 0)
						listed = 1;
				if (!listed)
					result = INVALID_VALUE; /* gpuPairs must list every checkpointed GPU */
			}
		}
		if (result == SUCCESS) {
			p->state = to;
			save(procs, n);
		}
	}
	unlock_state(fd);
	log_line("call=%s pid=%d%s raw=%s result=%d%s", call, pid, decoded, rawhex, result, note);
	return result;
}

#ifndef FAKE_WITHOUT_CHECKPOINT_API

CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
	char decoded[128];
	unsigned int timeout = args ? args->timeoutMs : 0;

	snprintf(decoded, sizeof(decoded), " timeoutMs=%u reserved0=%u", timeout, args ? args->reserved0 : 0);
	return transition("lock", pid, RUNNING, LOCKED, args, sizeof(*args), decoded, NULL, timeout);
}

CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)
{
	return transition("checkpoint", pid, LOCKED, CHECKPOINTED, args, sizeof(*args), "", NULL, 0);
}

CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
	char decoded[LINE];
	size_t off;
	unsigned int i, count = args ? args->gpuPairsCount : 0;

	off = (size_t)snprintf(decoded, sizeof(decoded), " pairs=%u", count);
	for (i = 0; args && args->gpuPairs && i < count && i < MAX_GPUS; i++) {
		char old[33], new[33];

		hex(old, args->gpuPairs[i].oldUuid.bytes, 16);
		hex(new, args->gpuPairs[i].newUuid.bytes, 16);
		off += (size_t)snprintf(decoded + off, sizeof(decoded) - off, " pair%u=%s:%s", i, old, new);
	}
	return transition("restore", pid, CHECKPOINTED, LOCKED, args, sizeof(*args), decoded, args, 0);
}

CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)
{
	return transition("unlock", pid, LOCKED, RUNNING, args, sizeof(*args), "", NULL, 0);
}

/*
 * The checks both read-only queries make first, under the state lock: CUDA initialised, no failure injected
 * for ``call``, a known ``pid`` and an ``out`` pointer. On SUCCESS *found is a copy of the pid's record.
 */
static CUresult query(const char *call, int pid, const void *out, struct proc *found)
{
	struct proc procs[MAX_PROCS], *p;
	CUresult result;
	int fd, n, code;

	fd = lock_state();
	n = load(procs);
	p = find(procs, &n, pid);
	if (need_init())
		result = NOT_INITIALIZED;
	else if ((code = injected(call, pid)) != 0)
		result = code;
	else if (!p || !out)
		result = INVALID_VALUE;
	else {
		*found = *p;
		result = SUCCESS;
	}
	unlock_state(fd);
	return result;
}

CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state)
{
	struct proc p;
	CUresult result = query("get_state", pid, state, &p);

	if (result == SUCCESS)
		*state = p.state;
	log_line("call=get_state pid=%d state=%d result=%d", pid, result == SUCCESS ? *state : -1, result);
	return result;
}

CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)
{
	struct proc p;
	CUresult result = query("get_restore_tid", pid, tid, &p);

	if (result == SUCCESS)
		*tid = pid + 1;
	log_line("call=get_restore_tid pid=%d result=%d", pid, result);
	return result;
}

#endif /* FAKE_WITHOUT_CHECKPOINT_API */

CUresult cuInit(unsigned int flags)
{
	const char *fail = getenv("FAKE_CUDA_INIT_RESULT");
	CUresult result = fail && *fail ? atoi(fail) : SUCCESS;

	if (flags != 0)
		result = INVALID_VALUE;
	if (result == SUCCESS)
		initialized = 1;
	log_line("call=init flags=%u result=%d", flags, result);
	return result;
}

/*
 * CUDA memory shared between processes, as a workload that loads this fake calls it:
 * cuMemExportToShareableHandle (POSIX file descriptor handle type) opens FAKE_CUDA_DEVICE (default
 * /dev/nvidiactl) and hands back that descriptor, as the driver hands back one of its device file;
 * cuIpcGetMemHandle fills the 64-byte handle with the caller's pid. Both are logged.
 */
CUresult cuMemExportToShareableHandle(void *handle, unsigned long long mem, int type, unsigned long long flags)
{
	const char *device = getenv("FAKE_CUDA_DEVICE");
	int fd;

	if (!handle || type != 1 || flags != 0)
		return INVALID_VALUE;
	fd = open(device && *device ? device : "/dev/nvidiactl", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return 999;
	*(int *)handle = fd;
	log_line("call=mem_export pid=%d mem=%llu fd=%d result=0", (int)getpid(), mem, fd);
	return SUCCESS;
}

CUresult cuIpcGetMemHandle(void *handle, unsigned long long ptr)
{
	if (!handle)
		return INVALID_VALUE;
	memset(handle, 0, 64);
	snprintf((char *)handle, 64, "fake-ipc:%d:%llu", (int)getpid(), ptr);
	log_line("call=ipc_get_mem_handle pid=%d ptr=%llu result=0", (int)getpid(), ptr);
	return SUCCESS;
}

CUresult cuDriverGetVersion(int *version)
{
	const char *v = getenv("FAKE_CUDA_DRIVER_VERSION");

	if (!version)
		return INVALID_VALUE;
	*version = v && *v ? atoi(v) : 13000;
	return SUCCESS;
}

#ifndef FAKE_WITHOUT_ERROR_NAME
CUresult cuGetErrorName(CUresult error, const char **name)
{
	static const struct {
		int code;
		const char *name;
	} names[] = {
		{ 0, "CUDA_SUCCESS" },
		{ 1, "CUDA_ERROR_INVALID_VALUE" },
		{ 3, "CUDA_ERROR_NOT_INITIALIZED" },
		{ 100, "CUDA_ERROR_NO_DEVICE" },
		{ 401, "CUDA_ERROR_ILLEGAL_STATE" },
		{ 600, "CUDA_ERROR_NOT_READY" },
		{ 801, "CUDA_ERROR_NOT_SUPPORTED" },
	};
	size_t i;

	if (!name)
		return INVALID_VALUE;
	for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (names[i].code == error) {
			*name = names[i].name;
			return SUCCESS;
		}
	}
	*name = NULL;
	return INVALID_VALUE;
}
#endif
