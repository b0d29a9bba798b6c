/*
 * Copyright (c) warmstart developers
 * GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
 * SPDX-License-Identifier: GPL-3.0-or-later
 *
 * A fake libascendcl.so for the tests of plugins/module_utils/accel/_ascend.py.
 *
 * It exports the four CANN snapshot entry points with the in-process ABI of
 * the runtime's master branch (aclError f(int pid, void *reserve_or_args);
 * CANN 9.0.0 declares them without parameters, which the same call satisfies
 * on the C calling conventions of x86-64 and aarch64), plus a tiny device
 * memory API (aclrtMalloc, aclrtFree, aclrtMemcpy) whose "device memory" is
 * an arena in host memory. It never touches an NPU.
 *
 *   State machine (per process, in this library):
 *     lock    RUNNING   -> LOCKED
 *     backup  LOCKED    -> BACKED_UP  device arena copied into a host backup,
 *                                     then the arena is poisoned (0xdd): the
 *                                     device memory is given back
 *     restore BACKED_UP -> LOCKED     the backup copied back into the arena
 *     unlock  LOCKED | BACKED_UP -> RUNNING
 *   anything else returns 507901 (state error) and changes nothing; a pid
 *   other than getpid(), a non-NULL reserve (lock, unlock) or args with
 *   non-zero flags (backup, restore) returns 100000 (invalid param),
 *   as the runtime does: the snapshot API acts on the calling process only.
 *   aclrtMalloc / aclrtMemcpy while LOCKED or BACKED_UP return 507901 (the
 *   runtime would block them; the fake refuses so a test sees it).
 *
 *   FAKE_ACL_LOG   every snapshot call is appended as one line:
 *                  call=<lock|backup|restore|unlock> pid=<arg> self=<getpid()>
 *                  state=<state before> args=<null|given> result=<code>
 *   FAKE_ACL_FAIL  "call=code,..." (call: lock, backup, restore, unlock): that
 *                  call returns that code and changes nothing.
 *
 * Build: gcc -shared -fPIC -o libascendcl.so fake_libascendcl.c
 *   -DFAKE_WITHOUT_SNAPSHOT_API  a CANN without the aclrtSnapShot* symbols
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int aclError;

enum { RUNNING = 0, LOCKED = 1, BACKED_UP = 2 };
enum { ACL_SUCCESS = 0, ACL_ERROR_INVALID_PARAM = 100000, ACL_ERROR_RT_STATE = 507901 };

#define ARENA 65536

static int state = RUNNING;
static unsigned char arena[ARENA];
static size_t used;

#ifndef FAKE_WITHOUT_SNAPSHOT_API
static const char *state_names[] = { "RUNNING", "LOCKED", "BACKED_UP" };
static unsigned char *backup_copy;

static int fail_code(const char *call)
{
	const char *spec = getenv("FAKE_ACL_FAIL");
	size_t len = strlen(call);

	while (spec && *spec) {
		if (strncmp(spec, call, len) == 0 && spec[len] == '=')
			return atoi(spec + len + 1);
		spec = strchr(spec, ',');
		if (spec)
			spec++;
	}
	return 0;
}


static const void *last_args;

static aclError logged(const char *call, int pid, int before, aclError result)
{
	const char *path = getenv("FAKE_ACL_LOG");
	FILE *log;

	if (!path)
		return result;
	log = fopen(path, "a");
	if (!log)
		return result;
	fprintf(log, "call=%s pid=%d self=%d state=%s args=%s result=%d\n", call, pid, (int)getpid(),
		state_names[before], last_args ? "given" : "null", result);
	fclose(log);
	return result;
}

/* reserve: lock / unlock take a reserved pointer that must be NULL; backup / restore take their args struct,
 * whose flags (the first 32 bits) must be 0 when one is given. */
static aclError transition(const char *call, int pid, const void *reserve, int legal_a, int legal_b)
{
	int before = state;
	int code;
	int takes_args = strcmp(call, "backup") == 0 || strcmp(call, "restore") == 0;

	last_args = reserve;

	if (pid != (int)getpid() || (reserve != NULL && (!takes_args || *(const unsigned int *)reserve != 0)))
		return logged(call, pid, before, ACL_ERROR_INVALID_PARAM);
	code = fail_code(call);
	if (code)
		return logged(call, pid, before, code);
	if (state != legal_a && state != legal_b)
		return logged(call, pid, before, ACL_ERROR_RT_STATE);
	return -1;
}

aclError aclrtSnapShotProcessLock(int pid, void *reserve)
{
	aclError code = transition("lock", pid, reserve, RUNNING, RUNNING);

	if (code >= 0)
		return code;
	state = LOCKED;
	return logged("lock", pid, RUNNING, ACL_SUCCESS);
}

aclError aclrtSnapShotProcessBackup(int pid, void *args)
{
	aclError code = transition("backup", pid, args, LOCKED, LOCKED);

	if (code >= 0)
		return code;
	free(backup_copy);
	backup_copy = malloc(ARENA);
	if (!backup_copy)
		return logged("backup", pid, LOCKED, 507899);
	memcpy(backup_copy, arena, ARENA);
	memset(arena, 0xdd, ARENA);
	state = BACKED_UP;
	return logged("backup", pid, LOCKED, ACL_SUCCESS);
}

aclError aclrtSnapShotProcessRestore(int pid, void *args)
{
	aclError code = transition("restore", pid, args, BACKED_UP, BACKED_UP);

	if (code >= 0)
		return code;
	memcpy(arena, backup_copy, ARENA);
	state = LOCKED;
	return logged("restore", pid, BACKED_UP, ACL_SUCCESS);
}

aclError aclrtSnapShotProcessUnlock(int pid, void *reserve)
{
	int before = state;
	aclError code = transition("unlock", pid, reserve, LOCKED, BACKED_UP);

	if (code >= 0)
		return code;
	state = RUNNING;
	return logged("unlock", pid, before, ACL_SUCCESS);
}
#endif

aclError aclrtMalloc(void **dev, size_t size, int policy)
{
	(void)policy;
	if (state != RUNNING)
		return ACL_ERROR_RT_STATE;
	if (!dev || size == 0 || used + size > ARENA)
		return ACL_ERROR_INVALID_PARAM;
	*dev = arena + used;
	used += (size + 63) & ~(size_t)63;
	return ACL_SUCCESS;
}

aclError aclrtFree(void *dev)
{
	(void)dev;
	return state == RUNNING ? ACL_SUCCESS : ACL_ERROR_RT_STATE;
}

/* kind: 0 host->host, 1 host->device, 2 device->host, 3 device->device (aclrtMemcpyKind) */
aclError aclrtMemcpy(void *dst, size_t dest_max, const void *src, size_t count, int kind)
{
	(void)kind;
	if (state != RUNNING)
		return ACL_ERROR_RT_STATE;
	if (!dst || !src || count > dest_max)
		return ACL_ERROR_INVALID_PARAM;
	memcpy(dst, src, count);
	return ACL_SUCCESS;
}
