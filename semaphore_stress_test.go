package fencelock_test

// Adversarial review of the semaphore hand-off (migration 00012). Each TestReview* test fails
// while the defect it names is there.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// rvSpan is one grant of a permit as logged: its start and its last expiry.
type rvSpan struct {
	name     string
	token    int64
	from, to time.Time
	limit    int
}

// rvInstallLog logs every version of the permit rows of sem, with the limit in force for the
// statement that wrote it.
func rvInstallLog(t *testing.T, b *bundle, sem string) {
	t.Helper()
	rvExec(t, b.Ctx, b.Pool, `CREATE TABLE rv_log (id bigserial PRIMARY KEY, name text, holder text, token bigint,
		acquired_at timestamptz, expires_at timestamptz, lim int)`)
	rvExec(t, b.Ctx, b.Pool, fmt.Sprintf(`CREATE FUNCTION rv_log() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO public.rv_log (name, holder, token, acquired_at, expires_at, lim)
			VALUES (NEW.name, NEW.holder, NEW.token, NEW.acquired_at, NEW.expires_at,
			        (SELECT s.permit_limit FROM fencelock.semaphores AS s WHERE s.name = %s));
			RETURN NULL;
		END $$`, quoteLiteral(sem)))
	rvExec(t, b.Ctx, b.Pool, fmt.Sprintf(`CREATE TRIGGER rv_log AFTER INSERT OR UPDATE ON fencelock.leases FOR EACH ROW
		WHEN (NEW.name LIKE %s) EXECUTE FUNCTION rv_log()`, quoteLiteral(sem+"#%")))
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// rvCheckLog returns the grants that started while their limit (or more) of other grants were
// unexpired on the database clock.
func rvCheckLog(t *testing.T, b *bundle) (spans []rvSpan, bad []string) {
	t.Helper()
	rows, err := b.Pool.Query(b.Ctx, `SELECT name, token, min(acquired_at),
		(array_agg(expires_at ORDER BY id DESC))[1], (array_agg(lim ORDER BY id))[1]
		FROM rv_log WHERE holder <> 'fencelock force-release' GROUP BY name, token`)
	require.NoError(t, err)
	for rows.Next() {
		var s rvSpan
		require.NoError(t, rows.Scan(&s.name, &s.token, &s.from, &s.to, &s.limit))
		spans = append(spans, s)
	}
	require.NoError(t, rows.Err())
	for _, g := range spans {
		n := 0
		for _, h := range spans {
			if !h.from.After(g.from) && g.from.Before(h.to) {
				n++
			}
		}
		if n > g.limit {
			bad = append(bad, fmt.Sprintf("%s token %d at %s: %d unexpired, limit %d", g.name, g.token, g.from.Format("15:04:05.000000"), n, g.limit))
		}
	}
	return spans, bad
}

// rvPool returns a pool on b's database with room for a stress test.
func rvPool(t *testing.T, b *bundle, conns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.DB.URL)
	require.NoError(t, err)
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(b.Ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// Promise 1 and 2 under load: many Acquire (some cut short mid-statement), TryAcquire and
// Release, SetLimit up and down, permits lost by TTL, guarded transactions held across their
// permit's expiry, and force_release of held permits. Checked: never more than the limit of
// permits unexpired at once (from a log of every version of the permit rows), tokens of each
// permit rising, and no permit trusted by its client while the server no longer has it
// (force-released ones aside).
func TestSemaphoreStress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const sem = "rvs"
	rvInstallLog(t, b, sem)
	pool := rvPool(t, b, 40)
	_, err := b.Pool.Exec(b.Ctx, `SELECT fencelock.semaphore_set_limit($1, 3)`, sem)
	require.NoError(t, err)
	deadline := time.Now().Add(8 * time.Second)
	var forcedMu sync.Mutex
	forced := map[int64]bool{}
	var grants, trusted, cut, refusedTry, goneForced atomic.Int64
	var wg sync.WaitGroup
	for li := range 4 {
		l := newLessor(t, pool, fmt.Sprintf("rvs-l%d", li), fencelock.WithBackoff(fencelock.ExponentialBackoff(time.Millisecond, 50*time.Millisecond)))
		s, err := fencelock.NewSemaphore(l, sem, 3)
		require.NoError(t, err)
		for g := range 3 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(li), uint64(g)))
				for time.Now().Before(deadline) {
					var p *fencelock.Lease
					var err error
					switch k := rng.IntN(10); {
					case k < 5:
						ctx, cancel := context.WithTimeout(b.Ctx, time.Duration(5+rng.IntN(300))*time.Millisecond)
						p, err = s.Acquire(ctx, 500*time.Millisecond)
						cancel()
					case k < 8:
						p, err = s.TryAcquire(b.Ctx, 500*time.Millisecond)
						if err != nil {
							refusedTry.Add(1)
						}
					default:
						ctx, cancel := context.WithTimeout(b.Ctx, time.Duration(100+rng.IntN(1500))*time.Microsecond)
						p, err = s.Acquire(ctx, 500*time.Millisecond)
						cancel()
						if err != nil {
							cut.Add(1)
						}
					}
					if err != nil {
						time.Sleep(time.Millisecond)
						continue
					}
					grants.Add(1)
					hold := time.Now().Add(time.Duration(rng.IntN(15)) * time.Millisecond)
					for time.Now().Before(hold) {
						if p.Err() != nil {
							break
						}
						until := p.TrustedUntil()
						// checked is the database clock once the server has looked (the scalar
						// sub-select runs before the second column): on a loaded machine the look
						// can come long after the send, past the trust window, and a permit gone
						// by then is no breach. Only one gone while still trusted is.
						var n int
						var checked time.Time
						err := b.Pool.QueryRow(b.Ctx, `SELECT (SELECT count(*) FROM fencelock.leases WHERE name = $1 AND token = $2 AND holder = $3
							AND expires_at > clock_timestamp()), clock_timestamp()`, p.Name(), int64(p.Token()), l.Holder()).Scan(&n, &checked)
						if err != nil {
							t.Error(err)
							return
						}
						trusted.Add(1)
						forcedMu.Lock()
						f := forced[int64(p.Token())]
						forcedMu.Unlock()
						if n == 0 && f {
							goneForced.Add(1)
						}
						if n == 0 && checked.Before(until) && !f {
							t.Errorf("permit %s token %d trusted by %s until %v, gone on the server at %v", p.Name(), p.Token(), l.Holder(), until.Format("15:04:05.000"), checked.Format("15:04:05.000"))
						}
						time.Sleep(3 * time.Millisecond)
					}
					_ = p.Release(b.Ctx)
				}
			})
		}
	}
	// Permits lost by their TTL: never renewed, never released.
	dead, err := fencelock.NewSemaphore(newLessor(t, pool, "rvs-dead", fencelock.WithoutHeartbeat()), sem, 3)
	require.NoError(t, err)
	wg.Go(func() {
		for time.Now().Before(deadline) {
			_, _ = dead.TryAcquire(b.Ctx, 80*time.Millisecond)
			time.Sleep(150 * time.Millisecond)
		}
	})
	// A guarded transaction held open across its permit's expiry.
	gs, err := fencelock.NewSemaphore(newLessor(t, pool, "rvs-guard", fencelock.WithoutHeartbeat()), sem, 3)
	require.NoError(t, err)
	wg.Go(func() {
		for time.Now().Before(deadline) {
			p, err := gs.TryAcquire(b.Ctx, 100*time.Millisecond)
			if err != nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			tx, err := pool.Begin(b.Ctx)
			if err != nil {
				t.Error(err)
				return
			}
			if p.GuardTx(b.Ctx, tx) == nil {
				time.Sleep(250 * time.Millisecond)
			}
			_ = tx.Commit(b.Ctx)
		}
	})
	// SetLimit up and down.
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(7, 7))
		for time.Now().Before(deadline) {
			if _, err := pool.Exec(b.Ctx, `SELECT fencelock.semaphore_set_limit($1, $2)`, sem, 1+rng.IntN(5)); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(time.Duration(50+rng.IntN(200)) * time.Millisecond)
		}
	})
	// An operator's force_release of a held permit.
	wg.Go(func() {
		for time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
			var name string
			var tok int64
			err := pool.QueryRow(b.Ctx, `SELECT name, token FROM fencelock.leases WHERE name LIKE 'rvs#%' AND expires_at > clock_timestamp()
				ORDER BY random() LIMIT 1`).Scan(&name, &tok)
			if err != nil {
				continue
			}
			forcedMu.Lock()
			forced[tok] = true
			forcedMu.Unlock()
			_ = pgx.BeginFunc(b.Ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(b.Ctx, `SET LOCAL lock_timeout = '500ms'`); err != nil {
					return err
				}
				_, err := tx.Exec(b.Ctx, `SELECT * FROM fencelock.force_release($1, '{}', $2)`, name, tok)
				return err
			})
		}
	})
	wg.Wait()
	spans, bad := rvCheckLog(t, b)
	t.Logf("%d grants by the workers (%d tries refused, %d attempts cut short), %d trust checks (%d found a force-released permit gone), %d grants logged",
		grants.Load(), refusedTry.Load(), cut.Load(), trusted.Load(), goneForced.Load(), len(spans))
	require.Empty(t, bad, "more permits unexpired at once than the limit")
	requireTokensRise(t, b)
}

