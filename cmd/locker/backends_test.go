package main

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-locker/locker/internal/etcdtest"
	"github.com/go-locker/locker/internal/pgtest"
	"github.com/go-locker/locker/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Each server backend once through `locker run`, against its real server
// started here: contending runs never overlap, --wait 0 is refused while the
// key is held, status shows the holder, and a signal ends the run and
// releases the lock.

func TestBackendRedis(t *testing.T) {
	s := redistest.Start(t)
	checkBackend(t, s.URL())
}

func TestBackendRueidis(t *testing.T) {
	s := redistest.Start(t)
	checkBackend(t, "rueidis://"+s.Addr)
}

func TestBackendEtcd(t *testing.T) {
	c := etcdtest.Start(t)
	checkBackend(t, c.URL("/locker-cmd-test"))
}

func TestBackendPostgres(t *testing.T) {
	s := pgtest.Start(t)
	checkBackend(t, s.URL())
}

func checkBackend(t *testing.T, url string) {
	// Mutual exclusion across processes.
	checkMutualExclusion(t, url, 3)

	// Held: --wait 0 is refused, status shows the holder.
	env := []string{"LOCKER_URL=" + url}
	holder := start(t, env, append([]string{"run", "--ttl", "5s", "job", "--"}, child("signals")...)...)
	tok := tokenOf(t, holder.expect(t, "ready"))
	code, _, stderr := run(t, env, append([]string{"run", "--wait", "0", "job", "--"}, child("exit", "0")...)...)
	if code != exitNotAcquired {
		t.Fatalf("--wait 0 on a held key: code %d, %s", code, stderr)
	}
	code, out, stderr := run(t, env, "status", "job")
	if code != exitOK || !strings.Contains(out, "token    "+uitoa(tok)+"\n") {
		t.Fatalf("status of a held key: code %d, %q, %q", code, out, stderr)
	}
	holder.signal(t, syscall.SIGTERM)
	if code := holder.wait(t); code != 7 {
		t.Fatalf("holder: code %d, %s", code, holder.stderr.String())
	}
	if code, out, stderr := run(t, env, "status", "job"); code != exitFree {
		t.Fatalf("status after release: code %d, %q, %q", code, out, stderr)
	}
}

// Deleting the lock on the real Redis under a running command: the command
// is terminated and locker exits with "lost".
func TestBackendRedisLockDeleted(t *testing.T) {
	s := redistest.Start(t)
	p := start(t, nil, append([]string{"run", "--url", s.URL(), "--ttl", "600ms", "job", "--"}, child("signals")...)...)
	p.expect(t, "ready")
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	drain(p)
	if code := p.wait(t); code != exitLost {
		t.Fatalf("code %d, want %d; stderr %s", code, exitLost, p.stderr.String())
	}
	if !strings.Contains(p.stderr.String(), `lock "job" lost while the command ran`) {
		t.Fatalf("stderr: %s", p.stderr.String())
	}
}
