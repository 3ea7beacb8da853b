package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/pgtest"
)

// grantTokens takes and releases the lease name n times and returns the tokens.
func grantTokens(t *testing.T, ctx context.Context, l *fencelock.Lessor, name string, n int) []int64 {
	t.Helper()
	var out []int64
	for range n {
		lease, err := l.TryAcquire(ctx, name, time.Minute)
		require.NoError(t, err)
		out = append(out, int64(lease.Token()))
		require.NoError(t, lease.Release(ctx))
	}
	return out
}

// acquireRetrying grants name, retrying while the pool reconnects after a fault. It fails the
// test after limit.
func acquireRetrying(t *testing.T, ctx context.Context, l *fencelock.Lessor, name string, limit time.Duration) *fencelock.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		lease, err := l.Acquire(ctx, name, time.Minute)
		if err == nil {
			return lease
		}
		require.NoError(t, ctx.Err(), "last error: %v", err)
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond): // the server is restarting: nothing to await but a connection
		}
	}
}

func maxOf(xs []int64) int64 {
	m := xs[0]
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// Backends terminated under a holder: the next grants still carry larger tokens, and the
// holder's heartbeat rides over the lost connection (the pool reconnects) without losing the
// lease.
func TestTokensAfterBackendTerminated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := newLessor(t, b.pool, "a", fencelock.WithHeartbeatInterval(30*time.Millisecond))
	before := grantTokens(t, b.ctx, a, "job", 5)
	held, err := a.TryAcquire(b.ctx, "held", time.Second)
	require.NoError(t, err)

	// Make sure the pool has several connections, then kill every one of them.
	var conns []*pgxpool.Conn
	for range 3 {
		c, err := b.pool.Acquire(b.ctx)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	rows, err := b.pool.Query(b.ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	require.NoError(t, err)
	var pids []uint32
	for rows.Next() {
		var pid uint32
		require.NoError(t, rows.Scan(&pid))
		pids = append(pids, pid)
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, pids)
	for _, pid := range pids {
		require.NoError(t, b.db.Server.TerminateBackend(b.ctx, pid))
	}

	after := acquireRetrying(t, b.ctx, a, "job", 10*time.Second)
	require.Greater(t, int64(after.Token()), maxOf(before))
	require.NoError(t, after.Release(b.ctx))
	// Two TTLs later, the held lease is still held: renewals resumed on fresh connections.
	_, err = b.pool.Exec(b.ctx, `SELECT pg_sleep(2)`)
	require.NoError(t, err)
	require.NoError(t, held.Err())
	require.NoError(t, held.Renew(b.ctx))
	require.NoError(t, held.Release(b.ctx))
}

// Server crashed (immediate shutdown) and restarted: tokens issued afterwards are larger than
// every token before, also where the server default is synchronous_commit = off.
func TestTokensAfterServerCrash(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		desc           string
		settings       []pgtest.Option
		syncCommitDflt string // the server default, checked: the test means nothing if "off" is not
	}{
		{"Default", nil, "on"},
		{"SynchronousCommitOff", []pgtest.Option{pgtest.AsyncCommit()}, "off"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			t.Parallel()
			srv := pgtest.NewServer(t, append(tc.settings, pgtest.Crashable())...)
			db := srv.NewDB(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			a := newLessor(t, db.Pool, "a")
			var before []int64
			for round := range 3 {
				// Many grants, held (no release, whose own commit would flush the WAL), the
				// crash right after the last acknowledged one: with asynchronous commit the
				// tail of the WAL, and the sequence's advance, would be lost.
				for i := range 100 {
					lease, err := a.TryAcquire(ctx, fmt.Sprintf("held:%d:%d", round, i), time.Minute)
					require.NoError(t, err)
					before = append(before, int64(lease.Token()))
				}
				require.NoError(t, srv.Crash(ctx))
				require.NoError(t, srv.Restart(ctx))
				db.Pool.Reset()
				after := acquireRetrying(t, ctx, a, "job:0", 30*time.Second)
				require.Greater(t, int64(after.Token()), maxOf(before), "round %d", round)
				before = append(before, int64(after.Token()))
				require.NoError(t, after.Release(ctx))
			}
			var sc string
			require.NoError(t, db.Pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&sc))
			require.Equal(t, tc.syncCommitDflt, sc)
		})
	}
}

// A holder process really paused with SIGSTOP past its TTL: a new holder takes over and writes;
// resumed, the old process finds Done closed and its fenced write rejected.
func TestStoppedProcessIsFenced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createWrites(t, b)

	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), holderChildEnv+"="+b.db.URL)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	out := bufio.NewScanner(stdout)
	readLine := func() string {
		t.Helper()
		require.True(t, out.Scan(), "child exited: %v", out.Err())
		return out.Text()
	}

	line := readLine() // "token N": the child holds the lease, heartbeat running
	oldToken, err := strconv.ParseInt(strings.TrimPrefix(line, "token "), 10, 64)
	require.NoError(t, err, line)

	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	cur := newLessor(t, b.pool, "new", fastBackoff)
	ln, err := cur.Acquire(b.ctx, "payment:7", 10*time.Second) // granted once the TTL ran out on the server
	require.NoError(t, err)
	require.Greater(t, int64(ln.Token()), oldToken)
	require.NoError(t, fencedWrite(b.ctx, b.pool, "payment:7", ln.Token()))
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))

	_, err = fmt.Fprintln(stdin, "write")
	require.NoError(t, err)
	require.Equal(t, "done-closed lost=true", readLine())
	require.Equal(t, fmt.Sprintf("write stale current=%d", ln.Token()), readLine())
	require.NoError(t, cmd.Wait())
	require.Equal(t, []int64{int64(ln.Token())}, writtenTokens(t, b, "payment:7"))
	require.NoError(t, ln.Release(b.ctx))
}

// runHolderChild is the child process of TestStoppedProcessIsFenced (see TestMain): it holds
// the lease payment:7 on the database at url, reports its token, and once told to write,
// reports whether Done closed and what the fence said of its write. It returns the exit code.
func runHolderChild(url string) int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	l, err := fencelock.NewLessor(pool, fencelock.WithHolder("old"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	lease, err := l.TryAcquire(ctx, "payment:7", 500*time.Millisecond)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Printf("token %d\n", lease.Token())

	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || in.Text() != "write" {
		return 2
	}
	// Resumed long past the trust window: the heartbeat's timer fires at once and closes Done.
	select {
	case <-lease.Done():
		fmt.Printf("done-closed lost=%v\n", errors.Is(lease.Err(), fencelock.ErrLeaseLost))
	case <-time.After(5 * time.Second):
		fmt.Println("done-open")
	}
	// Write anyway, as a buggy holder would: the fence must reject it.
	err = fencedWrite(ctx, pool, "payment:7", lease.Token())
	var stale *fencelock.StaleTokenError
	if errors.As(err, &stale) {
		fmt.Printf("write stale current=%d\n", stale.Current)
	} else {
		fmt.Printf("write err=%v\n", err)
	}
	return 0
}
