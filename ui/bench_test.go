package ui_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/db"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
	"github.com/fencelock/fencelock/ui"
)

// BenchmarkPoll measures the poller's one statement against a SELECT 1 round trip, alternated
// in the same run, with 0, 1,000 and 10,000 leases held and 200 waiters queued, with lists cut
// at 1,000 rows (the default) and at 10,000:
//
//	go test -run '^$' -bench Poll -benchtime 200x ./ui/
func BenchmarkPoll(b *testing.B) {
	for _, leases := range []int{0, 1000, 10000} {
		for _, maxRows := range []int{1000, 10000} {
			if leases < maxRows && maxRows > 1000 {
				continue
			}
			b.Run(fmt.Sprintf("leases=%d/max_rows=%d", leases, maxRows), func(b *testing.B) {
				bb := testkit.Setup(b)
				fill(b, bb.Ctx, bb.Pool, leases)
				q := db.New()
				arg := db.LiveViewSnapshotParams{Since: time.Now().Add(-10 * time.Second), MaxRows: int32(maxRows)}
				var poll, floor time.Duration
				var size int
				b.ResetTimer()
				for range b.N {
					t := time.Now()
					s, err := q.LiveViewSnapshot(bb.Ctx, bb.Pool, arg)
					poll += time.Since(t)
					require.NoError(b, err)
					size = len(s)
					t = time.Now()
					_, err = bb.Pool.Exec(bb.Ctx, `SELECT 1`)
					floor += time.Since(t)
					require.NoError(b, err)
				}
				b.ReportMetric(float64(poll.Microseconds())/float64(b.N), "us/poll")
				b.ReportMetric(float64(poll)/float64(floor), "x_select1")
				b.ReportMetric(float64(size), "bytes/poll")
			})
		}
	}
}

// fill holds n leases of an hour (and queues 200 waiters on the first names when n > 0) with
// plain SQL, the way the lessor's rows look.
func fill(b *testing.B, ctx context.Context, pool *pgxpool.Pool, n int) {
	b.Helper()
	if n == 0 {
		return
	}
	_, err := pool.Exec(ctx, `
		INSERT INTO fencelock.leases (name, holder, token, acquired_at, expires_at)
		SELECT 'bench:' || i, 'holder-' || (i % 50), fencelock.next_token(false), now(), now() + interval '1 hour'
		FROM generate_series(1, $1) AS i`, n)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `
		INSERT INTO fencelock.lease_waiters (name, holder, wait_id, seq, channel, ttl_us, since, expires_at)
		SELECT 'bench:' || (i % 20 + 1), 'waiter-' || i, i, nextval('fencelock.lease_waiters_seq'), NULL, 60000000, now(), now() + interval '1 hour'
		FROM generate_series(1, 200) AS i`)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `ANALYZE fencelock.leases, fencelock.lease_waiters`)
	require.NoError(b, err)
}

// BenchmarkPollerPages counts the statements a second the live view sends with 1 and with 20
// pages open, each following its event stream, at the default interval (500 ms), for five
// seconds each while a lease changes hands every 50 ms:
//
//	go test -run '^$' -bench PollerPages -benchtime 1x ./ui/
func BenchmarkPollerPages(b *testing.B) {
	for _, pages := range []int{1, 20} {
		b.Run(fmt.Sprintf("pages=%d", pages), func(b *testing.B) {
			bb := testkit.Setup(b)
			tr := &countingTracer{}
			reader := testkit.NewPool(b, bb.Ctx, bb.DB.URL, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tr })
			h, err := ui.New(reader)
			require.NoError(b, err)
			base := serve(b, h)
			ctx, cancel := context.WithCancel(bb.Ctx)
			defer cancel()
			churn := make(chan struct{})
			go func() {
				defer close(churn)
				l := fencetest.NewLessor(b, bb.Pool, "churn")
				for ctx.Err() == nil {
					if lease, err := l.TryAcquire(ctx, "churn", time.Minute); err == nil {
						_ = lease.Release(ctx)
					}
					select {
					case <-ctx.Done():
					case <-time.After(50 * time.Millisecond):
					}
				}
			}()
			streams := make([]<-chan string, pages)
			for i := range streams {
				streams[i] = events(b, ctx, base, "leases", "")
			}
			updates := make(chan int, pages)
			start, s0 := time.Now(), tr.n.Load()
			for _, s := range streams {
				go func() {
					n := 0
					for {
						select {
						case _, ok := <-s:
							if !ok {
								updates <- n
								return
							}
							n++
						case <-time.After(time.Until(start.Add(5 * time.Second))):
							updates <- n
							return
						}
					}
				}()
			}
			total := 0
			for range streams {
				total += <-updates
			}
			elapsed, statements := time.Since(start), tr.n.Load()-s0
			cancel()
			<-churn
			b.ReportMetric(float64(statements)/elapsed.Seconds(), "statements/s")
			b.ReportMetric(float64(total)/float64(pages)/elapsed.Seconds(), "updates/s/page")
		})
	}
}
