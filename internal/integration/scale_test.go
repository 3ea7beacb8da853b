package integration

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/pgtest"
)

// scaleEnv, when set (to a number of leases, or "1" for 100,000), runs TestScaleManyLeases.
const scaleEnv = "FENCELOCK_SCALE"

// One lessor holds 100,000 leases (TTL 10 s, default heartbeat of 3.3 s and safety margin of
// 1 s) for 60 s and loses none: renewal is linear in the leases renewed, sent in batches of at
// most 1,000, and adding or removing a lease does not scan the others. Opt-in (about two
// minutes): FENCELOCK_SCALE=1 go test -run TestScaleManyLeases -v. It logs the grant and
// release rates, the heartbeat's client CPU and the time each lease stayed ahead of its
// trust window (the closest call).
func TestScaleManyLeases(t *testing.T) {
	n := 100_000
	switch v := os.Getenv(scaleEnv); v {
	case "":
		t.Skip(scaleEnv + " is not set: the 100,000-lease run is opt-in")
	case "1":
	default:
		_, err := fmt.Sscan(v, &n)
		require.NoError(t, err, scaleEnv)
	}
	hold := 60 * time.Second
	srv := pgtest.NewServer(t)
	db := srv.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	l := newLessor(t, pool, "scale")

	leases := make([]*fencelock.Lease, n)
	var next atomic.Int64
	t0 := time.Now()
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				lease, err := l.TryAcquire(ctx, fmt.Sprintf("scale:%d", i), 10*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				leases[i] = lease
			}
		})
	}
	wg.Wait()
	require.False(t, t.Failed())
	grantTime := time.Since(t0)
	t.Logf("granted %d leases in %v (%.0f/s)", n, grantTime.Round(time.Millisecond), float64(n)/grantTime.Seconds())

	cpu0 := processCPU(t)
	start := time.Now()
	minAhead := time.Hour // the closest any lease came to the end of its trust window
	for time.Since(start) < hold {
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(500 * time.Millisecond): // sampling, not awaiting: the check below is the event
		}
		now := time.Now()
		for _, lease := range leases {
			require.NoError(t, lease.Err(), "lease %s lost after %v", lease.Name(), now.Sub(start))
			minAhead = min(minAhead, lease.TrustedUntil().Sub(now))
		}
	}
	cpu := processCPU(t) - cpu0
	t.Logf("held %d leases for %v, none lost; heartbeat client CPU %v (%.1f%% of one core); closest call %v before a trust window's end (window 9 s, heartbeat 3.3 s)",
		n, hold, cpu.Round(time.Millisecond), 100*cpu.Seconds()/hold.Seconds(), minAhead.Round(time.Millisecond))

	t0 = time.Now()
	next.Store(0)
	for range 16 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if err := leases[i].Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	releaseTime := time.Since(t0)
	t.Logf("released %d leases in %v (%.0f/s)", n, releaseTime.Round(time.Millisecond), float64(n)/releaseTime.Seconds())
}

// processCPU returns the test process's user + system CPU time.
func processCPU(t testing.TB) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
