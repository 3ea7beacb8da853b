package integration

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/ratelimit"
)

// BenchmarkFloorRateLimit is the floor table of rate limits (issue 23): a request of
// ratelimit.Limiter.Allow, by default (its commit does not wait for the WAL flush) and
// WithDurableDecisions, against a one-row autocommit UPDATE committed the same two ways, a
// SELECT 1 round trip, and go-redis/redis_rate v10 (GCRA in a Lua script) on a local
// redis-server. Every client has 1,000 keys of its own (rows of its own for the UPDATEs), each
// request picks one at random, and every key is created before any timing; the limit (10^6 a
// second, burst 1,000) allows every request.
//
// Redis persists as the row it is set beside does: with fsync=on, redis_rate appends to its
// log and fsyncs it once a second (appendfsync everysec, which a crash may cost about a
// second of writes: the counterpart of allow's asynchronous commit), and redis_rate-always
// fsyncs before every reply (appendfsync always, beside allow-durable); with fsync=off,
// redis_rate appends without ever fsyncing (appendfsync no), as Postgres then writes its WAL
// without flushing it.
//
// Ratios: allow/update-async and allow-durable/update-sync (the targets: >= 0.9),
// allow/redis_rate (>= 0.5), allow-durable/redis_rate-always with fsync=on, and what returning
// the decision costs: allow/update-async-returning and update-async-returning/update-async.
func BenchmarkFloorRateLimit(b *testing.B) {
	withFsync(b, func(b *testing.B, e *benchEnv) {
		var fsync string // withFsync's mode, as the server has it
		if err := e.pool.QueryRow(e.ctx, `SHOW fsync`).Scan(&fsync); err != nil {
			b.Fatal(err)
		}
		fsyncOn := fsync == "on"
		const perClient = 1000
		const maxClients = 16
		if _, err := e.pool.Exec(e.ctx, fmt.Sprintf(`CREATE TABLE bench_rl (id int PRIMARY KEY, v bigint NOT NULL) WITH (fillfactor = 70);
			INSERT INTO bench_rl SELECT g, 0 FROM generate_series(0, %d) g`, perClient*maxClients-1)); err != nil {
			b.Fatal(err)
		}
		limit := ratelimit.Limit{Rate: 1_000_000, Per: time.Second, Burst: 1000}
		peerLimit := redis_rate.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1000}
		type peer struct {
			name string
			rl   *redis_rate.Limiter
		}
		var peers []peer
		if fsyncOn {
			peers = append(peers,
				peer{"redis_rate", redis_rate.NewLimiter(startRedisWith(b, "--appendonly", "yes", "--appendfsync", "everysec"))},
				peer{"redis_rate-always", redis_rate.NewLimiter(startRedisWith(b, "--appendonly", "yes", "--appendfsync", "always"))})
		} else {
			peers = append(peers, peer{"redis_rate", redis_rate.NewLimiter(startRedisWith(b, "--appendonly", "yes", "--appendfsync", "no"))})
		}
		keys := make([][]string, maxClients)
		for c := range keys {
			keys[c] = make([]string, perClient)
			for i := range keys[c] {
				keys[c][i] = "c" + strconv.Itoa(c) + ":key:" + strconv.Itoa(i)
			}
		}
		// Every key's first request (which creates its row) before any timing.
		warm, err := ratelimit.New(e.pool, limit)
		if err != nil {
			b.Fatal(err)
		}
		for _, ks := range keys {
			for _, k := range ks {
				if _, err := warm.Allow(e.ctx, k); err != nil {
					b.Fatal(err)
				}
				for _, p := range peers {
					if _, err := p.rl.Allow(e.ctx, k, peerLimit); err != nil {
						b.Fatal(err)
					}
				}
			}
		}
		for _, sql := range []string{`VACUUM ANALYZE fencelock.rate_limits`, `VACUUM ANALYZE bench_rl`, `CHECKPOINT`} {
			if _, err := e.pool.Exec(e.ctx, sql); err != nil {
				b.Fatal(err)
			}
		}
		withClients(b, func(b *testing.B, clients int) {
			pool := e.poolOf(b, int32(clients))
			ops := floorRateLimitOps(b, e, pool, limit, keys)
			for _, p := range peers {
				ops = append(ops, floorOp{p.name, func(c int) (func() error, error) {
					rng := rand.New(rand.NewPCG(uint64(c), 3))
					ks := keys[c]
					return func() error {
						res, err := p.rl.Allow(e.ctx, ks[rng.IntN(len(ks))], peerLimit)
						if err == nil && res.Allowed != 1 {
							err = fmt.Errorf("redis_rate refused: %+v", res)
						}
						return err
					}, nil
				}})
			}
			pairs := [][2]string{{"allow", "update-async"}, {"allow-durable", "update-sync"}, {"allow", "redis_rate"},
				{"allow", "update-async-returning"}, {"update-async-returning", "update-async"}}
			if fsyncOn {
				pairs = append(pairs, [2]string{"allow-durable", "redis_rate-always"})
			}
			report(b, floorTable(b, clients, ops), pairs...)
		})
	})
}

