package fencelock_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// statementNames is a pgx QueryTracer that counts the sqlc queries a pool sends, by name
// (the "-- name: X" line sqlc puts first), with when each started and how many are in flight.
type statementNames struct {
	mu      sync.Mutex
	seen    map[string]int
	starts  map[string][]time.Time
	running map[string]int
}

type statementNameKey struct{}

func (s *statementNames) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	rest, ok := strings.CutPrefix(d.SQL, "-- name: ")
	if !ok {
		return ctx
	}
	name, _, _ := strings.Cut(rest, " ")
	s.mu.Lock()
	s.seen[name]++
	s.starts[name] = append(s.starts[name], time.Now())
	s.running[name]++
	s.mu.Unlock()
	return context.WithValue(ctx, statementNameKey{}, name)
}

func (s *statementNames) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if name, ok := ctx.Value(statementNameKey{}).(string); ok {
		s.mu.Lock()
		s.running[name]--
		s.mu.Unlock()
	}
}

func (s *statementNames) count(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[name]
}

// inFlight is how many queries of name have started and not ended.
func (s *statementNames) inFlight(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running[name]
}

// startedAfter counts the queries of name that started after t.
func (s *statementNames) startedAfter(name string, t time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, at := range s.starts[name] {
		if at.After(t) {
			n++
		}
	}
	return n
}

// tracedPool returns a pool on the bundle's database whose sqlc queries are counted.
func tracedPool(t *testing.T, b *bundle) (*pgxpool.Pool, *statementNames) {
	names := &statementNames{seen: map[string]int{}, starts: map[string][]time.Time{}, running: map[string]int{}}
	return newPool(t, b.Ctx, b.DB.URL, func(c *pgxpool.Config) { c.ConnConfig.Tracer = names }), names
}

// awaitListeningWaiters waits until sem has n waiters whose rows carry a NOTIFY channel (a
// waiter's first attempt may run before its pool's notifier listens; it tells its channel
// at once when LISTEN is up).
func awaitListeningWaiters(t *testing.T, b *bundle, sem string, n int) {
	t.Helper()
	waitFor(t, b, "waiters with a channel", func() bool {
		var got int
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM fencelock.semaphore_waiters
			WHERE semaphore = $1 AND channel IS NOT NULL AND expires_at > clock_timestamp()`, sem).Scan(&got))
		return got == n
	})
}

// A permit released to a waiter of the same process reaches it without a NOTIFY (issue 31):
// the release's statement gives it the permit, and the process's notifier that listens on
// the waiter's channel delivers the grant directly. Both on one pool, and on two pools of the
// process (the waiter's notifier is the other pool's). No SemaphoreNotify is sent, and the
// waiter holds the permit.
func TestSemaphoreLocalHandoffSendsNoNotify(t *testing.T) {
	t.Parallel()
	for _, samePool := range []bool{true, false} {
		t.Run(map[bool]string{true: "SamePool", false: "OtherPool"}[samePool], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			pool, names := tracedPool(t, b)
			waiterPool := pool
			if !samePool {
				waiterPool = newPool(t, b.Ctx, b.DB.URL)
			}
			holder := fencetest.NewSemaphore(t, pool, "holder", "local", 1)
			waiter := fencetest.NewSemaphore(t, waiterPool, "waiter", "local", 1)
			p, err := holder.TryAcquire(b.Ctx, time.Minute)
			require.NoError(t, err)
			type result struct {
				p   *fencelock.Lease
				err error
			}
			got := make(chan result, 1)
			go func() {
				wp, err := waiter.Acquire(b.Ctx, time.Minute)
				got <- result{wp, err}
			}()
			awaitListeningWaiters(t, b, "local", 1)
			require.NoError(t, p.Release(b.Ctx))
			var r result
			select {
			case r = <-got:
			case <-b.Ctx.Done():
				t.Fatal("the waiter never got the permit")
			}
			require.NoError(t, r.err, "the waiter got the permit")
			require.NoError(t, r.p.Err())
			require.Equal(t, 1, names.count("SemaphoreRelease"))
			require.Zero(t, names.count("SemaphoreNotify"), "a waiter of this process is told without a NOTIFY")
			require.NoError(t, r.p.Release(b.Ctx))
		})
	}
}

// A permit released to a waiter this process does not listen for (another process's: here a
// queue row written by SQL, with a channel a plain session LISTENs on) is still announced by
// NOTIFY, with the waiter's wait id first in the payload.
func TestSemaphoreHandoffToAnotherProcessNotifies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, names := tracedPool(t, b)
	holder := fencetest.NewSemaphore(t, pool, "holder", "remote", 1)
	p, err := holder.TryAcquire(b.Ctx, time.Minute)
	require.NoError(t, err)

	listener, err := pgx.Connect(b.Ctx, b.DB.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = listener.Close(context.Background()) })
	_, err = listener.Exec(b.Ctx, `LISTEN other_process`)
	require.NoError(t, err)
	w := rvAcquire(t, b.Ctx, b.Pool, "remote", "elsewhere", 4242, time.Minute, true, "other_process")
	require.EqualValues(t, 4, w.outcome, "queued")

	require.NoError(t, p.Release(b.Ctx))
	require.Equal(t, 1, names.count("SemaphoreNotify"), "a waiter of another process is told by NOTIFY")
	n, err := listener.WaitForNotification(b.Ctx)
	require.NoError(t, err)
	require.Equal(t, "other_process", n.Channel)
	require.True(t, strings.HasPrefix(n.Payload, "4242 "), "payload %q", n.Payload)
}