// The log check of TestSemaphoreStress catches a grant over the limit.
func TestSemaphoreStressCheckerCatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rvInstallLog(t, b, "rvk")
	rvExec(t, b.Ctx, b.Pool, `SELECT fencelock.semaphore_set_limit('rvk', 1)`)
	rvExec(t, b.Ctx, b.Pool, `INSERT INTO fencelock.leases (name, holder, token, acquired_at, expires_at)
		VALUES ('rvk#0', 'x', fencelock.next_token(false), clock_timestamp(), clock_timestamp() + interval '1 minute'),
		       ('rvk#1', 'y', fencelock.next_token(false), clock_timestamp(), clock_timestamp() + interval '1 minute')`)
	_, bad := rvCheckLog(t, b)
	require.Len(t, bad, 1)
}

// Promise 5: no waiter's statement waits for a lock behind another waiter's. 32 waits on a
// semaphore of 2 (short liveness, so they refresh often) while a sampler looks for semaphore
// statements waiting for a lock, and what blocks them.
func TestSemaphoreNoWaiterWaitsForAnother(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const sem = "rvw"
	pool := rvPool(t, b, 40)
	// The semaphore's row first (concurrent first acquires would be busy, and look again,
	// while one of them creates it: TestSemaphoreNoAttemptWaitsOnFirstAcquires).
	rvExec(t, b.Ctx, b.Pool, `SELECT fencelock.semaphore_set_limit('rvw', 2)`)
	deadline := time.Now().Add(6 * time.Second)
	var wg sync.WaitGroup
	var grants atomic.Int64
	for li := range 4 {
		s, err := fencelock.NewSemaphore(newLessor(t, pool, fmt.Sprintf("rvw-l%d", li)), sem, 2)
		require.NoError(t, err)
		for range 8 {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					ctx, cancel := context.WithDeadline(b.Ctx, deadline)
					p, err := s.Acquire(ctx, 300*time.Millisecond)
					cancel()
					if err != nil {
						continue
					}
					grants.Add(1)
					time.Sleep(2 * time.Millisecond)
					_ = p.Release(b.Ctx)
				}
			})
		}
	}
	seen := map[string]int{}
	samples := 0
	for time.Now().Before(deadline) {
		rows, err := b.Pool.Query(b.Ctx, `SELECT a.query, coalesce(bl.query, '?'), a.wait_event, coalesce(bl.state, '?'),
				coalesce((SELECT string_agg(DISTINCT k.locktype || coalesce(':' || k.relation::regclass::text, ''), ',') FROM pg_locks AS k WHERE k.pid = a.pid AND (NOT k.granted OR k.locktype = 'tuple')), '')
			FROM pg_stat_activity AS a
			LEFT JOIN LATERAL unnest(pg_blocking_pids(a.pid)) AS p(pid) ON true
			LEFT JOIN pg_stat_activity AS bl ON bl.pid = p.pid AND bl.datname = a.datname
			WHERE a.datname = current_database() AND a.wait_event_type = 'Lock' AND a.query LIKE '%semaphore%'`)
		require.NoError(t, err)
		for rows.Next() {
			var q, by, ev, st, lk string
			require.NoError(t, rows.Scan(&q, &by, &ev, &st, &lk))
			seen[rvStmt(q)+" <- "+rvStmt(by)+" ("+ev+" "+lk+", blocker "+st+")"]++
		}
		require.NoError(t, rows.Err())
		samples++
		time.Sleep(2 * time.Millisecond)
	}
	wg.Wait()
	t.Logf("%d grants, %d samples; lock waits: %v", grants.Load(), samples, seen)
	for k, n := range seen {
		if strings.HasPrefix(k, "SemaphoreAcquire <- SemaphoreAcquire") && !strings.Contains(k, "(extend") {
			t.Errorf("a waiter's statement waited behind another waiter's %d times (%s)", n, k)
		}
	}
}

// rvStmt names a statement of the library by its sqlc name.
func rvStmt(q string) string {
	if i := strings.Index(q, "-- name: "); i >= 0 {
		f := strings.Fields(q[i+len("-- name: "):])
		if len(f) > 0 {
			return f[0]
		}
	}
	if len(q) > 60 {
		q = q[:60]
	}
	return q
}