// floorRateLimitOps returns the Postgres rows of BenchmarkFloorRateLimit on pool: client c
// picks among keys[c] (the limiter's rows) and rows c*1000 to c*1000+999 of bench_rl.
func floorRateLimitOps(b *testing.B, e *benchEnv, pool *pgxpool.Pool, limit ratelimit.Limit, keys [][]string) []floorOp {
	b.Helper()
	fast, err := ratelimit.New(pool, limit)
	if err != nil {
		b.Fatal(err)
	}
	durable, err := ratelimit.New(pool, limit, ratelimit.WithDurableDecisions())
	if err != nil {
		b.Fatal(err)
	}
	update := func(sql string) func(c int) (func() error, error) {
		return func(c int) (func() error, error) {
			rng := rand.New(rand.NewPCG(uint64(c), 1))
			base := c * len(keys[c])
			return func() error {
				_, err := pool.Exec(e.ctx, sql, base+rng.IntN(len(keys[c])))
				return err
			}, nil
		}
	}
	allow := func(r *ratelimit.Limiter) func(c int) (func() error, error) {
		return func(c int) (func() error, error) {
			rng := rand.New(rand.NewPCG(uint64(c), 2))
			ks := keys[c]
			return func() error {
				res, err := r.Allow(e.ctx, ks[rng.IntN(len(ks))])
				if err == nil && res.Allowed != 1 {
					err = fmt.Errorf("refused: %+v", res)
				}
				return err
			}, nil
		}
	}
	return []floorOp{
		{"select1", func(int) (func() error, error) {
			return func() error {
				var one int
				return pool.QueryRow(e.ctx, `SELECT 1`).Scan(&one)
			}, nil
		}},
		// The limiter's way of committing without waiting for the flush: set_config(..., true)
		// inside the one autocommit statement.
		{"update-async", update(`UPDATE bench_rl SET v = v + 1
			FROM (SELECT set_config('synchronous_commit', 'off', true)) AS cfg WHERE id = $1`)},
		{"update-sync", update(`UPDATE bench_rl SET v = v + 1 WHERE id = $1`)},
		// update-async that returns a row as a decision does (a timestamptz, a boolean, a
		// timestamptz): a statement that returns rows runs into a tuple store on the server
		// (PORTAL_ONE_RETURNING) and is read as a result set by pgx.
		{"update-async-returning", func(c int) (func() error, error) {
			rng := rand.New(rand.NewPCG(uint64(c), 1))
			base := c * len(keys[c])
			return func() error {
				var t1, t2 time.Time
				var ok bool
				return pool.QueryRow(e.ctx, `UPDATE bench_rl SET v = v + 1
					FROM (SELECT set_config('synchronous_commit', 'off', true)) AS cfg WHERE id = $1
					RETURNING clock_timestamp(), v > 0, clock_timestamp()`, base+rng.IntN(len(keys[c]))).Scan(&t1, &ok, &t2)
			}, nil
		}},
		{"allow", allow(fast)},
		{"allow-durable", allow(durable)},
	}
}
