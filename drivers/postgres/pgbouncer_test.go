package postgres

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-locker/locker/internal/pgtest"
)

// startPgBouncer runs a real PgBouncer in transaction pooling mode in front
// of srv and returns its port. It fails the test if pgbouncer is missing
// (scripts/test installs it).
func startPgBouncer(t *testing.T, srv *pgtest.Server) int {
	t.Helper()
	bin, lerr := exec.LookPath("pgbouncer")
	if lerr != nil {
		if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr != nil {
			t.Fatalf("pgbouncer is not installed (scripts/test installs it): %v", lerr)
		}
		bin = "/usr/sbin/pgbouncer"
	}
	// Not t.TempDir: its parent is private to root, and pgbouncer runs as
	// postgres.
	dir, err := os.MkdirTemp("", "pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	var cred *syscall.Credential
	if os.Geteuid() == 0 { // pgbouncer refuses to run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running pgbouncer as root needs a postgres OS user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ini := fmt.Sprintf(`[databases]
* = host=127.0.0.1 port=%d
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
ignore_startup_parameters = extra_float_digits,options
logfile = %s
`, srv.Port(), port, filepath.Join(dir, "users.txt"), filepath.Join(dir, "pgbouncer.log"))
	for name, body := range map[string]string{"pgbouncer.ini": ini, "users.txt": `"postgres" ""` + "\n"} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if cred != nil {
			_ = os.Chown(p, int(cred.Uid), int(cred.Gid))
		}
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out := &syncBuf{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting pgbouncer: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
			return port
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			t.Fatalf("pgbouncer exited: %s\n%s", out.String(), log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgbouncer not listening after 15s: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Behind a real PgBouncer in transaction mode, session advisory locks would
// not coordinate (the next transaction may run on another server session),
// so the driver refuses with ErrPooler and leaves nothing held.
func TestBehindPgBouncerRefused(t *testing.T) {
	srv := pgtest.Start(t)
	port := startPgBouncer(t, srv)
	ctx := ctxFor(t, 60*time.Second)
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	l, err := Open(ctx, url)
	if err == nil {
		defer l.Close()
		_, err = l.Acquire(ctx, "behind-pgbouncer", "o", time.Minute)
	}
	if !errors.Is(err, ErrPooler) {
		t.Fatalf("lock through PgBouncer (transaction mode): got %v, want ErrPooler", err)
	}
	t.Logf("refused with: %v", err)
	// Nothing was left held on the server.
	conn, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d advisory locks left on the server", n)
	}
}

// syncBuf collects a child's output from its copying goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  []byte
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b = append(s.b, p...)
	return len(p), nil
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.b)
}
